"""The LibvirtMachine controller: one libvirt domain per Cluster API Machine.

Level-based: every reconcile reads the LibvirtMachine, its Machine, Cluster and LibvirtCluster
from the cache and the domain from its host, makes the world match, and reports status with
at most one status patch. Decisions without I/O live in `capl.controllers.machine_plan`.

Gates (the InfraMachine contract, in order)
    owner Machine (a MachineSet-owned object waits until the Machine adopts it) -> finalizer
    -> pause (Paused condition) -> cluster infrastructure provisioned (never blocks deletion)
    -> bootstrap data Secret (key `value`, optional `format`) -> create.

Identity first
    Placement (spec.hostName, else Machine.spec.failureDomain, else the reachable host with
    the most memory left; control-plane machines only on `controlPlane: true` hosts) is
    chosen and written *before anything is created*, in one spec patch together with the
    finalizer: spec.hostName, spec.domainUUID (a fresh uuid4), spec.providerID
    `libvirt:///<uuid>` (write-once by CEL) and the placement annotation (host URI, pool,
    network; what deletion needs if the LibvirtCluster is gone). The domain is defined with
    that UUID, so a crash at any later point finds it again by UUID, and `clusterctl move`
    (which restores no status) loses nothing.

Creation (only while no domain with the UUID exists; each step idempotent)
    name-collision check -> base image (shared import) -> root overlay -> extra disks ->
    bootstrap volume (Ignition file for fw_cfg, or NoCloud ISO; re-uploaded on every attempt
    until the domain exists, never afterwards: a changed Secret never recreates the VM) ->
    DHCP reservations (LIVE|CONFIG, IP picked by the host under its per-network lock,
    excluding the IPs other LibvirtMachines report: an index of the cache, not a scan) with
    the DNS host record `<name>.<dnsDomain>` merged in the same locked update -> define ->
    start. A failed
    attempt rolls back what it created (volumes, reservations, record; not the shared base
    image), so bad input leaves nothing behind; the condition names the libvirt error, a
    Warning event repeats it once, and the retry backs off (transient: 2 s doubling to
    2 min; hopeless until the spec changes: 10 min). Every step is a fault-injection point
    (`CAPL_FAULT`, see machine_plan).

After creation
    Addresses from DHCP leases and the guest agent (merged; the last known IP kept while
    they report nothing); a short requeue while waiting for the address, none once Ready:
    domain lifecycle and host connection events (Hosts.subscribe) requeue the machine (the
    STARTED echo of our own start is ignored). A domain that stopped is started again, one
    deleted out of band is recreated with the same UUID; both are reported (DomainProvisioned
    keeps reason DomainRestarted/DomainRecreated until it changes, plus a Warning event).
    The workload Node gets the providerID through the `<cluster>-kubeconfig` Secret while
    the Machine has no nodeRef (requeued every `node_poll` until the Node exists).

Re-created networks
    The cluster network's DHCP reservations and DNS records live in the network's
    definition: when the network is destroyed and defined again (the LibvirtCluster
    controller re-creates a network of its own that vanished; someone runs virsh), they are
    gone, and a guest would get another address at its next lease and its name would not
    resolve. The LibvirtCluster reports each host's network UUID (status.hosts[].networkUUID)
    and the machine records the UUID its entries were made or restored in
    (status.networkUUID). The LibvirtCluster watch requeues the cluster's machines when
    status.hosts changes; a machine whose recorded UUID differs restores its reservations
    with the MACs its domain's definition holds (a collision fallback included) and the
    addresses it had (spec, lease/agent by MAC, else its InternalIPs in the CIDR) plus its
    DNS name: idempotent (present entries are only read), then the new UUID is recorded (a
    Normal event names what was ensured). Nothing polls libvirt for this: a settled machine
    whose network keeps its UUID makes no call. A failure is a Warning event and a retry
    with backoff; the conditions do not change (the domain itself is fine).

Deletion
    Ready False/Deleting; ACPI shutdown requested, requeued until the domain is off or
    `shutdown_timeout` since metadata.deletionTimestamp passed (no worker waits); undefine
    (NVRAM/snapshot metadata) after checking UUID + ownership tag; volumes by name prefix
    (root, extra, Ignition/ISO, console log), DHCP reservations and the DNS name; not-found
    is success; a missing Machine, Cluster or LibvirtCluster does not block (the host comes
    from the LibvirtCluster when it exists, else from the placement annotation); then the
    finalizer goes. Deletion respects pause, and an object `clusterctl move` deletes
    (annotation clusterctl.cluster.x-k8s.io/delete-for-move) only loses its finalizer.

API errors
    A reconcile that gets no answer from the API server (connection refused/reset, timeout)
    or a 429/5xx logs one warning line (no traceback) and is retried after a short backoff
    of its own, `retry_first` doubling up to `api_retry_max`, instead of the work queue's
    per-item backoff, which would grow to minutes during an API server outage.

API writes
    A read-your-writes overlay (the newest object this process wrote) keeps a reconcile that
    runs before the informer caught up from writing again, and a reconcile whose object is
    unchanged since it settled at Ready (same resourceVersion, no event for it since)
    returns without calling libvirt. From create to Ready: one spec patch, one or two status
    patches.

Objects that vanish
    kube-apiserver can remove a LibvirtMachine whose DELETE raced the patch that added our
    finalizer (kubernetes/kubernetes#77988): the patch answers 200, the controller creates the
    domain, and the object is gone. So the reconciler remembers, per key, the incarnation (UID)
    it created or found a domain for; when a write answers 404, or a reconcile finds the object
    missing from the cache or carrying another UID, a live GET confirms it and what was made
    for that UID is removed: the domain only if its owner tag still names that UID, then the
    volumes, DHCP reservations and DNS name (which are named after namespace/name, not the
    UID) only while no domain holds the machine's name on that host. All of it runs inside a
    reconcile of the key, so it never overlaps a reconcile of a re-created object of the same
    name. A Normal event on the LibvirtCluster names what was removed.

Orphan sweep
    The backstop for what the process did not see (it restarted, a write failed for another
    reason): every `orphan_sweep_interval` (and once the caches synced) each host of each
    LibvirtCluster the manager watches (namespace, watch filter; not while the Cluster is
    paused, e.g. during `clusterctl move`) is listed for domains tagged for that cluster and
    namespace that no cached LibvirtMachine accounts for (same UID, or the same name with the
    domain's UUID recorded: a moved object adopts it). A domain reported by two consecutive
    sweeps and first seen at least `orphan_grace` ago is confirmed with a live GET (the cache
    may lag) and then removed by the same path as above, queued as a reconcile of its key; a
    Warning event on the LibvirtCluster names it.

Cost at scale
    Nothing in a reconcile scans every LibvirtMachine: the addresses other machines report
    and the machines placed but not provisioned on a host (committed memory, only weighed
    when there is more than one host) come from indexes of the informer cache, so a
    scale-out of N machines costs O(N) here, not O(N^2). bench/machines_testdriver.py
    measures it against the API server's and libvirt's own limits.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import datetime
import posixpath
import uuid as uuidlib
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import structlog

from capl.api import constants as c
from capl.api.capi import Cluster, Machine
from capl.api.cluster import LibvirtCluster, LibvirtHost
from capl.api.defaults import default_libvirt_cluster, default_libvirt_machine
from capl.api.machine import LibvirtMachine, LibvirtMachineSpec
from capl.controllers.common import (
    ClusterLayout,
    CredentialsMissing,
    Deps,
    InvalidObject,
    add_finalizer,
    connect_host,
    find_host,
    layout,
    libvirt_cluster_of,
    owner,
    parse,
    paused,
    remove_finalizer,
)
from capl.controllers.machine_bootstrap import (
    BootstrapOptions,
    BootstrapSubject,
    BootstrapWatcher,
    sooner,
)
from capl.controllers.machine_plan import (
    PLACEMENT_ANNOTATION,
    BootstrapData,
    BootstrapProblem,
    Failure,
    HostCandidate,
    NicPlan,
    OrphanTracker,
    Placement,
    accounts_for,
    build_domain_spec,
    choose_host,
    classify,
    committed_memory,
    dns_name,
    domain_state_text,
    fault_point,
    image_plan,
    internal_ips,
    mac_candidates,
    merge_addresses,
    nic_mac,
    nic_plans,
    owner_matches,
    pending_on_host,
    read_bootstrap,
    restore_plan,
)
from capl.ports.bootstrap import build_nocloud_iso
from capl.ports.errors import (
    AddressConflict,
    CredentialsError,
    ForeignDomainError,
    NetworkNotFound,
    PoolNotFound,
    Unsupported,
    VirtError,
)
from capl.ports.naming import MachineNames, machine_hostname, machine_names
from capl.ports.virt import (
    DomainEvent,
    DomainEventKind,
    DomainInfo,
    DomainOwner,
    DomainState,
    Host,
    HostEvent,
    HostId,
    HostInfo,
    InterfaceAddress,
    VirtEvent,
)
from capl.runtime.conditions import get_condition, rfc3339, set_condition, summarize
from capl.runtime.controller import Controller, Result, Watch
from capl.runtime.errors import ApiError, TransportError
from capl.runtime.errors import NotFound as ApiNotFound
from capl.runtime.handlers import (
    FuncPredicate,
    Mapper,
    field_indexer,
    map_by_name_index,
    map_cluster_members,
    map_ref,
    map_via,
)
from capl.runtime.informer import Cache
from capl.runtime.manager import Manager
from capl.runtime.objects import Obj, ObjectKey, copy_obj, get_path, key_of, labels, meta
from capl.runtime.patch import apply_patch, diff
from capl.runtime.resources import CLUSTER, LIBVIRT_CLUSTER, LIBVIRT_MACHINE, MACHINE, SECRET
from capl.runtime.store import INDEX_CLUSTER, cluster_index_value

__all__ = [
    "CONTROLLER_NAME",
    "INDEX_BOOTSTRAP_SECRET",
    "INDEX_DOMAIN_UUID",
    "INDEX_HOST",
    "INDEX_INTERNAL_IP",
    "INDEX_PENDING_HOST",
    "LibvirtMachineReconciler",
    "MachineOptions",
    "setup",
]

log = structlog.get_logger("capl.controllers.libvirtmachine")

CONTROLLER_NAME = "libvirtmachine"
INDEX_DOMAIN_UUID = "libvirtmachine.domain-uuid"
INDEX_HOST = "libvirtmachine.host"
INDEX_BOOTSTRAP_SECRET = "libvirtmachine.bootstrap-secret"
INDEX_INTERNAL_IP = "libvirtmachine.internal-ip"
INDEX_PENDING_HOST = "libvirtmachine.pending-host"
KUBECONFIG_SUFFIX = "-kubeconfig"
#: Set by `clusterctl move` on the source objects it is about to delete.
DELETE_FOR_MOVE_ANNOTATION = "clusterctl.cluster.x-k8s.io/delete-for-move"

READY_ORDER = (
    c.ConditionType.DOMAIN_PROVISIONED,
    c.ConditionType.BOOTSTRAP_DATA_DELIVERED,
    c.ConditionType.ADDRESS_ASSIGNED,
)
DONE = Result()


@dataclass(frozen=True, slots=True, kw_only=True)
class MachineOptions:
    """Timings of the machine controller (seconds)."""

    shutdown_timeout: float = 60.0
    """Graceful ACPI shutdown on delete, counted from metadata.deletionTimestamp; then destroy."""
    shutdown_poll: float = 2.0
    address_poll: float = 1.0
    """Requeue interval while the domain runs without an address."""
    address_timeout: float = 600.0
    """After this long without an address the condition says so and polling slows down."""
    address_slow_poll: float = 30.0
    node_poll: float = 20.0
    """Requeue interval while the workload Node has no providerID (kubeconfig Secret known)."""
    retry_first: float = 2.0
    retry_max: float = 120.0
    """Backoff of transient failures (host unreachable, pool busy/full, download failed)."""
    terminal_retry: float = 600.0
    """Requeue after a failure retrying cannot fix (checksum mismatch, foreign domain...)."""
    settled_ttl: float = 600.0
    """A settled machine (Ready, nothing happened) is re-checked against libvirt at most
    this often when it is reconciled without a change (resync)."""
    api_retry_max: float = 10.0
    """Cap of the retry delay while the API server does not answer (connection errors,
    429, 5xx): the reconcile is retried every few seconds, logged in one line."""
    orphan_sweep_interval: float = 60.0
    """How often the hosts are swept for domains of LibvirtMachines that no longer exist
    (0: never). The first sweep runs once the caches synced."""
    orphan_grace: float = 30.0
    """A domain is removed by the sweep only once it was reported orphaned by two consecutive
    sweeps and first seen at least this long ago."""
    bootstrap: BootstrapOptions = field(default_factory=BootstrapOptions)
    """The BootstrapSucceeded condition (capl.controllers.machine_bootstrap)."""


# -- indexes ----------------------------------------------------------------------------------


def index_domain_uuid(obj: Obj) -> Iterable[str]:
    value = get_path(obj, "spec", "domainUUID")
    return (str(value).lower(),) if value else ()


def host_index_value(namespace: str, cluster: str, host: str) -> str:
    return f"{namespace}/{cluster}/{host}"


def index_host(obj: Obj) -> Iterable[str]:
    host = get_path(obj, "spec", "hostName")
    cluster = labels(obj).get(c.CLUSTER_NAME_LABEL)
    if not host or not cluster:
        return ()
    return (host_index_value(meta(obj).get("namespace") or "", cluster, str(host)),)


def index_internal_ip(obj: Obj) -> Iterable[str]:
    """The addresses a machine reports: excluded when another machine's address is picked."""
    return internal_ips(obj)


