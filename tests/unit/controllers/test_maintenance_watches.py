"""What wakes the LibvirtCluster controller for host maintenance: evacuation migrations,
machines changing host, migration target or eviction strategy; the host index it reads."""

from __future__ import annotations

from typing import Any

import pytest

from capl.api import constants as c
from capl.controllers.cluster_watches import (
    MIGRATION_CHANGES,
    ControlPlaneMachineChanges,
    watches,
)
from capl.controllers.machine.indexes import INDEX_HOST, host_index_value
from capl.runtime.clock import FakeClock
from capl.runtime.handlers import HasLabel
from capl.runtime.informer import Cache
from capl.runtime.objects import Obj, ObjectKey
from capl.runtime.resources import LIBVIRT_CLUSTER, LIBVIRT_MACHINE, LIBVIRT_MACHINE_MIGRATION
from tests.fixtures.runtime import FakeClient

NS = "ns"


def worker(host: str | None = "kvm1", **spec: Any) -> Obj:
    return {
        "metadata": {
            "name": "w",
            "namespace": NS,
            "labels": {c.CLUSTER_NAME_LABEL: "c1"},
            "resourceVersion": "1",
        },
        "spec": {"hostName": host, **spec},
        "status": {"host": host},
    }


def migration(phase: str | None = None, *, deleting: bool = False, label: bool = True) -> Obj:
    metadata: dict[str, Any] = {
        "name": "evacuate-w-1234abcd",
        "namespace": NS,
        "labels": {c.EVACUATION_HOST_LABEL: "kvm1"} if label else {},
        "ownerReferences": [
            {"apiVersion": c.API_VERSION, "kind": "LibvirtCluster", "name": "lc1", "uid": "u"},
            {"apiVersion": "v1", "kind": "ConfigMap", "name": "other", "uid": "x"},
        ],
    }
    if deleting:
        metadata["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": metadata, "spec": {"machineName": "w"}, "status": {"phase": phase}}


def libvirt_cluster(*, maintenance: str | None) -> Obj:
    host: dict[str, Any] = {"name": "kvm1", "uri": "test:///default"}
    if maintenance:
        host["maintenance"] = {"reason": maintenance}
    return {
        "metadata": {
            "name": "lc1",
            "namespace": NS,
            "ownerReferences": [
                {"apiVersion": c.CAPI_API_VERSION, "kind": "Cluster", "name": "c1", "uid": "u"}
            ],
        },
        "spec": {"hosts": [host]},
    }


def test_a_worker_changing_host_target_or_strategy_wakes_the_cluster() -> None:
    cache = Cache(FakeClient(), clock=FakeClock())
    cache.store(LIBVIRT_CLUSTER).upsert(libvirt_cluster(maintenance="kernel update"))
    predicate = ControlPlaneMachineChanges(cache)
    old = worker()
    assert not predicate.update(old, old)  # resync of a worker: nothing
    assert not predicate.update(old, {**old, "status": {"host": "kvm1", "addresses": []}})
    assert predicate.update(old, worker(migrationTarget="kvm2"))
    assert predicate.update(old, worker("kvm2"))
    assert predicate.update(old, worker(evictionStrategy="Recreate"))
    assert not predicate.create(old)
    assert predicate.delete(old)


def test_placement_changes_wake_the_cluster_only_while_a_host_is_in_maintenance() -> None:
    """A new machine gets its hostName, then status.host: without maintenance these must not
    wake the cluster reconcile (it reads the network's whole definition) for nothing."""
    cache = Cache(FakeClient(), clock=FakeClock())
    predicate = ControlPlaneMachineChanges(cache)
    new, placed = worker(None), worker()
    assert not predicate.update(new, placed)  # no LibvirtCluster in the cache
    cache.store(LIBVIRT_CLUSTER).upsert(libvirt_cluster(maintenance=None))
    assert not predicate.update(new, placed)
    assert not predicate.update(placed, worker("kvm2"))
    cache.store(LIBVIRT_CLUSTER).upsert(libvirt_cluster(maintenance="disk swap"))
    assert predicate.update(new, placed)
    assert predicate.update(placed, worker("kvm2"))
    ended = libvirt_cluster(maintenance=None)
    ended["status"] = {"hosts": [{"name": "kvm1", "maintenance": {"phase": "Evacuated"}}]}
    cache.store(LIBVIRT_CLUSTER).upsert(ended)  # status still reported: still woken
    assert predicate.update(placed, worker("kvm2"))


def test_without_maintenance_a_placement_change_reads_no_cached_object(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The common case is answered from an index: no Cluster or LibvirtCluster is decoded
    for each machine event; with maintenance elsewhere, only that cluster's machines wake."""
    cache = Cache(FakeClient(), clock=FakeClock())
    cache.store(LIBVIRT_CLUSTER).upsert(libvirt_cluster(maintenance=None))
    predicate = ControlPlaneMachineChanges(cache)
    new, placed = worker(None), worker()

    def no_read(*args: object) -> None:
        raise AssertionError("a cached object was read")

    with monkeypatch.context() as patch:
        patch.setattr(cache, "get", no_read)
        assert not predicate.update(new, placed)
    other = libvirt_cluster(maintenance="disk swap")
    other["metadata"]["name"] = "lc2"
    other["metadata"]["ownerReferences"][0]["name"] = "c2"
    cache.store(LIBVIRT_CLUSTER).upsert(other)
    assert not predicate.update(new, placed)  # c1's machine: c2's maintenance is not its own
    moved = worker()
    moved["metadata"]["labels"][c.CLUSTER_NAME_LABEL] = "c2"
    assert predicate.update({**moved, "spec": {"hostName": None}}, moved)


def test_evacuation_migrations_wake_their_libvirt_cluster() -> None:
    cache = Cache(FakeClient(), clock=FakeClock())
    watch = next(w for w in watches(cache) if w.resource == LIBVIRT_MACHINE_MIGRATION)
    assert list(watch.mapper(migration())) == [ObjectKey(NS, "lc1")]
    label, changes = watch.predicates
    assert isinstance(label, HasLabel)
    assert label.key == c.EVACUATION_HOST_LABEL
    assert not label.create(migration(label=False))
    assert changes is MIGRATION_CHANGES
    running = migration("Running")
    assert MIGRATION_CHANGES.update(running, running)  # resync
    assert not MIGRATION_CHANGES.update(running, migration("Running"))  # e.g. progress only
    assert MIGRATION_CHANGES.update(running, migration("Succeeded"))
    assert MIGRATION_CHANGES.update(running, migration("Running", deleting=True))
    assert MIGRATION_CHANGES.create(running)
    assert MIGRATION_CHANGES.delete(running)


def test_watches_register_the_machine_host_index() -> None:
    cache = Cache(FakeClient(), clock=FakeClock())
    watches(cache)
    cache.store(LIBVIRT_MACHINE).upsert(worker())
    value = host_index_value(NS, "c1", "kvm1")
    assert cache.store(LIBVIRT_MACHINE).index_keys(INDEX_HOST, value) == [ObjectKey(NS, "w")]
