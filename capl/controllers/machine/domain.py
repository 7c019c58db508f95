"""The machine's domain: found by UUID, created when missing, started when stopped.

The domain is defined with the UUID recorded in spec.domainUUID before anything was
created, so a crash at any later point finds it again by UUID, and `clusterctl move` (which
restores no status) loses nothing. A domain with the UUID but another owner tag is never
touched (`ForeignDomain`); one that differs only in the owner's UID (a moved object) is
retagged. From the first look on, what exists (or is about to) belongs to this incarnation
(`MachineMemory.made`: removed if the incarnation vanishes).

Conditions left behind (DomainProvisioned):
- `Running`: the domain runs (created now, or found running);
- `DomainRecreated`: a provisioned machine's domain was deleted out of band and recreated
  with the same UUID (Warning event); kept until the condition changes;
- `DomainRestarted`: a provisioned machine's domain had stopped and was started again
  (Warning event); kept until the condition changes;
- `DomainNotRunning`: the guest is shutting down; it is started again once it is off (the
  lifecycle event brings the reconcile back);
- a libvirt error's reason (`plan.classify`), with backoff.
BootstrapDataDelivered=True/`Delivered` once the domain exists with its bootstrap volume.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from capl.api import constants as c
from capl.controllers.machine.create import bootstrap_data, create, start_domain
from capl.controllers.machine.plan import classify, domain_state_text, owner_matches
from capl.controllers.machine.scope import MachineScope, Problem, condition_true
from capl.ports.errors import ForeignDomainError, VirtError
from capl.ports.virt import DomainInfo, DomainState, InterfaceAddress
from capl.runtime.controller import Result

__all__ = ["DomainOutcome", "ensure_domain", "report_domain"]


@dataclass(frozen=True, slots=True, kw_only=True)
class DomainOutcome:
    """The domain as this reconcile left it."""

    info: DomainInfo
    repaired: str | None
    """Running (created now), DomainRecreated or DomainRestarted; None: found as it was."""
    observed: list[InterfaceAddress]
    """The addresses the host reports (DHCP lease, guest agent) while it runs."""

    @property
    def created(self) -> bool:
        """The domain (and its reservations) was made by this reconcile."""
        return self.repaired is not None and self.repaired != c.Reason.DOMAIN_RESTARTED


async def ensure_domain(scope: MachineScope) -> DomainOutcome | Result:
    """The running domain, or the Result to close the reconcile with (conditions set)."""
    on = scope.on
    scope.status["host"] = on.target.name
    scope.status["failureDomain"] = on.target.name
    try:
        return await _ensure(scope)
    except Problem as problem:
        return scope.fail(problem.failure)
    except VirtError as exc:
        return scope.fail(classify(exc))


async def _ensure(scope: MachineScope) -> DomainOutcome | Result:
    on = scope.on
    host, expected, domain_uuid = on.target.host, on.ident.owner(), on.domain_uuid
    info = await host.get_domain(domain_uuid)
    if info is not None:
        ours, retag = owner_matches(info.owner, expected)
        if not ours:
            raise ForeignDomainError(
                f"domain {info.name!r} with this machine's UUID {domain_uuid} on host "
                f"{on.target.name} carries another owner tag; it is left untouched",
                name=info.name,
            )
        if retag:
            info = await host.retag_domain(domain_uuid, owner=expected)
    # from here on, what exists (or is about to) belongs to this incarnation
    scope.record.made = on.leftover(scope.lm.spec)
    repaired: str | None = None
    if info is None:
        created = await _create(scope)
        if isinstance(created, Result):
            return created
        info, repaired = (
            created,
            (c.Reason.DOMAIN_RECREATED if on.provisioned else c.Reason.RUNNING),
        )
    elif info.state is DomainState.SHUTDOWN:
        # the guest is shutting down: start it again once it is off (event)
        set_domain_state(scope, info)
        scope.set(
            c.ConditionType.DOMAIN_PROVISIONED,
            False,
            c.Reason.DOMAIN_NOT_RUNNING,
            "the domain is shutting down; it is started again when it is off",
        )
        return Result(requeue_after=scope.ctx.options.address_poll)
    elif info.state is not DomainState.RUNNING:
        info = await _restart(scope, info)
        if on.provisioned:
            repaired = c.Reason.DOMAIN_RESTARTED
    observed = await host.domain_addresses(domain_uuid) if info.state is DomainState.RUNNING else []
    return DomainOutcome(info=info, repaired=repaired, observed=observed)


async def _create(scope: MachineScope) -> DomainInfo | Result:
    """Create the missing domain (a first creation, or a recreation) and say so."""
    on = scope.on
    bootstrap = scope.bootstrap or bootstrap_data(scope)
    if bootstrap is None:
        return Result()
    info = await create(scope, bootstrap)
    fmt = "Ignition" if bootstrap.format is c.BootstrapFormat.IGNITION else "NoCloud"
    scope.set(
        c.ConditionType.BOOTSTRAP_DATA_DELIVERED,
        True,
        c.Reason.DELIVERED,
        f"{fmt} bootstrap data attached to the domain",
    )
    if on.provisioned:
        message = (
            f"domain {on.domain_uuid} was gone from host {on.target.name} and was "
            "recreated with the same UUID"
        )
        scope.event("Warning", c.Reason.DOMAIN_RECREATED, message)
    else:
        scope.event(
            "Normal",
            "DomainCreated",
            f"domain {info.name} ({on.domain_uuid}) started on host {on.target.name}",
        )
    return info


async def _restart(scope: MachineScope, before: DomainInfo) -> DomainInfo:
    """Start a stopped domain; a provisioned machine reports it (DomainRestarted)."""
    on = scope.on
    info = await start_domain(scope.ctx, on.target.host, on.domain_uuid, on.ident.owner())
    if on.provisioned:
        message = (
            f"domain {info.name} was {before.state.value} ({before.reason}); "
            f"started it again at {scope.ctx.now()}"
        )
        scope.event("Warning", c.Reason.DOMAIN_RESTARTED, message)
        scope.set(c.ConditionType.DOMAIN_PROVISIONED, True, c.Reason.DOMAIN_RESTARTED, message)
    return info


def report_domain(scope: MachineScope, outcome: DomainOutcome) -> None:
    """status.domainState, DomainProvisioned and BootstrapDataDelivered once it runs."""
    set_domain_state(scope, outcome.info)
    status = scope.status
    if outcome.repaired == c.Reason.DOMAIN_RECREATED:
        scope.set(
            c.ConditionType.DOMAIN_PROVISIONED,
            True,
            c.Reason.DOMAIN_RECREATED,
            f"the domain had been deleted out of band and was recreated at {scope.ctx.now()}",
        )
    elif outcome.repaired != c.Reason.DOMAIN_RESTARTED and not _repaired(status):
        # a repair report (restarted, recreated) stays until the condition changes
        scope.set(c.ConditionType.DOMAIN_PROVISIONED, True, c.Reason.RUNNING)
    if not condition_true(status, c.ConditionType.BOOTSTRAP_DATA_DELIVERED):
        scope.set(
            c.ConditionType.BOOTSTRAP_DATA_DELIVERED,
            True,
            c.Reason.DELIVERED,
            "bootstrap data attached to the domain",
        )


def set_domain_state(scope: MachineScope, info: DomainInfo) -> None:
    scope.status["domainState"] = domain_state_text(info.state.value)


def _repaired(status: Mapping[str, Any]) -> bool:
    for cond in status.get("conditions") or ():
        if cond.get("type") == c.ConditionType.DOMAIN_PROVISIONED:
            return bool(
                cond.get("status") == "True"
                and cond.get("reason") in (c.Reason.DOMAIN_RESTARTED, c.Reason.DOMAIN_RECREATED)
            )
    return False