def index_pending_host(obj: Obj) -> Iterable[str]:
    """Like index_host, only while the machine is placed and not provisioned yet (its
    memory counts as committed on that host when the next machine is placed)."""
    return index_host(obj) if pending_on_host(obj) else ()


def _cluster_name_of_libvirt_cluster(obj: Obj) -> str | None:
    name = labels(obj).get(c.CLUSTER_NAME_LABEL)
    if name:
        return name
    for ref in meta(obj).get("ownerReferences") or ():
        if ref.get("kind") == "Cluster" and str(ref.get("apiVersion", "")).startswith(
            c.CAPI_GROUP + "/"
        ):
            return str(ref.get("name"))
    return None


# -- predicates -------------------------------------------------------------------------------


def _changed(old: Obj, new: Obj, *paths: tuple[str, ...]) -> bool:
    return any(get_path(old, *p) != get_path(new, *p) for p in paths)


_META_PATHS = (
    ("metadata", "labels"),
    ("metadata", "annotations"),
    ("metadata", "ownerReferences"),
    ("metadata", "deletionTimestamp"),
)
MACHINE_CHANGES = FuncPredicate(
    on_update=lambda old, new: (
        old is new or _changed(old, new, ("spec",), ("status", "nodeRef"), *_META_PATHS)
    )
)
CLUSTER_CHANGES = FuncPredicate(
    on_update=lambda old, new: (
        old is new or _changed(old, new, ("spec",), ("status", "initialization"), *_META_PATHS)
    )
)
LIBVIRT_CLUSTER_CHANGES = FuncPredicate(
    on_update=lambda old, new: (
        old is new
        or _changed(
            old, new, ("spec",), ("status", "initialization"), ("status", "hosts"), *_META_PATHS
        )
    )
)


# -- the reconciler ---------------------------------------------------------------------------


class _Problem(Exception):
    """A gate or step that cannot go on: condition + retry policy."""

    def __init__(self, failure: Failure) -> None:
        super().__init__(failure.message)
        self.failure = failure


@dataclass(slots=True)
class _Work:
    """The object as the server has it (`current`) and the copy being changed (`desired`)."""

    current: Obj
    desired: Obj = field(init=False)
    raced: bool = False
    """The object our last write returned shows a change made by someone else meanwhile."""

    def __post_init__(self) -> None:
        self.desired = copy_obj(self.current)

    @property
    def status(self) -> dict[str, Any]:
        status: dict[str, Any] = self.desired.setdefault("status", {})
        return status

    def rebase(self, new: Obj) -> None:
        """After a spec patch: the server's object, keeping the status being computed."""
        status = self.desired.get("status")
        self.current = new
        self.desired = copy_obj(new)
        if status is not None:
            self.desired["status"] = status


@dataclass(slots=True)
class _Target:
    """The host a machine lives on and the names of its cluster resources there."""

    name: str
    uri: str
    host: Host
    pool: str
    network: str | None
    dns_domain: str | None
    bridge_mode: bool
    credentials_secret: str | None
    info: HostInfo | None = None
    cidr: str | None = None
    network_uuid: str | None = None
    """The network's UUID on this host as the LibvirtCluster last reported it
    (status.hosts[].networkUUID); None when not reported (yet)."""

    def placement(self, cluster: str) -> Placement:
        return Placement(
            host=self.name,
            uri=self.uri,
            pool=self.pool,
            network=self.network,
            dns_domain=self.dns_domain,
            credentials_secret=self.credentials_secret,
            cluster=cluster,
        )


@dataclass(frozen=True, slots=True)
class _Identity:
    namespace: str
    name: str
    uid: str
    cluster: str
    names: MachineNames
    hostname: str

    @classmethod
    def of(cls, *, namespace: str, name: str, uid: str, cluster: str) -> _Identity:
        """The identity of machine namespace/name (its libvirt names derived from those)."""
        return cls(
            namespace=namespace,
            name=name,
            uid=uid,
            cluster=cluster,
            names=machine_names(namespace=namespace, name=name),
            hostname=machine_hostname(name),
        )

    def owner(self) -> DomainOwner:
        return DomainOwner(
            cluster=self.cluster, namespace=self.namespace, name=self.name, uid=self.uid
        )


@dataclass(slots=True, kw_only=True)
class _Leftover:
    """What was made on one host for one incarnation (UID) of a LibvirtMachine: removed once
    that incarnation is confirmed gone (see "Objects that vanish" in the module docstring)."""

    ident: _Identity
    domain_uuid: str
    target: _Target
    spec: LibvirtMachineSpec | None
    """The spec it was created from (NICs, MACs); None when only the domain is known (sweep):
    the default single NIC on the cluster network is assumed."""
    swept: bool = False

    @property
    def uid(self) -> str:
        return self.ident.uid


ROLLED_BACK_REASON = "VanishedMachineRolledBack"
NETWORK_RESTORED_REASON = "NetworkEntriesRestored"
NETWORK_RESTORE_FAILED_REASON = "NetworkEntriesRestoreFailed"
ORPHAN_REMOVED_REASON = "OrphanDomainRemoved"


