"""The LibvirtCluster controller: turns a set of KVM hosts into one workload cluster's
infrastructure, and removes exactly what it created.

One reconcile, level-based, in this order:

1. Gates (Cluster API contract): wait for the owner `Cluster` (deleted without one: drop the
   finalizer, nothing else); skip objects annotated `cluster.x-k8s.io/managed-by`; add the
   finalizer; respect pause (`Cluster.spec.paused` or the paused annotation: only the
   `Paused` condition is written).
2. Defaults: names the webhook did not fill in (network name/DNS domain/DHCP range, storage
   pool name/path, from `capl.api.defaults`) and the control-plane endpoint are written into
   spec with the finalizer, in one patch, before any host is touched, so they survive
   `clusterctl move` (which restores no status). The endpoint is the Cluster's
   `spec.controlPlaneEndpoint` when the user set it there (a VIP: no records), else
   `api.<dnsDomain>:6443`. Read-your-writes: see `LibvirtClusterReconciler._fresh`. For an
   adopted network the endpoint is decided once a host showed the
   network runs libvirt's DNS (the endpoint is immutable once set, so it is never guessed);
   its DNS domain then defaults to the derived `<name>.<namespace>.capl.internal`. In bridge
   mode libvirt serves no DNS: the user must set the endpoint (condition
   `ControlPlaneEndpointRequired` until then).
3. Credentials Secrets named by `spec.hosts[].credentialsRef` get a (non-controller) owner
   reference to the LibvirtCluster, so `clusterctl move` carries them.
4. Every host concurrently (`cluster_hosts.converge_host`): host info, network (create
   tagged, or adopt untouched), storage pool (create with owner marker, or adopt), and, when
   capl manages the endpoint, the DNS records of `api`/`api-int` pointing at the InternalIP
   addresses of the cluster's live control-plane LibvirtMachines (label
   `cluster.x-k8s.io/control-plane` on the LibvirtMachine or its owner Machine). Record
   ownership is shared with the machine controller per hostname: see `cluster_dns`. An
   unreachable host or a bad spec on one host never stops the others.
5. Status, at most one patch (none when nothing changed): `failureDomains`, `hosts[]`,
   conditions `HostsReachable`, `NetworkReady`, `StorageReady`,
   `ControlPlaneEndpointReady`, `Ready` (their summary) and `Paused`;
   `initialization.provisioned` once network and pool exist on every control-plane host and
   the endpoint is set — never set back to false. Warning events when a condition turns
   False (with the libvirt cause), Normal events for created/removed networks and pools.

Deletion: wait until no LibvirtMachine of the cluster remains (index by cluster label; their
deletion events bring the reconcile back), then on every host remove the endpoint records
from adopted networks, the networks capl created (tagged with this cluster) and the pools
capl created that hold no foreign volume (`cluster_hosts.clean_host`), then drop the
finalizer. A host that cannot be reached blocks the deletion (condition naming it) until it
answers again or is removed from `spec.hosts` — unless `status.hosts` shows capl never got a
network or pool there (wrong URI, credentials never valid): then there is nothing to clean.

Requeues: transient libvirt errors use the rate-limited backoff; unreachable hosts retry
after `unreachable_retry`; problems only a spec or host change can cure after
`terminal_retry` (spec/Secret changes trigger a reconcile anyway); a healthy cluster is
looked at again after `health_interval` (HostsReachable stays current), which can be turned
off. libvirt host connection events (connected / disconnected) requeue the clusters using
that host.
"""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from capl.api import constants as c
from capl.api.capi import Cluster
from capl.api.cluster import LibvirtCluster, LibvirtHost
from capl.api.defaults import DEFAULT_POOL_PARENT, default_libvirt_cluster, derived_dns_domain
from capl.api.meta import APIEndpoint
from capl.controllers.cluster_dns import API_PORT, addresses_in_network, endpoint_host
from capl.controllers.cluster_hosts import (
    ApiPlan,
    HostPlan,
    HostReport,
    Problem,
    clean_host,
    converge_host,
    has_dns,
)
from capl.controllers.cluster_status import (
    failure_domains,
    host_statuses,
    join_messages,
    set_host_conditions,
    set_ready,
)
from capl.controllers.common import (
    CAPI_GROUP,
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
from capl.ports.virt import (
    ClusterOwner,
    Host,
    HostEvent,
    NetworkMode,
    NetworkSpec,
    PoolSpec,
    VirtEvent,
)
from capl.runtime.client import ResourceClient
from capl.runtime.conditions import (
    FALSE,
    TRUE,
    UNKNOWN,
    get_condition,
    rfc3339,
    set_condition,
)
from capl.runtime.controller import Controller, Result, Watch
from capl.runtime.errors import ApiError, NotFound
from capl.runtime.events import NORMAL, WARNING
from capl.runtime.handlers import (
    HasLabel,
    SkipStatusOnlyUpdates,
    map_by_name_index,
    map_ref,
)
from capl.runtime.informer import Cache
from capl.runtime.manager import Manager
from capl.runtime.objects import (
    Obj,
    ObjectKey,
    copy_obj,
    get_path,
    is_deleting,
    key_of,
    labels,
    meta,
    owner_references,
    resource_version,
)
from capl.runtime.patch import Patcher, apply_patch
from capl.runtime.resources import CLUSTER, LIBVIRT_CLUSTER, LIBVIRT_MACHINE, MACHINE, SECRET
from capl.runtime.store import INDEX_CLUSTER, cluster_index_value

__all__ = [
    "CONTROLLER_NAME",
    "CREDENTIALS_INDEX",
    "ControlPlaneMachineChanges",
    "LibvirtClusterOptions",
    "LibvirtClusterReconciler",
    "control_plane_addresses",
    "credentials_indexer",
    "host_event_trigger",
    "internal_ips",
    "is_control_plane_machine",
    "libvirt_clusters_of",
    "setup",
    "watches",
]

log = structlog.get_logger("capl.controllers.libvirtcluster")

CONTROLLER_NAME = "libvirtcluster"
CREDENTIALS_INDEX = "libvirtcluster-credentials"
"""LibvirtCluster index: "namespace/secret-name" of every host's credentials Secret."""

DONE = Result()


@dataclass(frozen=True, slots=True, kw_only=True)
class LibvirtClusterOptions:
    """Timing of the LibvirtCluster controller (seconds)."""

    health_interval: float | None = 60.0
    """Look at a cluster again after this long (HostsReachable, drift); None/0: only on events."""
    unreachable_retry: float = 30.0
    """Retry after this long while a host cannot be reached."""
    terminal_retry: float = 300.0
    """Retry after this long when only a spec, Secret or host change can help."""
    host_timeout: float | None = 120.0
    """Give up on one host's work after this long in a reconcile (reported as unreachable)."""


# --- reading the cluster's machines ----------------------------------------------------------


def internal_ips(machine: Mapping[str, Any]) -> list[str]:
    """InternalIP addresses in a LibvirtMachine's status."""
    addresses = get_path(machine, "status", "addresses") or []
    return [
        str(a.get("address"))
        for a in addresses
        if isinstance(a, Mapping)
        and a.get("type") == c.AddressType.INTERNAL_IP
        and a.get("address")
    ]


def is_control_plane_machine(cache: Cache, machine: Mapping[str, Any]) -> bool:
    """The control-plane label on the LibvirtMachine, or on its owner Machine."""
    if c.CONTROL_PLANE_LABEL in labels(machine):
        return True
    namespace = meta(machine).get("namespace") or ""
    for ref in owner_references(machine):
        if ref.get("kind") != "Machine" or not str(ref.get("apiVersion", "")).startswith(
            CAPI_GROUP + "/"
        ):
            continue
        owner_machine = cache.get(MACHINE, ObjectKey(namespace, str(ref.get("name"))))
        if owner_machine is not None and c.CONTROL_PLANE_LABEL in labels(owner_machine):
            return True
    return False


def _ip_sort_key(value: str) -> int:
    return int(ipaddress.IPv4Address(value))


def control_plane_addresses(cache: Cache, *, namespace: str, cluster: str) -> tuple[str, ...]:
    """IPv4 InternalIPs of the cluster's control-plane LibvirtMachines not being deleted."""
    found: set[str] = set()
    for machine in cache.by_index(
        LIBVIRT_MACHINE, INDEX_CLUSTER, cluster_index_value(namespace, cluster)
    ):
        if is_deleting(machine) or not is_control_plane_machine(cache, machine):
            continue
        found.update(addresses_in_network(internal_ips(machine), None))
    return tuple(sorted(found, key=_ip_sort_key))


# --- watches ---------------------------------------------------------------------------------


def credentials_indexer(obj: Obj) -> Iterable[str]:
    namespace = meta(obj).get("namespace") or ""
    names = {
        str(get_path(h, "credentialsRef", "name"))
        for h in get_path(obj, "spec", "hosts") or []
        if isinstance(h, Mapping) and get_path(h, "credentialsRef", "name")
    }
    return [f"{namespace}/{name}" for name in sorted(names)]


def libvirt_clusters_of(cache: Cache, *, namespace: str, cluster: str) -> list[ObjectKey]:
    """The LibvirtClusters of a Cluster: its infrastructureRef, and any owned by it."""
    keys: set[ObjectKey] = set()
    cluster_obj = cache.get(CLUSTER, ObjectKey(namespace, cluster))
    if cluster_obj is not None:
        keys.update(map_ref("spec", "infrastructureRef", kind=c.Kind.LIBVIRT_CLUSTER)(cluster_obj))
    for obj in cache.list(LIBVIRT_CLUSTER, namespace=namespace):
        for ref in owner_references(obj):
            if (
                ref.get("kind") == "Cluster"
                and ref.get("name") == cluster
                and str(ref.get("apiVersion", "")).startswith(CAPI_GROUP + "/")
            ):
                keys.add(key_of(obj))
    return sorted(keys)


def _map_member_to_clusters(cache: Cache) -> Callable[[Obj], Iterable[ObjectKey]]:
    """A (Libvirt)Machine -> the LibvirtCluster(s) of its cluster."""

    def mapper(obj: Obj) -> Iterable[ObjectKey]:
        cluster = labels(obj).get(c.CLUSTER_NAME_LABEL) or get_path(obj, "spec", "clusterName")
        if not cluster:
            return ()
        return libvirt_clusters_of(
            cache, namespace=meta(obj).get("namespace") or "", cluster=str(cluster)
        )

    return mapper


class ControlPlaneMachineChanges:
    """LibvirtMachine events that matter to the cluster: any deletion (deletion waits for the
    machines), and creates/updates of control-plane machines that change their addresses,
    labels or deletion state (the endpoint records)."""

    def __init__(self, cache: Cache) -> None:
        self.cache = cache

    def create(self, obj: Obj) -> bool:
        return is_control_plane_machine(self.cache, obj)

    def delete(self, obj: Obj) -> bool:
        return True

    def update(self, old: Obj, new: Obj) -> bool:
        if not (
            is_control_plane_machine(self.cache, old) or is_control_plane_machine(self.cache, new)
        ):
            return False
        if old is new:
            return True
        return (
            internal_ips(old) != internal_ips(new)
            or is_deleting(old) != is_deleting(new)
            or labels(old).get(c.CONTROL_PLANE_LABEL) != labels(new).get(c.CONTROL_PLANE_LABEL)
        )


def watches(cache: Cache) -> list[Watch]:
    """The secondary watches of the controller (adds the credentials index to the cache)."""
    cache.informer(LIBVIRT_CLUSTER).add_indexer(CREDENTIALS_INDEX, credentials_indexer)
    members = _map_member_to_clusters(cache)
    return [
        Watch(CLUSTER, map_ref("spec", "infrastructureRef", kind=c.Kind.LIBVIRT_CLUSTER)),
        Watch(LIBVIRT_MACHINE, members, predicates=(ControlPlaneMachineChanges(cache),)),
        Watch(
            MACHINE,
            members,
            predicates=(HasLabel(c.CONTROL_PLANE_LABEL), SkipStatusOnlyUpdates()),
        ),
        Watch(SECRET, map_by_name_index(cache, LIBVIRT_CLUSTER, CREDENTIALS_INDEX)),
    ]


def host_event_trigger(
    deps: Deps, enqueue: Callable[[ObjectKey], None]
) -> Callable[[asyncio.Event], Any]:
    """A runnable: libvirt host (dis)connections requeue the LibvirtClusters using the host."""

    def listener(event: VirtEvent) -> None:
        if not isinstance(event, HostEvent):
            return
        for obj in deps.cache.list(LIBVIRT_CLUSTER):
            for host in get_path(obj, "spec", "hosts") or []:
                uri = host.get("uri") if isinstance(host, Mapping) else None
                if uri and deps.hosts.host_id(str(uri)) == event.host_id:
                    enqueue(key_of(obj))
                    break

    async def run(stop: asyncio.Event) -> None:
        subscription = deps.hosts.subscribe(listener)
        try:
            await stop.wait()
        finally:
            subscription.close()

    return run


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
    return controller


# --- spec defaults ---------------------------------------------------------------------------


def fill_spec_defaults(
    obj: Obj, current: LibvirtCluster, *, cluster_endpoint: APIEndpoint | None = None
) -> None:
    """Write derived defaults the webhook did not (only unset fields) and the endpoint into a
    copied raw object: the Cluster's own `spec.controlPlaneEndpoint` when the user set it
    there, else for networks capl creates with DNS `api.<dnsDomain>:6443`."""
    defaulted = default_libvirt_cluster(current)
    spec: dict[str, Any] = obj.setdefault("spec", {})
    want = defaulted.spec.wire()
    network: dict[str, Any] = spec.setdefault("network", {})
    for field in ("name", "dnsDomain", "dhcp"):
        if field in want.get("network", {}) and field not in network:
            network[field] = want["network"][field]
    if want.get("storagePool"):
        pool: dict[str, Any] = spec.setdefault("storagePool", {})
        for field in ("name", "path"):
            if field in want["storagePool"] and field not in pool:
                pool[field] = want["storagePool"][field]
    endpoint = spec.get("controlPlaneEndpoint") or {}
    if endpoint.get("host"):
        if not endpoint.get("port"):
            spec["controlPlaneEndpoint"] = {**endpoint, "port": API_PORT}
        return
    if cluster_endpoint is not None and cluster_endpoint.host:
        spec["controlPlaneEndpoint"] = {
            "host": cluster_endpoint.host,
            "port": cluster_endpoint.port or endpoint.get("port") or API_PORT,
        }
        return
    net = defaulted.spec.network
    if net.cidr is not None and net.mode != "bridge" and net.dns_domain:
        spec["controlPlaneEndpoint"] = {
            "host": endpoint_host(net.dns_domain),
            "port": endpoint.get("port") or API_PORT,
        }


def _endpoint(obj: Obj) -> tuple[str, int] | None:
    host = get_path(obj, "spec", "controlPlaneEndpoint", "host")
    port = get_path(obj, "spec", "controlPlaneEndpoint", "port")
    return (str(host), int(port)) if host and port else None


def _never_set_up(current: LibvirtCluster) -> set[str]:
    """Hosts whose status entry shows capl never got a network or pool there (e.g. never
    reachable, credentials never valid). Without an entry nothing is known: not included."""
    return {
        entry.name
        for entry in current.status.hosts or ()
        if entry.network is None and entry.storage_pool is None
    }


class _TrackingPatcher(Patcher):
    """A Patcher that remembers the resourceVersions its patches superseded."""

    def __init__(self, client: ResourceClient, obj: Obj, superseded: set[str]) -> None:
        super().__init__(client, obj)
        self.superseded = superseded
        self.wrote = False

    async def apply(self, *, precondition: bool | None = None, status: bool = True) -> Obj:
        before = resource_version(self.original)
        result = await super().apply(precondition=precondition, status=status)
        if resource_version(result) != before:
            self.superseded.add(before)
            self.wrote = True
        return result


# --- the reconciler --------------------------------------------------------------------------


class LibvirtClusterReconciler:
    """See the module docstring."""

    def __init__(self, deps: Deps, options: LibvirtClusterOptions | None = None) -> None:
        self.deps = deps
        self.options = options or LibvirtClusterOptions()
        self._client = deps.client.resource(LIBVIRT_CLUSTER)
        self._written: dict[ObjectKey, tuple[frozenset[str], Obj]] = {}

    def _now(self) -> str:
        return rfc3339(self.deps.clock.wall())

    def _fresh(self, key: ObjectKey, cached: Obj) -> tuple[Obj, set[str]]:
        """Read-your-writes: the informer may not have delivered our last patch yet when the
        next reconcile starts (e.g. the one our own spec patch triggered). While the cache
        still shows a resourceVersion our writes superseded, work from the object our last
        patch returned, so an unchanged world yields no second, identical status patch."""
        memo = self._written.get(key)
        if memo is not None:
            superseded, latest = memo
            if resource_version(cached) in superseded:
                return latest, set(superseded)
            del self._written[key]
        return cached, set()

    async def reconcile(self, key: ObjectKey) -> Result:
        cached = self.deps.cache.get(LIBVIRT_CLUSTER, key)
        if cached is None:
            self._written.pop(key, None)
            return DONE
        raw, superseded = self._fresh(key, cached)
        patcher = _TrackingPatcher(self._client, raw, superseded)
        try:
            return await self._reconcile(patcher)
        except NotFound:  # deleted while we worked; the delete event settles it
            self._written.pop(key, None)
            return DONE
        finally:
            if patcher.wrote:
                self._written[key] = (frozenset(patcher.superseded), patcher.original)

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
        add_finalizer(patcher.obj, c.CLUSTER_FINALIZER)
        fill_spec_defaults(
            patcher.obj, current, cluster_endpoint=cluster.spec.control_plane_endpoint
        )
        if patcher.changed():
            await patcher.apply(status=False)
        current = default_libvirt_cluster(parse(LibvirtCluster, patcher.obj))
        if self._set_paused(patcher.obj, cluster, current):
            await patcher.apply()
            return DONE
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
            )
            plans.append((plan, self._connector(namespace, host)))
        return plans

    def _connector(self, namespace: str, host: LibvirtHost) -> Callable[[], Host]:
        return lambda: connect_host(self.deps, namespace=namespace, host=host)

    def _managed_api_domain(self, current: LibvirtCluster, obj: Obj) -> str | None:
        """The DNS domain when the endpoint is capl's (`api.<dnsDomain>`), else None."""
        endpoint = _endpoint(obj)
        domain = current.spec.network.dns_domain
        if endpoint is None or not domain or endpoint[0] != endpoint_host(domain):
            return None
        return domain

    # -- converge -------------------------------------------------------------------------

    async def _converge(self, patcher: Patcher, current: LibvirtCluster, cluster: str) -> Result:
        obj = patcher.obj
        metadata = current.metadata
        namespace = metadata.namespace or ""
        lay = layout(current)
        await self._own_credentials(current)
        domain = self._managed_api_domain(current, obj)
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
        self._report_changes(obj, reports)
        endpoint_problem = self._endpoint_condition(obj, current, lay, reports, api)
        status: dict[str, Any] = obj.setdefault("status", {})
        domains = failure_domains(reports, status.get("failureDomains"))
        if domains:
            status["failureDomains"] = domains
        else:
            status.pop("failureDomains", None)
        status["hosts"] = host_statuses(reports, status.get("hosts"))
        if isinstance(metadata.generation, int):
            status["observedGeneration"] = metadata.generation
        set_host_conditions(obj, reports, network=lay.network, pool=lay.pool, now=self._now)
        set_ready(obj, now=self._now)
        control_plane_hosts = [r for r in reports if r.plan.control_plane]
        if (
            _endpoint(obj) is not None
            and control_plane_hosts
            and all(r.network is not None and r.pool is not None for r in control_plane_hosts)
        ):
            status.setdefault("initialization", {})["provisioned"] = True
        self._warn_new_failures(patcher.original, obj)
        await patcher.apply()
        problems = [p for r in reports for p in r.problems()]
        if endpoint_problem is not None:
            problems.append(endpoint_problem)
        return self._next(problems)

    def _next(self, problems: Sequence[Problem]) -> Result:
        options = self.options
        delays: list[float] = []
        if options.health_interval:
            delays.append(options.health_interval)
        if any(not p.terminal and not p.unreachable for p in problems):
            return Result(requeue=True)
        if any(p.unreachable and not p.terminal for p in problems):
            delays.append(options.unreachable_retry)
        if any(p.terminal for p in problems):
            delays.append(options.terminal_retry)
        return Result(requeue_after=min(delays)) if delays else DONE

    def _decide_endpoint(
        self,
        obj: Obj,
        current: LibvirtCluster,
        lay: ClusterLayout,
        reports: Sequence[HostReport],
    ) -> tuple[tuple[str, int] | None, Problem | None]:
        """No endpoint in spec yet: set `api.<dnsDomain>:6443` for an adopted network once a
        host shows it runs libvirt's DNS; otherwise say why there is none."""
        net = current.spec.network
        if net.mode == "bridge":
            return None, Problem(
                c.Reason.CONTROL_PLANE_ENDPOINT_REQUIRED,
                f"network {lay.network} is in bridge mode, where libvirt serves no DNS: "
                "set spec.controlPlaneEndpoint (e.g. a kube-vip address)",
                terminal=True,
            )
        seen = [r.network for r in reports if r.network is not None]
        if any(has_dns(network) for network in seen):
            domain = lay.dns_domain or derived_dns_domain(
                namespace=current.metadata.namespace or "", name=current.metadata.name or ""
            )
            spec: dict[str, Any] = obj.setdefault("spec", {})
            spec.setdefault("network", {}).setdefault("dnsDomain", domain)
            spec["controlPlaneEndpoint"] = {"host": endpoint_host(domain), "port": API_PORT}
            return _endpoint(obj), None
        if seen:
            return None, Problem(
                c.Reason.CONTROL_PLANE_ENDPOINT_REQUIRED,
                f"network {lay.network} has no libvirt DNS (forward mode "
                f"{seen[0].forward_mode}): set spec.controlPlaneEndpoint",
                terminal=True,
            )
        return None, Problem(
            c.Reason.PROVISIONING, f"waiting for network {lay.network} on a reachable host"
        )

    def _endpoint_condition(
        self,
        obj: Obj,
        current: LibvirtCluster,
        lay: ClusterLayout,
        reports: Sequence[HostReport],
        api: ApiPlan | None,
    ) -> Problem | None:
        """Set ControlPlaneEndpointReady (deciding an adopted network's endpoint first);
        returns the problem that should shape the requeue, if any."""
        type_ = c.ConditionType.CONTROL_PLANE_ENDPOINT_READY
        endpoint = _endpoint(obj)
        if endpoint is None:
            endpoint, problem = self._decide_endpoint(obj, current, lay, reports)
            if endpoint is None:
                assert problem is not None
                set_condition(
                    obj,
                    type_,
                    FALSE if problem.terminal else UNKNOWN,
                    reason=problem.reason,
                    message=problem.message,
                    now=self._now,
                )
                # waiting: the hosts' own problems drive the requeue
                return problem if problem.terminal else None
        where = f"{endpoint[0]}:{endpoint[1]}"
        if api is None:
            managed = self._managed_api_domain(current, obj)
            message = where if managed else f"{where} (not managed by capl: no DNS records)"
            set_condition(obj, type_, TRUE, reason=c.Reason.READY, message=message, now=self._now)
            return None
        failed = [r.dns_problem for r in reports if r.dns_problem is not None]
        if failed:
            set_condition(
                obj,
                type_,
                FALSE,
                reason=failed[0].reason,
                message=join_messages([p.message for p in failed]),
                now=self._now,
            )
            return failed[0]
        targets = ", ".join(api.addresses) or "no control-plane machine address yet"
        set_condition(
            obj, type_, TRUE, reason=c.Reason.READY, message=f"{where} -> {targets}", now=self._now
        )
        return None

    # -- credentials ----------------------------------------------------------------------

    async def _own_credentials(self, current: LibvirtCluster) -> None:
        """Give each credentials Secret an owner reference to this LibvirtCluster (added to
        the list, never replacing a controller reference), so `clusterctl move` takes it."""
        metadata = current.metadata
        namespace, uid = metadata.namespace or "", metadata.uid or ""
        if not uid:
            return
        names = sorted({h.credentials_ref.name for h in current.spec.hosts if h.credentials_ref})
        secrets = self.deps.client.resource(SECRET)
        for name in names:
            secret = self.deps.cache.get(SECRET, ObjectKey(namespace, name))
            if secret is None or any(r.get("uid") == uid for r in owner_references(secret)):
                continue
            desired = copy_obj(secret)
            refs: list[dict[str, Any]] = desired["metadata"].setdefault("ownerReferences", [])
            refs.append(
                {
                    "apiVersion": c.API_VERSION,
                    "kind": c.Kind.LIBVIRT_CLUSTER,
                    "name": metadata.name,
                    "uid": uid,
                }
            )
            try:
                await apply_patch(secrets, secret, desired, status=False)
            except NotFound:
                continue
            except ApiError as exc:  # secondary to the hosts' work: retried next time
                log.warning("cannot add the owner reference", secret=name, error=str(exc))

    # -- events ---------------------------------------------------------------------------

    def _report_changes(self, obj: Obj, reports: Sequence[HostReport]) -> None:
        recorder = self.deps.recorder
        for report in reports:
            where = report.plan.label
            if report.network is not None and report.network.created:
                recorder.event(
                    obj,
                    NORMAL,
                    "NetworkCreated",
                    f"created network {report.network.name} on {where}",
                )
            if report.pool is not None and report.pool.created:
                recorder.event(
                    obj,
                    NORMAL,
                    "StoragePoolCreated",
                    f"created storage pool {report.pool.name} at {report.pool.path} on {where}",
                )
            for change in report.dns_changes:
                parts = []
                if change.add:
                    parts.append(f"added {', '.join(change.add)}")
                if change.remove:
                    parts.append(f"removed {', '.join(change.remove)}")
                recorder.event(
                    obj,
                    NORMAL,
                    "EndpointRecordsUpdated",
                    f"DNS record {change.ip} on {where}: {'; '.join(parts)}",
                )

    def _warn_new_failures(self, original: Obj, obj: Obj) -> None:
        """A Warning event for every condition that turned False or changed its cause."""
        for cond in get_path(obj, "status", "conditions") or []:
            if cond.get("type") == c.ConditionType.READY or cond.get("status") != FALSE:
                continue
            before = get_condition(original, str(cond.get("type")))
            if before is not None and all(
                before.get(k) == cond.get(k) for k in ("status", "reason", "message")
            ):
                continue
            self.deps.recorder.event(
                obj, WARNING, str(cond.get("reason")), str(cond.get("message"))
            )

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
        forget = self._managed_api_domain(current, obj) if lay.network_adopted else None
        plans = self._plans(current, lay, api=None, forget_api_domain=forget)
        reports = list(
            await asyncio.gather(
                *(
                    clean_host(plan, connect, time_limit=self.options.host_timeout)
                    for plan, connect in plans
                )
            )
        )
        for report in reports:
            where = report.plan.label
            if report.network_removed:
                self.deps.recorder.event(
                    obj, NORMAL, "NetworkDeleted", f"removed network {lay.network} from {where}"
                )
            if report.pool_removed:
                self.deps.recorder.event(
                    obj,
                    NORMAL,
                    "StoragePoolDeleted",
                    f"removed storage pool {lay.pool} from {where}",
                )
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
            self._warn_new_failures(patcher.original, obj)
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
