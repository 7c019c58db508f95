"""The maintenance service (`cluster_maintenance.Maintenance`) on a fake API and a cache
filled by hand, with a fake clock: what it writes, the races it tolerates (409 on create,
UID preconditions), a write that fails (e.g. a role without the verb), Events once, and the
requeue at the end of a retry backoff."""

from __future__ import annotations

from typing import Any, cast

from capl.api import constants as c
from capl.api.cluster import LibvirtCluster
from capl.controllers.cluster_maintenance import Maintenance, MaintenanceOptions
from capl.controllers.cluster_maintenance_plan import migration_name
from capl.controllers.cluster_watches import watches
from capl.controllers.common import Deps
from capl.runtime.clock import FakeClock
from capl.runtime.conditions import rfc3339
from capl.runtime.errors import Forbidden
from capl.runtime.events import NullRecorder
from capl.runtime.informer import Cache
from capl.runtime.objects import Obj, ObjectKey, copy_obj
from capl.runtime.resources import LIBVIRT_MACHINE, LIBVIRT_MACHINE_MIGRATION, MACHINE, Resource
from tests.fixtures.runtime import FakeApi, FakeClient

NS = "ns"
OPTIONS = MaintenanceOptions(max_parallel=2, retry_backoff=300.0, poll_interval=30.0)


class Bed:
    def __init__(self) -> None:
        self.api = FakeApi()
        self.clock = FakeClock()
        self.cache = Cache(FakeClient(self.api), clock=self.clock)
        watches(self.cache)  # the host index
        self.recorder = NullRecorder()
        deps = Deps(
            cache=self.cache,
            client=FakeClient(self.api),
            recorder=self.recorder,
            hosts=cast(Any, None),
            workload=cast(Any, None),
            clock=self.clock,
        )
        self.service = Maintenance(deps, OPTIONS)
        self.lc = LibvirtCluster.model_validate(
            {
                "metadata": {"name": "lc1", "namespace": NS, "uid": "lc-uid"},
                "spec": {
                    "hosts": [
                        {"name": "kvm1", "uri": "test:///default", "maintenance": {"reason": "r"}},
                        {"name": "kvm2", "uri": "test:///default"},
                    ],
                    "network": {"name": "net"},
                },
            }
        )
        self.status: Obj = {"status": {"hosts": [{"name": "kvm1"}, {"name": "kvm2"}]}}

    def put(self, resource: Resource, obj: Obj) -> Obj:
        made = self.api.put(resource, obj)
        self.cache.store(resource).upsert(made)
        return made

    def sync(self, resource: Resource) -> None:
        """The cache catches up with the fake API for one resource."""
        store = self.cache.store(resource)
        for key in store.list_keys():
            if key not in self.api.objects.get(resource, {}):
                store.delete(key)
        for obj in self.api.objects.get(resource, {}).values():
            store.upsert(copy_obj(obj))

    def machine(self, name: str, strategy: str, host: str = "kvm1") -> Obj:
        owner = self.put(MACHINE, {"metadata": {"name": name, "namespace": NS}})
        return self.put(
            LIBVIRT_MACHINE,
            {
                "metadata": {
                    "name": name,
                    "namespace": NS,
                    "labels": {c.CLUSTER_NAME_LABEL: "c1"},
                    "ownerReferences": [
                        {
                            "apiVersion": c.CAPI_API_VERSION,
                            "kind": "Machine",
                            "name": name,
                            "uid": owner["metadata"]["uid"],
                        }
                    ],
                },
                "spec": {
                    "hostName": host,
                    "domainUUID": "0f8fad5b-d9cb-469f-a165-70867728950e",
                    "evictionStrategy": strategy,
                },
                "status": {"host": host},
            },
        )

    async def reconcile(self) -> tuple[Obj, Any]:
        original = copy_obj(self.status)
        desired = copy_obj(self.status)
        result = await self.service.reconcile(self.lc, desired, original, cluster="c1")
        self.status = desired
        return desired, result

    def maintenance(self, host: str = "kvm1") -> Any:
        entry = next(h for h in self.status["status"]["hosts"] if h["name"] == host)
        return entry.get("maintenance")

    def events(self, reason: str) -> list[str]:
        return [m for _, _, r, m in self.recorder.events if r == reason]


