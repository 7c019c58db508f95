"""The generated CRDs on a real kube-apiserver: round trips, samples, rejections, immutability.

Every rejection case asserts HTTP 422 and that the API server's message names the field at
fault, so the schema (bounds, patterns, enums, map-lists, CEL rules, transition rules) is
proven where users meet it, not only in the generator's unit tests.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client

from capl import api
from capl.api.kinds import KINDS, KINDS_BY_NAME, KindInfo
from capl.testbed import ControlPlane
from tests.kube.crd_objects import (
    TWO_HOSTS,
    UUID,
    T,
    at,
    cluster,
    create,
    full_migration,
    get,
    merge_patch,
    objects,
)

__all__ = ["objects"]  # the fixture, registered by this import

pytestmark = pytest.mark.apiserver

REPO = Path(__file__).resolve().parents[2]
SAMPLES = REPO / "config" / "samples"


# --- valid objects ---------------------------------------------------------------------------


def full_machine(name: str = "full") -> dict[str, Any]:
    return {
        "apiVersion": api.API_VERSION,
        "kind": "LibvirtMachine",
        "metadata": {"name": name, "labels": {api.CLUSTER_NAME_LABEL: "demo"}},
        "spec": {
            "providerID": f"libvirt:///{UUID}",
            "domainUUID": UUID,
            "hostName": "h0",
            "cpus": 4,
            "memoryMiB": 8192,
            "image": {
                "url": "https://images.example.invalid/base.qcow2",
                "checksum": "sha256:" + "ab" * 32,
                "format": "qcow2",
            },
            "rootVolume": {"sizeGiB": 30},
            "extraDisks": [{"name": "etcd", "sizeGiB": 10}, {"name": "data", "sizeGiB": 100}],
            "networkInterfaces": [
                {"mac": "52:54:00:12:34:56", "ip": "192.168.150.10"},
                {"bridge": "br0"},
                {"network": "storage-net"},
            ],
            "firmware": "uefi",
            "domainType": "qemu",
            "evictionStrategy": "LiveMigrate",
            "migrationTarget": "h1",
        },
    }


def machine_status() -> dict[str, Any]:
    return {
        "initialization": {"provisioned": True},
        "addresses": [
            {"type": "Hostname", "address": "full"},
            {"type": "InternalIP", "address": "192.168.150.10"},
            {"type": "InternalDNS", "address": "full.demo.ns.capl.internal"},
        ],
        "failureDomain": "h0",
        "host": "h0",
        "domainState": "Running",
        "observedGeneration": 1,
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "Ready",
                "message": "",
                "lastTransitionTime": T,
                "observedGeneration": 1,
            },
            {
                "type": "Paused",
                "status": "False",
                "reason": "NotPaused",
                "message": "",
                "lastTransitionTime": T,
            },
        ],
    }


def full_cluster(name: str = "full") -> dict[str, Any]:
    return {
        "apiVersion": api.API_VERSION,
        "kind": "LibvirtCluster",
        "metadata": {"name": name},
        "spec": {
            "controlPlaneEndpoint": {"host": "192.168.150.5", "port": 6443},
            # one host: a created network (cidr) on several hosts is refused
            "hosts": [
                {
                    "name": "h0",
                    "uri": "qemu+ssh://root@kvm1.example.invalid/system",
                    "credentialsRef": {"name": "kvm1-ssh"},
                    "controlPlane": True,
                    "maintenance": {"reason": "kernel update"},
                },
            ],
            "network": {
                "name": "capl-demo",
                "cidr": "192.168.150.0/24",
                "mode": "isolated",
                "bridge": "virbr-demo",
                "dnsDomain": "demo.example.invalid",
                "dhcp": {"start": "192.168.150.100", "end": "192.168.150.200"},
            },
            "storagePool": {"name": "capl-demo", "path": "/var/lib/libvirt/images/capl-demo"},
        },
    }


def cluster_status() -> dict[str, Any]:
    return {
        "initialization": {"provisioned": True},
        "failureDomains": [
            {"name": "h0", "controlPlane": True, "attributes": {"cpus": "8", "memoryMiB": "32768"}},
            {"name": "h1", "controlPlane": False},
        ],
        "hosts": [
            {
                "name": "h0",
                "reachable": True,
                "libvirtVersion": "9.0.0",
                "network": "capl-demo",
                "networkCreated": True,
                "bridge": "virbr-demo",
                "storagePool": "capl-demo",
                "storagePoolCreated": True,
                "maintenance": {"phase": "Blocked", "machines": 1, "message": "m0: None"},
            },
            {"name": "h1", "reachable": False, "message": "connection refused"},
        ],
        "observedGeneration": 1,
        "conditions": [
            {
                "type": "HostsReachable",
                "status": "False",
                "reason": "Unreachable",
                "message": "h1: connection refused",
                "lastTransitionTime": T,
            }
        ],
    }


def machine_template_status() -> dict[str, Any]:
    return {
        "capacity": {"cpu": "2", "memory": "4096Mi", "nvidia.com/gpu": "1"},
        "nodeInfo": {"architecture": "amd64", "operatingSystem": "linux"},
    }


def migration_status() -> dict[str, Any]:
    return {
        "phase": "Running",
        "sourceHost": "h0",
        "targetHost": "h1",
        "copyStorage": True,
        "startTime": "2026-12-02T01:00:00Z",
        "abortRequested": False,
        "state": {"dataTotalBytes": 1 << 30, "dataRemainingBytes": 1 << 20, "downtimeMs": 80},
        "message": "moving",
        "observedGeneration": 1,
        "conditions": [
            {
                "type": "Succeeded",
                "status": "False",
                "reason": "MigrationRunning",
                "message": "moving",
                "lastTransitionTime": "2026-12-02T01:00:00Z",
            }
        ],
    }


def full_object(kind: str) -> dict[str, Any]:
    if kind == "LibvirtMachineMigration":
        return full_migration()
    if kind == "LibvirtMachine":
        return full_machine()
    if kind == "LibvirtCluster":
        return full_cluster()
    if kind == "LibvirtMachineTemplate":
        spec = full_machine()["spec"]
        for key in ("providerID", "domainUUID", "migrationTarget"):
            del spec[key]
        spec["networkInterfaces"] = [{}, {"bridge": "br0"}]
        template: dict[str, Any] = {"metadata": {"labels": {"role": "worker"}}, "spec": spec}
    else:
        template = {"metadata": {"annotations": {"a": "b"}}, "spec": full_cluster()["spec"]}
    return {
        "apiVersion": api.API_VERSION,
        "kind": kind,
        "metadata": {"name": "full"},
        "spec": {"template": template},
    }


@pytest.mark.parametrize("info", KINDS, ids=lambda i: i.kind.value)
async def test_every_kind_round_trips(
    objects: client.CustomObjectsApi, namespace: str, info: KindInfo
) -> None:
    body = full_object(info.kind.value)
    sent = info.model.model_validate(body)
    created = await create(objects, namespace, sent.wire())
    back = info.model.model_validate(created)
    assert back.spec == sent.spec
    assert back.metadata.uid
    assert back.metadata.creation_timestamp is not None
    if info.status_subresource:
        status = {
            "LibvirtMachine": machine_status,
            "LibvirtCluster": cluster_status,
            "LibvirtMachineMigration": migration_status,
            "LibvirtMachineTemplate": machine_template_status,
        }[info.kind.value]()
        patched = await merge_patch(
            objects, namespace, info.kind.value, "full", {"status": status}, status=True
        )
        parsed = info.model.model_validate(patched)
        assert (
            parsed.wire()["status"]
            == info.model.model_validate({**body, "status": status}).wire()["status"]
        )
        again = info.model.model_validate(await get(objects, namespace, info.kind.value, "full"))
        assert again == parsed


async def test_server_defaults_match_the_model_defaults(
    objects: client.CustomObjectsApi, namespace: str
) -> None:
    minimal = {
        "apiVersion": api.API_VERSION,
        "kind": "LibvirtMachine",
        "metadata": {"name": "minimal"},
        "spec": {"image": {"path": "/var/lib/libvirt/images/base.qcow2"}},
    }
    created = await create(objects, namespace, minimal)
    model = api.LibvirtMachine.model_validate(minimal)
    assert created["spec"] == model.wire()["spec"]
    minimal_cluster = {
        "apiVersion": api.API_VERSION,
        "kind": "LibvirtCluster",
        "metadata": {"name": "minimal"},
        "spec": {
            "hosts": [{"name": "h0", "uri": "test:///default"}],
            "network": {"name": "default"},
        },
    }
    created = await create(objects, namespace, minimal_cluster)
    assert created["spec"] == api.LibvirtCluster.model_validate(minimal_cluster).wire()["spec"]


async def test_samples_are_accepted(control_plane: ControlPlane, namespace: str) -> None:
    out = await control_plane.kubectl(
        "apply", "--server-side", "-n", namespace, "-k", str(SAMPLES), "-o", "name"
    )
    assert len(out.split()) == len(KINDS)
    listing = await control_plane.kubectl(
        "get", "-n", namespace, "lvc,lvct,lvm,lvmt,lvmm", "-o", "json"
    )
    items = json.loads(listing)["items"]
    assert sorted(i["kind"] for i in items) == sorted(k.kind.value for k in KINDS)
    for item in items:
        KINDS_BY_NAME[item["kind"]].model.model_validate(item)


async def test_several_hosts_share_a_bridge_mode_network_or_an_adopted_one(
    objects: client.CustomObjectsApi, namespace: str
) -> None:
    """The multi-host refusal is about networks capl creates per host in nat/isolated mode
    only: bridge mode (a LAN all hosts share) and an adopted network stay allowed."""
    bridged = at(
        at(cluster(), "spec.hosts", TWO_HOSTS), "spec.network", {"mode": "bridge", "bridge": "br0"}
    )
    adopted = at(at(cluster(), "spec.hosts", TWO_HOSTS), "spec.network", {"name": "lan"})
    for name, body in (("bridged", bridged), ("adopted", adopted)):
        created = await create(objects, namespace, at(body, "metadata.name", name))
        assert len(created["spec"]["hosts"]) == 2


async def test_printer_columns_and_short_names(
    control_plane: ControlPlane, objects: client.CustomObjectsApi, namespace: str
) -> None:
    await create(objects, namespace, full_machine("shown"))
    await merge_patch(
        objects, namespace, "LibvirtMachine", "shown", {"status": machine_status()}, status=True
    )
    table = await control_plane.kubectl("get", "lvm", "-n", namespace)
    header, row = table.splitlines()[:2]
    assert header.split() == [
        "NAME",
        "CLUSTER",
        "HOST",
        "STATE",
        "READY",
        "PROVIDERID",
        "ADDRESS",
        "AGE",
    ]
    assert row.split()[:7] == [
        "shown",
        "demo",
        "h0",
        "Running",
        "True",
        f"libvirt:///{UUID}",
        "192.168.150.10",
    ]
    categories = await control_plane.kubectl("get", "cluster-api", "-n", namespace, "-o", "name")
    assert "libvirtmachine.infrastructure.cluster.x-k8s.io/shown" in categories.split()


async def test_server_side_apply_merges_hosts_by_name(
    control_plane: ControlPlane, namespace: str
) -> None:
    base = full_cluster("ssa")
    base["spec"]["hosts"] = [{"name": "h0", "uri": "qemu:///system"}]
    base["spec"]["network"] = {"mode": "bridge", "bridge": "br0"}  # room for a second host
    await control_plane.kubectl(
        "apply", "--server-side", "--field-manager=alice", "-n", namespace, "-f", "-",
        stdin=yaml.safe_dump(base).encode(),
    )  # fmt: skip
    extra = {
        "apiVersion": api.API_VERSION,
        "kind": "LibvirtCluster",
        "metadata": {"name": "ssa"},
        "spec": {"hosts": [{"name": "h9", "uri": "qemu+ssh://kvm9/system", "controlPlane": False}]},
    }
    await control_plane.kubectl(
        "apply", "--server-side", "--field-manager=bob", "-n", namespace, "-f", "-",
        stdin=yaml.safe_dump(extra).encode(),
    )  # fmt: skip
    obj = json.loads(
        await control_plane.kubectl("get", "lvc", "ssa", "-n", namespace, "-o", "json")
    )
    assert [h["name"] for h in obj["spec"]["hosts"]] == ["h0", "h9"]
