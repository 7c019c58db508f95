"""The decisions around the snapshot a day-2 change is made under
(capl.controllers.machine.day2 / day2_snapshot), with recording fakes: what is reverted,
dropped, deferred and taken back, and which disks the snapshot leaves out. The real
snapshots on the real libvirtd with a guest: tests/libvirtd/test_machine_day2.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from capl.controllers.machine import day2
from capl.controllers.machine.day2_plan import DayTwoPlan, GrowDisk, RemoveDisk, SetVcpus
from capl.controllers.machine.day2_snapshot import DAY2_SNAPSHOT, DiskSnapshots, on_leftover
from capl.ports.errors import AlreadyExists, InvalidSpec, OperationInvalid, Unsupported
from capl.ports.virt import Applied, DomainDisk, DomainResources, HostId
from capl.ports.virt.snapshots import SnapshotInfo

UUID = "5b0f3c1e-0000-4000-8000-000000000001"
PREFIX = "capl-ns-m-0123"
FAKE_HOST = HostId("fake")


@dataclass
class FakeHost:
    """Records the calls; `set_vcpus` fails when `fail` is set."""

    calls: list[str] = field(default_factory=list)
    fail: bool = False

    async def grow_disk(self, uuid: str, **kw: Any) -> Applied:
        self.calls.append(f"grow {kw['target']}")
        return Applied(live=True)

    async def detach_disk(self, uuid: str, **kw: Any) -> bool:
        self.calls.append(f"detach {kw['serial']}")
        return True

    async def delete_volume(self, *, pool: str, name: str) -> bool:
        self.calls.append(f"delete {name}")
        return True

    async def set_vcpus(self, uuid: str, **kw: Any) -> Applied:
        if self.fail:
            raise OperationInvalid("vcpu hot-plug refused")
        self.calls.append(f"vcpus {kw['count']}")
        return Applied(live=True)


@dataclass
class FakeSnapshots:
    """The snapshot port, recording."""

    calls: list[str]
    exists: bool = False
    host_id: HostId = FAKE_HOST

    async def list_snapshots(self, uuid: str) -> list[SnapshotInfo]:
        raise AssertionError("not used")

    async def persistent_definition(self, uuid: str) -> str:
        self.calls.append("definition")
        return "<domain/>"

    async def create_snapshot(self, uuid: str, name: str, **kw: Any) -> SnapshotInfo:
        if self.exists:
            self.exists = False
            raise AlreadyExists("taken")
        self.calls.append(f"create {name} exclude={list(kw.get('exclude', ()))}")
        return None  # type: ignore[return-value]

    async def revert_snapshot(self, uuid: str, name: str, **kw: Any) -> SnapshotInfo:
        self.calls.append(f"revert {name} definition={kw.get('definition')}")
        return None  # type: ignore[return-value]

    async def delete_snapshot(self, uuid: str, name: str) -> bool:
        self.calls.append(f"delete-snapshot {name}")
        return True


def _scope(host: FakeHost) -> Any:
    names = SimpleNamespace(owns_volume=lambda v: v.startswith(PREFIX + "-"))
    ident = SimpleNamespace(owner=lambda: None, names=names)
    target = SimpleNamespace(host=host, pool="pool")
    return SimpleNamespace(
        on=SimpleNamespace(target=target, ident=ident, domain_uuid=UUID),
        event=lambda *a: host.calls.append(f"event {a[1]}"),
    )


def _hardware(*paths: str) -> DomainResources:
    disks = tuple(
        DomainDisk(
            target=f"vd{chr(97 + i)}", path=p, serial=None if i == 0 else f"d{i}", capacity_bytes=1
        )
        for i, p in enumerate(paths)
    )
    return DomainResources(
        running=True, vcpus=1, max_vcpus=2, config_vcpus=1, config_max_vcpus=2, memory_mib=1,
        max_memory_mib=1, config_memory_mib=1, config_max_memory_mib=1, disks=disks, nics=(),
    )  # fmt: skip


ROOT, DATA = f"/p/{PREFIX}-root.qcow2", f"/p/{PREFIX}-disk-data.qcow2"
PLAN = DayTwoPlan(
    changes=(GrowDisk("vda", 2, "rootVolume.sizeGiB"), RemoveDisk("d1", DATA), SetVcpus(2, 2))
)


def _guard(host: FakeHost, **kw: Any) -> tuple[DiskSnapshots, FakeSnapshots]:
    fake = FakeSnapshots(host.calls, **kw)
    return DiskSnapshots(lambda _host: fake), fake


async def test_a_change_that_works_is_merged_then_the_removed_volume_deleted() -> None:
    host = FakeHost()
    guard, _ = _guard(host)
    assert await day2._apply_with_snapshot(_scope(host), PLAN, _hardware(ROOT, DATA), guard) == []
    assert host.calls == [
        "definition",
        f"create {DAY2_SNAPSHOT} exclude=['vdb']",  # the disk being removed is left out
        "grow vda",
        "detach d1",
        "vcpus 2",
        "event HardwareApplied",
        f"delete-snapshot {DAY2_SNAPSHOT}",  # merged away
        f"delete {PREFIX}-disk-data.qcow2",  # only once the change is kept
    ]


async def test_a_change_that_fails_is_reverted_with_the_saved_definition() -> None:
    host = FakeHost(fail=True)
    guard, _ = _guard(host)
    with pytest.raises(day2.ChangeReverted) as caught:
        await day2._apply_with_snapshot(_scope(host), PLAN, _hardware(ROOT, DATA), guard)
    assert "vcpu hot-plug refused" in str(caught.value)
    assert host.calls == [
        "definition",
        f"create {DAY2_SNAPSHOT} exclude=['vdb']",
        "grow vda",
        "detach d1",
        f"revert {DAY2_SNAPSHOT} definition=<domain/>",
        f"delete-snapshot {DAY2_SNAPSHOT}",
    ]  # the removed disk's volume is kept: the reverted definition has the disk again


async def test_without_snapshots_a_failure_is_raised_and_removals_finished() -> None:
    host = FakeHost(fail=True)
    with pytest.raises(OperationInvalid):
        await day2._apply_with_snapshot(
            _scope(host), PLAN, _hardware(ROOT, DATA), day2.NoSnapshots()
        )
    assert host.calls == ["grow vda", "detach d1", f"delete {PREFIX}-disk-data.qcow2"]


async def test_a_stale_snapshot_is_merged_before_a_new_one_is_taken() -> None:
    host = FakeHost()
    guard, _ = _guard(host, exists=True)
    token = await guard.before(_scope(host), DayTwoPlan(changes=()), _hardware(ROOT))
    assert token is not None
    assert "definition=" not in repr(token)  # the definition (may hold secrets) not shown
    assert host.calls == [
        "definition",
        f"delete-snapshot {DAY2_SNAPSHOT}",
        f"create {DAY2_SNAPSHOT} exclude=[]",
    ]


@pytest.mark.parametrize(
    "refused",
    [InvalidSpec("no writable file-backed disk"), Unsupported("unsupported flags (0x10)")],
)
async def test_no_snapshot_possible_means_none(refused: Exception) -> None:
    host = FakeHost()
    guard, fake = _guard(host)

    async def refuse(*a: Any, **kw: Any) -> SnapshotInfo:
        raise refused

    fake.create_snapshot = refuse  # type: ignore[method-assign]
    assert await guard.before(_scope(host), PLAN, _hardware(ROOT)) is None


async def test_a_leftover_is_found_in_the_disk_paths_and_merged() -> None:
    overlay = f"/p/{PREFIX}-vda-snap-{DAY2_SNAPSHOT}.qcow2"
    assert on_leftover(_hardware(overlay))
    assert not on_leftover(_hardware(ROOT))
    assert not on_leftover(_hardware(f"/p/{PREFIX}-vda-snap-operator.qcow2"))
    host = FakeHost()
    guard, _ = _guard(host)
    assert not await guard.finish_leftover(_scope(host), _hardware(ROOT))
    assert host.calls == []
    assert await guard.finish_leftover(_scope(host), _hardware(overlay))
    assert host.calls == [f"delete-snapshot {DAY2_SNAPSHOT}"]
