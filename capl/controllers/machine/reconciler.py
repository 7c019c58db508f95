"""The LibvirtMachine reconciler: gates, watches and the order of the steps.

Level-based: every reconcile reads the LibvirtMachine (through read-your-writes), its
Machine, Cluster and LibvirtCluster from the cache and the domain from its host, makes the
world match, and reports status with at most one status patch (`scope.MachineScope.close`).
The steps are done by the services of this package; this module only decides their order
(see `LibvirtMachineReconciler._provision`; the gates and the identity patch are in `gates`,
deletion's steps in `delete.delete_steps`) and what wakes a machine.

Gates (the InfraMachine contract, in order)
    owner Machine (a MachineSet-owned object waits until the Machine adopts it) -> pause
    (the Cluster's spec.paused or the paused annotation: the Paused condition is the only
    write, checked before the finalizer and everything else, deletion included) -> finalizer
    -> cluster infrastructure provisioned (never blocks deletion) -> bootstrap data Secret
    (key `value`, optional `format`) -> create.

Identity first
    Placement (`placement`) is chosen and written *before anything is created*, in one spec
    patch together with the finalizer: spec.hostName (Machine.spec.failureDomain is
    authoritative: a conflicting spec.hostName stops here, `placement`), spec.domainUUID
    (a fresh uuid4),
    spec.providerID `libvirt:///<uuid>` (write-once by CEL) and the placement annotation
    (host URI, pool, network; what deletion needs if the LibvirtCluster is gone). The domain
    is defined with that UUID (`domain`, `create`).

What wakes a machine
    Its own object, and what `watches` lists: its Machine, Cluster and LibvirtCluster, its
    bootstrap data and kubeconfig Secrets, libvirt domain lifecycle and host connection
    events (the STARTED echo of our own start is ignored). Each of these "touches" the key:
    a machine settled at Ready (same resourceVersion, nothing touched it since) returns
    without calling libvirt for `settled_ttl`.

API errors
    A reconcile that gets no answer from the API server (connection refused/reset, timeout)
    or a 429/5xx logs one warning line (no traceback) and is retried after a short backoff
    of its own, `retry_first` doubling up to `api_retry_max`, instead of the work queue's
    per-item backoff, which would grow to minutes during an API server outage.

Deletion respects pause, and an object `clusterctl move` deletes (annotation
clusterctl.cluster.x-k8s.io/delete-for-move) only loses its finalizer (`delete`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

import structlog

from capl.api import constants as c
from capl.api.defaults import default_libvirt_machine
from capl.api.machine import LibvirtMachine
from capl.controllers.common import (
    Deps,
    InvalidObject,
    parse,
)
from capl.controllers.machine import (
    cleanup,
    create,
    day2,
    delete,
    domain,
    gates,
    guest,
    ipam,
    network,
    placement,
    watches,
)
from capl.controllers.machine.bootstrap import BootstrapWatcher
from capl.controllers.machine.indexes import (
    INDEX_BOOTSTRAP_SECRET,
    INDEX_DOMAIN_UUID,
    INDEX_HOST,
    INDEX_INTERNAL_IP,
    INDEX_PENDING_HOST,
    bootstrap_secret_indexer,
    index_domain_uuid,
    index_host,
    index_internal_ip,
    index_pending_host,
)
from capl.controllers.machine.memory import Memory
from capl.controllers.machine.options import LOGGER, MachineOptions
from capl.controllers.machine.plan import fault_point
from capl.controllers.machine.plan_orphans import OrphanTracker
from capl.controllers.machine.scope import (
    DONE,
    Context,
    MachineScope,
    Problem,
    condition_true,
)
from capl.ports.virt import DomainEvent, DomainEventKind, HostEvent, HostId, VirtEvent
from capl.runtime.controller import Controller, Result, Watch
from capl.runtime.errors import ApiError, TransportError
from capl.runtime.errors import NotFound as ApiNotFound
from capl.runtime.handlers import (
    Mapper,
)
from capl.runtime.informer import Cache
from capl.runtime.manager import Manager
from capl.runtime.objects import Obj, ObjectKey, meta
from capl.runtime.patch import Patcher
from capl.runtime.resources import LIBVIRT_MACHINE, MACHINE

__all__ = ["CONTROLLER_NAME", "LibvirtMachineReconciler", "setup"]

log = structlog.get_logger(LOGGER)

CONTROLLER_NAME = "libvirtmachine"


class LibvirtMachineReconciler:
    """Reconciles LibvirtMachines; see the module docstring."""

    def __init__(self, deps: Deps, *, options: MachineOptions | None = None) -> None:
        self.deps = deps
        self.cache: Cache = deps.cache
        self.options = options or MachineOptions()
        self.controller: Controller | None = None
        self.memory = Memory(orphan_grace=self.options.orphan_grace)
        self.ctx = Context(
            deps=deps,
            options=self.options,
            memory=self.memory,
            client=deps.client.resource(LIBVIRT_MACHINE),
            watcher=BootstrapWatcher(
                recorder=deps.recorder, clock=deps.clock, options=self.options.bootstrap
            ),
        )

    @property
    def orphans(self) -> OrphanTracker:
        """The orphan sweep's sightings (diagnostics, tests)."""
        return self.memory.orphans

    @property
    def removed(self) -> list[str]:
        """What vanished-object clean-ups removed (diagnostics, tests), newest last."""
        return self.memory.removed

    # -- wiring ------------------------------------------------------------------------------

    def bind(self, controller: Controller) -> None:
        self.controller = controller

    def touch(self, key: ObjectKey) -> None:
        """Something about `key` changed outside the object: forget that it had settled."""
        self.memory.touch(key)

    def touching(self, mapper: Mapper) -> Mapper:
        def mapped(obj: Obj) -> Iterable[ObjectKey]:
            keys = list(mapper(obj))
            for key in keys:
                self.touch(key)
            return keys

        return mapped

    def watches(self, cache: Cache) -> list[Watch]:
        return watches.watches(cache, self.touching)

    async def run_events(self, stop: asyncio.Event) -> None:
        """A manager runnable: libvirt domain/host events -> requeues, while leading."""
        subscription = self.deps.hosts.subscribe(self.on_virt_event, wants=_worth_a_look)
        try:
            await stop.wait()
        finally:
            subscription.close()

    def on_virt_event(self, event: VirtEvent) -> None:
        if isinstance(event, DomainEvent):
            if event.kind is DomainEventKind.DEFINED:
                return
            if event.kind is DomainEventKind.STARTED and self.memory.own_starts.echo(
                event.uuid.lower(), now=self.deps.clock.now()
            ):
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
        return watches.keys_on_host(self.cache, self.deps.hosts, host_id)

    async def run_sweeps(self, stop: asyncio.Event) -> None:
        """A manager runnable (while leading): the orphan sweep (`cleanup`)."""
        await cleanup.run_sweeps(self.ctx, self.controller, stop)

    async def sweep(self) -> list[ObjectKey]:
        """One orphan sweep (`cleanup.sweep`); the keys queued to remove a confirmed orphan."""
        return await cleanup.sweep(self.ctx, self.controller)

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
            record = self.memory.of(key)
            delay = self.options.backoff(record.api_failures, cap=self.options.api_retry_max)
            record.api_failures += 1
            log.warning("API server unavailable, retrying", error=str(exc), retry_in=delay)
            return Result(requeue_after=delay)
        known = self.memory.get(key)
        if known is not None:
            known.api_failures = 0
        return result

    async def _reconcile(self, key: ObjectKey) -> Result:
        memory = self.memory
        obj = memory.writes.read(key, self.cache.get(LIBVIRT_MACHINE, key))
        if memory.has_leftovers(key):
            waiting = await cleanup.remove_vanished(self.ctx, key, obj)
            if waiting is not None:
                return waiting
        if obj is None:
            memory.forget(key)
            return DONE
        record = memory.of(key)
        if record.settled is not None:
            rv, when = record.settled
            if rv == meta(obj).get("resourceVersion") and (
                self.deps.clock.now() - when < self.options.settled_ttl
            ):
                return DONE
            record.settled = None
        epoch = record.epoch
        try:
            lm = default_libvirt_machine(parse(LibvirtMachine, obj))
        except InvalidObject as exc:
            log.warning("cannot read LibvirtMachine", error=str(exc))
            return DONE
        patcher = Patcher(self.ctx.client, obj, writes=memory.writes)
        scope = MachineScope(ctx=self.ctx, key=key, patcher=patcher, lm=lm, record=record)
        if lm.metadata.deletion_timestamp is not None:
            return await delete.delete_steps(scope)
        try:
            result = await self._provision(scope)
        except ApiNotFound:
            # gone under this reconcile (e.g. deleted while our finalizer patch committed,
            # kubernetes/kubernetes#77988): what was made for it must not stay behind
            log.info("LibvirtMachine vanished during the reconcile")
            memory.writes.forget(key)
            record.settled = None
            return await cleanup.remove_vanished(self.ctx, key, None) or DONE
        ready = condition_true(scope.desired.get("status") or {}, c.ConditionType.READY)
        if result == DONE and record.epoch == epoch and not scope.raced and ready:
            rv = str(meta(scope.current).get("resourceVersion"))
            record.settled = (rv, self.deps.clock.now())
        return result

    # -- provisioning: the steps -------------------------------------------------------------

    async def _provision(self, scope: MachineScope) -> Result:
        """The steps of a machine that is not being deleted, and the condition reason each
        leaves behind when it stops the reconcile:

        1. owner Machine        (waits without a write until a Machine owns the object)
        3. pause                Paused: Paused (else NotPaused); checked before any other
                                write: a paused machine gets nothing else, not even the
                                finalizer (the Cluster is read from the cache first)
        2. finalizer, Cluster   DomainProvisioned: WaitingForCluster
        4. infrastructure       DomainProvisioned: WaitingForClusterInfrastructure
        4c. IPAM addresses      IPAddressesClaimed (and DomainProvisioned until provisioned):
                                WaitingForIPAddress, PoolExhausted, InvalidIPAddress
        5. bootstrap data       BootstrapDataDelivered, DomainProvisioned:
                                WaitingForBootstrapData, BootstrapDataInvalid
        6. placement            DomainProvisioned: FailureDomainConflict, HostNotFound,
                                Unreachable, CredentialsInvalid, InternalError
        6b. IPAM on the host    IPAddressesClaimed: AddressOutsideNetwork (a DHCP NIC's
                                address outside the network's CIDR; nothing made)
        7. identity             (the spec patch: hostName, domainUUID, providerID, placement)
        8. domain               DomainProvisioned: Running, DomainRecreated, DomainRestarted,
                                DomainNotRunning, or the libvirt error's reason
        8b. day-2 changes       HardwareUpdated: HardwareApplied, RestartRequired,
                                NotInPlace, HardwareUpdateFailed (`day2`)
        9. network entries      (Events NetworkEntriesRestored/RestoreFailed; a retry)
        10. addresses           AddressAssigned: Assigned, WaitingForAddress
        11. workload Node       (its providerID; requeued every node_poll)
        12. bootstrap success   BootstrapSucceeded: BootstrapSucceeded, WaitingForBootstrap,
                                BootstrapTimedOut
        and the one status write (`scope.close`): Ready summarizes 8, 5 and 10.
        """
        if not gates.owner_machine(scope):  # 1
            return DONE
        if not gates.unpaused(scope):  # 3, before any other write: only Paused changes
            return await scope.close_paused()
        if not (gates.cluster_known(scope) and gates.infrastructure_ready(scope)):
            return await scope.close(DONE)  # 2, 4
        if not gates.not_migrating(scope):
            return await scope.close(DONE)  # 4b: a live migration moves the domain
        claimed = await ipam.claim_addresses(scope)  # 4c
        if isinstance(claimed, Result):
            return await scope.close(claimed)
        try:
            if not scope.lm.spec.domain_uuid:
                scope.bootstrap = create.bootstrap_data(scope)  # 5
                if scope.bootstrap is None:
                    return await scope.close(DONE)
            target = await placement.place(scope)  # 6
        except Problem as problem:
            return await scope.close(scope.fail(problem.failure))
        unusable = ipam.place_addresses(scope, target, claimed)  # 6b
        if unusable is not None:
            return await scope.close(unusable)
        await gates.identity(scope, target)  # 7
        outcome = await domain.ensure_domain(scope)  # 8
        if isinstance(outcome, Result):
            return await scope.close(outcome)
        changed_retry = await day2.apply_changes(scope, outcome)  # 8b
        restore_retry = await network.ensure_network_entries(  # 9
            scope, outcome.observed, made=outcome.created
        )
        if restore_retry is None:
            scope.record.failures = 0
        domain.report_domain(scope, outcome)
        result, have_ip = guest.report_addresses(scope, outcome.observed)  # 10
        if have_ip:
            node_retry = await guest.workload_node(scope)  # 11
            if node_retry is not None:
                result = node_retry
            result = await guest.watch_bootstrap(scope, result)  # 12
        result = await scope.close(_earlier(_earlier(result, restore_retry), changed_retry))
        if outcome.created:
            fault_point("status-written")
        return result


# -- helpers ----------------------------------------------------------------------------------


def _worth_a_look(event: VirtEvent) -> bool:
    """On libvirt's event thread: a domain's definition (one per new machine, ours) is not
    handed to the loop; `on_virt_event` would drop it there."""
    return not (isinstance(event, DomainEvent) and event.kind is DomainEventKind.DEFINED)


def _api_unavailable(exc: ApiError) -> bool:
    """No answer, throttled or a server-side error: worth a quick retry, not a traceback."""
    return isinstance(exc, TransportError) or exc.code == 429 or exc.code >= 500


def _earlier(result: Result, retry: Result | None) -> Result:
    """`result`, or `retry` when it asks to come back sooner."""
    if retry is None:
        return result
    retry_in = retry.requeue_after or 0.0
    if result.requeue_after is None or retry_in < result.requeue_after:
        return retry
    return result


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
    manager.cache.informer(MACHINE).add_indexer(INDEX_BOOTSTRAP_SECRET, bootstrap_secret_indexer)
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
