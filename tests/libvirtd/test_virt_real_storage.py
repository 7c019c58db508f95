"""Storage through the adapter on the real libvirtd: pools, uploads, image imports, overlays.

Every pool is named ``capl-test-<random>`` and removed after the test with plain libvirt
calls, whatever the adapter did or failed to do.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path

import libvirt
import pytest

from capl.ports.errors import ImageChecksumError, StorageError, StorageFull
from capl.ports.naming import pool_owner_marker, short_hash
from capl.ports.virt import (
    BaseImage,
    ClusterOwner,
    ImageFromPath,
    ImageFromURL,
    ImageFromVolume,
    PoolSpec,
)
from capl.virt import LibvirtHost
from capl.virt.images import COMPLETE_SUFFIX
from tests.fixtures.images import ImageServer
from tests.fixtures.libvirt_direct import remove_pool

pytestmark = pytest.mark.libvirtd

POOL_ROOT = Path("/var/lib/libvirt/images")
MIB = 1024**2


@pytest.fixture
def pool_names(
    libvirtd_conn: libvirt.virConnect, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[str]]:
    """Pool names a test may create; each is removed afterwards no matter what. No transient
    import pool over this session's temporary directories may be left (import pools of other
    stages running beside this one, over their own directories, are not this test's)."""
    names: list[str] = []
    yield names
    for name in names:
        remove_pool(libvirtd_conn, name)
    ours = str(tmp_path_factory.getbasetemp())
    leftovers = [
        p.name()
        for p in libvirtd_conn.listAllStoragePools(0)
        if p.name().startswith("capl-import-") and ours in p.XMLDesc(0)
    ]
    assert not leftovers, leftovers


@pytest.fixture
async def pool(host: LibvirtHost, pool_names: list[str]) -> tuple[str, ClusterOwner]:
    owner = ClusterOwner(namespace="capl-test", name="c-" + secrets.token_hex(3))
    name = "capl-test-" + secrets.token_hex(4)
    pool_names.append(name)
    await host.ensure_pool(PoolSpec(name=name, path=str(POOL_ROOT / name), owner=owner))
    return name, owner


def _qcow2(path: Path, size: str = "64M") -> bytes:
    subprocess.run(
        ["qemu-img", "create", "-q", "-f", "qcow2", str(path), size], check=True, timeout=60
    )
    return path.read_bytes()


def _download(conn: libvirt.virConnect, pool: str, name: str) -> bytes:
    volume = conn.storagePoolLookupByName(pool).storageVolLookupByName(name)
    stream = conn.newStream(0)
    volume.download(stream, 0, 0, 0)
    chunks = []
    while True:
        chunk = stream.recv(1 << 20)
        if chunk == -2:
            continue
        if not chunk:
            break
        chunks.append(chunk)
    stream.finish()
    return b"".join(chunks)


async def test_pool_is_created_marked_and_removed(host: LibvirtHost, pool_names: list[str]) -> None:
    owner = ClusterOwner(namespace="capl-test", name="c-" + secrets.token_hex(3))
    name = "capl-test-" + secrets.token_hex(4)
    pool_names.append(name)
    path = POOL_ROOT / name
    info = await host.ensure_pool(PoolSpec(name=name, path=str(path), owner=owner))
    assert info.created
    assert info.active
    assert info.autostart
    assert (path / pool_owner_marker(namespace=owner.namespace, name=owner.name)).is_file()
    await host.upload_volume(pool=name, name="capl-x-ignition.ign", data=b"{}")
    assert await host.delete_pool(name=name, owner=owner)
    assert not path.exists()
    assert await host.get_pool(name) is None


async def test_unwritable_pool_path_leaves_nothing(
    host: LibvirtHost, pool_names: list[str]
) -> None:
    name = "capl-test-" + secrets.token_hex(4)
    pool_names.append(name)
    owner = ClusterOwner(namespace="capl-test", name="c")
    with pytest.raises(StorageError) as info:
        await host.ensure_pool(PoolSpec(name=name, path=f"/proc/{name}", owner=owner))
    assert info.value.reason == "StoragePoolBuildFailed"
    assert f"/proc/{name}" in str(info.value)
    assert await host.get_pool(name) is None


