"""Live migration through the virt layer (`capl.virt.migration.LibvirtMigrations`) between two
real hosts of the multi-host bed: kvm1 and kvm2, both ``qemu+tls://``, each with a pool of its
own at the same path (not shared) and a NAT network of the same name and CIDR.

One TCG guest of the test guest image, booted once for the module on kvm1 with capl's own
host operations (base image by digest, root overlay, Ignition file over fw_cfg, DHCP
reservation + DNS record, define, start), then, in order:

1. bad input: kvm1 -> kvm1 is refused with a clear error and changes nothing;
2. kvm1 -> kvm2 with storage copy (NON_SHARED_INC): a counter the guest's shell writes to its
   serial console keeps counting across the move (memory state survives, no reboot: the
   destination's console log starts mid-count and has no boot marker; uptime goes on), the
   UUID and MAC stay, the source no longer has the domain, and after ``cleanup_source`` none of
   its volumes or network entries; the address answers on the destination;
3. kvm2 -> kvm1 at 1 MiB/s with a completion timeout of a fraction of a second: aborted, the
   guest still runs on kvm2 (still counting), and after ``unprepare`` nothing of the machine
   is left on kvm1 (the base image stays: it is shared by the machines of a pool);
4. kvm2 -> kvm1 with the base image removed from kvm1: the destination refuses the
   incremental copy, ``MigrationFailed`` reports the domain still running on kvm2.

Migration time and downtime are printed in the timing summary.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import secrets
import subprocess
import time
import uuid as uuidlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from capl.ports.errors import InvalidSpec, VirtError
from capl.ports.naming import base_image_volume_name
from capl.ports.virt import (
    ClusterOwner,
    DiskSpec,
    DomainOwner,
    DomainSpec,
    FwCfgEntry,
    ImageFromPath,
    NetworkMode,
    NetworkSpec,
    NicSpec,
    PoolSpec,
)
from capl.ports.virt.migration import (
    AbortReason,
    MigrationAborted,
    MigrationFailed,
    MigrationOptions,
    MigrationProgress,
    MigrationRequest,
    MigrationStorage,
    PreparedMigration,
    Whereabouts,
)
from capl.testbed.multihost import MultihostBed
from capl.virt import LibvirtHost, LibvirtHosts
from capl.virt.migration import LibvirtMigrations
from tests.fixtures.common import eventually
from tests.fixtures.guest import ignition_config
from tests.fixtures.libvirt import random_mac, record_timing
from tests.multihost.conftest import BedSession, ping
from tests.multihost.guest import run_in_guest

pytestmark = [pytest.mark.libvirtd, pytest.mark.guest]

BOOT = 240.0
TOKEN = secrets.token_hex(3)
POOL = f"capl-mig-{TOKEN}"
POOL_PATH = f"/var/lib/libvirt/images/{POOL}"  # per host: /var/lib/libvirt is each host's own
NETWORK = f"capl-mig-{TOKEN}"
CIDR = "10.233.7.0/24"
OWNER = ClusterOwner(namespace="mig", name=f"c-{TOKEN}")
COUNT = re.compile(rb"CAPL-COUNT=(\d+)")


@dataclass
class MovingGuest:
    """The module's guest and where it runs now."""

    hosts: dict[str, LibvirtHost]
    bed: MultihostBed
    uuid: str
    owner: DomainOwner
    mac: str
    ip: str
    storage: MigrationStorage
    console_log: str
    on: str = "kvm1"
    history: list[str] = field(default_factory=list)

    def request(self, to: str, options: MigrationOptions) -> MigrationRequest:
        return MigrationRequest(
            source=self.hosts[self.on],
            destination=self.hosts[to],
            uuid=self.uuid,
            owner=self.owner,
            storage=self.storage,
            migration_address=self.bed.host(to).lan_ip,
            options=options,
        )

    async def console(self, name: str) -> bytes:
        tail = await self.hosts[name].read_volume_tail(
            pool=self.storage.pool, name=self.console_log, limit=1 << 20
        )
        return tail.data if tail is not None else b""

    async def counts(self, name: str) -> list[int]:
        return [int(n) for n in COUNT.findall(await self.console(name))]


def _image() -> Path:
    done = subprocess.run(
        ["hack/guest-image.sh"], capture_output=True, text=True, timeout=900, check=True
    )
    return Path(done.stdout.strip().splitlines()[-1])