class LibvirtMachineReconciler:
    """Reconciles LibvirtMachines; see the module docstring."""

    def __init__(self, deps: Deps, *, options: MachineOptions | None = None) -> None:
        self.deps = deps
        self.cache: Cache = deps.cache
        self.options = options or MachineOptions()
        self.client = deps.client.resource(LIBVIRT_MACHINE)
        self.controller: Controller | None = None
        self._latest: dict[ObjectKey, Obj] = {}
        self._settled: dict[ObjectKey, tuple[str, float]] = {}
        self._epoch: dict[ObjectKey, int] = {}
        self._failures: dict[ObjectKey, int] = {}
        self._shutdown_requested: set[ObjectKey] = set()
        self._nodes_done: set[tuple[ObjectKey, str]] = set()
        self._own_starts: dict[str, float] = {}
        """Domains this process is starting: their next STARTED event is our own echo."""
        self._api_failures: dict[ObjectKey, int] = {}
        self._made: dict[ObjectKey, _Leftover] = {}
        """Per key, the incarnation this process created (or found) a domain for."""
        self._orphans: dict[ObjectKey, dict[str, _Leftover]] = {}
        """Domains the sweep confirmed orphaned, by key and domain UUID, until removed."""
        self.orphans = OrphanTracker(grace=self.options.orphan_grace)
        self.removed: list[str] = []
        """What vanished-object clean-ups removed (diagnostics, tests), newest last."""
        self.bootstrap = BootstrapWatcher(
            recorder=deps.recorder, clock=deps.clock, options=self.options.bootstrap
        )

    # -- wiring ------------------------------------------------------------------------------

    def bind(self, controller: Controller) -> None:
        self.controller = controller

    def touch(self, key: ObjectKey) -> None:
        """Something about `key` changed outside the object: forget that it had settled."""
        self._settled.pop(key, None)
        self._epoch[key] = self._epoch.get(key, 0) + 1

    def touching(self, mapper: Mapper) -> Mapper:
        def mapped(obj: Obj) -> Iterable[ObjectKey]:
            keys = list(mapper(obj))
            for key in keys:
                self.touch(key)
            return keys

        return mapped

    def watches(self, cache: Cache) -> list[Watch]:
        to_machine = map_ref("spec", "infrastructureRef", kind=c.Kind.LIBVIRT_MACHINE)
        return [
            Watch(MACHINE, self.touching(to_machine), (MACHINE_CHANGES,)),
            Watch(
                CLUSTER,
                self.touching(map_cluster_members(cache, LIBVIRT_MACHINE)),
                (CLUSTER_CHANGES,),
            ),
            Watch(
                LIBVIRT_CLUSTER,
                self.touching(self._map_libvirt_cluster),
                (LIBVIRT_CLUSTER_CHANGES,),
            ),
            Watch(
                SECRET,
                self.touching(
                    _union(
                        map_via(
                            cache,
                            MACHINE,
                            map_by_name_index(cache, MACHINE, INDEX_BOOTSTRAP_SECRET),
                            to_machine,
                        ),
                        self._map_kubeconfig_secret,
                    )
                ),
            ),
        ]

    def _map_libvirt_cluster(self, obj: Obj) -> Iterable[ObjectKey]:
        cluster = _cluster_name_of_libvirt_cluster(obj)
        if not cluster:
            return ()
        value = cluster_index_value(meta(obj).get("namespace") or "", cluster)
        return self.cache.store(LIBVIRT_MACHINE).index_keys(INDEX_CLUSTER, value)

    def _map_kubeconfig_secret(self, obj: Obj) -> Iterable[ObjectKey]:
        name = str(meta(obj).get("name") or "")
        if not name.endswith(KUBECONFIG_SUFFIX):
            return ()
        cluster = name[: -len(KUBECONFIG_SUFFIX)]
        value = cluster_index_value(meta(obj).get("namespace") or "", cluster)
        return self.cache.store(LIBVIRT_MACHINE).index_keys(INDEX_CLUSTER, value)

    async def run_events(self, stop: asyncio.Event) -> None:
        """A manager runnable: libvirt domain/host events -> requeues, while leading."""
        subscription = self.deps.hosts.subscribe(self.on_virt_event)
        try:
            await stop.wait()
        finally:
            subscription.close()

    def on_virt_event(self, event: VirtEvent) -> None:
        if isinstance(event, DomainEvent):
            if event.kind is DomainEventKind.DEFINED:
                return
            if event.kind is DomainEventKind.STARTED:
                deadline = self._own_starts.pop(event.uuid.lower(), None)
                if deadline is not None and deadline >= self.deps.clock.now():
                    return  # the echo of our own start_domain: nothing to look at
            keys = self.cache.store(LIBVIRT_MACHINE).index_keys(
                INDEX_DOMAIN_UUID, event.uuid.lower()
            )
        elif isinstance(event, HostEvent):
            keys = self._keys_on_host(event.host_id)
        else:  # pragma: no cover - the union is closed
            return
        for key in keys:
            self.touch(key)
            if self.controller is not None:
                self.controller.enqueue(key)

    def _keys_on_host(self, host_id: HostId) -> list[ObjectKey]:
        keys: list[ObjectKey] = []
        store = self.cache.store(LIBVIRT_MACHINE)
        for obj in self.cache.list(LIBVIRT_CLUSTER):
            cluster = _cluster_name_of_libvirt_cluster(obj)
            if not cluster:
                continue
            namespace = meta(obj).get("namespace") or ""
            for entry in get_path(obj, "spec", "hosts") or ():
                try:
                    same = self.deps.hosts.host_id(str(entry.get("uri", ""))) == host_id
                except VirtError:
                    continue
                if same:
                    value = host_index_value(namespace, cluster, str(entry.get("name")))
                    keys.extend(store.index_keys(INDEX_HOST, value))
        return keys

    # -- reading -----------------------------------------------------------------------------

    def _read(self, key: ObjectKey) -> Obj | None:
        """The cached object, or the newer one this process wrote (read-your-writes)."""
        cached = self.cache.get(LIBVIRT_MACHINE, key)
        mine = self._latest.get(key)
        if cached is None:
            self._latest.pop(key, None)
            return None
        if mine is None:
            return cached
        if _rv(mine) > _rv(cached):
            return mine
        del self._latest[key]
        return cached

    def _remember(self, obj: Obj) -> None:
        """Keep the object a write returned (ours: the answer to our request), without
        managedFields like the cache's objects (see capl.runtime.informer)."""
        meta(obj).pop("managedFields", None)
        self._latest[key_of(obj)] = obj

    def _forget(self, key: ObjectKey) -> None:
        self._latest.pop(key, None)
        self._settled.pop(key, None)
        self._epoch.pop(key, None)
        self._failures.pop(key, None)
        self._shutdown_requested.discard(key)
        self._nodes_done = {entry for entry in self._nodes_done if entry[0] != key}
        self._made.pop(key, None)
        self._api_failures.pop(key, None)
        self.bootstrap.forget(key)

    def _now(self) -> str:
        return rfc3339(self.deps.clock.wall())

    # -- reconcile ---------------------------------------------------------------------------

    async def reconcile(self, key: ObjectKey) -> Result:
        try:
            result = await self._reconcile(key)
        except ApiError as exc:
            if not _api_unavailable(exc):
                raise
            # no answer from the API server (or 429/5xx): one line, a short capped backoff
            # of our own instead of the work queue's growing one (the reconcile is
            # idempotent; the next attempt picks up where this one stopped)
            failures = self._api_failures.get(key, 0)
            self._api_failures[key] = failures + 1
            delay = min(self.options.api_retry_max, self.options.retry_first * (2**failures))
            log.warning("API server unavailable, retrying", error=str(exc), retry_in=delay)
            return Result(requeue_after=delay)
        self._api_failures.pop(key, None)
        return result

    async def _reconcile(self, key: ObjectKey) -> Result:
        obj = self._read(key)
        if key in self._made or key in self._orphans:
            waiting = await self._remove_vanished(key, obj)
            if waiting is not None:
                return waiting
        if obj is None:
            self._forget(key)
            return DONE
        settled = self._settled.get(key)
        if settled is not None:
            rv, when = settled
            if rv == meta(obj).get("resourceVersion") and (
                self.deps.clock.now() - when < self.options.settled_ttl
            ):
                return DONE
            del self._settled[key]
        epoch = self._epoch.get(key, 0)
        try:
            machine = default_libvirt_machine(parse(LibvirtMachine, obj))
        except InvalidObject as exc:
            log.warning("cannot read LibvirtMachine", error=str(exc))
            return DONE
        work = _Work(obj)
        if machine.metadata.deletion_timestamp is not None:
            return await self._delete(key, work, machine)
        try:
            result = await self._provision(key, work, machine)
        except ApiNotFound:
            # gone under this reconcile (e.g. deleted while our finalizer patch committed,
            # kubernetes/kubernetes#77988): what was made for it must not stay behind
            log.info("LibvirtMachine vanished during the reconcile")
            self._latest.pop(key, None)
            self._settled.pop(key, None)
            return await self._remove_vanished(key, None) or DONE
        if result == DONE and self._epoch.get(key, 0) == epoch and not work.raced:
            status = work.desired.get("status") or {}
            if _condition_true(status, c.ConditionType.READY):
                self._settled[key] = (
                    str(meta(work.current).get("resourceVersion")),
                    self.deps.clock.now(),
                )
        return result

    # -- conditions and writes ---------------------------------------------------------------

    def _set(self, work: _Work, type_: str, status: bool, reason: str, message: str = "") -> None:
        set_condition(work.desired, type_, status, reason=reason, message=message, now=self._now)

    def _fail(self, key: ObjectKey, work: _Work, failure: Failure, *, event: bool = True) -> Result:
        """Report a failure (condition, Warning event) and say when to retry."""
        cond = get_condition(work.current, failure.condition)
        repeated = cond is not None and cond.get("reason") == failure.reason
        self._set(work, failure.condition, False, failure.reason, failure.message)
        if failure.condition != c.ConditionType.DOMAIN_PROVISIONED and not _condition_true(
            work.status, c.ConditionType.DOMAIN_PROVISIONED
        ):
            self._set(
                work, c.ConditionType.DOMAIN_PROVISIONED, False, failure.reason, failure.message
            )
        if event and not repeated:
            self.deps.recorder.event(work.current, "Warning", failure.reason, failure.message)
        if not failure.transient:
            return Result(requeue_after=self.options.terminal_retry)
        failures = self._failures.get(key, 0)
        self._failures[key] = failures + 1
        delay = min(self.options.retry_max, self.options.retry_first * (2**failures))
        return Result(requeue_after=delay)

    async def _finish(self, work: _Work, result: Result) -> Result:
        summarize(
            work.desired,
            READY_ORDER,
            true_reason=c.Reason.READY,
            missing_reason=c.Reason.PROVISIONING,
            now=self._now,
        )
        generation = meta(work.desired).get("generation")
        if isinstance(generation, int):
            work.status["observedGeneration"] = generation
            for cond in work.status.get("conditions") or ():
                if cond.get("type") in _OWN_CONDITIONS:
                    cond["observedGeneration"] = generation
        intended = _fingerprint(work.desired)
        new = await apply_patch(self.client, work.current, work.desired)
        if new is not work.current:
            self._remember(new)
            work.rebase(new)
            work.raced = _fingerprint(new) != intended
        return result

    async def _write_main(self, work: _Work) -> None:
        """Metadata/spec changes only (identity, finalizer), with a resourceVersion
        precondition: a stale read answers 409 and the reconcile is retried."""
        new = await apply_patch(
            self.client, work.current, work.desired, precondition=True, status=False
        )
        if new is not work.current:
            self._remember(new)
            work.rebase(new)

    # -- provisioning ------------------------------------------------------------------------

    async def _provision(self, key: ObjectKey, work: _Work, lm: LibvirtMachine) -> Result:
        md = lm.metadata
        namespace, name = md.namespace or "", md.name or ""
        ref = owner(md, kind="Machine")
        if ref is None:
            log.debug("waiting for the owner Machine")
            return DONE
        machine_raw = self.cache.get(MACHINE, ObjectKey(namespace, ref.name))
        if machine_raw is None:
            log.debug("owner Machine not in the cache yet", machine=ref.name)
            return DONE
        machine = parse(Machine, machine_raw)
        add_finalizer(work.desired, c.MACHINE_FINALIZER)
        cluster_name = md.label(c.CLUSTER_NAME_LABEL) or machine.spec.cluster_name
        provisioned = bool(lm.status.initialization and lm.status.initialization.provisioned)
        cluster_raw = (
            self.cache.get(CLUSTER, ObjectKey(namespace, cluster_name)) if cluster_name else None
        )
        if cluster_raw is None:
            self._set(
                work,
                c.ConditionType.DOMAIN_PROVISIONED,
                provisioned,
                c.Reason.RUNNING if provisioned else c.Reason.WAITING_FOR_CLUSTER,
                "" if provisioned else f"Cluster {namespace}/{cluster_name} not found",
            )
            return await self._finish(work, DONE)
        cluster = parse(Cluster, cluster_raw)
        if paused(cluster, md):
            self._set(work, c.ConditionType.PAUSED, True, c.Reason.PAUSED)
            return await self._finish(work, DONE)
        self._set(work, c.ConditionType.PAUSED, False, c.Reason.NOT_PAUSED)

        lcluster = libvirt_cluster_of(self.cache, cluster)
        if not lm.spec.domain_uuid and not cluster.infrastructure_provisioned:
            self._set(
                work,
                c.ConditionType.DOMAIN_PROVISIONED,
                False,
                c.Reason.WAITING_FOR_CLUSTER_INFRASTRUCTURE,
                "the Cluster's infrastructure is not provisioned yet",
            )
            return await self._finish(work, DONE)
        if lcluster is None:
            self._set(
                work,
                c.ConditionType.DOMAIN_PROVISIONED,
                False,
                c.Reason.WAITING_FOR_CLUSTER_INFRASTRUCTURE,
                f"the LibvirtCluster of Cluster {namespace}/{cluster_name} is not in the cache",
            )
            return await self._finish(work, DONE)

        ident = _Identity.of(namespace=namespace, name=name, uid=md.uid or "", cluster=cluster_name)
        bootstrap: BootstrapData | None = None
        try:
            if not lm.spec.domain_uuid:
                bootstrap = self._bootstrap(work, machine, namespace)
                if bootstrap is None:
                    return await self._finish(work, DONE)
            target = await self._place(lm, machine, lcluster, namespace, cluster_name)
        except _Problem as problem:
            result = self._fail(key, work, problem.failure)
            return await self._finish(work, result)

        # identity before anything is created
        domain_uuid = lm.spec.domain_uuid or _uuid_from_provider_id(lm.spec.provider_id)
        spec = work.desired.setdefault("spec", {})
        fresh = domain_uuid is None
        if fresh:
            domain_uuid = str(uuidlib.uuid4())
        assert domain_uuid is not None
        spec.setdefault("hostName", target.name)
        spec["domainUUID"] = domain_uuid
        spec["providerID"] = c.PROVIDER_ID_PREFIX + domain_uuid
        annotations = work.desired.setdefault("metadata", {}).setdefault("annotations", {})
        annotations[PLACEMENT_ANNOTATION] = target.placement(cluster_name).encode()
        if fresh or _main_changed(work):
            await self._write_main(work)
            fault_point("identity-recorded")
        return await self._ensure(
            key, work, lm, machine, target, ident, domain_uuid, bootstrap, provisioned
        )

    def _bootstrap(self, work: _Work, machine: Machine, namespace: str) -> BootstrapData | None:
        """The bootstrap data, or None with the condition saying what is missing."""
        secret_name = machine.spec.bootstrap.data_secret_name
        if not secret_name:
            message = "Machine.spec.bootstrap.dataSecretName is not set yet"
            secret = None
        else:
            secret = self.cache.get(SECRET, ObjectKey(namespace, secret_name))
            message = f"bootstrap data Secret {namespace}/{secret_name} not found"
        if secret is None:
            for type_ in (
                c.ConditionType.BOOTSTRAP_DATA_DELIVERED,
                c.ConditionType.DOMAIN_PROVISIONED,
            ):
                self._set(work, type_, False, c.Reason.WAITING_FOR_BOOTSTRAP_DATA, message)
            return None
        try:
            return read_bootstrap(secret)
        except BootstrapProblem as problem:
            cond = get_condition(work.current, c.ConditionType.BOOTSTRAP_DATA_DELIVERED)
            for type_ in (
                c.ConditionType.BOOTSTRAP_DATA_DELIVERED,
                c.ConditionType.DOMAIN_PROVISIONED,
            ):
                self._set(work, type_, False, problem.reason, problem.message)
            if cond is None or cond.get("message") != problem.message:
                self.deps.recorder.event(work.current, "Warning", problem.reason, problem.message)
            return None

    async def _place(
        self,
        lm: LibvirtMachine,
        machine: Machine,
        lcluster: LibvirtCluster,
        namespace: str,
        cluster_name: str,
    ) -> _Target:
        """The host of the machine: pinned, failure domain, or chosen (no write here)."""
        try:
            lay = layout(lcluster)
        except InvalidObject as exc:
            raise _Problem(Failure(c.Reason.INTERNAL_ERROR, str(exc), True)) from None
        wanted = lm.spec.host_name or machine.spec.failure_domain
        if wanted:
            entry = find_host(lcluster, wanted)
            if entry is None:
                raise _Problem(
                    Failure(
                        c.Reason.HOST_NOT_FOUND,
                        f"host {wanted!r} is not one of LibvirtCluster "
                        f"{namespace}/{lcluster.metadata.name}'s spec.hosts",
                        False,
                    )
                )
            return self._target(namespace, entry, lay, lcluster)
        control_plane = c.CONTROL_PLANE_LABEL in (machine.metadata.labels or {}) or (
            c.CONTROL_PLANE_LABEL in (lm.metadata.labels or {})
        )
        entries = [h for h in lcluster.spec.hosts if h.control_plane or not control_plane]
        if not entries:
            raise _Problem(
                Failure(
                    c.Reason.HOST_NOT_FOUND,
                    "no host of the LibvirtCluster allows control-plane machines",
                    False,
                )
            )
        targets = [self._target(namespace, entry, lay, lcluster) for entry in entries]
        infos = await asyncio.gather(*(t.host.info() for t in targets), return_exceptions=True)
        uid = lm.metadata.uid or ""
        candidates: list[HostCandidate] = []
        problems: list[str] = []
        for target, info in zip(targets, infos, strict=True):
            if isinstance(info, BaseException):
                if not isinstance(info, VirtError):
                    raise info
                problems.append(f"{target.name}: {info}")
                continue
            target.info = info
            committed = 0
            if len(targets) > 1:  # one host: nothing to weigh
                committed = committed_memory(
                    self.cache.by_index(
                        LIBVIRT_MACHINE,
                        INDEX_PENDING_HOST,
                        host_index_value(namespace, cluster_name, target.name),
                    ),
                    host=target.name,
                    skip_uid=uid,
                )
            candidates.append(
                HostCandidate(
                    name=target.name,
                    free_bytes=info.memory_free_bytes,
                    committed_bytes=committed,
                )
            )
        chosen = choose_host(candidates)
        if chosen is None:
            raise _Problem(
                Failure(c.Reason.UNREACHABLE, "no host is reachable: " + "; ".join(problems), True)
            )
        return next(t for t in targets if t.name == chosen)

    def _target(
        self, namespace: str, entry: LibvirtHost, lay: ClusterLayout, lcluster: LibvirtCluster
    ) -> _Target:
        try:
            host = connect_host(self.deps, namespace=namespace, host=entry)
        except (CredentialsMissing, CredentialsError) as exc:
            raise _Problem(Failure(c.Reason.CREDENTIALS_INVALID, str(exc), False)) from None
        ref = entry.credentials_ref
        reported = next(
            (h for h in lcluster.status.hosts or () if h.name == entry.name and h.network_uuid),
            None,
        )
        return _Target(
            name=entry.name,
            uri=str(entry.uri),
            host=host,
            pool=lay.pool,
            network=lay.network,
            dns_domain=lay.dns_domain,
            bridge_mode=lcluster.spec.network.mode == "bridge",
            credentials_secret=ref.name if ref is not None and ref.name else None,
            cidr=lay.cidr,
            network_uuid=(
                str(reported.network_uuid).lower()
                if reported is not None and reported.network and reported.network == lay.network
                else None
            ),
        )

    async def _ensure(
        self,
        key: ObjectKey,
        work: _Work,
        lm: LibvirtMachine,
        machine: Machine,
        target: _Target,
        ident: _Identity,
        domain_uuid: str,
        bootstrap: BootstrapData | None,
        provisioned: bool,
    ) -> Result:
        host = target.host
        expected = ident.owner()
        fqdn = dns_name(ident.hostname, target.dns_domain)
        status = work.status
        status["host"] = target.name
        status["failureDomain"] = target.name
        created_reason: str | None = None
        try:
            info = await host.get_domain(domain_uuid)
            if info is not None:
                ours, retag = owner_matches(info.owner, expected)
                if not ours:
                    raise ForeignDomainError(
                        f"domain {info.name!r} with this machine's UUID {domain_uuid} on host "
                        f"{target.name} carries another owner tag; it is left untouched",
                        name=info.name,
                    )
                if retag:
                    info = await host.retag_domain(domain_uuid, owner=expected)
            # from here on, what exists (or is about to) belongs to this incarnation
            self._made[key] = _Leftover(
                ident=ident, domain_uuid=domain_uuid, target=target, spec=lm.spec
            )
            if info is None:
                if bootstrap is None:
                    bootstrap = self._bootstrap(work, machine, ident.namespace)
                    if bootstrap is None:
                        return await self._finish(work, DONE)
                info = await self._create(lm, target, ident, domain_uuid, bootstrap, fqdn)
                created_reason = c.Reason.DOMAIN_RECREATED if provisioned else c.Reason.RUNNING
                fmt = "Ignition" if bootstrap.format is c.BootstrapFormat.IGNITION else "NoCloud"
                self._set(
                    work,
                    c.ConditionType.BOOTSTRAP_DATA_DELIVERED,
                    True,
                    c.Reason.DELIVERED,
                    f"{fmt} bootstrap data attached to the domain",
                )
                if provisioned:
                    message = (
                        f"domain {domain_uuid} was gone from host {target.name} and was "
                        "recreated with the same UUID"
                    )
                    self.deps.recorder.event(
                        work.current, "Warning", c.Reason.DOMAIN_RECREATED, message
                    )
                else:
                    self.deps.recorder.event(
                        work.current,
                        "Normal",
                        "DomainCreated",
                        f"domain {info.name} ({domain_uuid}) started on host {target.name}",
                    )
            elif info.state is DomainState.SHUTDOWN:
                # the guest is shutting down: start it again once it is off (event)
                self._set_domain_state(work, info)
                self._set(
                    work,
                    c.ConditionType.DOMAIN_PROVISIONED,
                    False,
                    c.Reason.DOMAIN_NOT_RUNNING,
                    "the domain is shutting down; it is started again when it is off",
                )
                return await self._finish(work, Result(requeue_after=self.options.address_poll))
            elif info.state is not DomainState.RUNNING:
                before = info
                info = await self._start(host, domain_uuid, expected)
                if provisioned:
                    created_reason = c.Reason.DOMAIN_RESTARTED
                    message = (
                        f"domain {info.name} was {before.state.value} ({before.reason}); "
                        f"started it again at {self._now()}"
                    )
                    self.deps.recorder.event(
                        work.current, "Warning", c.Reason.DOMAIN_RESTARTED, message
                    )
                    self._set(
                        work,
                        c.ConditionType.DOMAIN_PROVISIONED,
                        True,
                        c.Reason.DOMAIN_RESTARTED,
                        message,
                    )
            observed = (
                await host.domain_addresses(domain_uuid)
                if info.state is DomainState.RUNNING
                else []
            )
        except _Problem as problem:
            return await self._finish(work, self._fail(key, work, problem.failure))
        except VirtError as exc:
            return await self._finish(work, self._fail(key, work, classify(exc)))
        fresh_creation = created_reason is not None and created_reason != c.Reason.DOMAIN_RESTARTED
        restore_retry = await self._network_entries(
            key, work, lm, target, ident, domain_uuid, observed, fqdn, made=fresh_creation
        )
        if restore_retry is None:
            self._failures.pop(key, None)
        self._set_domain_state(work, info)
        if created_reason == c.Reason.DOMAIN_RECREATED:
            self._set(
                work,
                c.ConditionType.DOMAIN_PROVISIONED,
                True,
                c.Reason.DOMAIN_RECREATED,
                f"the domain had been deleted out of band and was recreated at {self._now()}",
            )
        elif created_reason != c.Reason.DOMAIN_RESTARTED and not _repaired(status):
            # a repair report (restarted, recreated) stays until the condition changes
            self._set(work, c.ConditionType.DOMAIN_PROVISIONED, True, c.Reason.RUNNING)
        if not _condition_true(status, c.ConditionType.BOOTSTRAP_DATA_DELIVERED):
            self._set(
                work,
                c.ConditionType.BOOTSTRAP_DATA_DELIVERED,
                True,
                c.Reason.DELIVERED,
                "bootstrap data attached to the domain",
            )
        addresses, have_ip = merge_addresses(
            observed, previous=status.get("addresses"), hostname=ident.hostname, fqdn=fqdn
        )
        status["addresses"] = addresses
        result = DONE
        if have_ip:
            self._set(work, c.ConditionType.ADDRESS_ASSIGNED, True, c.Reason.ASSIGNED)
            status.setdefault("initialization", {})["provisioned"] = True
        else:
            result = self._waiting_for_address(work)
        if have_ip:
            node_result = await self._node_provider_id(key, machine, ident, domain_uuid)
            if node_result is not None:
                result = node_result
            watched = BootstrapSubject(
                key=key,
                obj=work.desired,
                host=host,
                domain_uuid=domain_uuid,
                pool=target.pool,
                console_volume=ident.names.console_log,
                node_joined=machine.status.node_ref is not None,
            )
            result = sooner(result, await self.bootstrap.observe(watched))
        if restore_retry is not None:
            retry_in = restore_retry.requeue_after or 0.0
            if result.requeue_after is None or retry_in < result.requeue_after:
                result = restore_retry
        result = await self._finish(work, result)
        if fresh_creation:
            fault_point("status-written")
        return result

    async def _start(self, host: Host, domain_uuid: str, owner: DomainOwner) -> DomainInfo:
        now = self.deps.clock.now()
        if len(self._own_starts) > 1024:
            self._own_starts = {u: d for u, d in self._own_starts.items() if d >= now}
        self._own_starts[domain_uuid] = now + 30.0
        try:
            return await host.start_domain(domain_uuid, owner=owner)
        except BaseException:
            self._own_starts.pop(domain_uuid, None)
            raise

    def _set_domain_state(self, work: _Work, info: DomainInfo) -> None:
        work.status["domainState"] = domain_state_text(info.state.value)

    def _waiting_for_address(self, work: _Work) -> Result:
        cond = get_condition(work.current, c.ConditionType.ADDRESS_ASSIGNED)
        waited = 0.0
        if cond is not None and cond.get("status") == "False" and cond.get("lastTransitionTime"):
            waited = self.deps.clock.wall() - _parse_time(str(cond["lastTransitionTime"]))
        if waited > self.options.address_timeout:
            self._set(
                work,
                c.ConditionType.ADDRESS_ASSIGNED,
                False,
                c.Reason.WAITING_FOR_ADDRESS,
                f"no address from the DHCP lease or the guest agent after "
                f"{self.options.address_timeout:.0f} s: check that the guest boots and runs "
                "DHCP on the cluster network (serial console log in the pool directory)",
            )
            return Result(requeue_after=self.options.address_slow_poll)
        message = "waiting for the guest's DHCP lease or guest agent to report an address"
        if cond is not None and cond.get("status") == "False":
            message = str(cond.get("message") or message)
        self._set(
            work, c.ConditionType.ADDRESS_ASSIGNED, False, c.Reason.WAITING_FOR_ADDRESS, message
        )
        return Result(requeue_after=self.options.address_poll)

    async def _node_provider_id(
        self, key: ObjectKey, machine: Machine, ident: _Identity, domain_uuid: str
    ) -> Result | None:
        """Give the workload Node its providerID; a requeue while the Node is missing."""
        if machine.status.node_ref is not None and machine.status.node_ref.name:
            return None
        provider_id = c.PROVIDER_ID_PREFIX + domain_uuid
        if (key, provider_id) in self._nodes_done:
            return None
        secret = self.cache.get(
            SECRET, ObjectKey(ident.namespace, ident.cluster + KUBECONFIG_SUFFIX)
        )
        if secret is None:
            return None
        kubeconfig = _secret_bytes(secret, c.BOOTSTRAP_DATA_KEY)
        if not kubeconfig:
            return None
        done = await self.deps.workload.ensure_node_provider_id(
            cluster=f"{ident.namespace}/{ident.cluster}",
            kubeconfig=kubeconfig,
            node_name=ident.hostname,
            provider_id=provider_id,
        )
        if done:
            self._nodes_done.add((key, provider_id))
            return None
        return Result(requeue_after=self.options.node_poll)

    async def _create(
        self,
        lm: LibvirtMachine,
        target: _Target,
        ident: _Identity,
        domain_uuid: str,
        bootstrap: BootstrapData,
        fqdn: str | None,
    ) -> DomainInfo:
        """Create everything of a machine whose domain does not exist; roll back on a
        failure retrying will not fix soon. Each step is idempotent."""
        try:
            return await self._create_steps(target, lm, ident, domain_uuid, bootstrap, fqdn)
        except VirtError as exc:
            await self._rollback(target, lm, ident, fqdn, classify(exc))
            raise

    async def _create_steps(
        self,
        target: _Target,
        lm: LibvirtMachine,
        ident: _Identity,
        domain_uuid: str,
        bootstrap: BootstrapData,
        fqdn: str | None,
    ) -> DomainInfo:
        host, names, spec = target.host, ident.names, lm.spec
        holder = await host.find_domain(names.domain)
        if holder is not None and holder.uuid.lower() != domain_uuid:
            held_by = (
                f"machine {holder.owner.namespace}/{holder.owner.name}"
                if holder.owner
                else "no capl owner tag"
            )
            raise ForeignDomainError(
                f"a domain named {names.domain!r} ({holder.uuid}, {held_by}) already exists on "
                f"host {target.name}; it is left untouched",
                name=names.domain,
            )
        info = target.info or await host.info()
        target.info = info
        # storage first: it is what usually fails (image, space), and then no address was
        # reserved for nothing
        root_path, extras, ignition_path, cidata_path = await self._create_storage(
            target, lm, ident, bootstrap
        )
        nics = await self._create_network(target, lm, ident, fqdn)
        domain_type = info.best_domain_type if spec.domain_type == "auto" else spec.domain_type
        domain_spec = build_domain_spec(
            names=names,
            uuid=domain_uuid,
            owner=ident.owner(),
            spec=spec,
            domain_type=domain_type,
            arch=info.arch or "x86_64",
            root_path=root_path,
            extra_paths=extras,
            ignition_path=ignition_path,
            cidata_path=cidata_path,
            nics=nics,
            console_log=posixpath.join(posixpath.dirname(root_path), names.console_log),
        )
        await host.define_domain(domain_spec)
        fault_point("domain-defined")
        started = await self._start(host, domain_uuid, ident.owner())
        fault_point("domain-started")
        return started

    async def _create_storage(
        self, target: _Target, lm: LibvirtMachine, ident: _Identity, bootstrap: BootstrapData
    ) -> tuple[str, list[tuple[str, str]], str | None, str | None]:
        """Base image, root overlay, extra disks, bootstrap volume: (root path, extra disks,
        Ignition path, NoCloud ISO path)."""
        host, names, spec = target.host, ident.names, lm.spec
        plan = image_plan(spec)
        base = await host.ensure_base_image(pool=target.pool, name=plan.volume, source=plan.source)
        fault_point("base-image")
        capacity = spec.root_volume.size_gib * 1024**3 if spec.root_volume else 0
        root = await host.create_overlay(
            pool=target.pool, name=names.root_volume, backing=base, capacity_bytes=capacity
        )
        fault_point("root-volume")
        extras: list[tuple[str, str]] = []
        for index, disk in enumerate(spec.extra_disks or ()):
            volume = await host.create_volume(
                pool=target.pool,
                name=names.extra_volume(index),
                capacity_bytes=disk.size_gib * 1024**3,
            )
            extras.append((disk.name, volume.path))
        fault_point("extra-volumes")
        if bootstrap.format is c.BootstrapFormat.IGNITION:
            volume = await host.upload_volume(
                pool=target.pool, name=names.ignition_volume, data=bootstrap.data
            )
            fault_point("bootstrap-volume")
            return root.path, extras, volume.path, None
        iso = build_nocloud_iso(
            user_data=bootstrap.data, instance_id=ident.uid, hostname=ident.hostname
        )
        volume = await host.upload_volume(pool=target.pool, name=names.cidata_volume, data=iso)
        fault_point("bootstrap-volume")
        return root.path, extras, None, volume.path

    async def _create_network(
        self, target: _Target, lm: LibvirtMachine, ident: _Identity, fqdn: str | None
    ) -> list[tuple[NicPlan, str]]:
        """MACs, DHCP reservations (LIVE|CONFIG) and the DNS name: [(NIC, MAC)]."""
        host = target.host
        nics: list[tuple[NicPlan, str]] = []
        first_ip: str | None = None
        exclude: set[str] | None = None
        for nic in nic_plans(
            lm.spec, cluster_network=target.network or "", bridge_mode=target.bridge_mode
        ):
            if nic.cluster_network and target.network:
                if exclude is None:
                    exclude = self._recorded_ips(ident)
                # the machine's DNS name goes with the first reservation, in the same
                # locked read-modify-write of the network
                dns = (fqdn,) if fqdn and first_ip is None else ()
                mac, ip = await self._reserve(host, target.network, nic, ident, exclude, dns)
                if ip is not None:
                    exclude.add(ip)
                    if first_ip is None:
                        first_ip = ip
            else:
                mac = nic.mac or nic_mac(
                    cluster=ident.cluster,
                    namespace=ident.namespace,
                    name=ident.name,
                    index=nic.index,
                    attempt=0,
                )
            nics.append((nic, mac))
        fault_point("dhcp-reserved")
        fault_point("dns-recorded")
        return nics

    def _recorded_ips(self, ident: _Identity) -> set[str]:
        """The InternalIPs other LibvirtMachines report (machine_plan.recorded_ips), from the
        cache's index instead of a scan of every machine."""
        taken = self.cache.index_values(LIBVIRT_MACHINE, INDEX_INTERNAL_IP)
        key = ObjectKey(ident.namespace, ident.name)
        own = self.cache.get(LIBVIRT_MACHINE, key)
        if own is not None and meta(own).get("uid") == ident.uid:
            store = self.cache.store(LIBVIRT_MACHINE)
            for ip in internal_ips(own):
                if store.index_keys(INDEX_INTERNAL_IP, ip) == [key]:
                    taken.discard(ip)
        return taken

    async def _reserve(
        self,
        host: Host,
        network: str,
        nic: NicPlan,
        ident: _Identity,
        exclude: set[str],
        dns: tuple[str, ...],
    ) -> tuple[str, str | None]:
        """(MAC, reserved IP) of a NIC on the cluster network (see machine_plan: MACs);
        `dns` names join the reserved address's DNS record once the reservation is ours."""
        dhcp_name = nic.dhcp_name(ident.hostname)
        candidates = mac_candidates(
            nic, cluster=ident.cluster, namespace=ident.namespace, name=ident.name
        )
        for mac in candidates:
            try:
                reservation = await host.ensure_dhcp_host(
                    network=network,
                    mac=mac,
                    name=dhcp_name,
                    ip=nic.ip,
                    exclude=exclude,
                    dns_hostnames=dns,
                )
            except AddressConflict as exc:
                if nic.mac or exc.field != "mac":
                    raise
                continue
            except Unsupported:
                return mac, None  # no DHCP managed by libvirt on this network
            if reservation.name == dhcp_name:
                return mac, reservation.ip
            if nic.mac:
                raise AddressConflict(
                    f"network {network!r}: MAC {mac} is reserved for host "
                    f"{reservation.name or '(unnamed)'} ({reservation.ip})",
                    field="mac",
                    value=mac,
                )
        raise AddressConflict(
            f"network {network!r}: the {len(candidates)} MAC addresses derived for this "
            "machine are all reserved by other hosts; set spec.networkInterfaces[].mac",
            field="mac",
            value=candidates[-1],
        )

    async def _network_entries(
        self,
        key: ObjectKey,
        work: _Work,
        lm: LibvirtMachine,
        target: _Target,
        ident: _Identity,
        domain_uuid: str,
        observed: list[InterfaceAddress],
        fqdn: str | None,
        *,
        made: bool,
    ) -> Result | None:
        """Restore the DHCP reservations and DNS record after the network was re-created
        (see "Re-created networks" in the module docstring); a retry on failure, else None.

        Runs only when the LibvirtCluster reports another network UUID for the host than
        the one recorded in status.networkUUID: a settled machine makes no libvirt call."""
        wanted = target.network_uuid
        if not wanted or not target.network or target.bridge_mode:
            return None
        status = work.status
        previous = status.get("networkUUID")
        if previous == wanted:
            return None
        if made:  # the reservations were made just now, in the network as it is
            status["networkUUID"] = wanted
            return None
        try:
            restored = await self._restore_reservations(
                target, lm, ident, domain_uuid, observed, fqdn, recorded=internal_ips(work.current)
            )
        except VirtError as exc:
            failure = classify(exc)
            failures = self._failures.get(key, 0)
            self._failures[key] = failures + 1
            if failures == 0:
                self.deps.recorder.event(
                    work.current,
                    "Warning",
                    NETWORK_RESTORE_FAILED_REASON,
                    f"restoring the DHCP reservations and DNS record in network "
                    f"{target.network} on host {target.name}: {failure.message}",
                )
            delay = self.options.retry_first * (2**failures)
            return Result(requeue_after=min(self.options.retry_max, delay))
        status["networkUUID"] = wanted
        if previous:
            message = (
                f"network {target.network} on host {target.name} was re-created "
                f"(UUID {previous} -> {wanted}); ensured DHCP reservation(s) "
                f"{', '.join(restored) or '(none)'}"
                + (f" and DNS name {fqdn}" if fqdn and restored else "")
            )
            log.info("network entries restored", network=target.network, host=target.name)
            self.deps.recorder.event(work.current, "Normal", NETWORK_RESTORED_REASON, message)
        return None

    async def _restore_reservations(
        self,
        target: _Target,
        lm: LibvirtMachine,
        ident: _Identity,
        domain_uuid: str,
        observed: list[InterfaceAddress],
        fqdn: str | None,
        *,
        recorded: Iterable[str],
    ) -> list[str]:
        """ensure_dhcp_host for every cluster-network NIC with the MAC the domain uses and
        the address the machine had, the DNS name with the first one (idempotent: present
        entries are only read). Returns "mac=ip" per reservation."""
        host, network = target.host, target.network
        assert network is not None
        plans = nic_plans(lm.spec, cluster_network=network, bridge_mode=target.bridge_mode)
        if not any(p.cluster_network for p in plans):
            return []
        nics = await host.domain_nics(domain_uuid)
        items = restore_plan(
            plans,
            nics,
            network=network,
            observed=observed,
            recorded=list(recorded),
            cidr=target.cidr,
        )
        exclude = self._recorded_ips(ident) if any(i.ip is None for i in items) else set()
        done: list[str] = []
        for index, item in enumerate(items):
            dhcp_name = item.plan.dhcp_name(ident.hostname)
            dns = (fqdn,) if fqdn and index == 0 else ()
            try:
                try:
                    reservation = await host.ensure_dhcp_host(
                        network=network,
                        mac=item.mac,
                        name=dhcp_name,
                        ip=item.ip,
                        exclude=exclude,
                        dns_hostnames=dns,
                    )
                except AddressConflict as exc:
                    if exc.field != "mac" or item.plan.ip:
                        raise
                    # the MAC is reserved already, for another address than the one the
                    # machine reported: that reservation stands (checked by name below)
                    reservation = await host.ensure_dhcp_host(
                        network=network, mac=item.mac, name=dhcp_name, dns_hostnames=dns
                    )
            except Unsupported:
                return done  # no DHCP managed by libvirt on this network
            if reservation.name != dhcp_name:
                raise AddressConflict(
                    f"network {network!r}: MAC {item.mac} of the domain is reserved for host "
                    f"{reservation.name or '(unnamed)'} ({reservation.ip})",
                    field="mac",
                    value=item.mac,
                )
            exclude.add(reservation.ip)
            done.append(f"{reservation.mac}={reservation.ip}")
        return done

    async def _rollback(
        self,
        target: _Target,
        lm: LibvirtMachine,
        ident: _Identity,
        fqdn: str | None,
        failure: Failure,
    ) -> None:
        """Undo what a failed creation attempt made (the domain does not exist)."""
        if failure.reason == c.Reason.UNREACHABLE:
            return  # nothing can be done on the host; the next attempt carries on
        try:
            await self._remove_resources(
                target.host,
                pool=target.pool,
                network=target.network,
                spec=lm.spec,
                ident=ident,
                fqdn=fqdn,
            )
        except VirtError as exc:
            log.warning("rollback after a failed creation incomplete", error=str(exc))

    async def _remove_resources(
        self,
        host: Host,
        *,
        pool: str | None,
        network: str | None,
        spec: LibvirtMachineSpec | None,
        ident: _Identity,
        fqdn: str | None,
    ) -> None:
        """Volumes, DHCP reservations and the DNS name of a machine (not-found is fine).

        Storage and network are cleaned independently: a failure in one does not keep the
        other from being cleaned; the first error is raised at the end."""
        errors: list[VirtError] = []
        if pool:
            try:
                await self._remove_volumes(host, pool, ident.names)
            except VirtError as exc:
                errors.append(exc)
        if network:
            try:
                await self._remove_network_entries(host, network, spec, ident, fqdn)
            except VirtError as exc:
                errors.append(exc)
        if errors:
            raise errors[0]

    async def _remove_volumes(self, host: Host, pool: str, names: MachineNames) -> None:
        try:
            refs = await host.list_volumes(pool=pool, prefix=names.prefix + "-", refresh=True)
        except PoolNotFound:
            return
        for ref in refs:
            if names.owns_volume(ref.name):
                await host.delete_volume(pool=pool, name=ref.name)

    async def _remove_network_entries(
        self,
        host: Host,
        network: str,
        spec: LibvirtMachineSpec | None,
        ident: _Identity,
        fqdn: str | None,
    ) -> None:
        try:
            info = await host.get_network(network)
        except NetworkNotFound:
            info = None
        if info is None:
            return
        ours: dict[str, set[str]] = {}
        plans = (
            nic_plans(spec, cluster_network=network, bridge_mode=False)
            if spec is not None
            else [_default_nic(network)]
        )
        for nic in plans:
            if nic.cluster_network:
                ours[nic.dhcp_name(ident.hostname)] = set(
                    mac_candidates(
                        nic, cluster=ident.cluster, namespace=ident.namespace, name=ident.name
                    )
                )
        for reservation in info.dhcp_hosts:
            if reservation.mac in ours.get(reservation.name or "", ()):
                await host.remove_dhcp_host(network=network, mac=reservation.mac)
        if fqdn:
            for record in info.dns_hosts:
                if fqdn in record.hostnames:
                    await host.remove_dns_hostnames(network=network, ip=record.ip, hostnames=[fqdn])

    # -- objects that vanished, orphans ---------------------------------------------------

    async def _remove_vanished(self, key: ObjectKey, cached: Obj | None) -> Result | None:
        """Remove what was made for incarnations of `key` other than `cached` (None: the
        object is not in the cache) once a live GET confirms they are gone. None when done;
        a short requeue while the object exists in the API but not yet in the cache."""
        uid = meta(cached).get("uid") if cached is not None else None
        made = self._made.get(key)
        swept = self._orphans.get(key, {})
        candidates = [x for x in (made, *swept.values()) if x is not None and x.uid != uid]
        for domain_uuid in [u for u, x in swept.items() if x.uid == uid]:
            del swept[domain_uuid]  # the cached object accounts for it after all
        if not candidates:
            self._drop_orphan_key(key)
            return None
        try:
            live: Obj | None = await self.client.get(key)
        except ApiNotFound:
            live = None
        for leftover in candidates:
            if accounts_for(live, owner_uid=leftover.uid, domain_uuid=leftover.domain_uuid):
                if leftover is made and live is not None and meta(live).get("uid") == leftover.uid:
                    # it exists; the cache has not caught up (or lost it for a relist)
                    return Result(requeue_after=self.options.address_poll)
                swept.pop(leftover.domain_uuid, None)
                self.orphans.forget(leftover.domain_uuid)
                continue
            await self._remove_leftover(leftover)
            if leftover is made:
                del self._made[key]
            swept.pop(leftover.domain_uuid, None)
        self._drop_orphan_key(key)
        return None

    def _drop_orphan_key(self, key: ObjectKey) -> None:
        if not self._orphans.get(key, True):
            del self._orphans[key]

    async def _remove_leftover(self, leftover: _Leftover) -> None:
        """The domain if it still carries the vanished incarnation's tag (UID included), then
        the machine's volumes, DHCP reservations and DNS name unless a domain holds its name
        on the host (the caller runs inside a reconcile of the key: no reconcile of a
        same-name object runs meanwhile)."""
        ident, target = leftover.ident, leftover.target
        host, owner_tag = target.host, ident.owner()
        removed: list[str] = []
        info = await host.get_domain(leftover.domain_uuid)
        if info is not None:
            if info.owner != owner_tag:
                log.info(
                    "domain of a vanished LibvirtMachine carries another owner tag now; left alone",
                    domain=info.name,
                    uuid=leftover.domain_uuid,
                    uid=leftover.uid,
                )
                self.orphans.forget(leftover.domain_uuid)
                return
            await host.undefine_domain(leftover.domain_uuid, owner=owner_tag)
            removed.append(f"domain {info.name} ({leftover.domain_uuid})")
        self.orphans.forget(leftover.domain_uuid)
        holder = await host.find_domain(ident.names.domain)
        if holder is None:
            await self._remove_resources(
                host,
                pool=target.pool,
                network=target.network,
                spec=leftover.spec,
                ident=ident,
                fqdn=dns_name(ident.hostname, target.dns_domain),
            )
            removed.append("its volumes, DHCP reservations and DNS name")
        else:
            log.info(
                "a domain holds the machine's name: its volumes and addresses are left",
                domain=holder.name,
                uuid=holder.uuid,
            )
        what = " and ".join(removed) or "nothing (already gone)"
        message = (
            f"LibvirtMachine {ident.namespace}/{ident.name} (uid {ident.uid}) no longer "
            f"exists; removed {what} from host {target.name}"
        )
        self.removed.append(message)
        if len(self.removed) > 256:
            del self.removed[:128]
        log.info(
            "removed what a vanished LibvirtMachine left",
            machine=f"{ident.namespace}/{ident.name}",
            uid=ident.uid,
            host=target.name,
            removed=what,
            swept=leftover.swept,
        )
        lcluster = self._libvirt_cluster_raw(ident.namespace, ident.cluster)
        if lcluster is not None and removed:
            if leftover.swept:
                self.deps.recorder.event(lcluster, "Warning", ORPHAN_REMOVED_REASON, message)
            else:
                self.deps.recorder.event(lcluster, "Normal", ROLLED_BACK_REASON, message)

    def _libvirt_cluster_raw(self, namespace: str, cluster_name: str) -> Obj | None:
        for obj in self.cache.list(LIBVIRT_CLUSTER, namespace=namespace):
            if _cluster_name_of_libvirt_cluster(obj) == cluster_name:
                return obj
        return None

    async def run_sweeps(self, stop: asyncio.Event) -> None:
        """A manager runnable (while leading): an orphan sweep once the caches synced, then
        every `orphan_sweep_interval` seconds of the injected clock."""
        interval = self.options.orphan_sweep_interval
        if interval <= 0:
            await stop.wait()
            return
        if self.controller is not None:
            await _until(self.controller.wait_synced(), stop)
        while not stop.is_set():
            try:
                await self.sweep()
            except (ApiError, VirtError) as exc:
                log.warning("orphan sweep incomplete", error=str(exc))
            await _until(self.deps.clock.sleep(interval), stop)

    async def sweep(self) -> list[ObjectKey]:
        """One orphan sweep (see the module docstring); returns the keys queued to remove a
        confirmed orphan."""
        key_filter = self.controller.options.key_filter if self.controller else None
        queued: list[ObjectKey] = []
        scopes: list[str] = []
        for raw in self.cache.list(LIBVIRT_CLUSTER):
            if key_filter is not None and not key_filter(raw):
                continue
            if DELETE_FOR_MOVE_ANNOTATION in (meta(raw).get("annotations") or {}):
                continue
            namespace = meta(raw).get("namespace") or ""
            cluster_name = _cluster_name_of_libvirt_cluster(raw)
            if not cluster_name:
                continue
            try:
                lcluster = default_libvirt_cluster(parse(LibvirtCluster, raw))
                lay = layout(lcluster)
                cluster_raw = self.cache.get(CLUSTER, ObjectKey(namespace, cluster_name))
                cluster = parse(Cluster, cluster_raw) if cluster_raw is not None else None
            except InvalidObject:
                continue
            if paused(cluster, lcluster.metadata):
                continue  # e.g. clusterctl move in progress: the domains change hands
            for entry in lcluster.spec.hosts:
                scope = host_index_value(namespace, cluster_name, entry.name)
                scopes.append(scope)
                try:
                    target = self._target(namespace, entry, lay, lcluster)
                    domains = await target.host.list_domains(cluster=cluster_name)
                except (_Problem, VirtError) as exc:
                    self.orphans.reset(scope)
                    log.debug("orphan sweep skips a host", host=entry.name, error=str(exc))
                    continue
                found: dict[str, tuple[ObjectKey, DomainInfo, DomainOwner]] = {}
                for info in domains:
                    tag = info.owner
                    if (
                        tag is None
                        or tag.kind != c.Kind.LIBVIRT_MACHINE
                        or tag.namespace != namespace
                        or tag.cluster != cluster_name
                    ):
                        continue
                    key = ObjectKey(namespace, tag.name)
                    cached = self.cache.get(LIBVIRT_MACHINE, key)
                    if accounts_for(cached, owner_uid=tag.uid, domain_uuid=info.uuid):
                        continue
                    found[info.uuid.lower()] = (key, info, tag)
                confirmed = self.orphans.observe(scope, found, now=self.deps.clock.now())
                for domain_uuid in sorted(confirmed):
                    key, info, tag = found[domain_uuid]
                    try:
                        live: Obj | None = await self.client.get(key)
                    except ApiNotFound:
                        live = None
                    if accounts_for(live, owner_uid=tag.uid, domain_uuid=domain_uuid):
                        self.orphans.forget(domain_uuid)
                        continue
                    ident = _Identity.of(
                        namespace=namespace, name=tag.name, uid=tag.uid, cluster=cluster_name
                    )
                    self._orphans.setdefault(key, {})[domain_uuid] = _Leftover(
                        ident=ident, domain_uuid=domain_uuid, target=target, spec=None, swept=True
                    )
                    log.info(
                        "orphaned domain confirmed, queued for removal",
                        domain=info.name,
                        uuid=domain_uuid,
                        machine=f"{namespace}/{tag.name}",
                        uid=tag.uid,
                        host=entry.name,
                    )
                    queued.append(key)
                    if self.controller is not None:
                        self.controller.enqueue(key)
        self.orphans.retain(scopes)
        return queued

    # -- deletion ----------------------------------------------------------------------------

    async def _delete(self, key: ObjectKey, work: _Work, lm: LibvirtMachine) -> Result:
        md = lm.metadata
        if not md.has_finalizer(c.MACHINE_FINALIZER):
            self._forget(key)
            return DONE
        namespace, name = md.namespace or "", md.name or ""
        if md.has_annotation(DELETE_FOR_MOVE_ANNOTATION):
            # clusterctl move deletes the source objects: the domain now belongs to the
            # target management cluster and must not be touched
            return await self._drop_finalizer(key, work)
        cluster_raw = self.cache.get(
            CLUSTER, ObjectKey(namespace, md.label(c.CLUSTER_NAME_LABEL) or "")
        )
        cluster = None
        if cluster_raw is not None:
            with contextlib.suppress(InvalidObject):
                cluster = parse(Cluster, cluster_raw)
        if paused(cluster, md):
            self._set(work, c.ConditionType.PAUSED, True, c.Reason.PAUSED)
            return await self._finish_deleting(work, DONE)
        self._set(work, c.ConditionType.READY, False, c.Reason.DELETING, "deleting the domain")
        if lm.spec.domain_uuid is None and not work.status.get("host"):
            return await self._drop_finalizer(key, work)  # nothing was ever created
        located = self._locate_for_delete(lm, namespace)
        if located is None:
            message = (
                "cannot tell which host the domain is on (no LibvirtCluster and no placement "
                f"record); libvirt resources of {namespace}/{name} are left in place"
            )
            log.warning(message)
            self.deps.recorder.event(work.current, "Warning", c.Reason.HOST_NOT_FOUND, message)
            return await self._drop_finalizer(key, work)
        target, cluster_name = located
        ident = _Identity.of(namespace=namespace, name=name, uid=md.uid or "", cluster=cluster_name)
        host = target.host
        try:
            if lm.spec.domain_uuid:
                waiting = await self._remove_domain(key, work, lm, host, ident)
                if waiting is not None:
                    return await self._finish_deleting(work, waiting)
            await self._remove_resources(
                host,
                pool=target.pool,
                network=target.network,
                spec=lm.spec,
                ident=ident,
                fqdn=dns_name(ident.hostname, target.dns_domain),
            )
        except _Problem as problem:
            result = self._fail(key, work, problem.failure)
            self._set(
                work, c.ConditionType.READY, False, c.Reason.DELETING, problem.failure.message
            )
            return await self._finish_deleting(work, result)
        except VirtError as exc:
            failure = classify(exc)
            result = self._fail(key, work, failure)
            self._set(work, c.ConditionType.READY, False, c.Reason.DELETING, failure.message)
            return await self._finish_deleting(work, result)
        return await self._drop_finalizer(key, work)

    async def _finish_deleting(self, work: _Work, result: Result) -> Result:
        try:
            new = await apply_patch(self.client, work.current, work.desired)
        except ApiNotFound:
            return DONE
        if new is not work.current:
            self._remember(new)
        return result

    async def _remove_domain(
        self, key: ObjectKey, work: _Work, lm: LibvirtMachine, host: Host, ident: _Identity
    ) -> Result | None:
        """Shut down (gracefully while time allows), then undefine; a requeue while waiting."""
        domain_uuid = str(lm.spec.domain_uuid)
        expected = ident.owner()
        info = await host.get_domain(domain_uuid)
        if info is None:
            return None
        ours, retag = owner_matches(info.owner, expected)
        if not ours:
            raise _Problem(
                Failure(
                    c.Reason.FOREIGN_DOMAIN,
                    f"domain {info.name!r} ({domain_uuid}) does not carry this machine's owner "
                    "tag: it is left untouched and deletion waits; remove it by hand or "
                    "remove the finalizer",
                    False,
                )
            )
        if retag:
            info = await host.retag_domain(domain_uuid, owner=expected)
        if info.state in (DomainState.RUNNING, DomainState.SHUTDOWN, DomainState.BLOCKED):
            elapsed = self.deps.clock.wall() - _deletion_started(lm)
            remaining = self.options.shutdown_timeout - elapsed
            if remaining > 0:
                if key not in self._shutdown_requested:
                    await host.request_shutdown(domain_uuid, owner=expected)
                    self._shutdown_requested.add(key)
                work.status["domainState"] = domain_state_text(info.state.value)
                self._set(
                    work,
                    c.ConditionType.READY,
                    False,
                    c.Reason.DELETING,
                    "waiting for the guest to shut down (ACPI power button)",
                )
                return Result(requeue_after=min(self.options.shutdown_poll, remaining))
        await host.undefine_domain(domain_uuid, owner=expected)
        self._shutdown_requested.discard(key)
        return None

    def _locate_for_delete(self, lm: LibvirtMachine, namespace: str) -> tuple[_Target, str] | None:
        """Host and cluster resource names: from the LibvirtCluster when it still exists,
        else from the placement annotation."""
        record = Placement.decode(lm.metadata.annotation(PLACEMENT_ANNOTATION))
        cluster_name = lm.metadata.label(c.CLUSTER_NAME_LABEL) or (record.cluster if record else "")
        host_name = lm.spec.host_name or (record.host if record else None)
        lcluster = self._libvirt_cluster_for(namespace, cluster_name)
        if lcluster is not None and host_name:
            entry = find_host(lcluster, host_name)
            if entry is not None:
                try:
                    lay = layout(lcluster)
                    return self._target(namespace, entry, lay, lcluster), cluster_name
                except (InvalidObject, _Problem) as exc:
                    log.info(
                        "LibvirtCluster unusable for deletion, using the record", error=str(exc)
                    )
        if record is None:
            return None
        credentials: dict[str, bytes] | None = None
        if record.credentials_secret:
            secret = self.cache.get(SECRET, ObjectKey(namespace, record.credentials_secret))
            if secret is not None:
                credentials = {}
                for item in secret.get("data") or {}:
                    value = _secret_bytes(secret, item)
                    if value is not None:
                        credentials[item] = value
        try:
            host = self.deps.hosts.get(uri=record.uri, credentials=credentials)
        except VirtError as exc:
            log.warning("cannot use the recorded host", error=str(exc))
            return None
        return (
            _Target(
                name=record.host,
                uri=record.uri,
                host=host,
                pool=record.pool,
                network=record.network,
                dns_domain=record.dns_domain,
                bridge_mode=False,
                credentials_secret=record.credentials_secret,
            ),
            cluster_name or record.cluster,
        )

    def _libvirt_cluster_for(self, namespace: str, cluster_name: str) -> LibvirtCluster | None:
        if not cluster_name:
            return None
        cluster_raw = self.cache.get(CLUSTER, ObjectKey(namespace, cluster_name))
        if cluster_raw is not None:
            with contextlib.suppress(InvalidObject):
                return libvirt_cluster_of(self.cache, parse(Cluster, cluster_raw))
        for obj in self.cache.list(LIBVIRT_CLUSTER, namespace=namespace):
            if _cluster_name_of_libvirt_cluster(obj) == cluster_name:
                with contextlib.suppress(InvalidObject):
                    return default_libvirt_cluster(parse(LibvirtCluster, obj))
        return None

    async def _drop_finalizer(self, key: ObjectKey, work: _Work) -> Result:
        remove_finalizer(work.desired, c.MACHINE_FINALIZER)
        with contextlib.suppress(ApiNotFound):
            await apply_patch(self.client, work.current, work.desired, status=False)
        self._forget(key)
        return DONE