async def test_creates_and_deletes_and_tolerates_races() -> None:
    bed = Bed()
    live = bed.machine("live", "LiveMigrate")
    bed.machine("gone", "Recreate")
    name = migration_name("live", live["metadata"]["uid"], "kvm1")
    # a migration made before a crash: in the API, not yet in the cache (409 on create)
    bed.api.put(LIBVIRT_MACHINE_MIGRATION, {"metadata": {"name": name, "namespace": NS}})
    _, result = await bed.reconcile()
    assert not result.failed
    assert result.requeue_after == 30.0
    assert ObjectKey(NS, "gone") not in bed.api.objects[MACHINE]  # Recreate
    assert bed.events("MachineDeleted")
    assert bed.maintenance() == {
        "phase": "Evacuating",
        "machines": 2,
        "message": f"gone: evictionStrategy Recreate: deleting Machine gone; "
        f"live: live migration {name} created",
    }
    # a pass whose cache is behind deletes again: NotFound, no second Event
    _, result = await bed.reconcile()
    assert not result.failed
    assert len(bed.events("MachineDeleted")) == 1
    # once the cache shows it: nothing is deleted again (the Machine is gone: "being deleted")
    bed.sync(MACHINE)
    bed.sync(LIBVIRT_MACHINE_MIGRATION)
    await bed.reconcile()
    assert len(bed.events("MachineDeleted")) == 1
    assert "gone: being deleted" in bed.maintenance()["message"]


async def test_a_write_refused_is_reported_and_retried() -> None:
    bed = Bed()
    bed.lc.spec.hosts[0].maintenance = None  # maintenance over: its migration must go
    stray = bed.put(
        LIBVIRT_MACHINE_MIGRATION,
        {
            "metadata": {
                "name": "evacuate-x-1",
                "namespace": NS,
                "labels": {c.EVACUATION_HOST_LABEL: "kvm1"},
                "ownerReferences": [
                    {
                        "apiVersion": c.API_VERSION,
                        "kind": "LibvirtCluster",
                        "name": "lc1",
                        "uid": "lc-uid",
                    }
                ],
            },
            "spec": {"machineName": "x"},
        },
    )
    bed.status["status"]["hosts"][0]["maintenance"] = {"phase": "Evacuating", "machines": 1}
    bed.api.fail("delete", Forbidden(403, "Forbidden", "cannot delete"))
    _, result = await bed.reconcile()
    assert result.failed  # the controller retries with backoff
    assert bed.maintenance() is None  # the status follows the spec regardless
    key = ObjectKey(NS, stray["metadata"]["name"])
    assert key in bed.api.objects[LIBVIRT_MACHINE_MIGRATION]
    _, result = await bed.reconcile()
    assert not result.failed
    assert key not in bed.api.objects[LIBVIRT_MACHINE_MIGRATION]


async def test_events_once_and_the_retry_backoff_on_a_fake_clock() -> None:
    bed = Bed()
    strict = bed.machine("strict", "LiveMigrate")
    bed.machine("stay", "None")
    await bed.reconcile()
    assert len(bed.events(c.Reason.EVACUATING)) == 1
    assert bed.events(c.Reason.EVICTION_BLOCKED) == ["host kvm1: stay: evictionStrategy None"]
    # the migration fails
    bed.sync(LIBVIRT_MACHINE_MIGRATION)
    name = migration_name("strict", strict["metadata"]["uid"], "kvm1")
    failed_at = bed.clock.wall()
    bed.api._update(
        LIBVIRT_MACHINE_MIGRATION,
        ObjectKey(NS, name),
        {"status": {"phase": "Failed", "completionTime": rfc3339(failed_at), "message": "m"}},
        None,
        True,
    )
    bed.sync(LIBVIRT_MACHINE_MIGRATION)
    bed.clock.advance(100)
    _, result = await bed.reconcile()
    assert result.requeue_after == 30.0  # the poll comes before the retry (200 s left)
    assert bed.maintenance()["phase"] == "Blocked"
    assert len(bed.events(c.Reason.EVICTION_BLOCKED)) == 2  # a new machine blocks
    await bed.reconcile()
    assert len(bed.events(c.Reason.EVACUATING)) == 1
    assert len(bed.events(c.Reason.EVICTION_BLOCKED)) == 2  # unchanged: no new event
    # the backoff ends: the failed migration is deleted, then made anew
    bed.clock.advance(200)
    await bed.reconcile()
    assert ObjectKey(NS, name) not in bed.api.objects[LIBVIRT_MACHINE_MIGRATION]
    bed.sync(LIBVIRT_MACHINE_MIGRATION)
    await bed.reconcile()
    assert ObjectKey(NS, name) in bed.api.objects[LIBVIRT_MACHINE_MIGRATION]
    # everything leaves: Evacuated, once
    for resource in (LIBVIRT_MACHINE, MACHINE):
        bed.api.objects[resource].clear()
        bed.sync(resource)
    _, result = await bed.reconcile()
    assert bed.maintenance() == {"phase": "Evacuated", "machines": 0}
    assert result.requeue_after is None
    await bed.reconcile()
    assert len(bed.events(c.Reason.EVACUATED)) == 1


async def test_nothing_to_do_costs_nothing() -> None:
    bed = Bed()
    bed.lc.spec.hosts[0].maintenance = None
    bed.status["status"]["hosts"][0]["maintenance"] = {"phase": "Evacuated", "machines": 0}
    _, result = await bed.reconcile()
    assert bed.maintenance() is None
    assert result.requeue_after is None
    assert bed.api.stats.object_counts() == {}
