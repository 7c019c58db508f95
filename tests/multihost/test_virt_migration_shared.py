"""Live migration with a shared pool: the same directory (the bed's /srv/capl-shared, mounted
in every host's namespace) is the pool on kvm1 and kvm2, so no disk is copied.

The counting guest of tests/multihost/test_virt_migration.py (booted after that module's guest
is gone: one guest at a time) moves kvm1 -> kvm2 without storage copy: ``prepare`` finds the
pool shared (a probe volume), copies no file and refuses a storage-copy request. libvirt
itself cannot tell that a local directory is shared (it trusts only NFS/GFS2/Ceph... with
``cache='none'``) and refuses the migration as unsafe, the domain untouched; with
``allow_unsafe`` it moves, the counter goes on, and ``cleanup_source`` removes the network
entries on kvm1 but not the disk both hosts use.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import AsyncIterator

import pytest

from capl.ports.errors import InvalidSpec
from capl.ports.virt.migration import MigrationFailed, MigrationOptions, Whereabouts
from capl.virt.migration import LibvirtMigrations
from tests.fixtures.common import eventually
from tests.fixtures.libvirt import record_timing
from tests.multihost.conftest import BedSession
from tests.multihost.test_virt_migration import (
    NETWORK,
    TOKEN,
    MovingGuest,
    _counting_past,
    guest_on_kvm1,
)

pytestmark = [pytest.mark.libvirtd, pytest.mark.guest]

POOL = f"capl-migs-{TOKEN}"
SHARED_PATH = f"/srv/capl-shared/{POOL}"


@pytest.fixture(scope="module")
async def shared_guest(multihost_session: BedSession) -> AsyncIterator[MovingGuest]:
    bed = multihost_session.bed

    def forget_pool() -> None:  # the directory went with the first host's delete
        for name in ("kvm1", "kvm2"):
            for verb in ("pool-destroy", "pool-undefine"):
                subprocess.run(
                    bed.in_host(name, ["virsh", "-q", verb, POOL]),
                    capture_output=True,
                    timeout=30,
                    check=False,
                )

    async with guest_on_kvm1(multihost_session, POOL, SHARED_PATH, teardown=forget_pool) as guest:
        yield guest


async def test_live_migration_over_a_shared_pool(shared_guest: MovingGuest) -> None:
    guest = shared_guest
    migrations = LibvirtMigrations()
    kvm1, kvm2 = guest.hosts["kvm1"], guest.hosts["kvm2"]
    with pytest.raises(InvalidSpec, match="is shared") as caught:
        await migrations.prepare(guest.request("kvm2", MigrationOptions(copy_storage=True)))
    assert caught.value.reason == "StorageSharingMismatch"
    request = guest.request("kvm2", MigrationOptions(copy_storage=False))
    prepared = await migrations.prepare(request)
    # libvirt cannot know that a bind-mounted local directory is shared: it refuses
    with pytest.raises(MigrationFailed, match="unsafe") as refused:
        await migrations.migrate(request, prepared)
    assert refused.value.reason == "MigrationUnsafe"
    assert refused.value.location is not None
    assert refused.value.location.where is Whereabouts.SOURCE
    # capl's probe proved it shared (prepare): tell libvirt so
    request = guest.request("kvm2", MigrationOptions(copy_storage=False, allow_unsafe=True))
    assert not prepared.copy_storage
    assert prepared.disks == ()
    assert prepared.volumes_created == ()
    assert prepared.files_copied == ()
    assert prepared.dhcp_hosts == ((NETWORK, guest.mac, guest.ip),)

    last_on_source = (await guest.counts("kvm1"))[-1]
    t0 = time.monotonic()
    result = await migrations.migrate(request, prepared)
    record_timing("migration: kvm1 -> kvm2 over a shared pool (wall)", time.monotonic() - t0)
    record_timing("migration: shared pool, libvirt time_elapsed", result.elapsed_seconds)
    guest.on = "kvm2"
    assert result.location.where is Whereabouts.DESTINATION
    assert result.location.source is None
    assert not result.copy_storage
    # the same console log file: both hosts write into the one directory
    await eventually(
        lambda: _counting_past(guest, "kvm2", last_on_source + 2), within=60, what="counting"
    )
    counts = await guest.counts("kvm2")
    assert counts == list(range(counts[0], counts[0] + len(counts)))
    assert (await guest.console("kvm2")).count(b"CAPL-GUEST: boot") == 1  # the first one only

    removed = await migrations.cleanup_source(request)
    assert all("volume" not in entry for entry in removed)
    assert any("DHCP host" in entry for entry in removed)
    root = guest.storage.volumes[0]
    assert await kvm1.get_volume(pool=POOL, name=root) is not None  # the disk kvm2 uses
    assert await kvm2.get_volume(pool=POOL, name=root) is not None
    network = await kvm1.get_network(NETWORK)
    assert network is not None
    assert guest.mac not in {h.mac for h in network.dhcp_hosts}
