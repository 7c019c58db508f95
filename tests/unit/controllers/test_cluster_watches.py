"""What wakes the LibvirtCluster controller: machine predicates, mappers, host events."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from capl.api import constants as c
from capl.controllers.cluster_watches import (
    CREDENTIALS_INDEX,
    ControlPlaneMachineChanges,
    control_plane_addresses,
    host_event_trigger,
    libvirt_clusters_of,
    watches,
)
from capl.ports.virt import (
    DomainEvent,
    DomainEventKind,
    HostEvent,
    HostEventKind,
    HostId,
    VirtEvent,
    VirtEventListener,
)
from capl.runtime.clock import FakeClock
from capl.runtime.informer import Cache
from capl.runtime.objects import Obj, ObjectKey
from capl.runtime.resources import CLUSTER, LIBVIRT_CLUSTER, LIBVIRT_MACHINE, MACHINE, SECRET
from tests.fixtures.runtime import FakeClient, eventually

NS = "ns"


def cache() -> Cache:
    return Cache(FakeClient(), clock=FakeClock())


def put(store_cache: Cache, resource: Any, obj: Obj) -> Obj:
    store_cache.store(resource).upsert(obj)
    return obj


def lm(
    name: str,
    *,
    cluster: str = "c1",
    cp: bool = False,
    ips: tuple[str, ...] = (),
    owner: str | None = None,
    deleting: bool = False,
) -> Obj:
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": NS,
        "labels": {c.CLUSTER_NAME_LABEL: cluster, **({c.CONTROL_PLANE_LABEL: ""} if cp else {})},
        "resourceVersion": "1",
    }
    if owner:
        metadata["ownerReferences"] = [
            {"apiVersion": c.CAPI_API_VERSION, "kind": "Machine", "name": owner, "uid": "u"}
        ]
    if deleting:
        metadata["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {
        "metadata": metadata,
        "status": {"addresses": [{"type": "InternalIP", "address": ip} for ip in ips]},
    }


def test_control_plane_addresses_and_the_machine_label() -> None:
    store = cache()
    put(store, LIBVIRT_MACHINE, lm("cp1", cp=True, ips=("10.0.0.11", "fd00::1")))
    put(store, LIBVIRT_MACHINE, lm("cp2", owner="m2", ips=("10.0.0.2",)))
    put(store, LIBVIRT_MACHINE, lm("cp3", cp=True, ips=("10.0.0.3",), deleting=True))
    put(store, LIBVIRT_MACHINE, lm("w1", ips=("10.0.0.4",)))
    put(store, LIBVIRT_MACHINE, lm("other", cluster="c2", cp=True, ips=("10.0.0.5",)))
    # the control-plane label only on the owner Machine
    put(
        store,
        MACHINE,
        {"metadata": {"name": "m2", "namespace": NS, "labels": {c.CONTROL_PLANE_LABEL: ""}}},
    )
    assert control_plane_addresses(store, namespace=NS, cluster="c1") == ("10.0.0.2", "10.0.0.11")


def test_machine_predicate() -> None:
    store = cache()
    changes = ControlPlaneMachineChanges(store)
    worker = lm("w1", ips=("10.0.0.4",))
    assert not changes.create(worker)
    assert changes.delete(worker)  # a deleting cluster waits for every machine
    assert not changes.update(worker, lm("w1", ips=("10.0.0.9",)))
    cp = lm("cp1", cp=True)
    assert changes.create(cp)
    assert changes.update(cp, lm("cp1", cp=True, ips=("10.0.0.1",)))
    assert changes.update(cp, lm("cp1", cp=True, deleting=True))
    assert changes.update(cp, lm("cp1"))  # label removed
    assert not changes.update(cp, lm("cp1", cp=True))  # nothing that matters changed
    assert changes.update(cp, cp)  # resync


def test_mappers() -> None:
    store = cache()
    watch_list = watches(store)
    put(
        store,
        CLUSTER,
        {
            "metadata": {"name": "c1", "namespace": NS},
            "spec": {"infrastructureRef": {"kind": "LibvirtCluster", "name": "lc1"}},
        },
    )
    put(
        store,
        LIBVIRT_CLUSTER,
        {
            "metadata": {
                "name": "lc-owned",
                "namespace": NS,
                "ownerReferences": [
                    {"apiVersion": c.CAPI_API_VERSION, "kind": "Cluster", "name": "c1", "uid": "u"}
                ],
            },
            "spec": {
                "hosts": [
                    {"name": "a", "uri": "qemu:///system", "credentialsRef": {"name": "s1"}},
                    {"name": "b", "uri": "test:///default"},
                ]
            },
        },
    )
    for name, ref in (
        ("lc-other", {"apiVersion": c.CAPI_API_VERSION, "kind": "Cluster", "name": "c2"}),
        ("lc-foreign", {"apiVersion": "example.com/v1", "kind": "Cluster", "name": "c1"}),
    ):
        owned = {"metadata": {"name": name, "namespace": NS, "ownerReferences": [ref]}}
        put(store, LIBVIRT_CLUSTER, owned)
    expected = [ObjectKey(NS, "lc-owned"), ObjectKey(NS, "lc1")]
    assert libvirt_clusters_of(store, namespace=NS, cluster="c1") == expected
    assert libvirt_clusters_of(store, namespace=NS, cluster="c2") == [ObjectKey(NS, "lc-other")]
    by_resource = {w.resource: w for w in watch_list}
    assert list(by_resource[LIBVIRT_MACHINE].mapper(lm("cp1"))) == expected
    machine = {"metadata": {"name": "m", "namespace": NS}, "spec": {"clusterName": "c1"}}
    assert list(by_resource[MACHINE].mapper(machine)) == expected
    secret = {"metadata": {"name": "s1", "namespace": NS}}
    assert list(by_resource[SECRET].mapper(secret)) == [ObjectKey(NS, "lc-owned")]
    assert store.store(LIBVIRT_CLUSTER).index_keys(CREDENTIALS_INDEX, f"{NS}/s1") == [
        ObjectKey(NS, "lc-owned")
    ]
    cluster = store.get(CLUSTER, ObjectKey(NS, "c1"))
    assert cluster is not None
    assert list(by_resource[CLUSTER].mapper(cluster)) == [ObjectKey(NS, "lc1")]
    watches(store)  # registering twice (a second manager) is fine


class FakeHosts:
    """Only what the host-event trigger uses: host ids and the event subscription."""

    def __init__(self) -> None:
        self.listeners: list[VirtEventListener] = []
        self.wants: list[Callable[[VirtEvent], bool] | None] = []

    def host_id(self, uri: str) -> HostId:
        return HostId(uri.split("?", 1)[0])

    def subscribe(
        self, listener: VirtEventListener, *, wants: Callable[[VirtEvent], bool] | None = None
    ) -> Any:
        self.listeners.append(listener)
        self.wants.append(wants)
        hosts = self

        class Subscription:
            def close(self) -> None:
                hosts.listeners.remove(listener)

        return Subscription()


async def test_host_events_requeue_the_clusters_using_the_host() -> None:
    store = cache()
    for name, uri in (("a", "qemu+ssh://root@kvm1/system?keyfile=x"), ("b", "test:///default")):
        put(
            store,
            LIBVIRT_CLUSTER,
            {"metadata": {"name": name, "namespace": NS}, "spec": {"hosts": [{"uri": uri}]}},
        )
    hosts = FakeHosts()
    deps: Any = type("D", (), {"cache": store, "hosts": hosts})()
    enqueued: list[ObjectKey] = []
    run = host_event_trigger(deps, enqueued.append)
    stop = asyncio.Event()
    task = asyncio.create_task(run(stop))
    await eventually(lambda: bool(hosts.listeners))
    hosts.listeners[0](
        HostEvent(host_id=HostId("qemu+ssh://root@kvm1/system"), kind=HostEventKind.CONNECTED)
    )
    assert enqueued == [ObjectKey(NS, "a")]
    # domain events are refused on libvirt's thread, never handed to the loop
    wants = hosts.wants[0]
    assert wants is not None
    assert wants(HostEvent(host_id=HostId("test:///default"), kind=HostEventKind.DISCONNECTED))
    started = DomainEvent(
        host_id=HostId("test:///default"),
        uuid="u",
        name="d",
        kind=DomainEventKind.STARTED,
        detail="booted",
    )
    assert not wants(started)
    stop.set()
    await task
    assert hosts.listeners == []
