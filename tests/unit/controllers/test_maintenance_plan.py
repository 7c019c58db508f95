"""Host maintenance decisions (pure, `cluster_maintenance_plan`): the strategies, the caps on
parallel migrations and control-plane disruptions, the LiveMigrateIfPossible fallback and the
LiveMigrate retry backoff on a fake clock."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from capl.controllers.cluster_maintenance_plan import (
    ControlPlaneState,
    CreateMigration,
    DeleteMachine,
    DeleteMigration,
    HostInMaintenance,
    MachineView,
    MaintenancePlan,
    MigrationView,
    Settings,
    effective_strategy,
    migration_name,
    plan_maintenance,
)
from capl.runtime.clock import FakeClock
from capl.runtime.conditions import rfc3339

SETTINGS = Settings(max_parallel=2, retry_backoff=300.0)
NOW = 1_800_000_000.0


def vm(name: str, strategy: str = "LiveMigrate", **kw: Any) -> MachineView:
    owner = kw.pop("owner", f"{name}-machine")
    return MachineView(
        name=name,
        uid=f"uid-{name}",
        strategy=effective_strategy(strategy),
        owner=owner,
        owner_uid=f"muid-{name}" if owner else None,
        **kw,
    )


def mig(machine: str, host: str = "kvm1", **kw: Any) -> MigrationView:
    name = migration_name(machine, f"uid-{machine}", host)
    return MigrationView(name=name, uid=f"m-{name}", machine=machine, host=host, **kw)


def plan(
    machines: Sequence[MachineView],
    migrations: Sequence[MigrationView] = (),
    *,
    hosts: Sequence[HostInMaintenance] | None = None,
    cp: ControlPlaneState | None = None,
    now: float = NOW,
    settings: Settings = SETTINGS,
) -> MaintenancePlan:
    return plan_maintenance(
        hosts if hosts is not None else [HostInMaintenance(name="kvm1", machines=tuple(machines))],
        migrations,
        control_plane=cp or ControlPlaneState(),
        settings=settings,
        now=now,
    )


def creates(p: MaintenancePlan) -> list[str]:
    return [a.machine for a in p.actions if isinstance(a, CreateMigration)]


def machine_deletes(p: MaintenancePlan) -> list[str]:
    return [a.libvirt_machine for a in p.actions if isinstance(a, DeleteMachine)]


def migration_deletes(p: MaintenancePlan) -> list[tuple[str, str]]:
    return [(a.name, a.why) for a in p.actions if isinstance(a, DeleteMigration)]


# --- names and defaults ----------------------------------------------------------------------


def test_migration_name_is_deterministic_and_short() -> None:
    first = migration_name("w-1", "uid-1", "kvm1")
    assert first == migration_name("w-1", "uid-1", "kvm1")
    assert first.startswith("evacuate-w-1-")
    assert len(first) == len("evacuate-w-1-") + 8
    assert first != migration_name("w-1", "uid-2", "kvm1")  # a re-created machine
    assert first != migration_name("w-1", "uid-1", "kvm2")  # another host
    long = migration_name("m" * 60 + "-x", "uid", "kvm1")
    assert len(long) <= 63
    dashed = migration_name("a" * 45 + "-" + "b" * 20, "uid", "kvm1")
    assert len(dashed) <= 63
    assert "--" not in dashed


def test_effective_strategy_defaults_to_live_migrate_if_possible() -> None:
    assert effective_strategy(None) == "LiveMigrateIfPossible"
    assert effective_strategy("") == "LiveMigrateIfPossible"
    assert effective_strategy("Recreate") == "Recreate"
    assert effective_strategy("None") == "None"


# --- the strategies --------------------------------------------------------------------------


def test_each_strategy_does_its_thing() -> None:
    machines = [
        vm("a-live", "LiveMigrate"),
        vm("b-maybe", "LiveMigrateIfPossible"),
        vm("c-recreate", "Recreate"),
        vm("d-none", "None"),
        vm("e-orphan", "Recreate", owner=None),
    ]
    p = plan(machines)
    assert creates(p) == ["a-live", "b-maybe"]
    assert machine_deletes(p) == ["c-recreate"]
    deleted = next(a for a in p.actions if isinstance(a, DeleteMachine))
    assert (deleted.name, deleted.uid, deleted.host) == (
        "c-recreate-machine",
        "muid-c-recreate",
        "kvm1",
    )
    created = next(a for a in p.actions if isinstance(a, CreateMigration))
    assert created == CreateMigration(
        migration_name("a-live", "uid-a-live", "kvm1"), "a-live", "kvm1"
    )
    outcome = p.hosts["kvm1"]
    assert outcome.phase == "Blocked"
    assert outcome.machines == 5
    assert outcome.message == (
        "d-none: evictionStrategy None; e-orphan: evictionStrategy Recreate, but no Machine owns it"
    )
    assert p.busy


def test_progress_messages_while_evacuating() -> None:
    machines = [vm("a"), vm("b", "Recreate", owner_deleting=True), vm("c", migrating_to="kvm3")]
    p = plan(machines, [mig("a", phase="Running")])
    assert p.actions == ()  # each is on its way; the Machine is deleted once
    assert p.hosts["kvm1"].phase == "Evacuating"
    assert p.hosts["kvm1"].message == (
        f"a: live migration {mig('a').name} Running; b: being deleted; c: being migrated to kvm3"
    )
    assert p.hosts["kvm1"].status() == {
        "phase": "Evacuating",
        "machines": 3,
        "message": p.hosts["kvm1"].message,
    }


def test_an_empty_host_is_evacuated_and_nothing_is_busy() -> None:
    p = plan([], [mig("gone", phase="Succeeded", finished_at=NOW - 10)])
    assert p.hosts["kvm1"].status() == {"phase": "Evacuated", "machines": 0}
    assert p.actions == ()  # finished migrations stay until the maintenance ends
    assert not p.busy


def test_migrations_of_hosts_out_of_maintenance_are_deleted_once() -> None:
    running = mig("a", host="kvm2", phase="Running")
    finished = mig("b", host="kvm2", phase="Failed")
    aborting = mig("c", host="kvm2", phase="Running", deleting=True)
    p = plan([], [running, finished, aborting], hosts=[])
    assert migration_deletes(p) == [
        (running.name, "host kvm2 left maintenance"),
        (finished.name, "host kvm2 left maintenance"),
    ]
    assert p.hosts == {}
    assert not p.busy


# --- parallelism -----------------------------------------------------------------------------


def test_at_most_max_parallel_unfinished_migrations_per_cluster() -> None:
    machines = [vm(f"w{i}") for i in range(4)]
    p = plan(machines)
    assert creates(p) == ["w0", "w1"]
    assert "w2: waits its turn (at most 2 evacuation migrations at once)" in str(
        p.hosts["kvm1"].message
    )
    # one already runs (from another host of the cluster): one more
    elsewhere = mig("x", host="kvm2", phase="Running")
    hosts = [
        HostInMaintenance(name="kvm1", machines=tuple(machines)),
        HostInMaintenance(name="kvm2", machines=(vm("x"),)),
    ]
    p = plan(machines, [elsewhere], hosts=hosts)
    assert creates(p) == ["w0"]
    # finished ones do not count
    done = [mig("w0", phase="Failed", finished_at=NOW), mig("w1", phase="Succeeded")]
    p = plan(machines[2:], done)
    assert creates(p) == ["w2", "w3"]
    wider = Settings(max_parallel=3, retry_backoff=300.0)
    assert creates(plan(machines, settings=wider)) == ["w0", "w1", "w2"]


def test_control_plane_machines_one_at_a_time() -> None:
    machines = [vm("cp0", control_plane=True), vm("cp1", control_plane=True), vm("w0")]
    p = plan(machines)
    assert creates(p) == ["cp0", "w0"]
    assert "cp1: waits for control-plane machine cp0 (one at a time)" in str(
        p.hosts["kvm1"].message
    )
    # cp0's migration runs: cp1 still waits, even with room in the cap
    p = plan(machines[1:], [mig("cp0", phase="Running", control_plane=True)])
    assert creates(p) == ["w0"]
    # a control-plane machine elsewhere migrates or is being deleted: none starts
    p = plan(machines, cp=ControlPlaneState(disrupted=("cp9",), live=3))
    assert creates(p) == ["w0"]
    # the running one finished: the next goes
    p = plan(machines[1:], [mig("cp0", phase="Succeeded", control_plane=True)])
    assert creates(p) == ["cp1", "w0"]


def test_recreate_of_control_plane_machines_is_careful() -> None:
    a = vm("cp0", "Recreate", control_plane=True)
    b = vm("cp1", "Recreate", control_plane=True)
    three = ControlPlaneState(live=3)
    p = plan([a, b], cp=three)
    assert machine_deletes(p) == ["cp0"]
    assert "cp1: evictionStrategy Recreate: waits for control-plane machine cp0" in str(
        p.hosts["kvm1"].message
    )
    # the replacement of the previous one is not provisioned yet: wait for it
    p = plan([b], cp=ControlPlaneState(unsettled=("cp0-new",), live=3))
    assert machine_deletes(p) == []
    # never the last control-plane machine
    p = plan([a], cp=ControlPlaneState(live=1))
    assert machine_deletes(p) == []
    assert p.hosts["kvm1"].phase == "Blocked"
    assert "last control-plane machine" in str(p.hosts["kvm1"].message)


# --- fallback and retry ----------------------------------------------------------------------


def test_live_migrate_if_possible_falls_back_to_recreate() -> None:
    failed = mig("b", phase="Failed", reason="NoTargetHost", message="no host", finished_at=NOW)
    p = plan([vm("b", "LiveMigrateIfPossible")], [failed])
    assert machine_deletes(p) == ["b"]
    assert creates(p) == []
    assert p.hosts["kvm1"].message == (
        f"b: live migration {failed.name} failed (NoTargetHost: no host), so Recreate: "
        "deleting Machine b-machine"
    )
    # no owner Machine to delete: blocked
    p = plan([vm("b", "LiveMigrateIfPossible", owner=None)], [failed])
    assert p.hosts["kvm1"].phase == "Blocked"
    assert machine_deletes(p) == []


def test_live_migrate_failure_blocks_then_retries_after_the_backoff() -> None:
    clock = FakeClock(wall_start=NOW)
    failed_at = clock.wall()
    failed = mig(
        "a", phase="Failed", reason="MigrationFailed", message="CPU mismatch", finished_at=failed_at
    )
    clock.advance(10)
    p = plan([vm("a")], [failed], now=clock.wall())
    assert p.actions == ()
    assert p.hosts["kvm1"].phase == "Blocked"
    assert p.hosts["kvm1"].message == (
        f"a: live migration {failed.name} failed (MigrationFailed: CPU mismatch); "
        f"retried after {rfc3339(failed_at + 300)}"
    )
    assert p.next_retry == pytest.approx(failed_at + 300)
    # the same later on: the message (and so the EvictionBlocked event) does not change
    clock.advance(200)
    assert plan([vm("a")], [failed], now=clock.wall()).hosts["kvm1"] == p.hosts["kvm1"]
    # the backoff is over: the failed migration goes, the next pass creates a new one
    clock.advance(90)
    p = plan([vm("a")], [failed], now=clock.wall())
    assert migration_deletes(p) == [(failed.name, "retry")]
    assert p.hosts["kvm1"].phase == "Evacuating"
    p = plan([vm("a")], [], now=clock.wall())
    assert creates(p) == ["a"]
    # while the old one is still being removed, nothing is created
    gone = mig("a", phase="Failed", finished_at=failed_at, deleting=True)
    assert plan([vm("a")], [gone], now=clock.wall()).actions == ()


def test_a_success_the_cache_has_not_caught_up_with_and_a_stale_one() -> None:
    done = mig("a", phase="Succeeded", finished_at=NOW)
    p = plan([vm("a")], [done], now=NOW + 5)
    assert p.actions == ()
    assert p.hosts["kvm1"].phase == "Evacuating"
    assert p.next_retry == NOW + 300
    p = plan([vm("a")], [done], now=NOW + 301)
    assert migration_deletes(p) == [(done.name, "stale")]


def test_none_stays_blocked_even_with_other_work_going_on() -> None:
    p = plan([vm("a"), vm("n", "None")], [mig("a", phase="Running")])
    assert p.hosts["kvm1"].phase == "Blocked"
    assert p.hosts["kvm1"].message == "n: evictionStrategy None"
    assert p.hosts["kvm1"].machines == 2
