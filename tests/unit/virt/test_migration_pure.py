"""The pure parts of live migration: flags and parameters, what a domain definition says
about moving it, timeout arithmetic and stall detection on a fake clock, and the watch loop
driven without a host (fake job, fake poll, fake clock: nothing sleeps)."""

from __future__ import annotations

import asyncio
from typing import Any

import libvirt
import pytest

from capl.ports.errors import InvalidSpec, Unsupported
from capl.ports.virt import (
    DiskBus,
    DiskDevice,
    DiskSpec,
    DomainInfo,
    DomainOwner,
    DomainSpec,
    DomainState,
    FwCfgEntry,
    HostId,
    NicSpec,
    VolumeFormat,
)
from capl.ports.virt.migration import (
    GIB,
    AbortReason,
    DomainLocation,
    MigrationOptions,
    MigrationPhase,
    MigrationProgress,
    Whereabouts,
)
from capl.virt.domainxml import build_domain_xml
from capl.virt.migration_params import (
    BASE_FLAGS,
    domain_layout,
    migrate_uri,
    migration_flags,
    migration_params,
)
from capl.virt.migration_watch import (
    Verdict,
    Watch,
    completion_timeout,
    drive,
    phase_of,
    progress_of,
)

OWNER = DomainOwner(cluster="c", namespace="ns", name="m", uid="u1")


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


# -- flags and parameters ----------------------------------------------------------------


def test_flags_live_persistent_undefine_abort_on_error_and_incremental_copy() -> None:
    shared = migration_flags(MigrationOptions())
    assert shared == BASE_FLAGS
    for flag in (
        libvirt.VIR_MIGRATE_LIVE,
        libvirt.VIR_MIGRATE_PERSIST_DEST,
        libvirt.VIR_MIGRATE_UNDEFINE_SOURCE,
        libvirt.VIR_MIGRATE_ABORT_ON_ERROR,
    ):
        assert shared & flag
    copy = migration_flags(MigrationOptions(copy_storage=True))
    assert copy & libvirt.VIR_MIGRATE_NON_SHARED_INC
    assert not copy & libvirt.VIR_MIGRATE_NON_SHARED_DISK
    everything = migration_flags(
        MigrationOptions(copy_storage=True, allow_auto_converge=True, allow_post_copy=True)
    )
    assert everything & libvirt.VIR_MIGRATE_AUTO_CONVERGE
    assert everything & libvirt.VIR_MIGRATE_POSTCOPY
    for flags in (shared, copy, everything):
        assert not flags & libvirt.VIR_MIGRATE_TUNNELLED
        assert not flags & libvirt.VIR_MIGRATE_PEER2PEER
    assert not copy & (libvirt.VIR_MIGRATE_AUTO_CONVERGE | libvirt.VIR_MIGRATE_POSTCOPY)
    assert not everything & libvirt.VIR_MIGRATE_UNSAFE
    assert migration_flags(MigrationOptions(allow_unsafe=True)) & libvirt.VIR_MIGRATE_UNSAFE


def test_params_uri_disks_bandwidth() -> None:
    params = migration_params(
        MigrationOptions(copy_storage=True, bandwidth_mib_per_s=64),
        address="10.231.0.12",
        disks=("vda", "vdb"),
    )
    assert params == {
        libvirt.VIR_MIGRATE_PARAM_URI: "tcp://10.231.0.12",
        libvirt.VIR_MIGRATE_PARAM_MIGRATE_DISKS: ["vda", "vdb"],
        libvirt.VIR_MIGRATE_PARAM_BANDWIDTH: 64,
    }
    shared = migration_params(MigrationOptions(), address="kvm2.lan", disks=("vda",))
    assert shared == {libvirt.VIR_MIGRATE_PARAM_URI: "tcp://kvm2.lan"}
    with pytest.raises(InvalidSpec, match="no disk to copy"):
        migration_params(MigrationOptions(copy_storage=True), address="10.0.0.1", disks=())


