"""The generated CRDs on a real kube-apiserver: immutable fields stay immutable (CEL transition
rules, refused with HTTP 422 naming the field), mutable ones stay mutable, a machine's host
changes only along a migration. Helpers: tests/kube/crd_objects.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from tests.kube.crd_objects import (
    UUID,
    UUID2,
    at,
    cluster,
    create,
    full_migration,
    machine,
    merge_patch,
    message_of,
    objects,
)

__all__ = ["objects"]  # the fixture, registered by this import

pytestmark = pytest.mark.apiserver


# --- immutability ----------------------------------------------------------------------------


IMMUTABLE: list[tuple[str, str, dict[str, Any], dict[str, Any], str]] = [
    # (case, kind, patch applied first (allowed), patch that must be refused, field)
    (
        "image",
        "LibvirtMachine",
        {},
        {"spec": {"image": {"url": "https://images.example.invalid/other.qcow2"}}},
        "spec.image",
    ),
    (
        "host-name",
        "LibvirtMachine",
        {"spec": {"hostName": "h0"}},
        {"spec": {"hostName": "h1"}},
        "spec.hostName",
    ),
    (
        "host-name-removed",
        "LibvirtMachine",
        {"spec": {"hostName": "h0"}},
        {"spec": {"hostName": None}},
        "spec.hostName",
    ),
    (
        "provider-id",
        "LibvirtMachine",
        {"spec": {"providerID": f"libvirt:///{UUID}", "domainUUID": UUID}},
        {"spec": {"providerID": f"libvirt:///{UUID2}", "domainUUID": UUID2}},
        "spec.providerID",
    ),
    (
        "domain-uuid-removed",
        "LibvirtMachine",
        {"spec": {"domainUUID": UUID}},
        {"spec": {"domainUUID": None}},
        "spec.domainUUID",
    ),
    (
        "cidr",
        "LibvirtCluster",
        {},
        {"spec": {"network": {"cidr": "192.168.151.0/24"}}},
        "spec.network.cidr",
    ),
    (
        "network-mode",
        "LibvirtCluster",
        {},
        {"spec": {"network": {"mode": "isolated"}}},
        "spec.network.mode",
    ),
    (
        "network-name",
        "LibvirtCluster",
        {"spec": {"network": {"name": "capl-x"}}},
        {"spec": {"network": {"name": "capl-y"}}},
        "spec.network.name",
    ),
    (
        "endpoint",
        "LibvirtCluster",
        {"spec": {"controlPlaneEndpoint": {"host": "api.x.example", "port": 6443}}},
        {"spec": {"controlPlaneEndpoint": {"host": "api.y.example"}}},
        "spec.controlPlaneEndpoint.host",
    ),
    (
        "pool-path",
        "LibvirtCluster",
        {"spec": {"storagePool": {"name": "p", "path": "/srv/p"}}},
        {"spec": {"storagePool": {"path": "/srv/q"}}},
        "spec.storagePool.path",
    ),
]


@pytest.mark.parametrize(
    ("case", "kind", "first", "second", "field"), IMMUTABLE, ids=[c[0] for c in IMMUTABLE]
)
async def test_immutable_fields(
    objects: client.CustomObjectsApi,
    namespace: str,
    case: str,
    kind: str,
    first: dict[str, Any],
    second: dict[str, Any],
    field: str,
) -> None:
    await create(objects, namespace, machine("imm") if kind == "LibvirtMachine" else cluster("imm"))
    if first:
        # Setting a write-once field the first time is allowed.
        await merge_patch(objects, namespace, kind, "imm", first)
    with pytest.raises(ApiException) as info:
        await merge_patch(objects, namespace, kind, "imm", second)
    assert info.value.status == 422
    message = message_of(info.value)
    assert field in message, f"{case}: {message}"
    assert "immutable" in message, f"{case}: {message}"


async def test_mutable_fields_stay_mutable(
    objects: client.CustomObjectsApi, namespace: str
) -> None:
    await create(objects, namespace, machine("mut"))
    patched = await merge_patch(
        objects,
        namespace,
        "LibvirtMachine",
        "mut",
        {
            "spec": {
                "cpus": 8,
                "hostName": "h0",
                "providerID": f"libvirt:///{UUID}",
                "domainUUID": UUID,
            }
        },
    )
    assert patched["spec"]["cpus"] == 8
    # Re-sending the same write-once values is not a change.
    await merge_patch(objects, namespace, "LibvirtMachine", "mut", {"spec": {"hostName": "h0"}})
    # bridge mode: hosts can be added (a created nat/isolated network allows one host)
    await create(
        objects, namespace, at(cluster("mut"), "spec.network", {"mode": "bridge", "bridge": "br0"})
    )
    await merge_patch(
        objects, namespace, "LibvirtCluster", "mut",
        {"spec": {"controlPlaneEndpoint": {"host": "api.mut.example", "port": 6443}}},
    )  # fmt: skip
    hosts = [
        {"name": "h0", "uri": "qemu:///system"},
        {"name": "h1", "uri": "qemu+ssh://kvm1/system"},
    ]
    await merge_patch(objects, namespace, "LibvirtCluster", "mut", {"spec": {"hosts": hosts}})


async def test_host_name_changes_only_along_a_migration(
    objects: client.CustomObjectsApi, namespace: str
) -> None:
    """spec.hostName is write-once except for the one step a migration takes: to the host
    recorded in migrationTarget, clearing it in the same write."""
    await create(objects, namespace, machine("mig"))
    await merge_patch(objects, namespace, "LibvirtMachine", "mig", {"spec": {"hostName": "h0"}})
    refused = [
        ({"hostName": "h1"}, "spec.hostName"),  # no migration recorded
        ({"migrationTarget": "h0"}, "spec.migrationTarget"),  # the host it is on
    ]
    for patch, field in refused:
        with pytest.raises(ApiException) as info:
            await merge_patch(objects, namespace, "LibvirtMachine", "mig", {"spec": patch})
        assert info.value.status == 422, patch
        assert field in message_of(info.value), patch
    await merge_patch(
        objects, namespace, "LibvirtMachine", "mig", {"spec": {"migrationTarget": "h1"}}
    )
    refused = [
        ({"hostName": "h2", "migrationTarget": None}, "spec.hostName"),  # not the target
        ({"hostName": "h1"}, "spec.hostName"),  # target not cleared in the same write
        ({"migrationTarget": "h2"}, "spec.migrationTarget"),  # retargeted mid-flight
    ]
    for patch, field in refused:
        with pytest.raises(ApiException) as info:
            await merge_patch(objects, namespace, "LibvirtMachine", "mig", {"spec": patch})
        assert info.value.status == 422, patch
        assert field in message_of(info.value), patch
    moved = await merge_patch(
        objects,
        namespace,
        "LibvirtMachine",
        "mig",
        {"spec": {"hostName": "h1", "migrationTarget": None}},
    )
    assert moved["spec"]["hostName"] == "h1"
    assert "migrationTarget" not in moved["spec"]
    # an aborted migration clears the target and leaves hostName alone
    await merge_patch(
        objects, namespace, "LibvirtMachine", "mig", {"spec": {"migrationTarget": "h0"}}
    )
    back = await merge_patch(
        objects, namespace, "LibvirtMachine", "mig", {"spec": {"migrationTarget": None}}
    )
    assert back["spec"]["hostName"] == "h1"


async def test_migration_spec_is_immutable(
    objects: client.CustomObjectsApi, namespace: str
) -> None:
    await create(objects, namespace, full_migration())
    with pytest.raises(ApiException) as info:
        await merge_patch(
            objects, namespace, "LibvirtMachineMigration", "full", {"spec": {"targetHost": "h2"}}
        )
    assert info.value.status == 422
    assert "spec is immutable" in message_of(info.value)