async def _make_host(host: LibvirtHost, pool: str, path: str) -> None:
    await host.ensure_pool(PoolSpec(name=pool, path=path, owner=OWNER))
    await host.ensure_network(
        NetworkSpec(name=NETWORK, mode=NetworkMode.NAT, owner=OWNER, cidr=CIDR)
    )


async def _boot(
    hosts: dict[str, LibvirtHost], bed: MultihostBed, pool: str, path: str
) -> MovingGuest:
    host = hosts["kvm1"]
    image = _image()
    digest = hashlib.sha256(image.read_bytes()).hexdigest()
    base_name = base_image_volume_name(image="capl-guest", digest=digest)
    source = ImageFromPath(path=str(image))
    base = await host.ensure_base_image(pool=pool, name=base_name, source=source)
    prefix = f"capl-mig-{TOKEN}-m"
    root = await host.create_overlay(
        pool=pool, name=f"{prefix}-root.qcow2", backing=base, capacity_bytes=0
    )
    hostname = f"mig-{TOKEN}"
    ignition = await host.upload_volume(
        pool=pool, name=f"{prefix}-ignition.ign", data=ignition_config(hostname=hostname)
    )
    mac = random_mac()
    reserved = await host.ensure_dhcp_host(
        network=NETWORK, mac=mac, name=hostname, dns_hostnames=(hostname,)
    )
    owner = DomainOwner(cluster=OWNER.name, namespace="mig", name="m", uid=TOKEN)
    domain_uuid = str(uuidlib.uuid4())
    console_log = f"{prefix}-console.log"
    await host.define_domain(
        DomainSpec(
            name=prefix,
            uuid=domain_uuid,
            owner=owner,
            vcpus=1,
            memory_mib=256,
            domain_type="qemu",
            machine="pc",
            disks=(DiskSpec(path=root.path),),
            nics=(NicSpec(mac=mac, network=NETWORK),),
            fw_cfg=(FwCfgEntry(name="opt/com.coreos/config", file=ignition.path),),
            console_log=f"{path}/{console_log}",
        )
    )
    t0 = time.monotonic()
    await host.start_domain(domain_uuid, owner=owner)
    guest = MovingGuest(
        hosts=hosts,
        bed=bed,
        uuid=domain_uuid,
        owner=owner,
        mac=mac,
        ip=reserved.ip,
        storage=MigrationStorage(
            pool=pool,
            volumes=(root.name,),
            files=(ignition.name,),
            base_image=base_name,
            image_source=source,
            leftovers=(console_log,),
        ),
        console_log=console_log,
    )
    await eventually(
        lambda: _has(guest, "kvm1", b"CAPL-GUEST: ready"), within=BOOT, what="the guest's boot"
    )
    record_timing("migration: TCG guest boot to ready", time.monotonic() - t0)
    return guest


async def _uptime(host: LibvirtHost, uuid: str) -> float:
    """The guest's uptime in seconds, asked on its console."""
    run = await run_in_guest(host, uuid, "echo UPTIME=$(cut -d' ' -f1 /proc/uptime)")
    found = re.search(r"UPTIME=(\d+\.\d+)", run.output)
    assert found, run.output[-500:]
    return float(found.group(1))


async def _has(guest: MovingGuest, name: str, text: bytes) -> bool:
    return text in await guest.console(name)


async def _counting_past(guest: MovingGuest, name: str, value: int) -> bool:
    counts = await guest.counts(name)
    return bool(counts) and counts[-1] > value


@contextlib.asynccontextmanager
async def guest_on_kvm1(
    session: BedSession, pool: str, path: str, *, teardown: Callable[[], object] | None = None
) -> AsyncIterator[MovingGuest]:
    """A counting guest on kvm1 in ``pool`` (at ``path`` on both hosts); everything of it
    removed from kvm1 and kvm2 at the end (``teardown`` runs after the pools' removal)."""
    bed = session.bed
    registry = LibvirtHosts()
    hosts = {
        name: registry.get(uri=bed.host(name).uri, credentials=bed.host(name).credentials)
        for name in ("kvm1", "kvm2")
    }
    guest: MovingGuest | None = None
    try:
        for host in hosts.values():
            await _make_host(host, pool, path)
        guest = await _boot(hosts, bed, pool, path)
        # the memory state: a counter in the guest's shell, on its serial console
        started = await run_in_guest(
            hosts["kvm1"],
            guest.uuid,
            "(i=0; while :; do echo CAPL-COUNT=$i; i=$((i+1)); sleep 1; done) "
            ">/dev/ttyS0 2>&1 & true",
            within=120,
        )
        assert started.status == 0
        await eventually(lambda: _counting_past(guest, "kvm1", 2), within=60, what="counting")
        yield guest
    finally:
        for host in hosts.values():
            if guest is not None:
                await host.undefine_domain(guest.uuid, owner=guest.owner)
            await host.delete_network(name=NETWORK, owner=OWNER)
            with contextlib.suppress(VirtError):  # a shared pool's directory goes once
                await host.delete_pool(name=pool, owner=OWNER)
        await registry.close()
        if teardown is not None:
            teardown()