# -- helpers ----------------------------------------------------------------------------------


async def _until(work: Awaitable[None], stop: asyncio.Event) -> None:
    """Await `work` unless `stop` is set first (then `work` is cancelled)."""
    task = asyncio.ensure_future(work)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for pending in (task, stopped):
            if not pending.done():
                pending.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await pending


def _union(*mappers: Mapper) -> Mapper:
    def mapper(obj: Obj) -> Iterable[ObjectKey]:
        keys: list[ObjectKey] = []
        for m in mappers:
            keys.extend(m(obj))
        return keys

    return mapper


def _api_unavailable(exc: ApiError) -> bool:
    """No answer, throttled or a server-side error: worth a quick retry, not a traceback."""
    return isinstance(exc, TransportError) or exc.code == 429 or exc.code >= 500


def _default_nic(network: str) -> NicPlan:
    """The one NIC on the cluster network a machine without spec.networkInterfaces has."""
    return NicPlan(index=0, network=network, bridge=None, cluster_network=True, mac=None, ip=None)


def _rv(obj: Obj) -> int:
    try:
        return int(meta(obj).get("resourceVersion") or 0)
    except ValueError:
        return 0


def _condition_true(status_or_obj: Mapping[str, Any], type_: str) -> bool:
    for cond in status_or_obj.get("conditions") or ():
        if cond.get("type") == type_:
            return bool(cond.get("status") == "True")
    return False