async def test_upload_reads_back(
    host: LibvirtHost, pool: tuple[str, ClusterOwner], libvirtd_conn: libvirt.virConnect
) -> None:
    name, _ = pool
    data = os.urandom(3 * MIB + 17)
    volume = await host.upload_volume(pool=name, name="capl-t-payload", data=data)
    assert volume.capacity_bytes == len(data)
    assert _download(libvirtd_conn, name, "capl-t-payload") == data
    assert await asyncio.to_thread(Path(volume.path).read_bytes) == data
    smaller = json.dumps({"ignition": {"version": "3.4.0"}}).encode()
    again = await host.upload_volume(pool=name, name="capl-t-payload", data=smaller)
    assert await asyncio.to_thread(Path(again.path).read_bytes) == smaller  # no stale tail


async def test_url_import_verified_shared_and_overlaid(
    host: LibvirtHost, pool: tuple[str, ClusterOwner], image_server: ImageServer, tmp_path: Path
) -> None:
    name, _ = pool
    data = _qcow2(tmp_path / "base.qcow2", "64M")
    image_server.files["/base.qcow2"] = data
    image_server.chunk = 64 * 1024  # streamed, in pieces
    source = ImageFromURL(
        url=image_server.url("/base.qcow2"), sha256=hashlib.sha256(data).hexdigest()
    )
    image_server.gate = asyncio.Event()

    def start() -> asyncio.Future[BaseImage]:
        return asyncio.ensure_future(
            host.ensure_base_image(pool=name, name="capl-base-t", source=source)
        )

    first = start()
    await asyncio.wait_for(image_server.requested.wait(), timeout=60)
    others = [start() for _ in range(3)]
    image_server.gate.set()
    images = await asyncio.gather(first, *others)
    assert image_server.requests == ["/base.qcow2"]
    image = images[0]
    assert image.imported
    assert image.virtual_size_bytes == 64 * MIB
    assert image.volume.format == "qcow2"
    assert await asyncio.to_thread(Path(image.volume.path).read_bytes) == data
    assert await asyncio.to_thread(Path(image.volume.path + COMPLETE_SUFFIX).exists)

    overlay = await host.create_overlay(
        pool=name, name="capl-t-root.qcow2", backing=image, capacity_bytes=32 * MIB
    )
    assert overlay.capacity_bytes == 64 * MIB  # never smaller than the base
    result = await asyncio.to_thread(
        subprocess.run,
        ["qemu-img", "info", "--output=json", "-U", overlay.path],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    info = json.loads(result.stdout)
    assert info["format"] == "qcow2"
    assert info["backing-filename"] == image.volume.path
    assert info["backing-filename-format"] == "qcow2"
    assert info["virtual-size"] == 64 * MIB


async def test_checksum_mismatch_leaves_no_volume(
    host: LibvirtHost, pool: tuple[str, ClusterOwner], image_server: ImageServer, tmp_path: Path
) -> None:
    name, _ = pool
    image_server.files["/base.qcow2"] = _qcow2(tmp_path / "base.qcow2")
    image_server.chunk = 64 * 1024
    source = ImageFromURL(url=image_server.url("/base.qcow2"), sha256="1" * 64)
    with pytest.raises(ImageChecksumError) as info:
        await host.ensure_base_image(pool=name, name="capl-base-bad", source=source)
    assert info.value.expected == "1" * 64
    assert not (POOL_ROOT / name / "capl-base-bad").exists()
    assert not [v for v in await host.list_volumes(pool=name, refresh=True) if "bad" in v.name]


async def test_import_from_host_path_and_from_another_pool(
    host: LibvirtHost,
    pool: tuple[str, ClusterOwner],
    pool_names: list[str],
    tmp_path: Path,
) -> None:
    name, owner = pool
    source_dir = tmp_path / "images"
    source_dir.mkdir()
    data = _qcow2(source_dir / "golden.qcow2", "48M")
    image = await host.ensure_base_image(
        pool=name,
        name="capl-base-path",
        source=ImageFromPath(path=str(source_dir / "golden.qcow2")),
    )
    assert image.imported
    assert image.virtual_size_bytes == 48 * MIB
    assert await asyncio.to_thread(Path(image.volume.path).read_bytes) == data  # copied
    # and from a volume in another pool
    other = "capl-test-" + secrets.token_hex(4)
    pool_names.append(other)
    await host.ensure_pool(PoolSpec(name=other, path=str(POOL_ROOT / other), owner=owner))
    cloned = await host.ensure_base_image(
        pool=other, name="capl-base-clone", source=ImageFromVolume(name="capl-base-path", pool=name)
    )
    assert cloned.volume.pool == other
    assert cloned.virtual_size_bytes == 48 * MIB
    in_place = await host.ensure_base_image(
        pool=other, name="ignored", source=ImageFromVolume(name="capl-base-clone")
    )
    assert not in_place.imported
    assert in_place.volume.path == cloned.volume.path


async def test_import_pool_left_by_a_killed_import_is_used_and_removed(
    host: LibvirtHost,
    pool: tuple[str, ClusterOwner],
    libvirtd_conn: libvirt.virConnect,
    tmp_path: Path,
) -> None:
    """A manager killed between creating its transient import pool and destroying it leaves
    the pool behind (libvirtd keeps it until it restarts); the next import of that path
    finds the file through the pool, copies it, and removes the pool."""
    name, _ = pool
    source_dir = tmp_path / "killed"
    source_dir.mkdir()
    source = source_dir / "golden.qcow2"
    _qcow2(source, "32M")
    leftover = f"capl-import-{short_hash(str(source), length=12)}"
    xml = (
        f"<pool type='dir'><name>{leftover}</name><target><path>{source_dir}</path></target></pool>"
    )
    await asyncio.to_thread(libvirtd_conn.storagePoolCreateXML, xml, 0)
    image = await host.ensure_base_image(
        pool=name, name="capl-base-leftover", source=ImageFromPath(path=str(source))
    )
    assert image.imported
    assert image.virtual_size_bytes == 32 * MIB
    pools = [p.name() for p in libvirtd_conn.listAllStoragePools(0)]
    assert leftover not in pools


@pytest.fixture
def small_filesystem(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs: a pool on it fills up for real."""
    mountpoint = tmp_path / "full"
    mountpoint.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mountpoint)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield mountpoint
    finally:
        subprocess.run(["umount", str(mountpoint)], check=True, timeout=30)


async def test_full_pool_is_a_typed_error_and_leaves_no_volume(
    host: LibvirtHost, pool_names: list[str], small_filesystem: Path
) -> None:
    owner = ClusterOwner(namespace="capl-test", name="c-" + secrets.token_hex(3))
    name = "capl-test-" + secrets.token_hex(4)
    pool_names.append(name)
    await host.ensure_pool(PoolSpec(name=name, path=str(small_filesystem / name), owner=owner))
    before = os.statvfs(small_filesystem / name)
    assert before.f_blocks * before.f_frsize <= MIB, before  # the pool is on the small tmpfs
    try:
        made = await host.upload_volume(pool=name, name="capl-t-big", data=os.urandom(3 * MIB))
    except StorageFull as exc:
        error = exc
    else:  # libvirtd can end a short upload without error; upload_bytes checks the size
        after = os.statvfs(small_filesystem / name)
        listing = sorted((p.name, p.stat().st_size) for p in (small_filesystem / name).iterdir())
        pytest.fail(f"3 MiB uploaded to a 1 MiB tmpfs: {made}; {before=} {after=} {listing=}")
    assert error.reason == "StorageFull"
    assert "No space left on device" in str(error)
    names = {v.name for v in await host.list_volumes(pool=name, refresh=True)}
    assert names == {pool_owner_marker(namespace=owner.namespace, name=owner.name)}
    assert await host.delete_pool(name=name, owner=owner)
