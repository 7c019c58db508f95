"""The LibvirtCluster health check (capl.controllers.cluster_health): one probe per host,
whatever the number of clusters using it; only the clusters whose status disagrees with the
answer are queued. Real LibvirtHosts on the in-process test driver, and a URI with no daemon
behind it for an unreachable host; the cache is the runtime's real Store (not started)."""

from __future__ import annotations

import asyncio
from typing import Any

from capl.api.constants import API_VERSION
from capl.controllers.cluster_health import HostProbe, HostUse, host_uses
from capl.controllers.common import Deps
from capl.runtime.clock import FakeClock
from capl.runtime.events import NullRecorder
from capl.runtime.informer import Cache
from capl.runtime.objects import ObjectKey
from capl.runtime.resources import LIBVIRT_CLUSTER
from capl.virt import LibvirtHosts

UP = "test:///default"
DOWN = "qemu+unix:///system?socket=/nonexistent/capl-probe.sock"


class _Client:
    """Only what `Cache.informer` touches before it is started (nothing is listed)."""

    def resource(self, resource: object) -> Any:
        return type("R", (), {"resource": resource})()


def _cluster(name: str, hosts: dict[str, str], reachable: dict[str, bool]) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "LibvirtCluster",
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "resourceVersion": "1"},
        "spec": {
            "hosts": [{"name": n, "uri": uri} for n, uri in hosts.items()],
            "network": {"mode": "isolated", "cidr": "10.250.0.0/24"},
        },
        "status": {"hosts": [{"name": n, "reachable": r} for n, r in reachable.items()]},
    }


def _deps(hosts: LibvirtHosts, clusters: list[dict[str, Any]]) -> Deps:
    cache = Cache(_Client())  # type: ignore[arg-type]
    for obj in clusters:
        cache.store(LIBVIRT_CLUSTER).upsert(obj)
    return Deps(
        cache=cache,
        client=_Client(),  # type: ignore[arg-type]
        recorder=NullRecorder(),
        hosts=hosts,
        workload=object(),  # type: ignore[arg-type]
        clock=FakeClock(),
    )


async def test_one_probe_per_host_and_only_disagreeing_clusters_queued() -> None:
    hosts = LibvirtHosts()
    try:
        clusters = [
            # 50 clusters share the reachable host and say so: nothing to do for them
            *(_cluster(f"ok{i:02d}", {"h1": UP}, {"h1": True}) for i in range(50)),
            # one still says unreachable from an earlier outage: queued
            _cluster("stale", {"h1": UP}, {"h1": False}),
            # one uses the unreachable host too, and says it is reachable: queued
            _cluster("both", {"h1": UP, "h2": DOWN}, {"h1": True, "h2": True}),
            # not reconciled yet (no status entry): left to its first reconcile
            _cluster("new", {"h2": DOWN}, {}),
        ]
        deps = _deps(hosts, clusters)
        uses = host_uses(deps, deps.cache.list(LIBVIRT_CLUSTER))
        assert sorted(len(u.users) for u in uses) == [2, 52]  # two hosts, not 53 clusters
        queued: list[ObjectKey] = []
        probe = HostProbe(deps, queued.append, interval=60.0)
        stop = asyncio.Event()
        round_ = asyncio.create_task(probe.round(stop))
        clock = deps.clock
        assert isinstance(clock, FakeClock)

        async def tick() -> None:  # the hosts are spread over the interval: 30 s apart
            while not round_.done():
                await asyncio.sleep(0.01)
                clock.advance(1.0)

        await asyncio.wait_for(asyncio.gather(round_, tick()), timeout=30)
        assert clock.now() - 1000.0 >= 60.0  # the round took the interval, not less
        assert probe.probes == 2
        assert sorted(queued) == [ObjectKey("ns", "both"), ObjectKey("ns", "stale")]
    finally:
        await hosts.close()


async def test_a_round_stops_when_the_manager_stops() -> None:
    hosts = LibvirtHosts()
    try:
        deps = _deps(hosts, [_cluster(f"c{i}", {"h1": UP}, {"h1": True}) for i in range(3)])
        stop = asyncio.Event()
        probe = HostProbe(deps, lambda key: None, interval=3600.0)
        probed = asyncio.Event()
        one = probe.probe

        async def probe_and_tell(use: HostUse) -> list[ObjectKey]:
            try:
                return await one(use)
            finally:
                probed.set()

        probe.probe = probe_and_tell  # type: ignore[method-assign]
        task = asyncio.create_task(probe.run(stop))
        await asyncio.wait_for(probed.wait(), timeout=30)
        stop.set()
        await asyncio.wait_for(task, timeout=10)
        assert probe.probes == 1
    finally:
        await hosts.close()