_OWN_CONDITIONS = frozenset({c.ConditionType.READY, c.ConditionType.PAUSED, *READY_ORDER})


def _fingerprint(obj: Obj) -> tuple[Any, ...]:
    """What a reconcile acts on besides status: changed by someone else during our write, it
    must be reconciled again (deletion, pause annotation, spec)."""
    md = meta(obj)
    return tuple(
        md.get(f)
        for f in (
            "generation",
            "labels",
            "annotations",
            "finalizers",
            "ownerReferences",
            "deletionTimestamp",
        )
    )


def _repaired(status: Mapping[str, Any]) -> bool:
    for cond in status.get("conditions") or ():
        if cond.get("type") == c.ConditionType.DOMAIN_PROVISIONED:
            return cond.get("status") == "True" and cond.get("reason") in (
                c.Reason.DOMAIN_RESTARTED,
                c.Reason.DOMAIN_RECREATED,
            )
    return False


def _main_changed(work: _Work) -> bool:
    main, _ = diff(work.current, work.desired)
    return bool(main)


def _uuid_from_provider_id(provider_id: str | None) -> str | None:
    if provider_id and provider_id.startswith(c.PROVIDER_ID_PREFIX):
        return provider_id[len(c.PROVIDER_ID_PREFIX) :].lower() or None
    return None


