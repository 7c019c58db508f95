"""One reconcile of one LibvirtMachine: its objects, their patcher, and the one status write.

A `MachineScope` is made per reconcile (after CAPMOX's pkg/scope): the LibvirtMachine as
read (through read-your-writes, `capl.runtime.patch`) and the copy being changed, its
model, the key's memory record, and what the gates find on the way — the owner Machine, the
Cluster, the LibvirtCluster, and once placed (`Placed`) the target host, the identity and the
domain UUID. Services read and change the scope instead of taking long argument lists.

Writes. The identity (spec.hostName, domainUUID, providerID, the placement annotation) and
the finalizer go in one spec patch with a resourceVersion precondition (`write_main`: a
stale read answers 409 and the reconcile is retried), keeping the status being computed. The
reconcile ends with `close(result)`: Ready summarizes DomainProvisioned,
BootstrapDataDelivered and AddressAssigned, observedGeneration is set, and at most one status
patch is sent (none when nothing changed). A write that shows someone else's change to what
a reconcile acts on (deletion, pause annotation, spec) marks the scope `raced`: it is not
taken as settled. From create to Ready: one spec patch, one or two status patches.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from capl.api import constants as c
from capl.api.capi import Cluster, Machine
from capl.api.cluster import LibvirtCluster
from capl.api.machine import LibvirtMachine, LibvirtMachineSpec
from capl.controllers.common import Deps, remove_finalizer
from capl.controllers.machine.bootstrap import BootstrapWatcher
from capl.controllers.machine.memory import MachineMemory, Memory
from capl.controllers.machine.options import MachineOptions
from capl.controllers.machine.plan import BootstrapData, Failure, dns_name
from capl.controllers.machine.plan_ipam import ClaimedAddress
from capl.controllers.machine.target import Identity, Leftover, Target
from capl.runtime.client import ResourceClient
from capl.runtime.conditions import get_condition, rfc3339, set_condition, summarize
from capl.runtime.controller import Result
from capl.runtime.errors import NotFound as ApiNotFound
from capl.runtime.events import EventType
from capl.runtime.informer import Cache
from capl.runtime.objects import Obj, ObjectKey, copy_obj, meta
from capl.runtime.patch import Patcher, diff

__all__ = [
    "DONE",
    "READY_ORDER",
    "Context",
    "MachineScope",
    "Placed",
    "Problem",
    "condition_true",
]

DONE = Result()
READY_ORDER = (
    c.ConditionType.DOMAIN_PROVISIONED,
    c.ConditionType.BOOTSTRAP_DATA_DELIVERED,
    c.ConditionType.ADDRESS_ASSIGNED,
)
_OWN_CONDITIONS = frozenset({c.ConditionType.READY, c.ConditionType.PAUSED, *READY_ORDER})


class Problem(Exception):
    """A gate or step that cannot go on: condition + retry policy."""

    def __init__(self, failure: Failure) -> None:
        super().__init__(failure.message)
        self.failure = failure


@dataclass(frozen=True, slots=True, kw_only=True)
class Context:
    """What every reconcile and service of the controller shares."""

    deps: Deps
    options: MachineOptions
    memory: Memory
    client: ResourceClient
    """The LibvirtMachine client."""
    watcher: BootstrapWatcher

    @property
    def cache(self) -> Cache:
        return self.deps.cache

    def now(self) -> str:
        return rfc3339(self.deps.clock.wall())


@dataclass(frozen=True, slots=True, kw_only=True)
class Placed:
    """A machine with its identity recorded: where it lives and under which names."""

    machine: Machine
    target: Target
    ident: Identity
    domain_uuid: str
    provisioned: bool
    """status.initialization.provisioned as read: the domain existed once (a missing one
    is recreated and reported so)."""

    @property
    def fqdn(self) -> str | None:
        return dns_name(self.ident.hostname, self.target.dns_domain)

    def leftover(self, spec: LibvirtMachineSpec) -> Leftover:
        """What is made for this incarnation, should it vanish (MachineMemory.made)."""
        return Leftover(
            ident=self.ident, domain_uuid=self.domain_uuid, target=self.target, spec=spec
        )


@dataclass(slots=True, kw_only=True)
class MachineScope:
    """The objects of one reconcile (see the module docstring)."""

    ctx: Context
    key: ObjectKey
    patcher: Patcher
    lm: LibvirtMachine
    record: MachineMemory
    cluster_name: str = ""
    machine: Machine | None = None
    cluster: Cluster | None = None
    lcluster: LibvirtCluster | None = None
    bootstrap: BootstrapData | None = None
    placed: Placed | None = None
    raced: bool = False
    ipam_static: tuple[tuple[str, ClaimedAddress], ...] = ()
    ipam_addresses: tuple[str, ...] = ()
    """The NICs' IPAM addresses in NIC order (reported first in status.addresses)."""
    """(MAC, address) of the NICs whose IPAM address goes into the bootstrap data as static
    configuration (`ipam.place_addresses`)."""
    """Our last write returned an object someone else changed meanwhile."""

    @property
    def current(self) -> Obj:
        """The object as the server has it (as read, or as our last write returned it)."""
        return self.patcher.original

    @property
    def desired(self) -> Obj:
        return self.patcher.obj

    @property
    def status(self) -> dict[str, Any]:
        status: dict[str, Any] = self.desired.setdefault("status", {})
        return status

    @property
    def namespace(self) -> str:
        return self.lm.metadata.namespace or ""

    @property
    def on(self) -> Placed:
        """Where the machine lives; only after placement (a bug otherwise)."""
        assert self.placed is not None, "placement comes first"
        return self.placed

    # -- conditions -------------------------------------------------------------------------

    def set(self, type_: str, status: bool, reason: str, message: str = "") -> None:
        set_condition(self.desired, type_, status, reason=reason, message=message, now=self.ctx.now)

    def fail(self, failure: Failure, *, event: bool = True) -> Result:
        """Report a failure (condition, Warning event once) and say when to retry."""
        options = self.ctx.options
        cond = get_condition(self.current, failure.condition)
        repeated = cond is not None and cond.get("reason") == failure.reason
        self.set(failure.condition, False, failure.reason, failure.message)
        if failure.condition != c.ConditionType.DOMAIN_PROVISIONED and not condition_true(
            self.status, c.ConditionType.DOMAIN_PROVISIONED
        ):
            self.set(c.ConditionType.DOMAIN_PROVISIONED, False, failure.reason, failure.message)
        if event and not repeated:
            self.event("Warning", failure.reason, failure.message)
        if not failure.transient:
            return Result(requeue_after=options.terminal_retry)
        delay = options.backoff(self.record.failures)
        self.record.failures += 1
        return Result(requeue_after=delay)

    def event(self, type_: EventType, reason: str, message: str) -> None:
        self.ctx.deps.recorder.event(self.current, type_, reason, message)

    # -- writes -----------------------------------------------------------------------------

    def main_changed(self) -> bool:
        main, _ = diff(self.current, self.desired)
        return bool(main)

    async def write_main(self) -> None:
        """Metadata/spec changes only (identity, finalizer), with a resourceVersion
        precondition: a stale read answers 409 and the reconcile is retried. The status
        being computed is kept."""
        status = self.desired.get("status")
        await self.patcher.apply(precondition=True, status=False)
        if status is not None:
            self.desired["status"] = status

    async def close(self, result: Result) -> Result:
        """The end of a reconcile that provisions: Ready, observedGeneration, one write."""
        summarize(
            self.desired,
            READY_ORDER,
            true_reason=c.Reason.READY,
            missing_reason=c.Reason.PROVISIONING,
            now=self.ctx.now,
        )
        generation = meta(self.desired).get("generation")
        if isinstance(generation, int):
            self.status["observedGeneration"] = generation
            for cond in self.status.get("conditions") or ():
                if cond.get("type") in _OWN_CONDITIONS:
                    cond["observedGeneration"] = generation
        intended = _fingerprint(self.desired)
        before = self.current
        new = await self.patcher.apply()
        if new is not before:
            self.raced = _fingerprint(new) != intended
        return result

    async def close_paused(self) -> Result:
        """The end of a reconcile stopped by pause: the Paused condition (set by the gate) is
        the only change written — no finalizer, no Ready summary, no observedGeneration
        besides the condition's own."""
        paused = get_condition(self.desired, c.ConditionType.PAUSED)
        assert paused is not None, "the pause gate sets the condition"
        self.patcher.obj = copy_obj(self.current)
        conditions: list[dict[str, Any]] = self.status.setdefault("conditions", [])
        at = [i for i, cond in enumerate(conditions) if cond.get("type") == c.ConditionType.PAUSED]
        if at:
            conditions[at[0]] = dict(paused)
        else:
            conditions.append(dict(paused))
        if self.patcher.changed():
            await self.patcher.apply()
        return DONE

    async def close_deleting(self, result: Result) -> Result:
        """The end of a deletion step that waits (shutdown) or failed: its conditions."""
        with contextlib.suppress(ApiNotFound):
            await self.patcher.apply()
            return result
        return DONE

    async def release(self) -> Result:
        """Drop the finalizer (the object may go at once) and forget the key."""
        remove_finalizer(self.desired, c.MACHINE_FINALIZER)
        with contextlib.suppress(ApiNotFound):
            await self.patcher.apply(status=False)
        self.ctx.memory.forget(self.key)
        return DONE


def condition_true(status_or_obj: Mapping[str, Any], type_: str) -> bool:
    for cond in status_or_obj.get("conditions") or ():
        if cond.get("type") == type_:
            return bool(cond.get("status") == "True")
    return False


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
