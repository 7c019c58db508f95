"""LibvirtMachines that vanish under the controller, and the orphan sweep.

kube-apiserver can remove an object whose DELETE raced the patch adding our finalizer
(kubernetes/kubernetes#77988; tests/chaos/test_delete_racing_finalizer.py hits it with a real
`capl manager`). Here the vanishing is made deterministic: a thin wrapper of the Hosts port
removes the finalizer and deletes the object right after the controller started its domain,
so the controller's status patch answers 404. What it created must be rolled back.

The sweep is driven by hand (`reconciler.sweep()`, the periodic runnable off) with no grace
period, so "two consecutive sweeps" is two calls; the grace timing itself is unit-tested
(tests/unit/controllers/test_machine_plan.py, OrphanTracker on explicit times).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import xml.etree.ElementTree as ET
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import libvirt
import pytest

from capl.controllers import machine as libvirtmachine
from capl.controllers.machine import LibvirtMachineReconciler
from capl.ports.virt import CAPL_XML_NAMESPACE, DomainInfo, DomainOwner, DomainSpec, Host, Hosts
from capl.runtime.objects import ObjectKey
from capl.runtime.resources import LIBVIRT_CLUSTER, LIBVIRT_MACHINE, MACHINE, SECRET
from capl.testing.harness import TEST_DRIVER, ClusterObjects, ControllerHarness
from tests.controllers.conftest import domain_owner, events_of, leftovers
from tests.fixtures.common import eventually

pytestmark = pytest.mark.apiserver

FAST = libvirtmachine.MachineOptions(
    address_poll=0.2,
    shutdown_timeout=3,
    shutdown_poll=0.2,
    retry_first=0.2,
    retry_max=1.0,
    terminal_retry=600.0,
    orphan_sweep_interval=0,
    orphan_grace=0,
)
SETUP = functools.partial(libvirtmachine.setup, options=FAST)

OnStart = Callable[[DomainOwner], Awaitable[None]]


class _HookedHost:
    """A Host that calls `on_start` after a domain was started, by start_domain or
    create_domain (everything else delegated)."""

    def __init__(self, inner: Host, on_start: OnStart) -> None:
        self._inner = inner
        self._on_start = on_start

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def start_domain(
        self, uuid: str, *, owner: DomainOwner, defined: DomainInfo | None = None
    ) -> DomainInfo:
        info = await self._inner.start_domain(uuid, owner=owner, defined=defined)
        await self._on_start(owner)
        return info

    async def create_domain(
        self, spec: DomainSpec, *, absent: bool = False, on_defined: Any = None
    ) -> tuple[DomainInfo, list[Any]]:
        created = await self._inner.create_domain(spec, absent=absent, on_defined=on_defined)
        await self._on_start(spec.owner)
        return created


class _HookedHosts:
    def __init__(self, inner: Hosts, on_start: OnStart) -> None:
        self._inner = inner
        self._on_start = on_start

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def get(self, **kwargs: Any) -> Host:
        return _HookedHost(self._inner.get(**kwargs), self._on_start)  # type: ignore[return-value]


def _reconciler(harness: ControllerHarness) -> LibvirtMachineReconciler:
    reconciler = harness.controller(libvirtmachine.CONTROLLER_NAME).reconciler
    assert isinstance(reconciler, LibvirtMachineReconciler)
    return reconciler


async def _vanish(harness: ControllerHarness, name: str) -> None:
    """What kubernetes/kubernetes#77988 does: the object is gone despite our finalizer."""
    await harness.patch(LIBVIRT_MACHINE, name, {"metadata": {"finalizers": None}})
    await harness.delete(LIBVIRT_MACHINE, name)


async def _cluster_events(harness: ControllerHarness, cluster: ClusterObjects) -> list[str]:
    name = str(cluster.libvirt_cluster["metadata"]["name"])
    return [f"{t} {r}: {m}" for t, r, m in await events_of(harness, name)]


