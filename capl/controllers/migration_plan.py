"""Pure decisions of the LibvirtMachineMigration controller: no I/O, no clock.

- `choose_target`: which host may take the machine (or why none may);
- `recover`: what to do with a migration that was in flight when the manager lost track of
  it (restart, crash, leader change), from where libvirt says the domain is now;
- `migration_address`: where QEMU on the destination listens for the migration stream.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from capl.api.cluster import LibvirtHost
from capl.ports.virt.migration import Whereabouts

__all__ = [
    "MIGRATION_FAULT_STEPS",
    "Candidate",
    "NoTarget",
    "Recovery",
    "choose_target",
    "migration_address",
    "recover",
]


MIGRATION_FAULT_STEPS: tuple[str, ...] = (
    "migration-scheduled",  # status PreparingTarget and the machine's migrationTarget written
    "migration-prepared",  # the destination prepared, the job not started
    "migration-running",  # the libvirt job in flight (its first progress report)
    "migration-moved",  # libvirt moved the domain; the machine's hostName not yet changed
    "migration-recorded",  # hostName changed; the source not cleaned yet
)
"""Where `CAPL_FAULT=<step>` (capl.controllers.machine.plan.fault_point) kills the manager
during a migration, for the crash tests (tests/multihost/test_migration_crash.py)."""


@dataclass(frozen=True, slots=True)
class Candidate:
    """One host of the machine's cluster, as the LibvirtCluster reports it."""

    name: str
    reachable: bool
    in_maintenance: bool
    control_plane_allowed: bool
    machines: int = 0
    """Machines of the cluster on it now (the emptiest host wins)."""


@dataclass(frozen=True, slots=True)
class NoTarget:
    """Why no host can take the machine (the NoTargetHost message)."""

    message: str


def choose_target(
    *,
    source: str,
    requested: str | None,
    candidates: Sequence[Candidate],
    control_plane: bool,
    control_plane_hosts: Iterable[str] = (),
) -> str | NoTarget:
    """The destination: `requested` when it is acceptable, else the acceptable host with the
    fewest machines (then by name). Acceptable: another host of the cluster, reachable, not
    in maintenance; for a control-plane machine also one that allows control planes and runs
    no other control-plane machine of the cluster (one per failure domain)."""
    busy = set(control_plane_hosts) - {source}
    reasons: dict[str, str] = {}
    ok: list[Candidate] = []
    for host in candidates:
        if host.name == source:
            reasons[host.name] = "the machine runs there"
        elif host.in_maintenance:
            reasons[host.name] = "in maintenance"
        elif not host.reachable:
            reasons[host.name] = "unreachable"
        elif control_plane and not host.control_plane_allowed:
            reasons[host.name] = "does not take control-plane machines (controlPlane: false)"
        elif control_plane and host.name in busy:
            reasons[host.name] = "runs another control-plane machine of the cluster"
        else:
            ok.append(host)
    if requested is not None:
        if requested in {h.name for h in ok}:
            return requested
        why = reasons.get(requested, "not a host of the machine's LibvirtCluster")
        return NoTarget(f"targetHost {requested}: {why}")
    if not ok:
        detail = "; ".join(f"{name}: {why}" for name, why in sorted(reasons.items()))
        return NoTarget(f"no host of the cluster can take the machine ({detail or 'no hosts'})")
    return min(ok, key=lambda h: (h.machines, h.name)).name


class Recovery(enum.StrEnum):
    FINALIZE = "Finalize"
    """The domain runs on the target: record that, clean the source."""
    RESTART = "Restart"
    """Nothing was moved yet and nothing is in flight: prepare and migrate again."""
    FAIL = "Fail"
    """The job ended without moving the domain: undo the preparation, report Failed."""
    WAIT = "Wait"
    """A job is still in flight on the hosts (the destination holds an incoming domain)."""
    CONFLICT = "Conflict"
    """The domain is active on both hosts: never resolved automatically."""
    LOST = "Lost"
    """Active on neither host: report Failed; the machine controller takes over."""


def recover(*, phase: str | None, where: Whereabouts, abort_requested: bool) -> Recovery:
    """What to do with a migration found in `phase` with no job of ours watching it.

    libvirt ends a managed migration whose driving client went away (its connection close
    callback cancels the job), so a domain still on the source means the job is over. Only
    a migration that had not started its job yet is restarted; one whose job was running is
    reported Failed (the operator or the maintenance decides whether to try again)."""
    if where is Whereabouts.DESTINATION:
        return Recovery.FINALIZE
    if where is Whereabouts.INCOMING:
        return Recovery.WAIT
    if where is Whereabouts.BOTH:
        return Recovery.CONFLICT
    if where is Whereabouts.ABSENT:
        return Recovery.LOST
    if phase == "PreparingTarget" and not abort_requested:
        return Recovery.RESTART
    return Recovery.FAIL


def migration_address(host: LibvirtHost) -> str | None:
    """Where the destination's QEMU listens: spec.hosts[].migrationAddress, else the host
    part of its URI (None for a URI without one, e.g. qemu:///system)."""
    if host.migration_address:
        return host.migration_address
    hostname = urlsplit(str(host.uri)).hostname
    return hostname or None