@pytest.fixture(scope="module")
async def moving_guest(multihost_session: BedSession) -> AsyncIterator[MovingGuest]:
    async with guest_on_kvm1(multihost_session, POOL, POOL_PATH) as guest:
        yield guest


async def test_same_host_is_refused_and_changes_nothing(moving_guest: MovingGuest) -> None:
    guest = moving_guest
    migrations = LibvirtMigrations()
    kvm1 = guest.hosts["kvm1"]
    before = await kvm1.list_volumes(pool=POOL, refresh=True)
    request = guest.request("kvm1", MigrationOptions(copy_storage=True))
    with pytest.raises(InvalidSpec, match="is the host the domain runs on") as caught:
        await migrations.prepare(request)
    assert caught.value.reason == "MigrationTargetIsSource"
    with pytest.raises(InvalidSpec, match="is the host the domain runs on"):
        await migrations.migrate(
            request, PreparedMigration(copy_storage=True, disks=(), copy_bytes=0)
        )
    location = await migrations.locate(kvm1, guest.hosts["kvm2"], guest.uuid)
    assert location.where is Whereabouts.SOURCE
    assert await kvm1.list_volumes(pool=POOL, refresh=True) == before
    # the pool is not shared: asking for a shared-storage migration is refused too
    with pytest.raises(InvalidSpec, match="not shared"):
        await migrations.prepare(guest.request("kvm2", MigrationOptions(copy_storage=False)))
    assert await guest.hosts["kvm2"].get_domain(guest.uuid) is None


async def test_live_migration_with_storage_copy(moving_guest: MovingGuest) -> None:
    guest = moving_guest
    assert guest.on == "kvm1"
    # progress is polled every poll_interval while the job runs; this job is short (libvirt
    # reports ~1 s) and with the default 1 s interval the first poll can come after it ended
    # (seen: "no progress was reported"), so this test polls ten times as often
    migrations = LibvirtMigrations(poll_interval=0.1)
    kvm1, kvm2 = guest.hosts["kvm1"], guest.hosts["kvm2"]
    uptime_before = await _uptime(kvm1, guest.uuid)
    # capped so that the job outlasts a few of the adapter's 1 s progress polls (uncapped it
    # ends in about 1 s on a quiet machine, sometimes before the first poll)
    request = guest.request("kvm2", MigrationOptions(copy_storage=True, bandwidth_mib_per_s=32))
    prepared = await migrations.prepare(request)
    assert prepared.copy_storage
    assert prepared.disks == ("vda",)
    assert prepared.dhcp_hosts == ((NETWORK, guest.mac, guest.ip),)
    again = await migrations.prepare(request)  # idempotent: a retry after a crash
    assert again == prepared
    dest_root = await kvm2.get_volume(pool=POOL, name=guest.storage.volumes[0])
    src_root = await kvm1.get_volume(pool=POOL, name=guest.storage.volumes[0])
    assert dest_root is not None
    assert src_root is not None
    assert (dest_root.path, dest_root.capacity_bytes) == (src_root.path, src_root.capacity_bytes)
    assert dest_root.backing_path == src_root.backing_path

    last_on_source = (await guest.counts("kvm1"))[-1]
    seen: list[MigrationProgress] = []
    t0 = time.monotonic()
    result = await migrations.migrate(request, prepared, on_progress=seen.append)
    wall = time.monotonic() - t0
    guest.on = "kvm2"
    record_timing("migration: kvm1 -> kvm2 with storage copy (wall)", wall)
    record_timing("migration: kvm1 -> kvm2 libvirt time_elapsed", result.elapsed_seconds)
    record_timing(
        f"migration: downtime {result.downtime_ms} ms (as s)", (result.downtime_ms or 0) / 1000
    )
    assert result.location.where is Whereabouts.DESTINATION
    assert result.location.source is None  # undefined on the source
    assert result.location.destination is not None
    assert result.location.destination.persistent
    assert seen, "no progress was reported"
    record_timing(f"migration: {result.data_processed_bytes >> 20} MiB moved (as s)", 0)
    nics = await kvm2.domain_nics(guest.uuid)
    assert [n.mac for n in nics] == [guest.mac]

    # the memory state survived: the counter goes on on kvm2, without a boot in between
    await eventually(
        lambda: _counting_past(guest, "kvm2", last_on_source + 2), within=60, what="counting"
    )
    after = await guest.console("kvm2")
    assert b"CAPL-GUEST: boot" not in after
    counts = await guest.counts("kvm2")
    assert counts[0] >= last_on_source
    assert counts == list(range(counts[0], counts[0] + len(counts)))
    uptime_after = await _uptime(kvm2, guest.uuid)
    assert uptime_after > uptime_before
    assert ping(guest.bed.host("kvm2").netns, guest.ip, count=3)

    removed = await migrations.cleanup_source(request)
    assert any(guest.storage.volumes[0] in r for r in removed)
    for name in (*guest.storage.volumes, *guest.storage.files):
        assert await kvm1.get_volume(pool=POOL, name=name) is None
    network = await kvm1.get_network(NETWORK)
    assert network is not None
    assert guest.mac not in {h.mac for h in network.dhcp_hosts}
    assert guest.ip not in {d.ip for d in network.dns_hosts}


