"""Pure decisions of host maintenance: what happens to each machine on a host in maintenance,
and what `status.hosts[].maintenance` says. No I/O and no clock: the service
(`cluster_maintenance`) reads the cache, passes `now` (wall seconds) in and carries out the
actions this returns.

Per machine on a host in maintenance, by its effective `evictionStrategy`:

- an evacuation migration of it that has not finished, a live migration by someone else
  (`spec.migrationTarget` set) or a deletion in progress (its LibvirtMachine or its Machine):
  it is on its way; nothing new is done.
- `LiveMigrate` / `LiveMigrateIfPossible`: create a LibvirtMachineMigration (no target host;
  the deterministic name of `migration_name`, so a crash or a second reconcile never makes
  two) — at most `max_parallel` unfinished evacuation migrations per cluster, and a
  control-plane machine only while no other control-plane machine of the cluster migrates
  or is being deleted. The migration failed: `LiveMigrateIfPossible` falls back to
  `Recreate` (the failed migration stays as the record of that); `LiveMigrate` is blocked
  until `retry_backoff` after the failure, then the failed migration is deleted and the next
  pass creates a new one. A migration that succeeded while its machine still shows this
  host is the cache catching up, unless that lasts longer than `retry_backoff` (a stale
  one from an earlier maintenance): then it is deleted and made again.
- `Recreate`: delete the owner Machine (its MachineSet or KubeadmControlPlane creates a
  replacement, which placement keeps off the cordoned host), once, then wait until the
  LibvirtMachine is gone. No owner Machine: blocked. A control-plane machine: only one at a
  time, only while every other control-plane machine is provisioned (the previous
  replacement is up), and never the cluster's last one (its etcd would go with it).
- `None`: blocked ("evictionStrategy None").

A host's phase: `Evacuated` when no machine of the cluster is left on it, else `Blocked` when
some machine cannot leave (the message names only those, so it changes — and the
EvictionBlocked event repeats — only when that set or its causes change), else `Evacuating`
(the message says what each machine waits for). Evacuation migrations of hosts that are no
longer in maintenance are deleted (an unfinished one is aborted by that).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal, get_args

from capl.api.machine import DEFAULT_EVICTION_STRATEGY, EvictionStrategy
from capl.api.migration import TERMINAL_PHASES
from capl.runtime.conditions import rfc3339

__all__ = [
    "MAX_MESSAGE",
    "Action",
    "ControlPlaneState",
    "CreateMigration",
    "DeleteMachine",
    "DeleteMigration",
    "HostInMaintenance",
    "HostOutcome",
    "MachineView",
    "MaintenancePhase",
    "MaintenancePlan",
    "MigrationView",
    "Settings",
    "effective_strategy",
    "migration_name",
    "plan_maintenance",
]

MaintenancePhase = Literal["Evacuating", "Blocked", "Evacuated"]
MAX_NAME: Final = 63
MAX_MESSAGE: Final = 1024
"""Bound of status.hosts[].maintenance.message (the CRD's maxLength)."""
NAME_PREFIX: Final = "evacuate-"


def migration_name(machine: str, uid: str, host: str) -> str:
    """The evacuation migration of one machine (by UID) from one host: `evacuate-<machine>-
    <8 hex of sha256(host/uid)>`, at most 63 characters, the same on every reconcile."""
    digest = hashlib.sha256(f"{host}/{uid}".encode()).hexdigest()[:8]
    stem = f"{NAME_PREFIX}{machine}"[: MAX_NAME - len(digest) - 1].rstrip("-.")
    return f"{stem}-{digest}"


_STRATEGIES: Final[dict[str, EvictionStrategy]] = {s: s for s in get_args(EvictionStrategy)}


def effective_strategy(value: object) -> EvictionStrategy:
    """spec.evictionStrategy, or the default (LiveMigrateIfPossible) when unset."""
    if not value:
        return DEFAULT_EVICTION_STRATEGY
    return _STRATEGIES.get(str(value), DEFAULT_EVICTION_STRATEGY)


# --- inputs ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class MachineView:
    """A LibvirtMachine of the cluster on a host in maintenance."""

    name: str
    uid: str
    strategy: EvictionStrategy = DEFAULT_EVICTION_STRATEGY
    control_plane: bool = False
    owner: str | None = None
    """The Cluster API Machine that owns it (None: none does)."""
    owner_uid: str | None = None
    deleting: bool = False
    """The LibvirtMachine has a deletionTimestamp."""
    owner_deleting: bool = False
    """Its Machine is being deleted (by a Recreate, or by anyone)."""
    migrating_to: str | None = None
    """spec.migrationTarget: a live migration moves it right now."""

    @property
    def leaving(self) -> bool:
        return self.deleting or self.owner_deleting


@dataclass(frozen=True, slots=True, kw_only=True)
class MigrationView:
    """An evacuation migration this LibvirtCluster created (label and owner reference)."""

    name: str
    uid: str
    machine: str
    host: str
    """The evacuation-host label: the host it evacuates."""
    phase: str | None = None
    reason: str | None = None
    """The Succeeded condition's reason (MigrationFailed, MigrationAborted, NoTargetHost)."""
    message: str | None = None
    finished_at: float | None = None
    """Wall seconds it finished (completionTime; the service falls back to other times)."""
    deleting: bool = False
    control_plane: bool = False
    """Its machine is a control-plane machine."""

    @property
    def finished(self) -> bool:
        return self.phase in TERMINAL_PHASES

    @property
    def running(self) -> bool:
        return not self.finished


@dataclass(frozen=True, slots=True, kw_only=True)
class HostInMaintenance:
    name: str
    machines: tuple[MachineView, ...] = ()
    """The cluster's machines whose spec.hostName is this host."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ControlPlaneState:
    """The cluster's control-plane LibvirtMachines, wherever they are."""

    disrupted: tuple[str, ...] = ()
    """Migrating (spec.migrationTarget) or being deleted (LibvirtMachine or Machine)."""
    unsettled: tuple[str, ...] = ()
    """Not provisioned yet (e.g. the replacement of the one recreated before)."""
    live: int = 0
    """Not being deleted."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    max_parallel: int = 2
    """Unfinished evacuation migrations per cluster at most."""
    retry_backoff: float = 300.0
    """Seconds after a failed LiveMigrate evacuation before it is tried again."""


# --- outputs ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CreateMigration:
    name: str
    machine: str
    host: str


@dataclass(frozen=True, slots=True)
class DeleteMigration:
    name: str
    uid: str
    why: str


@dataclass(frozen=True, slots=True)
class DeleteMachine:
    name: str
    """The Cluster API Machine."""
    uid: str | None
    libvirt_machine: str
    host: str


Action = CreateMigration | DeleteMigration | DeleteMachine


@dataclass(frozen=True, slots=True, kw_only=True)
class HostOutcome:
    phase: MaintenancePhase
    machines: int
    message: str | None = None

    def status(self) -> dict[str, Any]:
        """status.hosts[].maintenance."""
        entry: dict[str, Any] = {"phase": self.phase, "machines": self.machines}
        if self.message:
            entry["message"] = self.message
        return entry


@dataclass(frozen=True, slots=True, kw_only=True)
class MaintenancePlan:
    actions: tuple[Action, ...] = ()
    hosts: Mapping[str, HostOutcome] = field(default_factory=dict)
    """Per host in maintenance, in the order given."""
    next_retry: float | None = None
    """Wall seconds of the earliest backoff that ends (a requeue then)."""

    @property
    def busy(self) -> bool:
        """Something is still to happen (requeue while evacuating)."""
        return any(o.phase != "Evacuated" for o in self.hosts.values())


# --- the decision ----------------------------------------------------------------------------


@dataclass(slots=True)
class _Pass:
    """What one planning pass has decided so far (the caps count its own decisions)."""

    settings: Settings
    now: float
    migrations: Mapping[tuple[str, str], MigrationView]
    running: int
    cp: ControlPlaneState
    cp_disrupted: list[str]
    actions: list[Action] = field(default_factory=list)
    retries: list[float] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class _Verdict:
    blocked: bool
    text: str


def plan_maintenance(
    hosts: Sequence[HostInMaintenance],
    migrations: Sequence[MigrationView],
    *,
    control_plane: ControlPlaneState,
    settings: Settings,
    now: float,
) -> MaintenancePlan:
    """Actions and host outcomes for this reconcile; see the module docstring."""
    in_maintenance = {h.name for h in hosts}
    disrupted = list(control_plane.disrupted)
    disrupted += [m.machine for m in migrations if m.running and m.control_plane]
    state = _Pass(
        settings=settings,
        now=now,
        migrations={(m.host, m.name): m for m in migrations},
        running=sum(1 for m in migrations if m.running),
        cp=control_plane,
        cp_disrupted=disrupted,
    )
    for stray in migrations:
        if stray.host not in in_maintenance and not stray.deleting:
            state.actions.append(
                DeleteMigration(stray.name, stray.uid, f"host {stray.host} left maintenance")
            )
    outcomes: dict[str, HostOutcome] = {}
    for host in hosts:
        machines = sorted(host.machines, key=lambda m: m.name)
        verdicts = [_decide(state, host.name, m) for m in machines]
        outcomes[host.name] = _outcome(machines, verdicts)
    return MaintenancePlan(
        actions=tuple(state.actions),
        hosts=outcomes,
        next_retry=min(state.retries) if state.retries else None,
    )


def _outcome(machines: Sequence[MachineView], verdicts: Sequence[_Verdict]) -> HostOutcome:
    if not machines:
        return HostOutcome(phase="Evacuated", machines=0)
    blocked = [f"{m.name}: {v.text}" for m, v in zip(machines, verdicts, strict=True) if v.blocked]
    if blocked:
        return HostOutcome(phase="Blocked", machines=len(machines), message=_join(blocked))
    moving = [f"{m.name}: {v.text}" for m, v in zip(machines, verdicts, strict=True)]
    return HostOutcome(phase="Evacuating", machines=len(machines), message=_join(moving))


def _join(parts: Iterable[str]) -> str:
    text = "; ".join(parts)
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 3] + "..."


def _decide(state: _Pass, host: str, machine: MachineView) -> _Verdict:
    mine = state.migrations.get((host, migration_name(machine.name, machine.uid, host)))
    if mine is not None and mine.running:
        what = "being aborted" if mine.deleting else (mine.phase or "Pending")
        return _Verdict(False, f"live migration {mine.name} {what}")
    if machine.leaving:
        return _Verdict(False, "being deleted")
    if machine.migrating_to:
        return _Verdict(False, f"being migrated to {machine.migrating_to}")
    strategy = machine.strategy
    if strategy == "None":
        return _Verdict(True, "evictionStrategy None")
    if mine is not None and mine.deleting:
        return _Verdict(False, f"live migration {mine.name} is being removed")
    if strategy == "LiveMigrateIfPossible" and mine is not None and mine.phase == "Failed":
        return _recreate(state, host, machine, fallback=_failure(mine))
    if strategy == "Recreate":
        return _recreate(state, host, machine, fallback=None)
    if mine is None:
        return _migrate(state, host, machine)
    if mine.phase == "Succeeded":
        return _succeeded(state, machine, mine)
    return _failed(state, mine)


def _failure(migration: MigrationView) -> str:
    cause = migration.reason or "MigrationFailed"
    detail = f": {migration.message}" if migration.message else ""
    return f"live migration {migration.name} failed ({cause}{detail})"


def _migrate(state: _Pass, host: str, machine: MachineView) -> _Verdict:
    others = sorted({n for n in state.cp_disrupted if n != machine.name})
    if machine.control_plane and others:
        return _Verdict(False, f"waits for control-plane machine {others[0]} (one at a time)")
    if state.running >= state.settings.max_parallel:
        limit = state.settings.max_parallel
        return _Verdict(False, f"waits its turn (at most {limit} evacuation migrations at once)")
    name = migration_name(machine.name, machine.uid, host)
    state.actions.append(CreateMigration(name, machine.name, host))
    state.running += 1
    if machine.control_plane:
        state.cp_disrupted.append(machine.name)
    return _Verdict(False, f"live migration {name} created")


def _succeeded(state: _Pass, machine: MachineView, migration: MigrationView) -> _Verdict:
    finished = migration.finished_at if migration.finished_at is not None else state.now
    if state.now - finished < state.settings.retry_backoff:
        state.retries.append(finished + state.settings.retry_backoff)
        return _Verdict(False, f"live migration {migration.name} succeeded; host not updated yet")
    # long after the success the machine is still here: a migration of an earlier
    # maintenance (the machine came back since); make a new one
    state.actions.append(DeleteMigration(migration.name, migration.uid, "stale"))
    return _Verdict(False, f"live migration {migration.name} is stale; migrating again")


def _failed(state: _Pass, migration: MigrationView) -> _Verdict:
    finished = migration.finished_at if migration.finished_at is not None else state.now
    retry_at = finished + state.settings.retry_backoff
    if state.now >= retry_at:
        state.actions.append(DeleteMigration(migration.name, migration.uid, "retry"))
        return _Verdict(False, f"live migration {migration.name} failed; retrying")
    state.retries.append(retry_at)
    return _Verdict(True, f"{_failure(migration)}; retried after {rfc3339(retry_at)}")


def _recreate(state: _Pass, host: str, machine: MachineView, *, fallback: str | None) -> _Verdict:
    how = f"{fallback}, so Recreate" if fallback else "evictionStrategy Recreate"
    if machine.owner is None:
        return _Verdict(True, f"{how}, but no Machine owns it")
    if machine.control_plane:
        others = [n for n in state.cp_disrupted if n != machine.name]
        unsettled = [n for n in state.cp.unsettled if n != machine.name]
        if others or unsettled:
            other = sorted(set(others or unsettled))[0]
            return _Verdict(False, f"{how}: waits for control-plane machine {other}")
        if state.cp.live < 2:
            return _Verdict(
                True, f"{how}, but it is the cluster's last control-plane machine (its etcd)"
            )
        state.cp_disrupted.append(machine.name)
    state.actions.append(DeleteMachine(machine.owner, machine.owner_uid, machine.name, host))
    return _Verdict(False, f"{how}: deleting Machine {machine.owner}")
