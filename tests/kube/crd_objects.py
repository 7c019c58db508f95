"""Helpers of the CRD tests on a real kube-apiserver (test_api_crds*.py): create/get/patch
through the custom objects API, the API server's message of a refusal, and minimal objects of
each kind with `at` to make malformed copies of them.
"""

from __future__ import annotations

import copy
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from capl import api
from capl.api.kinds import KINDS_BY_NAME

UUID = "6f1c8c52-1d7a-4c2e-9d4e-0a1b2c3d4e5f"
UUID2 = "0b7e3d1a-2c4f-4a6b-8c9d-1e2f3a4b5c6d"
T = "2026-01-02T03:04:05Z"


@pytest.fixture
async def objects(api_client: client.ApiClient) -> AsyncIterator[client.CustomObjectsApi]:
    return client.CustomObjectsApi(api_client)


def plural(kind: str) -> str:
    return KINDS_BY_NAME[kind].plural.value


async def create(
    objs: client.CustomObjectsApi, namespace: str, body: dict[str, Any]
) -> dict[str, Any]:
    result: dict[str, Any] = await objs.create_namespaced_custom_object(
        api.GROUP, api.VERSION, namespace, plural(body["kind"]), body
    )
    return result


async def get(
    objs: client.CustomObjectsApi, namespace: str, kind: str, name: str
) -> dict[str, Any]:
    result: dict[str, Any] = await objs.get_namespaced_custom_object(
        api.GROUP, api.VERSION, namespace, plural(kind), name
    )
    return result


async def merge_patch(
    objs: client.CustomObjectsApi,
    namespace: str,
    kind: str,
    name: str,
    patch: dict[str, Any],
    *,
    status: bool = False,
) -> dict[str, Any]:
    call = (
        objs.patch_namespaced_custom_object_status
        if status
        else objs.patch_namespaced_custom_object
    )
    result: dict[str, Any] = await call(
        api.GROUP,
        api.VERSION,
        namespace,
        plural(kind),
        name,
        patch,
        _content_type="application/merge-patch+json",
    )
    return result


def message_of(exc: ApiException) -> str:
    body = json.loads(exc.body)
    text: str = body["message"]
    return text


# --- minimal objects -------------------------------------------------------------------------


def at(obj: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    """A copy of obj with the dotted path set (numeric parts index lists); None deletes."""
    result = copy.deepcopy(obj)
    node: Any = result
    parts = dotted.split(".")
    for part in parts[:-1]:
        node = node[int(part)] if part.isdigit() else node.setdefault(part, {})
    last = parts[-1]
    if value is None:
        del node[last]
    elif last.isdigit():
        node[int(last)] = value
    else:
        node[last] = value
    return result


def machine(name: str = "bad") -> dict[str, Any]:
    return {
        "apiVersion": api.API_VERSION,
        "kind": "LibvirtMachine",
        "metadata": {"name": name},
        "spec": {"image": {"url": "https://images.example.invalid/base.qcow2"}},
    }


def cluster(name: str = "bad") -> dict[str, Any]:
    return {
        "apiVersion": api.API_VERSION,
        "kind": "LibvirtCluster",
        "metadata": {"name": name},
        "spec": {
            "hosts": [{"name": "h0", "uri": "qemu:///system"}],
            "network": {"cidr": "192.168.150.0/24"},
        },
    }


def machine_template() -> dict[str, Any]:
    return {
        "apiVersion": api.API_VERSION,
        "kind": "LibvirtMachineTemplate",
        "metadata": {"name": "bad"},
        "spec": {"template": {"spec": machine()["spec"]}},
    }


def cluster_template() -> dict[str, Any]:
    return {
        "apiVersion": api.API_VERSION,
        "kind": "LibvirtClusterTemplate",
        "metadata": {"name": "bad"},
        "spec": {"template": {"spec": cluster()["spec"]}},
    }


def full_migration() -> dict[str, Any]:
    return {
        "apiVersion": api.API_VERSION,
        "kind": "LibvirtMachineMigration",
        "metadata": {"name": "full"},
        "spec": {
            "machineName": "full",
            "targetHost": "h1",
            "bandwidthMiBPerSecond": 100,
            "completionTimeoutPerGiB": 60,
            "progressTimeoutSeconds": 30,
            "allowAutoConverge": True,
            "allowPostCopy": False,
        },
    }


TWO_HOSTS = [{"name": "h0", "uri": "qemu:///system"}, {"name": "h1", "uri": "qemu+tls://h1/system"}]
