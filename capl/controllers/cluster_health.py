"""The LibvirtCluster health check: one probe per host, not one reconcile per cluster.

A cluster's full reconcile reads its network (the whole definition, DHCP and DNS entries of
every machine), its pool and its records on every host: at 100 clusters of 100 machines, a
reconcile of each every minute was most of a settled manager's CPU (issue 16). Reachability
is a property of the host, not of the cluster, so it is checked per host:

- every `interval` each distinct host named by a LibvirtCluster's `spec.hosts` (by host
  identity: two URIs of one host are probed once) is asked one question
  (`Host.reachable()`: one `getLibVersion` round trip), the hosts spread evenly over the
  interval;
- a cluster whose `status.hosts[].reachable` disagrees with the answer is queued: its
  reconcile rewrites `HostsReachable` (and retries an unreachable host every
  `unreachable_retry`, as before); clusters that agree cost nothing more;
- a connection that drops or comes back queues the clusters of its host at once
  (`cluster_watches.host_event_trigger`), without waiting for the probe.

Drift (a network or pool removed behind capl's back) is what remains of the old periodic
reconcile: a healthy cluster is reconciled in full every `LibvirtClusterOptions
.drift_interval` (10 min by default), each at its own jittered time.

A host is probed with the credentials and options of the first cluster (by namespace/name)
that names it, the connection the clusters share (`connect_host`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import structlog

from capl.api.cluster import LibvirtCluster
from capl.controllers.common import Deps, InvalidObject, connect_host, parse
from capl.ports.errors import VirtError
from capl.ports.virt import HostId
from capl.runtime.clock import Clock
from capl.runtime.objects import Obj, ObjectKey, get_path, key_of
from capl.runtime.resources import LIBVIRT_CLUSTER

__all__ = ["HostProbe", "HostUse", "host_uses", "stale_clusters"]

log = structlog.get_logger("capl.controllers.cluster_health")


@dataclass(slots=True)
class HostUse:
    """One host (by identity) and the clusters naming it: (cluster key, host entry name)."""

    host_id: HostId
    cluster: LibvirtCluster
    """The first cluster naming it: its entry's URI, credentials and options are probed."""
    entry: str
    users: list[tuple[ObjectKey, str]] = field(default_factory=list)


def host_uses(deps: Deps, clusters: list[Obj]) -> list[HostUse]:
    """Every distinct host of the cached LibvirtClusters (not being deleted), in a stable
    order; an unparsable cluster or a URI without identity is skipped (its own reconcile
    reports it)."""
    uses: dict[HostId, HostUse] = {}
    for raw in sorted(clusters, key=key_of):
        if get_path(raw, "metadata", "deletionTimestamp"):
            continue
        try:
            cluster = parse(LibvirtCluster, raw)
        except InvalidObject:
            continue
        for host in cluster.spec.hosts:
            try:
                host_id = deps.hosts.host_id(str(host.uri))
            except VirtError:
                continue
            use = uses.get(host_id)
            if use is None:
                use = uses[host_id] = HostUse(host_id=host_id, cluster=cluster, entry=host.name)
            use.users.append((key_of(raw), host.name))
    return list(uses.values())


def stale_clusters(
    use: HostUse, reachable: bool, status_of: Callable[[ObjectKey], Obj | None]
) -> list[ObjectKey]:
    """The clusters whose `status.hosts[]` entry for this host says otherwise (or has none
    yet: the first reconcile has not written it, and will)."""
    stale: list[ObjectKey] = []
    for key, name in use.users:
        obj = status_of(key)
        if obj is None:
            continue
        entries = get_path(obj, "status", "hosts") or ()
        said = next(
            (
                e.get("reachable")
                for e in entries
                if isinstance(e, Mapping) and e.get("name") == name
            ),
            None,
        )
        if said is not None and bool(said) != reachable and key not in stale:
            stale.append(key)
    return stale


class HostProbe:
    """The manager runnable of the module docstring."""

    def __init__(
        self, deps: Deps, enqueue: Callable[[ObjectKey], None], *, interval: float
    ) -> None:
        self.deps = deps
        self.enqueue = enqueue
        self.interval = interval
        self.probes = 0
        """Probes made (diagnostics and tests)."""

    async def probe(self, use: HostUse) -> list[ObjectKey]:
        """Probe one host; queue (and return) the clusters that disagree with the answer."""
        entry = next(h for h in use.cluster.spec.hosts if h.name == use.entry)
        namespace = use.cluster.metadata.namespace or ""
        try:
            host = connect_host(self.deps, namespace=namespace, host=entry)
            reachable = await host.reachable()
        except Exception as exc:  # credentials gone, bad URI: the reconcile will say why
            log.debug("host probe failed", host=use.entry, error=str(exc))
            reachable = False
        self.probes += 1
        stale = stale_clusters(
            use, reachable, lambda key: self.deps.cache.get(LIBVIRT_CLUSTER, key)
        )
        for key in stale:
            self.enqueue(key)
        if stale:
            log.info(
                "host reachability changed",
                host=use.entry,
                reachable=reachable,
                clusters=[str(k) for k in stale],
            )
        return stale

    async def round(self, stop: asyncio.Event) -> None:
        """One interval: every host probed once, spread evenly over it."""
        uses = host_uses(self.deps, self.deps.cache.list(LIBVIRT_CLUSTER))
        step = self.interval / max(1, len(uses))
        clock = self.deps.clock
        for use in uses:
            started = clock.now()
            await self.probe(use)
            if await _stopped(stop, clock, max(0.0, step - (clock.now() - started))):
                return
        if not uses and await _stopped(stop, clock, self.interval):
            return

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.round(stop)


async def _stopped(stop: asyncio.Event, clock: Clock, delay: float) -> bool:
    """Wait `delay` on the injected clock; True when `stop` was set meanwhile."""
    sleeper = asyncio.ensure_future(clock.sleep(delay))
    waiter = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({sleeper, waiter}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (sleeper, waiter):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    return stop.is_set()