@pytest.mark.parametrize(
    ("address", "uri"),
    [("10.1.2.3", "tcp://10.1.2.3"), ("fd00::2", "tcp://[fd00::2]"), (" kvm2 ", "tcp://kvm2")],
)
def test_migrate_uri(address: str, uri: str) -> None:
    assert migrate_uri(address) == uri


@pytest.mark.parametrize("address", ["", "tcp://x", "a b", "x/y", "u@h", "h:49152"])
def test_migrate_uri_refuses_anything_but_a_host(address: str) -> None:
    with pytest.raises(InvalidSpec):
        migrate_uri(address)


def test_options_validate() -> None:
    with pytest.raises(ValueError, match="bandwidth"):
        MigrationOptions(bandwidth_mib_per_s=0)
    with pytest.raises(ValueError, match="timeouts"):
        MigrationOptions(progress_timeout=0)
    defaults = MigrationOptions()
    assert defaults.completion_timeout_per_gib == 150.0
    assert defaults.progress_timeout == 150.0
    assert not defaults.allow_auto_converge
    assert not defaults.allow_post_copy


# -- the domain definition ---------------------------------------------------------------


def _spec(**overrides: Any) -> DomainSpec:
    fields: dict[str, Any] = {
        "name": "capl-ns-m-1234",
        "uuid": "6f1c1e4e-8a39-4d35-9d3a-1b2c3d4e5f60",
        "owner": OWNER,
        "vcpus": 1,
        "memory_mib": 256,
        "disks": (
            DiskSpec(path="/pool/root.qcow2"),
            DiskSpec(path="/pool/data0.qcow2"),
            DiskSpec(
                path="/pool/cidata.iso",
                format=VolumeFormat.ISO,
                device=DiskDevice.CDROM,
                bus=DiskBus.SATA,
            ),
        ),
        "nics": (
            NicSpec(mac="52:54:00:AA:BB:CC", network="capl-net"),
            NicSpec(mac="52:54:00:00:00:01", bridge="br-lan"),
        ),
        "fw_cfg": (FwCfgEntry(name="opt/com.coreos/config", file="/pool/m.ign"),),
    }
    fields.update(overrides)
    return DomainSpec(**fields)


def test_layout_of_a_capl_domain() -> None:
    layout = domain_layout(build_domain_xml(_spec()))
    assert layout.memory_bytes == 256 * 1024**2
    assert [(d.target, d.readonly) for d in layout.disks] == [
        ("vda", False),
        ("vdb", False),
        ("sda", True),
    ]
    assert layout.copied_disks() == ("vda", "vdb")  # never the read-only cdrom
    assert layout.fw_cfg_files == ("/pool/m.ign",)
    assert layout.nic_macs == (("52:54:00:aa:bb:cc", "capl-net"), ("52:54:00:00:00:01", None))
    layout.check_movable(
        files={"/pool/cidata.iso", "/pool/m.ign"},
        volumes={"/pool/root.qcow2", "/pool/data0.qcow2"},
    )


def test_layout_refuses_what_capl_cannot_place() -> None:
    layout = domain_layout(build_domain_xml(_spec()))
    files = {"/pool/cidata.iso", "/pool/m.ign"}
    with pytest.raises(InvalidSpec, match="writable disk vdb"):
        layout.check_movable(files=files, volumes={"/pool/root.qcow2"})
    with pytest.raises(InvalidSpec, match="read-only disk sda"):
        layout.check_movable(
            files={"/pool/m.ign"}, volumes={"/pool/root.qcow2", "/pool/data0.qcow2"}
        )
    with pytest.raises(InvalidSpec, match=r"fw_cfg file /pool/m\.ign"):
        layout.check_movable(
            files={"/pool/cidata.iso"}, volumes={"/pool/root.qcow2", "/pool/data0.qcow2"}
        )
    xml = build_domain_xml(_spec()).replace(
        "</devices>",
        "<hostdev mode='subsystem' type='pci'><source><address domain='0' bus='1' slot='0' "
        "function='0'/></source></hostdev></devices>",
    )
    with pytest.raises(Unsupported, match="hostdev") as caught:
        domain_layout(xml).check_movable(files=set(), volumes=set())
    assert caught.value.reason == "NotMigratable"