async def test_abort_by_completion_timeout_leaves_it_on_the_source(
    moving_guest: MovingGuest,
) -> None:
    guest = moving_guest
    if guest.on != "kvm2":
        pytest.skip("the storage-copy migration did not move the guest")
    migrations = LibvirtMigrations()
    kvm1 = guest.hosts["kvm1"]
    options = MigrationOptions(
        copy_storage=True, bandwidth_mib_per_s=1, completion_timeout_per_gib=2
    )
    request = guest.request("kvm1", options)
    prepared = await migrations.prepare(request)
    t0 = time.monotonic()
    with pytest.raises(MigrationAborted) as caught:
        await migrations.migrate(request, prepared)
    record_timing("migration: abort at the completion timeout (wall)", time.monotonic() - t0)
    error = caught.value
    assert error.abort_reason is AbortReason.COMPLETION_TIMEOUT
    assert error.location is not None
    assert error.location.where is Whereabouts.SOURCE
    assert "CompletionTimeout" in str(error)
    assert (await kvm1.get_domain(guest.uuid)) is None

    removed = await migrations.unprepare(request)
    assert removed
    for name in (*guest.storage.volumes, *guest.storage.files, *guest.storage.leftovers):
        assert await kvm1.get_volume(pool=POOL, name=name) is None
    network = await kvm1.get_network(NETWORK)
    assert network is not None
    assert guest.mac not in {h.mac for h in network.dhcp_hosts}
    # still running, still counting on kvm2
    last = (await guest.counts("kvm2"))[-1]
    await eventually(lambda: _counting_past(guest, "kvm2", last + 1), within=30, what="counting")


async def test_failure_reports_where_the_domain_runs(moving_guest: MovingGuest) -> None:
    """The destination refuses the incremental copy when the base image is missing there:
    a MigrationFailed (not an abort) that says the domain still runs on the source."""
    guest = moving_guest
    if guest.on != "kvm2":
        pytest.skip("the storage-copy migration did not move the guest")
    migrations = LibvirtMigrations()
    kvm1 = guest.hosts["kvm1"]
    request = guest.request("kvm1", MigrationOptions(copy_storage=True))
    prepared = await migrations.prepare(request)
    base = guest.storage.base_image
    assert base is not None
    for name in (base + ".capl-complete", base):
        assert await kvm1.delete_volume(pool=POOL, name=name)
    with pytest.raises(MigrationFailed) as caught:
        await migrations.migrate(request, prepared)
    assert not isinstance(caught.value, MigrationAborted)
    assert "backing file" in str(caught.value)
    assert caught.value.location is not None
    assert caught.value.location.where is Whereabouts.SOURCE
    assert await migrations.unprepare(request)
    assert await kvm1.get_domain(guest.uuid) is None
    last = (await guest.counts("kvm2"))[-1]
    await eventually(lambda: _counting_past(guest, "kvm2", last + 1), within=30, what="counting")
