"""Host maintenance against the real kube-apiserver and libvirt's test driver, with the real
LibvirtCluster and LibvirtMachine controllers: two hosts (kvm1 the in-process test driver,
kvm2 libvirtd's shared test driver) on one adopted network.

Two parts of the system do not run here, and the tests stand in for them where they say so:

- the LibvirtMachineMigration controller (written separately): the test patches an
  evacuation migration's status the way it would (Running, then Succeeded or Failed) and
  moves the LibvirtMachine along the path the CRD allows (spec.migrationTarget, then
  spec.hostName = the target with migrationTarget cleared). The machine controller then finds
  no domain on kvm2 and creates one there (DomainRecreated), which stands in for libvirt
  having moved it; status.host follows from that;
- the Cluster API core manager: after capl deleted a Machine (evictionStrategy Recreate) the
  test deletes its LibvirtMachine, as Cluster API's Machine controller would (there is no
  garbage collector either).
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from capl.api import constants as c
from capl.controllers import libvirtcluster
from capl.controllers import machine as libvirtmachine
from capl.controllers.cluster_maintenance import MaintenanceOptions
from capl.controllers.cluster_maintenance_plan import migration_name
from capl.controllers.libvirtcluster import LibvirtClusterOptions
from capl.runtime.conditions import rfc3339
from capl.runtime.objects import Obj, get_path
from capl.runtime.resources import (
    CLUSTER,
    EVENT,
    LIBVIRT_CLUSTER,
    LIBVIRT_MACHINE,
    LIBVIRT_MACHINE_MIGRATION,
    MACHINE,
)
from capl.testing.harness import TEST_DRIVER, ClusterObjects, ControllerHarness
from capl.testing.objects import libvirt_machine_spec
from tests.controllers.test_cluster_support import condition_of, delete_everything

pytestmark = pytest.mark.apiserver

OPTIONS = LibvirtClusterOptions(
    health_interval=None,
    unreachable_retry=1.0,
    terminal_retry=5.0,
    host_timeout=30.0,
    maintenance=MaintenanceOptions(max_parallel=2, retry_backoff=3.0, poll_interval=1.0),
)
MACHINES = libvirtmachine.MachineOptions(
    address_poll=0.2, shutdown_timeout=5, shutdown_poll=0.2, orphan_sweep_interval=0
)


@pytest.fixture
async def bed(
    harness: ControllerHarness, shared_test_driver: str
) -> AsyncIterator[tuple[ControllerHarness, ClusterObjects]]:
    """Both controllers on a cluster of kvm1 and kvm2, network and pool prepared."""
    hosts = [{"name": "kvm1", "uri": TEST_DRIVER}, {"name": "kvm2", "uri": shared_test_driver}]
    cluster = await harness.make_cluster(hosts=hosts, adopt_network=True)
    await harness.start(
        functools.partial(libvirtcluster.setup, options=OPTIONS),
        functools.partial(libvirtmachine.setup, options=MACHINES),
    )
    try:
        yield harness, cluster
    finally:
        for obj in await migrations(harness):
            await harness.delete(LIBVIRT_MACHINE_MIGRATION, obj["metadata"]["name"])
        await delete_everything(harness)


# --- helpers ---------------------------------------------------------------------------------


async def migrations(h: ControllerHarness) -> list[Obj]:
    listing = await h.api.resource(LIBVIRT_MACHINE_MIGRATION).list(namespace=h.namespace)
    return list(listing.items)


async def events(h: ControllerHarness, about: str, reason: str) -> list[tuple[str, int]]:
    """(message, count) of the Events with `reason` about object `about`."""
    listing = await h.api.resource(EVENT).list(namespace=h.namespace)
    return [
        (str(e.get("message")), int(e.get("count") or 1))
        for e in listing.items
        if (e.get("involvedObject") or {}).get("name") == about and e.get("reason") == reason
    ]


async def wait_events(
    h: ControllerHarness, about: str, reason: str, *, within: float = 30.0
) -> list[tuple[str, int]]:
    """The Events with `reason` once there is one (the recorder writes in the background)."""
    deadline = time.monotonic() + within
    while not (found := await events(h, about, reason)):
        assert time.monotonic() < deadline, f"no {reason} event about {about}"
        await asyncio.sleep(0.05)
    return found


def host_entry(obj: Obj, name: str) -> dict[str, Any]:
    for entry in get_path(obj, "status", "hosts") or ():
        if entry.get("name") == name:
            return dict(entry)
    return {}


def maintenance_of(obj: Obj, name: str = "kvm1") -> dict[str, Any] | None:
    value = host_entry(obj, name).get("maintenance")
    return dict(value) if value is not None else None


def domain_of(obj: Obj, name: str) -> dict[str, Any]:
    for fd in get_path(obj, "status", "failureDomains") or ():
        if fd.get("name") == name:
            return dict(fd)
    return {}


async def set_maintenance(h: ControllerHarness, cluster: str, maintenance: Any) -> None:
    """spec.hosts[kvm1].maintenance = `maintenance` (None: removed)."""
    obj = await h.get(LIBVIRT_CLUSTER, cluster)
    assert obj is not None
    hosts = []
    for entry in obj["spec"]["hosts"]:
        entry = dict(entry)
        if entry["name"] == "kvm1":
            entry.pop("maintenance", None)
            if maintenance is not None:
                entry["maintenance"] = maintenance
        hosts.append(entry)
    await h.patch(LIBVIRT_CLUSTER, cluster, {"spec": {"hosts": hosts}})


async def wait_cluster(
    h: ControllerHarness, cluster: str, predicate: Callable[[Obj], bool], what: str
) -> Obj:
    return await h.wait_for(LIBVIRT_CLUSTER, cluster, predicate, within=60, what=what)


async def machine_on(
    h: ControllerHarness, cluster: ClusterObjects, name: str, strategy: str, host: str = "kvm1"
) -> Obj:
    await h.make_machine(
        cluster, name, spec=libvirt_machine_spec(hostName=host, evictionStrategy=strategy)
    )
    obj = await h.wait_ready(name)
    assert obj["status"]["host"] == host
    return obj


async def act_as_migration_controller(
    h: ControllerHarness, migration: str, machine: str, *, succeed: bool = True
) -> None:
    """What the migration controller would write (see the module docstring)."""
    now = rfc3339(h.manager.clock.wall())
    await h.patch_status(
        LIBVIRT_MACHINE_MIGRATION,
        migration,
        {"status": {"phase": "Running", "sourceHost": "kvm1", "targetHost": "kvm2"}},
    )
    if succeed:
        await h.patch(LIBVIRT_MACHINE, machine, {"spec": {"migrationTarget": "kvm2"}})
        await h.patch(
            LIBVIRT_MACHINE, machine, {"spec": {"hostName": "kvm2", "migrationTarget": None}}
        )
    status = "True" if succeed else "False"
    reason = c.Reason.MIGRATION_SUCCEEDED if succeed else c.Reason.MIGRATION_FAILED
    message = "" if succeed else "destination lacks CPU feature x"
    await h.patch_status(
        LIBVIRT_MACHINE_MIGRATION,
        migration,
        {
            "status": {
                "phase": "Succeeded" if succeed else "Failed",
                "completionTime": now,
                "message": message or None,
                "conditions": [
                    {
                        "type": c.ConditionType.SUCCEEDED,
                        "status": status,
                        "reason": reason,
                        "message": message,
                        "lastTransitionTime": now,
                    }
                ],
            }
        },
    )


# --- tests -----------------------------------------------------------------------------------


async def test_evacuation_by_strategy_cordon_and_the_end_of_maintenance(
    bed: tuple[ControllerHarness, ClusterObjects],
) -> None:
    h, cluster = bed
    name = cluster.name
    live = await machine_on(h, cluster, "live", "LiveMigrate")
    await machine_on(h, cluster, "recreate", "Recreate")
    await machine_on(h, cluster, "stay", "None")
    before = await wait_cluster(
        h, name, lambda o: domain_of(o, "kvm1").get("controlPlane") is True, "failure domains"
    )
    assert maintenance_of(before) is None

    await set_maintenance(h, name, {"reason": "kernel update"})
    # evacuating: one migration for the LiveMigrate machine, the Recreate machine's Machine
    # deleted, the None machine blocks
    expected = migration_name("live", live["metadata"]["uid"], "kvm1")
    obj = await wait_cluster(
        h,
        name,
        lambda o: (maintenance_of(o) or {}).get("phase") == "Blocked",
        "kvm1 Blocked",
    )
    assert maintenance_of(obj) == {
        "phase": "Blocked",
        "machines": 3,
        "message": "stay: evictionStrategy None",
    }
    assert domain_of(obj, "kvm1")["controlPlane"] is False  # cordoned
    assert domain_of(obj, "kvm2")["controlPlane"] is True
    made = await migrations(h)
    assert [m["metadata"]["name"] for m in made] == [expected]
    migration = made[0]
    assert migration["spec"]["machineName"] == "live"
    assert "targetHost" not in migration["spec"]  # the migration controller chooses
    assert migration["metadata"]["labels"][c.EVACUATION_HOST_LABEL] == "kvm1"
    assert [(r["kind"], r["name"]) for r in migration["metadata"]["ownerReferences"]] == [
        ("LibvirtCluster", name)
    ]
    await h.wait_gone(MACHINE, "recreate")
    assert await h.get(MACHINE, "live") is not None
    assert await h.get(MACHINE, "stay") is not None
    assert await wait_events(h, name, c.Reason.EVACUATING) == [
        ("host kvm1 is in maintenance (kernel update): evacuating 3 machine(s) of the cluster", 1)
    ]
    assert await wait_events(h, name, c.Reason.EVICTION_BLOCKED) == [
        ("host kvm1: stay: evictionStrategy None", 1)
    ]
    assert await wait_events(h, name, "MachineDeleted")

    # cordon: a new machine pinned to kvm1 waits and says why; an unpinned one goes to kvm2
    await h.make_machine(cluster, "pinned", spec=libvirt_machine_spec(hostName="kvm1"))
    pinned = await h.wait_for(
        LIBVIRT_MACHINE,
        "pinned",
        lambda o: (
            condition_of(o, c.ConditionType.DOMAIN_PROVISIONED).get("reason")
            == c.Reason.HOST_NOT_FOUND
        ),
        what="pinned waits",
    )
    assert "host kvm1 is in maintenance (kernel update)" in str(
        condition_of(pinned, c.ConditionType.DOMAIN_PROVISIONED).get("message")
    )
    assert "domainUUID" not in pinned["spec"]
    free = await h.make_machine(cluster, "free", spec=libvirt_machine_spec())
    assert (await h.wait_ready(free.name))["spec"]["hostName"] == "kvm2"

    # the migration controller moves "live"; Cluster API removes "recreate"
    await act_as_migration_controller(h, expected, "live")
    await h.wait_for(
        LIBVIRT_MACHINE, "live", lambda o: get_path(o, "status", "host") == "kvm2", what="moved"
    )
    await h.delete(LIBVIRT_MACHINE, "recreate")
    await h.wait_gone(LIBVIRT_MACHINE, "recreate", within=60)
    obj = await wait_cluster(
        h, name, lambda o: (maintenance_of(o) or {}).get("machines") == 1, "one machine left"
    )
    assert maintenance_of(obj) == {
        "phase": "Blocked",
        "machines": 1,
        "message": "stay: evictionStrategy None",
    }
    assert [m["metadata"]["name"] for m in await migrations(h)] == [expected]  # kept

    # each Event once so far: the Blocked one did not repeat while other machines left
    assert await events(h, name, c.Reason.EVICTION_BLOCKED) == [
        ("host kvm1: stay: evictionStrategy None", 1)
    ]
    assert await events(h, name, c.Reason.EVACUATED) == []

    # the user lets "stay" go after all: it is recreated and the host is evacuated
    await h.patch(LIBVIRT_MACHINE, "stay", {"spec": {"evictionStrategy": "Recreate"}})
    await h.wait_gone(MACHINE, "stay")
    await h.delete(LIBVIRT_MACHINE, "stay")  # as Cluster API would
    obj = await wait_cluster(
        h, name, lambda o: (maintenance_of(o) or {}).get("phase") == "Evacuated", "evacuated"
    )
    assert maintenance_of(obj) == {"phase": "Evacuated", "machines": 0}
    assert await wait_events(h, name, c.Reason.EVACUATED) == [
        ("host kvm1 is evacuated: no machine of the cluster is left on it", 1)
    ]
    assert domain_of(obj, "kvm1")["controlPlane"] is False  # cordoned until the end

    # the end: status and failure domain as before, the evacuation migration deleted, the
    # pinned machine placed on kvm1 at last
    await set_maintenance(h, name, None)
    obj = await wait_cluster(
        h,
        name,
        lambda o: maintenance_of(o) is None and domain_of(o, "kvm1").get("controlPlane") is True,
        "maintenance over",
    )
    assert "maintenance" not in host_entry(obj, "kvm1")
    assert (await h.wait_ready("pinned"))["spec"]["hostName"] == "kvm1"
    await h.wait_gone(LIBVIRT_MACHINE_MIGRATION, expected)  # garbage-collected
    assert await migrations(h) == []
    assert [n for _, n in await events(h, name, c.Reason.EVACUATING)] == [1]


async def test_failed_live_migration_blocks_retries_and_if_possible_recreates(
    bed: tuple[ControllerHarness, ClusterObjects],
) -> None:
    h, cluster = bed
    name = cluster.name
    strict = await machine_on(h, cluster, "strict", "LiveMigrate")
    lenient = await machine_on(h, cluster, "lenient", "LiveMigrateIfPossible")
    # nothing happens while the Cluster is paused
    await h.patch(CLUSTER, name, {"spec": {"paused": True}})
    await wait_cluster(
        h,
        name,
        lambda o: condition_of(o, c.ConditionType.PAUSED).get("status") == "True",
        "paused",
    )
    await set_maintenance(h, name, {})
    await h.reconciled_after(
        libvirtcluster.CONTROLLER_NAME,
        h.patch(LIBVIRT_CLUSTER, name, {"metadata": {"annotations": {"poke": "1"}}}),
    )
    assert await migrations(h) == []
    assert maintenance_of(await h.get(LIBVIRT_CLUSTER, name) or {}) is None
    await h.patch(CLUSTER, name, {"spec": {"paused": False}})

    strict_name = migration_name("strict", strict["metadata"]["uid"], "kvm1")
    lenient_name = migration_name("lenient", lenient["metadata"]["uid"], "kvm1")

    async def both_made() -> list[Obj]:
        await wait_cluster(
            h, name, lambda o: (maintenance_of(o) or {}).get("phase") == "Evacuating", "started"
        )
        return await migrations(h)

    made = {m["metadata"]["name"]: m for m in await both_made()}
    assert set(made) == {strict_name, lenient_name}
    first_uid = made[strict_name]["metadata"]["uid"]

    # both fail: the LiveMigrateIfPossible machine is recreated, the LiveMigrate one blocks
    await act_as_migration_controller(h, lenient_name, "lenient", succeed=False)
    await act_as_migration_controller(h, strict_name, "strict", succeed=False)
    await h.wait_gone(MACHINE, "lenient")
    obj = await wait_cluster(
        h,
        name,
        lambda o: (maintenance_of(o) or {}).get("phase") == "Blocked",
        "strict blocked",
    )
    message = str((maintenance_of(obj) or {}).get("message"))
    assert message.startswith(
        f"strict: live migration {strict_name} failed "
        "(MigrationFailed: destination lacks CPU feature x); retried after "
    )
    warnings = await wait_events(h, name, c.Reason.EVICTION_BLOCKED)
    assert any(m.startswith("host kvm1: strict: live migration") for m, _ in warnings)

    # after the backoff (3 s here) the failed migration is replaced by a new one
    fresh = await h.wait_for(
        LIBVIRT_MACHINE_MIGRATION,
        strict_name,
        lambda o: o["metadata"]["uid"] != first_uid,
        within=30,
        what="a new migration after the backoff",
    )
    assert get_path(fresh, "status", "phase") is None  # not looked at (no controller)
    obj = await wait_cluster(
        h, name, lambda o: (maintenance_of(o) or {}).get("phase") == "Evacuating", "retrying"
    )

    # Cluster API removes "lenient"; ending the maintenance deletes the unfinished migration
    # (which aborts it) and the failed one
    await h.delete(LIBVIRT_MACHINE, "lenient")
    await h.wait_gone(LIBVIRT_MACHINE, "lenient", within=60)
    await set_maintenance(h, name, None)
    await wait_cluster(h, name, lambda o: maintenance_of(o) is None, "maintenance over")
    for gone in (strict_name, lenient_name):
        await h.wait_gone(LIBVIRT_MACHINE_MIGRATION, gone)
    assert await h.get(MACHINE, "strict") is not None
