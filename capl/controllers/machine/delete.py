"""Deleting a machine: its domain, shut down first, then its volumes and network entries.

Ready False/`Deleting`; an ACPI shutdown is requested (once, `MachineMemory.
shutdown_requested`) and the machine requeued until the domain is off or `shutdown_timeout`
since metadata.deletionTimestamp passed (no worker waits); then undefine (NVRAM/snapshot
metadata) after checking UUID + ownership tag; then volumes by name prefix (root, extra,
Ignition/ISO, console log), DHCP reservations and the DNS name (`create.remove_resources`);
not-found is success. A missing Machine, Cluster or LibvirtCluster does not block: the host
comes from the LibvirtCluster when it exists, else from the placement annotation
(`placement.locate`). A domain with this UUID and another owner tag is never touched:
deletion waits, Ready says `ForeignDomain` in its message (remove it by hand or remove the
finalizer).
"""

from __future__ import annotations

import datetime

from capl.api import constants as c
from capl.api.machine import LibvirtMachine
from capl.controllers.machine.create import remove_resources
from capl.controllers.machine.plan import Failure, dns_name, domain_state_text, owner_matches
from capl.controllers.machine.scope import MachineScope, Problem
from capl.controllers.machine.target import Identity, Target
from capl.ports.virt import DomainState
from capl.runtime.controller import Result

__all__ = ["remove_machine"]


async def remove_machine(scope: MachineScope, target: Target, ident: Identity) -> Result | None:
    """The domain (after its shutdown), then the volumes and network entries; a requeue
    while the guest shuts down. Raises Problem or VirtError."""
    if scope.lm.spec.domain_uuid:
        waiting = await _remove_domain(scope, target, ident)
        if waiting is not None:
            return waiting
    await remove_resources(
        target.host,
        pool=target.pool,
        network=target.network,
        spec=scope.lm.spec,
        ident=ident,
        fqdn=_fqdn(ident, target),
    )
    return None


async def _remove_domain(scope: MachineScope, target: Target, ident: Identity) -> Result | None:
    """Shut down (gracefully while time allows), then undefine; a requeue while waiting."""
    lm, host, record, options = scope.lm, target.host, scope.record, scope.ctx.options
    domain_uuid = str(lm.spec.domain_uuid)
    expected = ident.owner()
    info = await host.get_domain(domain_uuid)
    if info is None:
        return None
    ours, retag = owner_matches(info.owner, expected)
    if not ours:
        raise Problem(
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
        elapsed = scope.ctx.deps.clock.wall() - _deletion_started(lm)
        remaining = options.shutdown_timeout - elapsed
        if remaining > 0:
            if not record.shutdown_requested:
                await host.request_shutdown(domain_uuid, owner=expected)
                record.shutdown_requested = True
            scope.status["domainState"] = domain_state_text(info.state.value)
            scope.set(
                c.ConditionType.READY,
                False,
                c.Reason.DELETING,
                "waiting for the guest to shut down (ACPI power button)",
            )
            return Result(requeue_after=min(options.shutdown_poll, remaining))
    await host.undefine_domain(domain_uuid, owner=expected)
    record.shutdown_requested = False
    return None


def _fqdn(ident: Identity, target: Target) -> str | None:
    return dns_name(ident.hostname, target.dns_domain)


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
