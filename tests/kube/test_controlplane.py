"""The control-plane fixture is a real Kubernetes API server, not a fake.

Each test proves one property the rest of the suite leans on: optimistic concurrency (409),
watches that resume from a resourceVersion, CRDs with schema validation, RBAC, durability
across kube-apiserver and etcd restarts, and 410 Gone after a forced compaction.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.exceptions import ApiException

from capl.testbed import ControlPlane
from tests.fixtures.controlplane import new_api_client

pytestmark = pytest.mark.apiserver

DEADLINE = 60.0  # seconds: a failure bound, never a synchronisation device

GROUP = "testbed.capl.dev"
VERSION = "v1alpha1"
PLURAL = "widgets"

WIDGET_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": f"{PLURAL}.{GROUP}"},
    "spec": {
        "group": GROUP,
        "scope": "Namespaced",
        "names": {
            "plural": PLURAL,
            "singular": "widget",
            "kind": "Widget",
            "listKind": "WidgetList",
        },
        "versions": [
            {
                "name": VERSION,
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "required": ["size"],
                                "properties": {"size": {"type": "integer", "minimum": 1}},
                            }
                        },
                    }
                },
            }
        ],
    },
}


async def eventually(condition: Callable[[], bool]) -> None:
    """Poll `condition` until it holds; fail after DEADLINE seconds."""
    async with asyncio.timeout(DEADLINE):
        while True:
            if condition():
                return
            await asyncio.sleep(0.05)


async def watch_all(core: client.CoreV1Api, namespace: str, *, resource_version: str) -> None:
    """Watch configmaps from `resource_version` until the server ends the watch."""
    async with asyncio.timeout(DEADLINE), watch.Watch() as w:
        stream = w.stream(
            core.list_namespaced_config_map,
            namespace,
            resource_version=resource_version,
            timeout_seconds=int(DEADLINE),
        )
        async for _ in stream:
            pass


def configmap(name: str, **data: str) -> client.V1ConfigMap:
    return client.V1ConfigMap(metadata=client.V1ObjectMeta(name=name), data=data)


async def test_configmap_create_read_update(api_client: client.ApiClient, namespace: str) -> None:
    core = client.CoreV1Api(api_client)
    created = await core.create_namespaced_config_map(namespace, configmap("cm", color="red"))

    read = await core.read_namespaced_config_map("cm", namespace)
    assert read.data == {"color": "red"}
    assert read.metadata.uid == created.metadata.uid

    read.data["color"] = "blue"
    updated = await core.replace_namespaced_config_map("cm", namespace, read)
    assert updated.data == {"color": "blue"}
    assert int(updated.metadata.resource_version) > int(created.metadata.resource_version)
    assert (await core.read_namespaced_config_map("cm", namespace)).data == {"color": "blue"}


async def test_update_with_stale_resource_version_conflicts(
    api_client: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(api_client)
    stale = await core.create_namespaced_config_map(namespace, configmap("cm", n="0"))
    fresh = await core.read_namespaced_config_map("cm", namespace)
    fresh.data["n"] = "1"
    await core.replace_namespaced_config_map("cm", namespace, fresh)

    stale.data["n"] = "2"
    with pytest.raises(ApiException) as err:
        await core.replace_namespaced_config_map("cm", namespace, stale)
    assert err.value.status == 409
    assert (await core.read_namespaced_config_map("cm", namespace)).data == {"n": "1"}


async def test_watch_resumes_from_resource_version(
    api_client: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(api_client)
    start = await core.create_namespaced_config_map(namespace, configmap("cm", n="0"))
    written = []
    for n in ("1", "2", "3"):
        cm = await core.patch_namespaced_config_map("cm", namespace, {"data": {"n": n}})
        written.append((n, cm.metadata.resource_version))
    await core.create_namespaced_config_map(namespace, configmap("other"))

    seen: list[tuple[str, str, str | None]] = []
    async with asyncio.timeout(DEADLINE), watch.Watch() as w:
        stream = w.stream(
            core.list_namespaced_config_map,
            namespace,
            resource_version=start.metadata.resource_version,
            timeout_seconds=int(DEADLINE),
        )
        async for event in stream:
            obj = event["object"]
            seen.append((event["type"], obj.metadata.name, (obj.data or {}).get("n")))
            if obj.metadata.name == "other":
                break

    assert seen == [
        ("MODIFIED", "cm", "1"),
        ("MODIFIED", "cm", "2"),
        ("MODIFIED", "cm", "3"),
        ("ADDED", "other", None),
    ]


async def test_crd_install_and_custom_object(
    control_plane: ControlPlane, api_client: client.ApiClient, namespace: str, tmp_path: Path
) -> None:
    (tmp_path / "widgets.yaml").write_text(yaml.safe_dump(WIDGET_CRD))
    installed = await control_plane.install_crds(tmp_path)
    assert installed == [f"{PLURAL}.{GROUP}"]

    custom = client.CustomObjectsApi(api_client)
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Widget",
        "metadata": {"name": "w1"},
        "spec": {"size": 3},
    }
    await custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
    got = await custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "w1")
    assert got["spec"] == {"size": 3}
    assert got["metadata"]["resourceVersion"]

    invalid = {**body, "metadata": {"name": "w2"}, "spec": {"size": "big"}}
    with pytest.raises(ApiException) as err:
        await custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, invalid)
    assert err.value.status == 422


async def test_install_crds_from_missing_or_empty_directory(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    assert await control_plane.install_crds(tmp_path / "absent") == []
    assert await control_plane.install_crds(tmp_path) == []


async def test_rbac_is_enforced(
    control_plane: ControlPlane, api_client: client.ApiClient, namespace: str
) -> None:
    nobody = await new_api_client(control_plane.add_user("nobody"))
    try:
        with pytest.raises(ApiException) as err:
            await client.CoreV1Api(nobody).list_namespaced_config_map(namespace)
        assert err.value.status == 403

        rbac = client.RbacAuthorizationV1Api(api_client)
        await rbac.create_namespaced_role(
            namespace,
            client.V1Role(
                metadata=client.V1ObjectMeta(name="read-configmaps"),
                rules=[
                    client.V1PolicyRule(
                        api_groups=[""], resources=["configmaps"], verbs=["get", "list"]
                    )
                ],
            ),
        )
        await rbac.create_namespaced_role_binding(
            namespace,
            client.V1RoleBinding(
                metadata=client.V1ObjectMeta(name="nobody-reads"),
                role_ref=client.V1RoleRef(
                    api_group="rbac.authorization.k8s.io", kind="Role", name="read-configmaps"
                ),
                subjects=[
                    client.RbacV1Subject(
                        api_group="rbac.authorization.k8s.io", kind="User", name="nobody"
                    )
                ],
            ),
        )
        # The authorizer sees the binding through its informer: wait for it, with a deadline.
        async with asyncio.timeout(DEADLINE):
            while True:
                try:
                    await client.CoreV1Api(nobody).list_namespaced_config_map(namespace)
                    break
                except ApiException as e:
                    if e.status != 403:
                        raise
                await asyncio.sleep(0.1)

        with pytest.raises(ApiException) as err:
            await client.CoreV1Api(nobody).create_namespaced_config_map(
                namespace, configmap("nope")
            )
        assert err.value.status == 403
    finally:
        await nobody.close()


async def test_data_survives_apiserver_restart(
    control_plane: ControlPlane, api_client: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(api_client)
    before = await core.create_namespaced_config_map(namespace, configmap("kept", k="v"))
    port = control_plane.apiserver_port
    old_pid = control_plane.apiserver_process.pid if control_plane.apiserver_process else None

    await control_plane.restart_apiserver()

    assert control_plane.apiserver_port == port
    assert control_plane.apiserver_process is not None
    assert control_plane.apiserver_process.pid != old_pid
    fresh = await new_api_client(control_plane.kubeconfig)
    try:
        after = await client.CoreV1Api(fresh).read_namespaced_config_map("kept", namespace)
    finally:
        await fresh.close()
    assert after.data == {"k": "v"}
    assert after.metadata.resource_version == before.metadata.resource_version


async def test_data_survives_etcd_restart(
    control_plane: ControlPlane, api_client: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(api_client)
    before = await core.create_namespaced_config_map(namespace, configmap("kept", k="v"))

    await control_plane.restart_etcd(grace=0)  # a crash: SIGKILL, no graceful shutdown

    after = await core.read_namespaced_config_map("kept", namespace)
    assert after.data == {"k": "v"}
    assert after.metadata.resource_version == before.metadata.resource_version


async def test_compaction_expires_old_resource_versions(
    control_plane: ControlPlane, api_client: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(api_client)
    old = await core.create_namespaced_config_map(namespace, configmap("cm", n="0"))
    for n in ("1", "2"):
        await core.patch_namespaced_config_map("cm", namespace, {"data": {"n": n}})

    revision = await control_plane.compact()
    assert revision > int(old.metadata.resource_version)

    with pytest.raises(ApiException) as err:
        await watch_all(core, namespace, resource_version=old.metadata.resource_version)
    assert err.value.status == 410

    # The present is unaffected: a watch from the current resourceVersion works.
    current = await core.list_namespaced_config_map(namespace)
    async with asyncio.timeout(DEADLINE), watch.Watch() as w:
        stream = w.stream(
            core.list_namespaced_config_map,
            namespace,
            resource_version=current.metadata.resource_version,
            timeout_seconds=int(DEADLINE),
        )
        await core.patch_namespaced_config_map("cm", namespace, {"data": {"n": "3"}})
        async for event in stream:
            assert event["type"] == "MODIFIED"
            assert event["object"].data == {"n": "3"}
            break


async def test_audit_log_records_requests(
    control_plane: ControlPlane, api_client: client.ApiClient, namespace: str
) -> None:
    mark = control_plane.audit_offset()
    await client.CoreV1Api(api_client).create_namespaced_config_map(namespace, configmap("audited"))

    def created() -> list[dict[str, Any]]:
        return [
            e
            for e in control_plane.audit_events(since=mark)
            if e["verb"] == "create"
            and e.get("objectRef", {}).get("resource") == "configmaps"
            and e["objectRef"].get("name") == "audited"
        ]

    # The event is written just after the response: wait for it, with a deadline.
    await eventually(lambda: bool(created()))
    (event,) = created()
    assert event["stage"] == "ResponseComplete"
    assert event["responseStatus"]["code"] == 201
    assert event["user"]["username"] == "capl-testbed-admin"
    assert event["objectRef"]["namespace"] == namespace