# -- timeouts and stalls -----------------------------------------------------------------


def _progress(remaining: int, phase: MigrationPhase = MigrationPhase.COPYING_MEMORY) -> Any:
    return MigrationProgress(phase=phase, elapsed_seconds=0, data_remaining_bytes=remaining)


def test_completion_timeout_scales_with_the_data_to_move() -> None:
    options = MigrationOptions()
    assert completion_timeout(options, GIB) == 150.0
    assert completion_timeout(options, 3 * GIB // 2) == 225.0
    assert completion_timeout(MigrationOptions(completion_timeout_per_gib=10), GIB // 4) == 2.5


def test_watch_aborts_at_the_completion_timeout() -> None:
    clock = FakeClock()
    watch = Watch(MigrationOptions(), copy_bytes=GIB, clock=clock)
    for remaining in range(150, 0, -1):  # progressing steadily: only the clock ends it
        clock.advance(1)
        assert watch.observe(_progress(remaining * 1000)).verdict is Verdict.CONTINUE
    clock.advance(0.5)
    decision = watch.observe(_progress(10))
    assert decision.verdict is Verdict.ABORT
    assert decision.reason is AbortReason.COMPLETION_TIMEOUT
    assert "150.0 s" in decision.detail


def test_watch_switches_to_post_copy_once_when_allowed() -> None:
    clock = FakeClock()
    options = MigrationOptions(allow_post_copy=True, progress_timeout=5)
    watch = Watch(options, copy_bytes=GIB // 150, clock=clock)  # a 1 s completion timeout
    clock.advance(2)
    assert watch.observe(_progress(100)).verdict is Verdict.POST_COPY
    assert watch.postcopy
    clock.advance(1)
    assert watch.observe(_progress(50, MigrationPhase.POST_COPY)).verdict is Verdict.CONTINUE


def test_watch_detects_no_new_low_within_the_progress_timeout() -> None:
    clock = FakeClock()
    watch = Watch(MigrationOptions(progress_timeout=10), copy_bytes=100 * GIB, clock=clock)
    assert watch.observe(_progress(1000)).verdict is Verdict.CONTINUE
    for remaining in (1200, 1100, 1000, 1050, 1001):  # dirtied as fast as sent: no new low
        clock.advance(2)
        assert watch.observe(_progress(remaining)).verdict is Verdict.CONTINUE
    clock.advance(0.1)
    decision = watch.observe(None)  # a poll without statistics counts as no progress
    assert decision.verdict is Verdict.ABORT
    assert decision.reason is AbortReason.NO_PROGRESS
    assert "lowest data remaining: 1000 bytes" in decision.detail


def test_watch_new_low_resets_the_progress_window() -> None:
    clock = FakeClock()
    watch = Watch(MigrationOptions(progress_timeout=10), copy_bytes=100 * GIB, clock=clock)
    for remaining in range(100, 0, -1):
        clock.advance(9)
        assert watch.observe(_progress(remaining)).verdict is Verdict.CONTINUE


def test_watch_memory_phase_after_the_disk_copy_is_not_a_stall() -> None:
    clock = FakeClock()
    watch = Watch(MigrationOptions(progress_timeout=10), copy_bytes=100 * GIB, clock=clock)
    watch.observe(_progress(100, MigrationPhase.COPYING_STORAGE))
    clock.advance(9)
    watch.observe(_progress(1, MigrationPhase.COPYING_STORAGE))
    # the memory phase starts higher than the disk phase's low: a new phase, a new low
    for remaining in (5000, 4000, 3000):
        clock.advance(9)
        assert watch.observe(_progress(remaining)).verdict is Verdict.CONTINUE


def test_watch_starting_job_gets_the_progress_timeout_too() -> None:
    clock = FakeClock()
    watch = Watch(MigrationOptions(progress_timeout=10), copy_bytes=100 * GIB, clock=clock)
    clock.advance(10.5)
    decision = watch.observe(_progress(0, MigrationPhase.STARTING))
    assert decision.reason is AbortReason.NO_PROGRESS
    assert "lowest data remaining: nothing" in decision.detail


def test_phase_and_progress_from_job_stats() -> None:
    storage = {"type": 2, "disk_total": 100, "disk_remaining": 40, "memory_total": 500}
    assert phase_of(storage) is MigrationPhase.COPYING_STORAGE
    memory = storage | {"disk_remaining": 0, "memory_processed": 10}
    assert phase_of(memory) is MigrationPhase.COPYING_MEMORY
    assert phase_of({"type": 2, "memory_total": 500}) is MigrationPhase.COPYING_MEMORY
    assert phase_of({"type": 2}) is MigrationPhase.STARTING
    assert phase_of(memory, postcopy=True) is MigrationPhase.POST_COPY
    stats = {
        "data_total": 1000,
        "data_processed": 600,
        "data_remaining": 400,
        "memory_remaining": 300,
        "disk_remaining": 100,
        "downtime": 42,
        "downtime_net": 7,
    }
    running = progress_of(stats, elapsed=3.0)
    assert (running.data_total_bytes, running.data_processed_bytes) == (1000, 600)
    assert (running.memory_remaining_bytes, running.disk_remaining_bytes) == (300, 100)
    assert running.downtime_ms == 7
    done = progress_of(stats, elapsed=3.0, completed=True)
    assert done.phase is MigrationPhase.COMPLETED
    assert done.downtime_ms == 42


# -- where a domain is -------------------------------------------------------------------


def _info(state: DomainState, reason: str) -> DomainInfo:
    return DomainInfo(
        host_id=HostId("h"),
        name="d",
        uuid="u",
        state=state,
        reason=reason,
        persistent=True,
        autostart=True,
        owner=OWNER,
    )


@pytest.mark.parametrize(
    ("source", "destination", "where"),
    [
        (_info(DomainState.RUNNING, "booted"), None, Whereabouts.SOURCE),
        (_info(DomainState.PAUSED, "user"), None, Whereabouts.SOURCE),
        (None, _info(DomainState.RUNNING, "migrated"), Whereabouts.DESTINATION),
        (_info(DomainState.SHUTOFF, "migrated"), _info(DomainState.RUNNING, "migrated"),
         Whereabouts.DESTINATION),
        (_info(DomainState.RUNNING, "migrating"), _info(DomainState.PAUSED, "migration"),
         Whereabouts.INCOMING),
        (_info(DomainState.RUNNING, "booted"), _info(DomainState.RUNNING, "booted"),
         Whereabouts.BOTH),
        (_info(DomainState.SHUTOFF, "destroyed"), None, Whereabouts.ABSENT),
        (None, None, Whereabouts.ABSENT),
    ],
)  # fmt: skip
def test_whereabouts(
    source: DomainInfo | None, destination: DomainInfo | None, where: Whereabouts
) -> None:
    location = DomainLocation(
        source_host=HostId("kvm1"),
        destination_host=HostId("kvm2"),
        source=source,
        destination=destination,
    )
    assert location.where is where
    assert location.describe().startswith(where.value)


# -- the watch loop, driven without a host -----------------------------------------------


class FakeJob:
    """A migrate call that ends when aborted (or when told), on a fake clock."""

    def __init__(self, clock: FakeClock, *, remaining: list[int]) -> None:
        self.clock = clock
        self.remaining = remaining
        self.finished: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.aborts = 0
        self.aborted_at: float | None = None
        self.post_copies = 0
        self.polls = 0
        self.dest_alive = True
        self.finish_after_polls: int | None = None

    async def wait(self, finished: asyncio.Future[Any], seconds: float) -> None:
        self.clock.advance(seconds)
        await asyncio.sleep(0)

    async def poll(self) -> dict[str, object] | None:
        self.polls += 1
        if self.finish_after_polls is not None and self.polls >= self.finish_after_polls:
            self.finished.set_result(None)
        value = self.remaining[min(self.polls - 1, len(self.remaining) - 1)]
        return {"type": 2, "data_remaining": value, "memory_total": 1, "data_processed": 1}

    async def abort(self) -> None:
        self.aborts += 1
        self.aborted_at = self.clock.now
        if not self.finished.done():
            self.finished.set_exception(RuntimeError("operation aborted"))

    async def post_copy(self) -> None:
        self.post_copies += 1


async def _drive(job: FakeJob, options: MigrationOptions, **kwargs: Any) -> Any:
    return await drive(
        job.finished,
        watch=Watch(options, copy_bytes=GIB, clock=job.clock),
        poll=job.poll,
        abort=job.abort,
        start_post_copy=job.post_copy,
        destination_alive=lambda: job.dest_alive,
        wait=job.wait,
        **kwargs,
    )


async def test_drive_reports_progress_until_the_job_ends() -> None:
    job = FakeJob(FakeClock(), remaining=[500, 300, 100])
    job.finish_after_polls = 3
    seen: list[MigrationProgress] = []

    async def record(progress: MigrationProgress) -> None:
        seen.append(progress)

    outcome = await _drive(job, MigrationOptions(), cancelled=asyncio.Event(), on_progress=record)
    assert outcome.abort_reason is None
    assert [p.data_remaining_bytes for p in seen] == [500, 300, 100]
    assert [p.elapsed_seconds for p in seen] == [1.0, 2.0, 3.0]
    assert outcome.last == seen[-1]
    assert job.aborts == 0


async def test_drive_aborts_a_stalled_job_once() -> None:
    job = FakeJob(FakeClock(), remaining=[500, 600])
    outcome = await _drive(job, MigrationOptions(progress_timeout=5), cancelled=asyncio.Event())
    assert outcome.abort_reason is AbortReason.NO_PROGRESS
    assert job.aborts == 1
    assert job.aborted_at == 1007.0  # the first poll more than 5 s after the low at 1 s


async def test_drive_aborts_at_the_completion_timeout() -> None:
    job = FakeJob(FakeClock(), remaining=list(range(10**6, 0, -1)))
    options = MigrationOptions(completion_timeout_per_gib=30)
    outcome = await _drive(job, options, cancelled=asyncio.Event())
    assert outcome.abort_reason is AbortReason.COMPLETION_TIMEOUT
    assert job.aborted_at == 1031.0
    assert job.aborts == 1


async def test_drive_switches_to_post_copy_instead_when_allowed() -> None:
    job = FakeJob(FakeClock(), remaining=list(range(10**6, 0, -1)))
    job.finish_after_polls = 40
    options = MigrationOptions(completion_timeout_per_gib=30, allow_post_copy=True)
    outcome = await _drive(job, options, cancelled=asyncio.Event())
    assert outcome.abort_reason is None
    assert (job.post_copies, job.aborts) == (1, 0)
    assert outcome.last.phase is MigrationPhase.POST_COPY


async def test_drive_cancel_and_lost_destination_abort() -> None:
    job = FakeJob(FakeClock(), remaining=list(range(10**6, 0, -1)))
    cancelled = asyncio.Event()

    async def cancel_at_third(progress: MigrationProgress) -> None:
        if progress.elapsed_seconds >= 3:
            cancelled.set()

    outcome = await _drive(
        job, MigrationOptions(), cancelled=cancelled, on_progress=cancel_at_third
    )
    assert outcome.abort_reason is AbortReason.CANCELLED
    assert job.aborted_at == 1004.0  # the poll after the one that cancelled

    lost = FakeJob(FakeClock(), remaining=list(range(10**6, 0, -1)))
    lost.dest_alive = False
    outcome = await _drive(lost, MigrationOptions(), cancelled=asyncio.Event())
    assert outcome.abort_reason is AbortReason.DESTINATION_LOST
    assert lost.aborts == 1


async def test_drive_survives_a_broken_progress_callback() -> None:
    job = FakeJob(FakeClock(), remaining=[3, 2, 1])
    job.finish_after_polls = 3

    def broken(progress: MigrationProgress) -> None:
        raise RuntimeError("observer bug")

    outcome = await _drive(job, MigrationOptions(), cancelled=asyncio.Event(), on_progress=broken)
    assert outcome.abort_reason is None
    assert job.polls == 3
