"""The LibvirtCluster controller: turns a set of KVM hosts into one workload cluster's
infrastructure, and removes exactly what it created.

One reconcile, level-based, in this order:

1. Gates (Cluster API contract): wait for the owner `Cluster` (deleted without one: drop the
   finalizer, nothing else); skip objects annotated `cluster.x-k8s.io/managed-by`; respect
   pause (`Cluster.spec.paused` or the paused annotation: only the `Paused` condition is
   written — not the finalizer, not the defaults); add the finalizer.
2. Defaults: names the webhook did not fill in (network name/DNS domain/DHCP range, storage
   pool name/path, from `capl.api.defaults`) and the control-plane endpoint are written into
   spec with the finalizer, in one patch, before any host is touched, so they survive
   `clusterctl move` (which restores no status). The endpoint is the Cluster's
   `spec.controlPlaneEndpoint` when the user set it there (a VIP: no records), else
   `api.<dnsDomain>:6443`; an adopted network's endpoint, and bridge mode: see
   `capl.controllers.cluster_endpoint`. Writes are read back through
   `capl.runtime.patch.ReadYourWrites` (a reconcile the informer has not caught up with
   works from the object our last patch returned).
3. Credentials Secrets named by `spec.hosts[].credentialsRef` get the label
   `clusterctl.cluster.x-k8s.io/move` and a (non-controller) owner reference to the
   LibvirtCluster, so `clusterctl move` carries them; a refused owner reference (e.g.
   OwnerReferencesPermissionEnforcement) is reported in `CredentialsOwned`
   (`cluster_credentials`).
4. Every host concurrently (`cluster_hosts.converge_host`): host info, network (create
   tagged, or adopt untouched), storage pool (create with owner marker, or adopt), and, when
   capl manages the endpoint, the DNS records of `api`/`api-int` pointing at the InternalIP
   addresses of the cluster's live control-plane LibvirtMachines (label
   `cluster.x-k8s.io/control-plane` on the LibvirtMachine or its owner Machine). Record
   ownership is shared with the machine controller per hostname: see `cluster_dns`. An
   unreachable host or a bad spec on one host never stops the others.
5. Host maintenance (`cluster_maintenance`): hosts with `spec.hosts[].maintenance` are
   cordoned (their failure domain says `controlPlane: false`; machine placement skips them)
   and evacuated — evacuation LibvirtMachineMigrations created, Machines deleted, each
   machine by its `evictionStrategy` — and `status.hosts[].maintenance` says how far it got;
   when the maintenance ends its migrations are deleted. API writes only, no libvirt call.
6. Status, at most one patch (none when nothing changed): `failureDomains`, `hosts[]`,
   conditions `HostsReachable`, `NetworkReady`, `StorageReady`,
   `ControlPlaneEndpointReady`, `Ready` (their summary) and `Paused`;
   `initialization.provisioned` once network and pool exist on every control-plane host and
   the endpoint is set — never set back to false. Warning events when a condition turns
   False (with the libvirt cause), Normal events for created/removed networks and pools
   (`cluster_events`).

Deletion: wait until no LibvirtMachine of the cluster remains (index by cluster label; their
deletion events bring the reconcile back), then on every host remove the endpoint records
from adopted networks, the networks capl created (tagged with this cluster) and the pools
capl created that hold no foreign volume (`cluster_hosts.clean_host`), then drop the
finalizer. A host that cannot be reached blocks the deletion (condition naming it) until it
answers again or is removed from `spec.hosts` — unless `status.hosts` shows capl never got a
network or pool there (wrong URI, credentials never valid): then there is nothing to clean.

Requeues: transient libvirt errors use the rate-limited backoff; unreachable hosts retry
after `unreachable_retry`; problems only a spec or host change can cure after
`terminal_retry` (spec/Secret changes trigger a reconcile anyway); a host being evacuated
after `maintenance.poll_interval` (its migrations and machines wake it sooner) and when a
failed migration's retry backoff ends; a healthy cluster is
looked at again after about `drift_interval` (jittered), which can be turned off.
HostsReachable stays current without a reconcile per cluster: every `health_interval` each
distinct host is probed once (`cluster_health`) and only the clusters whose status disagrees
are queued; libvirt host connection events (connected / disconnected) requeue the clusters
using that host at once; the watches are in `cluster_watches`.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog

from capl.api import constants as c
from capl.api.capi import Cluster
from capl.api.cluster import LibvirtCluster, LibvirtHost
from capl.api.defaults import DEFAULT_POOL_PARENT, default_libvirt_cluster
from capl.controllers.cluster_credentials import CredentialsOwnership
from capl.controllers.cluster_endpoint import (
    endpoint_condition,
    fill_spec_defaults,
    managed_api_domain,
    spec_endpoint,
)
from capl.controllers.cluster_events import report_changes, report_removals, warn_new_failures
from capl.controllers.cluster_health import HostProbe
from capl.controllers.cluster_hosts import (
    ApiPlan,
    HostPlan,
    Problem,
    clean_host,
    converge_host,
)
from capl.controllers.cluster_maintenance import (
    Maintenance,
    MaintenanceOptions,
    MaintenanceResult,
)
from capl.controllers.cluster_status import (
    failure_domains,
    host_statuses,
    join_messages,
    set_host_conditions,
    set_ready,
)
from capl.controllers.cluster_watches import (
    control_plane_addresses,
    host_event_trigger,
    watches,
)
from capl.controllers.common import (
    ClusterLayout,
    Deps,
    InvalidObject,
    add_finalizer,
    connect_host,
    externally_managed,
    layout,
    owner,
    parse,
    paused,
    remove_finalizer,
)
from capl.ports.virt import ClusterOwner, Host, NetworkMode, NetworkSpec, PoolSpec
from capl.runtime.conditions import FALSE, TRUE, rfc3339, set_condition
from capl.runtime.controller import Controller, Result
from capl.runtime.errors import NotFound
from capl.runtime.events import WARNING
from capl.runtime.manager import Manager
from capl.runtime.objects import Obj, ObjectKey, get_path, meta
from capl.runtime.patch import Patcher, ReadYourWrites
from capl.runtime.resources import CLUSTER, LIBVIRT_CLUSTER, LIBVIRT_MACHINE
from capl.runtime.store import INDEX_CLUSTER, cluster_index_value

__all__ = [
    "CONTROLLER_NAME",
    "LibvirtClusterOptions",
    "LibvirtClusterReconciler",
    "setup",
]

log = structlog.get_logger("capl.controllers.libvirtcluster")

CONTROLLER_NAME = "libvirtcluster"

DONE = Result()


@dataclass(frozen=True, slots=True, kw_only=True)
class LibvirtClusterOptions:
    """Timing of the LibvirtCluster controller (seconds)."""

    health_interval: float | None = 60.0
    """Probe every host of the clusters this often, one host at a time spread over the
    interval (`cluster_health`): a cluster whose HostsReachable disagrees is reconciled;
    None/0: only connection events and `drift_interval`."""
    drift_interval: float | None = 600.0
    """Reconcile a healthy cluster in full again after about this long (a network or pool
    removed behind capl's back), jittered by up to -10 % so that clusters spread; None/0:
    only on events."""
    unreachable_retry: float = 30.0
    """Retry after this long while a host cannot be reached."""
    terminal_retry: float = 300.0
    """Retry after this long when only a spec, Secret or host change can help."""
    host_timeout: float | None = 120.0
    """Give up on one host's work after this long in a reconcile (reported as unreachable)."""
    maintenance: MaintenanceOptions = field(default_factory=MaintenanceOptions)
    """Evacuation of hosts in maintenance: parallelism, retry backoff, polling."""


def _never_set_up(current: LibvirtCluster) -> set[str]:
    """Hosts whose status entry shows capl never got a network or pool there (e.g. never
    reachable, credentials never valid). Without an entry nothing is known: not included."""
    return {
        entry.name
        for entry in current.status.hosts or ()
        if entry.network is None and entry.storage_pool is None
    }


class LibvirtClusterReconciler:
    """See the module docstring."""

    def __init__(self, deps: Deps, options: LibvirtClusterOptions | None = None) -> None:
        self.deps = deps
        self.options = options or LibvirtClusterOptions()
        self._client = deps.client.resource(LIBVIRT_CLUSTER)
        self._writes = ReadYourWrites()
        self._maintenance = Maintenance(deps, self.options.maintenance)
        self._credentials = CredentialsOwnership(deps)

    def _now(self) -> str:
        return rfc3339(self.deps.clock.wall())

    async def reconcile(self, key: ObjectKey) -> Result:
        raw = self._writes.read(key, self.deps.cache.get(LIBVIRT_CLUSTER, key))
        if raw is None:
            return DONE
        patcher = Patcher(self._client, raw, writes=self._writes)
        try:
            return await self._reconcile(patcher)
        except NotFound:  # deleted while we worked; the delete event settles it
            self._writes.forget(key)
            return DONE

    async def _reconcile(self, patcher: Patcher) -> Result:
        raw = patcher.original
        try:
            current = parse(LibvirtCluster, raw)
        except InvalidObject as exc:
            self.deps.recorder.event(raw, WARNING, c.Reason.INVALID_SPEC, str(exc))
            return DONE
        metadata = current.metadata
        namespace = metadata.namespace or ""
        cluster_ref = owner(metadata, kind="Cluster")
        deleting = metadata.deletion_timestamp is not None
        if cluster_ref is None:
            if deleting and remove_finalizer(patcher.obj, c.CLUSTER_FINALIZER):
                await patcher.apply(status=False)
            return DONE  # the Cluster controller sets the owner reference; that update wakes us
        if externally_managed(metadata):
            return DONE
        cluster_raw = self.deps.cache.get(CLUSTER, ObjectKey(namespace, cluster_ref.name))
        cluster = parse(Cluster, cluster_raw) if cluster_raw is not None else None
        if deleting:
            return await self._delete(patcher, current, cluster, cluster_ref.name)
        if cluster is None:
            return DONE  # the Cluster watch brings us back once it is cached
        if paused(cluster, metadata):
            self._set_paused(patcher.obj, cluster, current)
            await patcher.apply()  # the Paused condition, nothing else
            return DONE
        add_finalizer(patcher.obj, c.CLUSTER_FINALIZER)
        fill_spec_defaults(
            patcher.obj, current, cluster_endpoint=cluster.spec.control_plane_endpoint
        )
        if patcher.changed():
            await patcher.apply(status=False)
        current = default_libvirt_cluster(parse(LibvirtCluster, patcher.obj))
        self._set_paused(patcher.obj, cluster, current)  # NotPaused, with the status write
        return await self._converge(patcher, current, cluster_ref.name)

    def _set_paused(self, obj: Obj, cluster: Cluster | None, current: LibvirtCluster) -> bool:
        """Write the Paused condition; True when paused."""
        if paused(cluster, current.metadata):
            why = (
                f"annotation {c.PAUSED_ANNOTATION}"
                if current.metadata.has_annotation(c.PAUSED_ANNOTATION)
                else f"Cluster {cluster.metadata.name if cluster else ''} is paused"
            )
            set_condition(
                obj,
                c.ConditionType.PAUSED,
                TRUE,
                reason=c.Reason.PAUSED,
                message=f"reconciliation is paused ({why})",
                now=self._now,
            )
            return True
        set_condition(obj, c.ConditionType.PAUSED, FALSE, reason=c.Reason.NOT_PAUSED, now=self._now)
        return False

    # -- plans ----------------------------------------------------------------------------

    def _plans(
        self,
        current: LibvirtCluster,
        lay: ClusterLayout,
        *,
        api: ApiPlan | None,
        forget_api_domain: str | None = None,
    ) -> list[tuple[HostPlan, Callable[[], Host]]]:
        metadata = current.metadata
        namespace = metadata.namespace or ""
        cluster_owner = ClusterOwner(
            namespace=namespace, name=metadata.name or "", uid=metadata.uid or ""
        )
        net = current.spec.network
        network = NetworkSpec(
            name=lay.network,
            mode=NetworkMode(net.mode),
            owner=cluster_owner,
            cidr=lay.cidr,
            dhcp_start=net.dhcp.start if net.dhcp else None,
            dhcp_end=net.dhcp.end if net.dhcp else None,
            dns_domain=net.dns_domain,
            bridge=net.bridge,
        )
        pool = PoolSpec(
            name=lay.pool,
            path=lay.pool_path or f"{DEFAULT_POOL_PARENT}/{lay.pool}",
            owner=cluster_owner,
        )
        plans: list[tuple[HostPlan, Callable[[], Host]]] = []
        for host in current.spec.hosts:
            plan = HostPlan(
                name=host.name,
                host_id=str(self.deps.hosts.host_id(str(host.uri))),
                control_plane=host.control_plane,
                owner=cluster_owner,
                network=network,
                adopt_network=lay.network_adopted,
                pool=pool,
                api=api,
                forget_api_domain=forget_api_domain,
                cordoned=host.maintenance is not None,
            )
            plans.append((plan, self._connector(namespace, host)))
        return plans

    def _connector(self, namespace: str, host: LibvirtHost) -> Callable[[], Host]:
        return lambda: connect_host(self.deps, namespace=namespace, host=host)

    # -- converge -------------------------------------------------------------------------

    async def _converge(self, patcher: Patcher, current: LibvirtCluster, cluster: str) -> Result:
        obj = patcher.obj
        metadata = current.metadata
        namespace = metadata.namespace or ""
        lay = layout(current)
        await self._credentials.reconcile(current, obj, self._now)
        domain = managed_api_domain(current, obj)
        api = (
            ApiPlan(
                dns_domain=domain,
                addresses=control_plane_addresses(
                    self.deps.cache, namespace=namespace, cluster=cluster
                ),
            )
            if domain
            else None
        )
        plans = self._plans(current, lay, api=api)
        reports = list(
            await asyncio.gather(
                *(
                    converge_host(plan, connect, time_limit=self.options.host_timeout)
                    for plan, connect in plans
                )
            )
        )
        report_changes(self.deps.recorder, obj, reports)
        endpoint_problem = endpoint_condition(obj, current, lay, reports, api, now=self._now)
        status: dict[str, Any] = obj.setdefault("status", {})
        domains = failure_domains(reports, status.get("failureDomains"))
        if domains:
            status["failureDomains"] = domains
        else:
            status.pop("failureDomains", None)
        status["hosts"] = host_statuses(reports, status.get("hosts"))
        evacuation = await self._maintenance.reconcile(
            current, obj, patcher.original, cluster=cluster
        )
        if isinstance(metadata.generation, int):
            status["observedGeneration"] = metadata.generation
        set_host_conditions(obj, reports, network=lay.network, pool=lay.pool, now=self._now)
        set_ready(obj, now=self._now)
        control_plane_hosts = [r for r in reports if r.plan.control_plane]
        if (
            spec_endpoint(obj) is not None
            and control_plane_hosts
            and all(r.network is not None and r.pool is not None for r in control_plane_hosts)
        ):
            status.setdefault("initialization", {})["provisioned"] = True
        warn_new_failures(self.deps.recorder, patcher.original, obj)
        await patcher.apply()
        problems = [p for r in reports for p in r.problems()]
        if endpoint_problem is not None:
            problems.append(endpoint_problem)
        return self._next(problems, evacuation)

    def _next(
        self, problems: Sequence[Problem], evacuation: MaintenanceResult | None = None
    ) -> Result:
        options = self.options
        delays: list[float] = []
        if options.drift_interval:
            delays.append(options.drift_interval * (1.0 - 0.1 * random.random()))
        if evacuation is not None and evacuation.requeue_after is not None:
            delays.append(evacuation.requeue_after)
        if any(not p.terminal and not p.unreachable for p in problems) or (
            evacuation is not None and evacuation.failed
        ):
            return Result(requeue=True)
        if any(p.unreachable and not p.terminal for p in problems):
            delays.append(options.unreachable_retry)
        if any(p.terminal for p in problems):
            delays.append(options.terminal_retry)
        return Result(requeue_after=min(delays)) if delays else DONE

    # -- delete ---------------------------------------------------------------------------

    async def _delete(
        self,
        patcher: Patcher,
        current: LibvirtCluster,
        cluster: Cluster | None,
        cluster_name: str,
    ) -> Result:
        obj = patcher.obj
        if not current.metadata.has_finalizer(c.CLUSTER_FINALIZER):
            return DONE
        if self._set_paused(obj, cluster, current):
            await patcher.apply()
            return DONE
        namespace = current.metadata.namespace or ""
        machines = sorted(
            str(meta(m).get("name"))
            for m in self.deps.cache.by_index(
                LIBVIRT_MACHINE, INDEX_CLUSTER, cluster_index_value(namespace, cluster_name)
            )
        )
        if machines:
            shown = ", ".join(machines[:10]) + (", ..." if len(machines) > 10 else "")
            set_condition(
                obj,
                c.ConditionType.READY,
                FALSE,
                reason=c.Reason.DELETING,
                message=f"waiting for {len(machines)} LibvirtMachine(s) to be deleted: {shown}",
                now=self._now,
            )
            await patcher.apply()
            return DONE  # their deletion events bring us back
        current = default_libvirt_cluster(current)
        try:
            lay = layout(current)
        except InvalidObject:  # defaults never written: nothing was created
            remove_finalizer(obj, c.CLUSTER_FINALIZER)
            await patcher.apply(status=False)
            return DONE
        forget = managed_api_domain(current, obj) if lay.network_adopted else None
        plans = self._plans(current, lay, api=None, forget_api_domain=forget)
        reports = list(
            await asyncio.gather(
                *(
                    clean_host(plan, connect, time_limit=self.options.host_timeout)
                    for plan, connect in plans
                )
            )
        )
        report_removals(self.deps.recorder, obj, reports, network=lay.network, pool=lay.pool)
        untouched = _never_set_up(current)
        reports = [
            r for r in reports if r.connect is None or r.name not in untouched
        ]  # unusable hosts where capl never created anything have nothing to clean
        problems = [p for r in reports for p in r.problems()]
        if problems:
            set_host_conditions(obj, reports, network=lay.network, pool=lay.pool, now=self._now)
            set_condition(
                obj,
                c.ConditionType.READY,
                FALSE,
                reason=c.Reason.DELETING,
                message="cannot remove the cluster's infrastructure yet: "
                + join_messages([p.message for p in problems]),
                now=self._now,
            )
            warn_new_failures(self.deps.recorder, patcher.original, obj)
            await patcher.apply()
            return self._next(problems)
        remove_finalizer(obj, c.CLUSTER_FINALIZER)
        await patcher.apply(status=False)
        await self._forget_unused_hosts(current)
        return DONE

    async def _forget_unused_hosts(self, gone: LibvirtCluster) -> None:
        """Close the connections (and remove the credential files) of the hosts no other
        LibvirtCluster uses any more; a host shared with another cluster stays connected."""
        in_use = {
            str(host.get("uri"))
            for other in self.deps.cache.list(LIBVIRT_CLUSTER)
            if meta(other).get("uid") != gone.metadata.uid
            for host in get_path(other, "spec", "hosts", default=None) or []
        }
        for host in gone.spec.hosts:
            if str(host.uri) not in in_use:
                await self.deps.hosts.forget(str(host.uri))


def setup(
    manager: Manager,
    deps: Deps,
    *,
    options: LibvirtClusterOptions | None = None,
    concurrency: int | None = None,
) -> Controller:
    """Register the controller, its watches and the host-event trigger with a manager.

    `deps.cache` must be `manager.cache`. Returns the Controller (e.g. for tests)."""
    reconciler = LibvirtClusterReconciler(deps, options)
    controller = manager.add_controller(
        CONTROLLER_NAME,
        for_=LIBVIRT_CLUSTER,
        reconciler=reconciler,
        watches=watches(deps.cache),
        concurrency=concurrency,
    )
    manager.add_runnable(
        host_event_trigger(deps, controller.enqueue), name=f"{CONTROLLER_NAME}-host-events"
    )
    if reconciler.options.health_interval:
        probe = HostProbe(deps, controller.enqueue, interval=reconciler.options.health_interval)
        manager.add_runnable(probe.run, name=f"{CONTROLLER_NAME}-host-probe")
    return controller