def _parse_time(value: str) -> float:
    try:
        return datetime.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def _deletion_started(lm: LibvirtMachine) -> float:
    stamp = lm.metadata.deletion_timestamp
    if stamp is None:
        return 0.0
    if isinstance(stamp, datetime.datetime):
        if stamp.tzinfo is None:
            stamp = stamp.replace(tzinfo=datetime.UTC)
        return stamp.timestamp()
    return _parse_time(str(stamp))


def _secret_bytes(secret: Mapping[str, Any], key: str) -> bytes | None:
    value = (secret.get("data") or {}).get(key)
    if value is None:
        return None
    try:
        return base64.b64decode(str(value))
    except (binascii.Error, ValueError):
        return None


# -- wiring -----------------------------------------------------------------------------------


def setup(manager: Manager, deps: Deps, *, options: MachineOptions | None = None) -> Controller:
    """Register the LibvirtMachine controller, its indexes, watches and libvirt events.

    `deps.cache` must be `manager.cache`. Returns the Controller (e.g. for tests).
    """
    reconciler = LibvirtMachineReconciler(deps, options=options)
    machines = manager.cache.informer(LIBVIRT_MACHINE)
    machines.add_indexer(INDEX_DOMAIN_UUID, index_domain_uuid)
    machines.add_indexer(INDEX_HOST, index_host)
    machines.add_indexer(INDEX_INTERNAL_IP, index_internal_ip)
    machines.add_indexer(INDEX_PENDING_HOST, index_pending_host)
    manager.cache.informer(MACHINE).add_indexer(INDEX_BOOTSTRAP_SECRET, _BOOTSTRAP_SECRET_INDEXER)
    controller = manager.add_controller(
        CONTROLLER_NAME,
        for_=LIBVIRT_MACHINE,
        reconciler=reconciler,
        watches=reconciler.watches(manager.cache),
    )
    reconciler.bind(controller)
    manager.add_runnable(reconciler.run_events, name="libvirtmachine-events")
    manager.add_runnable(reconciler.run_sweeps, name="libvirtmachine-orphan-sweep")
    return controller


_BOOTSTRAP_SECRET_INDEXER: Callable[[Obj], Iterable[str]] = field_indexer(
    "spec", "bootstrap", "dataSecretName"
)
