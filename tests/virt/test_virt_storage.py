"""Pools, volumes and base images through the adapter on the test driver.

The test driver keeps volume metadata only (no upload) and clones only within a pool:
content checks and cross-pool clones live in
tests/libvirtd; here the logic: ownership markers, idempotency, import de-duplication,
checksum verification (the download still happens), crash leftovers.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import secrets
import threading
import uuid
import xml.etree.ElementTree as ET
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any

import libvirt
import pytest

from capl.ports.errors import (
    AlreadyExists,
    ImageChecksumError,
    ImageDownloadError,
    ImageError,
    ImageFormatError,
    PoolNotFound,
)
from capl.ports.naming import pool_owner_marker
from capl.ports.virt import (
    BaseImage,
    ClusterOwner,
    ImageFromURL,
    ImageFromVolume,
    MachineVolumes,
    PoolSpec,
    VolumeFormat,
)
from capl.virt import LibvirtHost, LibvirtHosts
from capl.virt.counting import remembered
from capl.virt.storage import lookup_pool
from tests.fixtures.images import ImageServer, qcow2_image

GIB = 1024**3
URI = "test:///default"


@pytest.fixture
async def pool(host: LibvirtHost) -> AsyncIterator[tuple[str, ClusterOwner]]:
    owner = ClusterOwner(namespace="ns", name="c-" + secrets.token_hex(3), uid="u")
    name = "capl-test-" + secrets.token_hex(4)
    info = await host.ensure_pool(
        PoolSpec(name=name, path=f"/var/lib/capl-test/{name}", owner=owner)
    )
    assert info.created
    yield name, owner
    await host.delete_pool(name=name, owner=owner)


async def test_pool_create_adopt_and_delete(host: LibvirtHost) -> None:
    owner = ClusterOwner(namespace="ns", name="c-" + secrets.token_hex(3))
    name = "capl-test-" + secrets.token_hex(4)
    spec = PoolSpec(name=name, path=f"/var/lib/capl-test/{name}", owner=owner)
    created = await host.ensure_pool(spec)
    assert created.created
    assert created.active
    assert created.autostart
    assert created.persistent
    assert created.owned_by(owner)
    again = await host.ensure_pool(spec)
    assert not again.created
    assert again.owned_by(owner)
    with pytest.raises(AlreadyExists, match="target path"):
        await host.ensure_pool(PoolSpec(name=name, path="/elsewhere", owner=owner))
    other = ClusterOwner(namespace="ns", name="someone-else")
    assert not (await host.get_pool(name)).owned_by(other)  # type: ignore[union-attr]
    assert not await host.delete_pool(name=name, owner=other)
    await host.create_volume(pool=name, name="capl-x-root.qcow2", capacity_bytes=GIB)
    assert await host.delete_pool(name=name, owner=owner)  # capl volumes go with it
    assert await host.get_pool(name) is None
    assert not await host.delete_pool(name=name, owner=owner)


async def test_pool_with_foreign_volumes_is_kept(host: LibvirtHost) -> None:
    owner = ClusterOwner(namespace="ns", name="c-" + secrets.token_hex(3))
    name = "capl-test-" + secrets.token_hex(4)
    await host.ensure_pool(PoolSpec(name=name, path=f"/var/lib/capl-test/{name}", owner=owner))
    await host.create_volume(pool=name, name="users-disk.qcow2", capacity_bytes=GIB)
    assert not await host.delete_pool(name=name, owner=owner)
    assert await host.get_pool(name) is not None
    assert await host.delete_volume(pool=name, name="users-disk.qcow2")
    assert await host.delete_pool(name=name, owner=owner)


async def test_adopted_pool_is_not_owned(host: LibvirtHost) -> None:
    owner = ClusterOwner(namespace="ns", name="c")
    info = await host.ensure_pool(PoolSpec(name="default-pool", path="/default-pool", owner=owner))
    assert not info.created
    assert not info.owned_by(owner)
    assert not await host.delete_pool(name="default-pool", owner=owner)


async def test_volumes(host: LibvirtHost, pool: tuple[str, ClusterOwner]) -> None:
    name, owner = pool
    base = await host.create_volume(pool=name, name="capl-base-a", capacity_bytes=2 * GIB)
    image = await host.ensure_base_image(
        pool=name, name="capl-base-a", source=ImageFromVolume(name="capl-base-a")
    )
    assert not image.imported  # used in place, never ours to delete
    assert image.virtual_size_bytes == 2 * GIB
    overlay = await host.create_overlay(
        pool=name, name="capl-m-root.qcow2", backing=image, capacity_bytes=GIB
    )
    assert overlay.backing_path == base.path
    assert overlay.backing_format == "qcow2"
    assert overlay.capacity_bytes == 2 * GIB  # raised to the backing image's size
    same = await host.create_overlay(
        pool=name, name="capl-m-root.qcow2", backing=image, capacity_bytes=10 * GIB
    )
    assert same.capacity_bytes == overlay.capacity_bytes  # existing: returned as is
    payload = b'{"ignition": {"version": "3.4.0"}}'
    uploaded = await host.upload_volume(pool=name, name="capl-m-ignition.ign", data=payload)
    assert uploaded.capacity_bytes == len(payload)  # metadata only on the test driver
    replaced = await host.upload_volume(pool=name, name="capl-m-ignition.ign", data=payload * 2)
    assert replaced.capacity_bytes == 2 * len(payload)
    refs = await host.list_volumes(pool=name, prefix="capl-m-")
    assert [r.name for r in refs] == ["capl-m-ignition.ign", "capl-m-root.qcow2"]
    assert await host.delete_volume(pool=name, name="capl-m-root.qcow2")
    assert not await host.delete_volume(pool=name, name="capl-m-root.qcow2")
    assert await host.get_volume(pool=name, name="capl-m-root.qcow2") is None
    marker = pool_owner_marker(namespace=owner.namespace, name=owner.name)
    assert marker in {r.name for r in await host.list_volumes(pool=name)}
    with pytest.raises(PoolNotFound):
        await host.create_volume(pool="capl-test-nopool", name="x", capacity_bytes=GIB)
    with pytest.raises(ImageError, match="does not exist") as info:
        await host.ensure_base_image(
            pool=name, name="missing", source=ImageFromVolume(name="missing")
        )
    assert info.value.reason == "ImageNotFound"


async def test_url_import_is_verified_and_shared(
    host: LibvirtHost, pool: tuple[str, ClusterOwner], image_server: ImageServer
) -> None:
    name, _ = pool
    data = qcow2_image(3 * GIB)
    image_server.files["/fcos.qcow2"] = data
    source = ImageFromURL(
        url=image_server.url("/fcos.qcow2"), sha256=hashlib.sha256(data).hexdigest()
    )
    image_server.gate = asyncio.Event()

    def start() -> asyncio.Future[BaseImage]:
        return asyncio.ensure_future(
            host.ensure_base_image(pool=name, name="capl-base-fcos", source=source)
        )

    first = start()
    await asyncio.wait_for(image_server.requested.wait(), timeout=30)  # download in flight
    others = [start() for _ in range(4)]
    image_server.gate.set()
    images = await asyncio.gather(first, *others)
    assert image_server.requests == ["/fcos.qcow2"]  # one download for five callers
    assert {i.volume.path for i in images} == {images[0].volume.path}
    assert images[0].virtual_size_bytes == 3 * GIB
    assert images[0].volume.format == "qcow2"
    # a later call finds the completed import without downloading again
    image_server.gate = None
    again = await host.ensure_base_image(pool=name, name="capl-base-fcos", source=source)
    assert again.volume.path == images[0].volume.path
    assert len(image_server.requests) == 1


async def test_checksum_mismatch_leaves_nothing(
    host: LibvirtHost, pool: tuple[str, ClusterOwner], image_server: ImageServer
) -> None:
    name, _ = pool
    image_server.files["/bad.qcow2"] = qcow2_image(GIB)
    source = ImageFromURL(url=image_server.url("/bad.qcow2") + "?token=s3cr3t", sha256="0" * 64)
    with pytest.raises(ImageChecksumError) as info:
        await host.ensure_base_image(pool=name, name="capl-base-bad", source=source)
    assert info.value.reason == "ImageChecksumMismatch"
    assert "s3cr3t" not in str(info.value)
    assert not [r for r in await host.list_volumes(pool=name) if r.name.startswith("capl-base-bad")]


@pytest.mark.parametrize(
    ("path", "content", "error", "reason"),
    [
        ("/missing.qcow2", None, ImageDownloadError, "ImageDownloadFailed"),
        (
            "/page.html",
            b"<!DOCTYPE html><html>login</html>",
            ImageFormatError,
            "ImageFormatInvalid",
        ),
        ("/empty", b"", ImageFormatError, "ImageFormatInvalid"),
    ],
)
async def test_bad_images_are_typed_errors(
    host: LibvirtHost,
    pool: tuple[str, ClusterOwner],
    image_server: ImageServer,
    path: str,
    content: bytes | None,
    error: type[ImageError],
    reason: str,
) -> None:
    name, _ = pool
    if content is not None:
        image_server.files[path] = content
    with pytest.raises(error) as info:
        await host.ensure_base_image(
            pool=name, name="capl-base-x", source=ImageFromURL(url=image_server.url(path))
        )
    assert info.value.reason == reason
    assert not [r for r in await host.list_volumes(pool=name) if r.name.startswith("capl-base-x")]


async def test_unreachable_image_server(host: LibvirtHost, pool: tuple[str, ClusterOwner]) -> None:
    name, _ = pool
    with pytest.raises(ImageDownloadError, match=re.escape("download http://127.0.0.1:9/")):
        await host.ensure_base_image(
            pool=name, name="capl-base-y", source=ImageFromURL(url="http://127.0.0.1:9/img")
        )


async def test_leftovers_of_an_interrupted_import_are_replaced(
    host: LibvirtHost, pool: tuple[str, ClusterOwner], image_server: ImageServer
) -> None:
    name, _ = pool
    # a crash after the volume was created but before the completion marker
    await host.create_volume(
        pool=name, name="capl-base-z", capacity_bytes=1, format=VolumeFormat.RAW
    )
    data = qcow2_image(GIB)
    image_server.files["/z.qcow2"] = data
    image = await host.ensure_base_image(
        pool=name, name="capl-base-z", source=ImageFromURL(url=image_server.url("/z.qcow2"))
    )
    assert image.virtual_size_bytes == GIB
    assert image_server.requests == ["/z.qcow2"]
    info = await host.get_volume(pool=name, name="capl-base-z")
    assert info is not None
    assert info.capacity_bytes == GIB  # recreated, not the stale 1-byte volume


async def test_pool_lock_serializes_parallel_volume_creation(
    host: LibvirtHost, pool: tuple[str, ClusterOwner]
) -> None:
    name, _ = pool
    make: Callable[[int], object] = lambda i: host.create_volume(  # noqa: E731
        pool=name, name=f"capl-par-{i}.qcow2", capacity_bytes=GIB
    )
    await asyncio.gather(*(make(i) for i in range(20)))  # type: ignore[arg-type]
    assert len(await host.list_volumes(pool=name, prefix="capl-par-")) == 20


async def test_a_users_volume_is_never_taken_for_a_leftover(
    host: LibvirtHost, pool: tuple[str, ClusterOwner], image_server: ImageServer
) -> None:
    name, _ = pool
    await host.create_volume(pool=name, name="golden.qcow2", capacity_bytes=GIB)
    image_server.files["/g.qcow2"] = qcow2_image(GIB)
    with pytest.raises(AlreadyExists, match="not imported by capl"):
        await host.ensure_base_image(
            pool=name, name="golden.qcow2", source=ImageFromURL(url=image_server.url("/g.qcow2"))
        )
    assert await host.get_volume(pool=name, name="golden.qcow2") is not None
    assert image_server.requests == []
    await host.delete_volume(pool=name, name="golden.qcow2")


async def test_a_remembered_pool_is_looked_up_again_when_re_created_elsewhere(
    hosts: LibvirtHosts, host: LibvirtHost, pool: tuple[str, ClusterOwner]
) -> None:
    """Volume calls look the pool up once per connection handle (counting.remembered); after
    a pool was destroyed and defined again behind the adapter's back (new UUID) the
    operation succeeds (the test driver finds pools by name; a driver that goes by UUID
    fails the stale object's call, and the operation is run again: the next test)."""
    name, _ = pool
    await host.create_volume(pool=name, name="capl-r-1", capacity_bytes=GIB)
    before = hosts.calls.snapshot()[host.host_id]
    await host.create_volume(pool=name, name="capl-r-2", capacity_bytes=GIB)
    after = hosts.calls.snapshot()[host.host_id]
    assert after.get("virConnect.storagePoolLookupByName") == before.get(
        "virConnect.storagePoolLookupByName"
    )
    other = libvirt.open(URI)
    try:
        old = other.storagePoolLookupByName(name)
        root = ET.fromstring(old.XMLDesc(0))
        old_uuid = old.UUIDString()
        for element in root.findall("uuid"):
            root.remove(element)
        for volume in old.listAllVolumes(0):
            volume.delete(0)
        old.destroy()
        old.undefine()
        new = other.storagePoolDefineXML(ET.tostring(root, encoding="unicode"), 0)
        new.create(0)
        assert new.UUIDString() != old_uuid
        made = await host.create_volume(pool=name, name="capl-r-3", capacity_bytes=GIB)
        assert made.name == "capl-r-3"
        assert [v.name() for v in new.listAllVolumes(0)] == ["capl-r-3"]
    finally:
        other.close()


class _PoolGone(libvirt.libvirtError):
    def get_error_code(self) -> int:
        return int(libvirt.VIR_ERR_NO_STORAGE_POOL)


async def test_an_operation_whose_remembered_pool_is_gone_runs_again_afresh(
    host: LibvirtHost,
) -> None:
    looked_up: list[int] = []
    attempts: list[object] = []

    def op(c: object) -> object:
        pool = remembered(c, "pool", "p", lambda: looked_up.append(1) or object())
        attempts.append(pool)
        if len(attempts) == 1:
            raise _PoolGone("no storage pool with matching uuid")
        return pool

    assert await host.connection.run("remembered pool", op) is attempts[1]
    assert len(looked_up) == 2
    assert attempts[0] is not attempts[1]
    # a pool that is really gone: the second attempt's error stands
    with pytest.raises(PoolNotFound):
        await host.connection.run("missing pool", lambda c: lookup_pool(c, "capl-none-x"))


async def test_a_base_image_is_checked_once_until_it_is_deleted(
    hosts: LibvirtHosts, host: LibvirtHost, pool: tuple[str, ClusterOwner]
) -> None:
    """A scale-out checks its base image once (ImageImporter remembers it per connection);
    deleting it through capl makes the next machine check (and fail) again."""
    name, _ = pool
    await host.create_volume(pool=name, name="capl-base-k", capacity_bytes=GIB)
    source = ImageFromVolume(name="capl-base-k")
    first = await host.ensure_base_image(pool=name, name="capl-base-k", source=source)
    total = hosts.calls.total(host.host_id)
    again = await host.ensure_base_image(pool=name, name="capl-base-k", source=source)
    assert again == first
    assert hosts.calls.total(host.host_id) == total  # no libvirt call
    assert await host.delete_volume(pool=name, name="capl-base-k")
    with pytest.raises(ImageError, match="does not exist"):
        await host.ensure_base_image(pool=name, name="capl-base-k", source=source)


async def test_a_machines_volumes_are_made_in_one_operation(
    hosts: LibvirtHosts, host: LibvirtHost, pool: tuple[str, ClusterOwner]
) -> None:
    """Host.create_machine_volumes: the name check, root overlay, extra disk and bootstrap
    volume in one worker-thread operation, the steps in order on that thread, the paths as
    the volumes' own descriptions give them, without reading those descriptions; a domain
    of that name with another UUID: nothing is made."""
    name, _ = pool
    await host.create_volume(pool=name, name="capl-base-b", capacity_bytes=2 * GIB)
    image = await host.ensure_base_image(
        pool=name, name="capl-base-b", source=ImageFromVolume(name="capl-base-b")
    )
    request = MachineVolumes(
        pool=name,
        domain_name="capl-test-mv-" + secrets.token_hex(3),
        domain_uuid=str(uuid.uuid4()),
        root="capl-mv-root.qcow2",
        backing=image,
        root_capacity_bytes=GIB,
        extras=(("capl-mv-data-0.qcow2", 3 * GIB),),
        bootstrap="capl-mv-ignition.ign",
        bootstrap_data=b'{"ignition": {"version": "3.4.0"}}',
    )
    assert "3.4.0" not in repr(request)  # secret material is never shown
    steps: list[tuple[str, bool]] = []

    def step(what: str) -> None:
        steps.append((what, threading.current_thread() is threading.main_thread()))

    handed = 0
    run = host.connection.run

    async def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal handed
        handed += 1
        return await run(*args, **kwargs)

    before = hosts.calls.snapshot()[host.host_id]
    host.connection.run = counted  # type: ignore[method-assign]
    try:
        made = await host.create_machine_volumes(request, on_step=step)
    finally:
        del host.connection.run
    after = hosts.calls.snapshot()[host.host_id]
    assert handed == 1
    assert steps == [("root-volume", False), ("extra-volumes", False), ("bootstrap-volume", False)]
    assert {k: n - before.get(k, 0) for k, n in after.items() if n != before.get(k, 0)} == {
        "virConnect.lookupByName": 1,
        "virStoragePool.createXML": 3,
    }
    assert made.holder is None
    root = await host.get_volume(pool=name, name=request.root)
    data = await host.get_volume(pool=name, name="capl-mv-data-0.qcow2")
    ignition = await host.get_volume(pool=name, name=request.bootstrap)
    assert root is not None
    assert data is not None
    assert ignition is not None
    assert (made.root, made.extras, made.bootstrap) == (root.path, (data.path,), ignition.path)
    assert root.backing_path == image.volume.path
    assert root.capacity_bytes == 2 * GIB  # raised to the backing image's size
    assert data.capacity_bytes == 3 * GIB
    assert ignition.capacity_bytes == len(request.bootstrap_data)
    # again: existing volumes are kept (the bootstrap volume is written anew)
    assert await host.create_machine_volumes(request) == made

    conn = libvirt.open(URI)
    try:
        foreign = conn.defineXML(
            f"<domain type='test'><name>{request.domain_name}</name>"
            "<memory unit='MiB'>64</memory><os><type arch='x86_64'>hvm</type></os></domain>"
        )
        try:
            other = replace(request, root="capl-mv2-root.qcow2", bootstrap="capl-mv2.ign")
            held = await host.create_machine_volumes(other, on_step=step)
            assert held.holder is not None
            assert held.holder.uuid == foreign.UUIDString()
            assert (held.root, held.extras, held.bootstrap) == ("", (), "")
            assert await host.get_volume(pool=name, name=other.root) is None
            assert await host.get_volume(pool=name, name=other.bootstrap) is None
            assert len(steps) == 3  # no step of the refused request ran
        finally:
            foreign.undefine()
    finally:
        conn.close()