async def test_object_gone_after_creation_is_rolled_back(harness: ControllerHarness) -> None:
    vanishing: set[str] = set()
    vanished: list[str] = []

    async def on_start(owner: DomainOwner) -> None:
        if owner.name in vanishing:
            vanishing.discard(owner.name)
            await _vanish(harness, owner.name)
            vanished.append(owner.name)

    harness.deps = dataclasses.replace(harness.deps, hosts=_HookedHosts(harness.hosts, on_start))
    cluster = await harness.make_cluster(dns_domain="vanish.example")
    await harness.start(SETUP)
    keep = await harness.make_machine(cluster, "keep")
    await harness.wait_ready(keep.name)
    vanishing.add("racing")
    await harness.make_machine(cluster, "racing")

    await eventually(lambda: vanished == ["racing"], within=30, what="the object vanished")
    await harness.wait_gone(LIBVIRT_MACHINE, "racing")
    await eventually_empty(harness, cluster, "racing")
    assert len(await leftovers(harness, cluster, keep.name)) == 5  # domain, 2 volumes, dhcp, dns
    events = await _cluster_events(harness, cluster)
    assert any("VanishedMachineRolledBack" in e and "/racing " in e for e in events), events

    # a same-name object created afterwards is provisioned normally and not touched
    await harness.delete(MACHINE, "racing")
    await harness.delete(SECRET, "racing-bootstrap")
    await harness.wait_gone(MACHINE, "racing")
    again = await harness.make_machine(cluster, "racing")
    obj = await harness.wait_ready(again.name)
    info = await harness.host().get_domain(obj["spec"]["domainUUID"])
    assert info is not None
    assert info.owner == domain_owner(obj)


async def eventually_empty(harness: ControllerHarness, cluster: ClusterObjects, name: str) -> None:
    found: list[str] = []

    async def empty() -> bool:
        found[:] = await leftovers(harness, cluster, name)
        return not found

    await eventually(empty, within=30, what=f"nothing left of {name}: {found}")


async def test_sweep_removes_orphans_only(harness: ControllerHarness) -> None:
    cluster = await harness.make_cluster(dns_domain="sweep.example")
    await harness.start(SETUP)
    reconciler = _reconciler(harness)
    old = await harness.make_machine(cluster, "reborn")
    lagging = await harness.make_machine(cluster, "lagging")
    old_obj = await harness.wait_ready(old.name)
    lagging_obj = await harness.wait_ready(lagging.name)
    old_uuid = old_obj["spec"]["domainUUID"]

    # "reborn" leaves its domain behind (as if the manager missed the deletion) ...
    await harness.patch(
        LIBVIRT_MACHINE,
        old.name,
        {"metadata": {"annotations": {"clusterctl.cluster.x-k8s.io/delete-for-move": ""}}},
    )
    await harness.delete_machine(old.name)
    await harness.delete(MACHINE, old.name)
    await harness.delete(SECRET, f"{old.name}-bootstrap")
    await harness.wait_gone(MACHINE, old.name)
    assert (await harness.host().get_domain(old_uuid)) is not None
    # ... and comes back under the same name with a new UID: its domain name is held by the
    # orphan, so it cannot be created until the sweep removed that
    new = await harness.make_machine(cluster, "reborn")
    assert new.libvirt_machine["metadata"]["uid"] != old_obj["metadata"]["uid"]
    # "lagging" exists in the API but the cache lost it (a lagging informer)
    store = harness.manager.cache.store(LIBVIRT_MACHINE)
    await eventually(
        lambda: store.get(ObjectKey(harness.namespace, new.name)) is not None,
        within=10,
        what="the new incarnation is cached",
    )
    assert store.delete(ObjectKey(harness.namespace, lagging.name)) is not None

    assert await reconciler.sweep() == []  # first sighting: nothing is removed yet
    assert reconciler.orphans.pending() == 2  # the old domain and the uncached one
    queued = await reconciler.sweep()
    assert queued == [ObjectKey(harness.namespace, "reborn")]

    obj = await harness.wait_ready(new.name)
    assert obj["spec"]["domainUUID"] != old_uuid
    assert (await harness.host().get_domain(old_uuid)) is None
    info = await harness.host().get_domain(obj["spec"]["domainUUID"])
    assert info is not None
    assert info.owner == domain_owner(obj)
    assert len(await leftovers(harness, cluster, new.name)) == 5
    # the machine missing from the cache was confirmed through the API and kept
    lagging_info = await harness.host().get_domain(lagging_obj["spec"]["domainUUID"])
    assert lagging_info is not None
    assert lagging_info.owner == domain_owner(lagging_obj)
    assert len(await leftovers(harness, cluster, lagging.name)) == 5
    events = await _cluster_events(harness, cluster)
    assert any("OrphanDomainRemoved" in e and old_uuid in e for e in events), events

    # nothing more to do: the re-created machine and the lagging one are never touched
    assert await reconciler.sweep() == []
    assert await reconciler.sweep() == []
    assert len(await leftovers(harness, cluster, new.name)) == 5
    assert len(await leftovers(harness, cluster, lagging.name)) == 5


def _retag(domain_uuid: str, **tag: str) -> None:
    """Rewrite a domain's capl owner tag directly through libvirt."""
    conn = libvirt.open(TEST_DRIVER)
    try:
        element = ET.Element("machine")
        for key in ("cluster", "namespace", "name", "uid"):
            ET.SubElement(element, key).text = tag[key]
        conn.lookupByUUIDString(domain_uuid).setMetadata(
            libvirt.VIR_DOMAIN_METADATA_ELEMENT,
            ET.tostring(element, encoding="unicode"),
            "capl",
            CAPL_XML_NAMESPACE,
            libvirt.VIR_DOMAIN_AFFECT_LIVE | libvirt.VIR_DOMAIN_AFFECT_CONFIG,
        )
    finally:
        conn.close()


def _remove_directly(domain_uuid: str) -> None:
    conn = libvirt.open(TEST_DRIVER)
    try:
        with contextlib.suppress(libvirt.libvirtError):
            dom = conn.lookupByUUIDString(domain_uuid)
            if dom.isActive():
                dom.destroy()
            dom.undefine()
    finally:
        conn.close()


async def _leave_domain_behind(harness: ControllerHarness, name: str) -> None:
    """Delete the LibvirtMachine the way `clusterctl move` does: the domain stays."""
    await harness.patch(
        LIBVIRT_MACHINE,
        name,
        {"metadata": {"annotations": {"clusterctl.cluster.x-k8s.io/delete-for-move": ""}}},
    )
    await harness.delete_machine(name)


async def test_sweep_respects_pause_and_other_namespaces(harness: ControllerHarness) -> None:
    cluster = await harness.make_cluster()
    lc_name = str(cluster.libvirt_cluster["metadata"]["name"])
    await harness.start(SETUP)
    reconciler = _reconciler(harness)
    left = await harness.wait_ready((await harness.make_machine(cluster, "left")).name)
    other = await harness.wait_ready((await harness.make_machine(cluster, "other")).name)
    other_uuid = other["spec"]["domainUUID"]
    try:
        # a domain tagged for a namespace this manager does not watch
        _retag(
            other_uuid,
            cluster=cluster.name,
            namespace=harness.namespace + "-elsewhere",
            name="other",
            uid="0000",
        )
        await _leave_domain_behind(harness, "left")
        await _leave_domain_behind(harness, "other")
        await harness.patch(LIBVIRT_CLUSTER, lc_name, {"metadata": {"annotations": {PAUSED: ""}}})
        await _cached(harness, lambda o: PAUSED in _annotations(o))
        for _ in range(3):
            assert await reconciler.sweep() == []  # paused: the domains may change hands
        assert reconciler.orphans.pending() == 0
        await harness.patch(LIBVIRT_CLUSTER, lc_name, {"metadata": {"annotations": {PAUSED: None}}})
        await _cached(harness, lambda o: PAUSED not in _annotations(o))
        assert await reconciler.sweep() == []
        assert await reconciler.sweep() == [ObjectKey(harness.namespace, "left")]
        await eventually_empty(harness, cluster, "left")
        assert (await harness.host().get_domain(left["spec"]["domainUUID"])) is None
        assert (await harness.host().get_domain(other_uuid)) is not None
        assert await reconciler.sweep() == []
    finally:
        _remove_directly(other_uuid)


PAUSED = "cluster.x-k8s.io/paused"


def _annotations(obj: Mapping[str, Any]) -> dict[str, Any]:
    return dict(obj["metadata"].get("annotations") or {})


async def _cached(harness: ControllerHarness, predicate: Callable[[Any], bool]) -> None:
    async def check() -> bool:
        for obj in harness.manager.cache.list(LIBVIRT_CLUSTER):
            if obj["metadata"]["namespace"] == harness.namespace and predicate(obj):
                return True
        await asyncio.sleep(0)
        return False

    await eventually(check, within=10, what="the LibvirtCluster change is cached")
