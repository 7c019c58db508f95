"""Base image import: once per (host, pool, volume), streamed, verified, crash-safe.

- Concurrent callers for the same (host, pool, volume name) share one import: the first
  caller starts it as its own task (a cancelled reconcile does not abort it), the others
  await the same ``concurrent.futures.Future`` (loop-independent).
- Trust needs a completion marker: after the content is written and verified, a zero-byte
  volume ``<name>.capl-complete`` is created. A volume without its marker is the leftover of
  an import that crashed half-way: it is deleted and imported again. libvirt cannot rename
  volumes, so a marker stands in for "download to a temporary name, then rename".
- From a URL: an HTTP GET streamed in 1 MiB chunks into ``virStorageVolUpload`` (never whole
  in memory), hashed on the way; the format is sniffed from the first bytes (qcow2 magic,
  else raw; an HTML page is refused). A checksum mismatch aborts the stream and deletes the
  volume before ``ImageChecksumError`` is raised.
- From a host path: libvirt copies it (``createXMLFrom``) from the pool that holds the file,
  or from a transient directory pool created for the file's directory.
- From a volume: used as is when it is in the target pool (never deleted by capl), cloned
  otherwise.
- A base image found complete (or imported) is remembered per (host, pool, volume) while the
  host's connection lasts, so that a scale-out checks it once, not once per machine. It is
  forgotten when capl deletes that volume or its pool, defines the pool, and when an overlay
  on it fails (``forget``): a base image removed behind capl's back costs the next machine
  one failed attempt, and its retry checks (and imports) again.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import hashlib
import logging
import os
import struct
import threading
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import libvirt

from capl.ports.errors import (
    AlreadyExists,
    ImageChecksumError,
    ImageDownloadError,
    ImageError,
    ImageFormatError,
    NotFound,
    VirtError,
)
from capl.ports.naming import is_capl_name, short_hash
from capl.ports.virt import (
    BaseImage,
    HostId,
    ImageFromPath,
    ImageFromURL,
    ImageFromVolume,
    ImageSource,
    VolumeFormat,
    VolumeInfo,
)
from capl.virt import storage
from capl.virt.pools import PoolDrivers, VolumeRequest
from capl.virt.pools.directory import build_pool_xml
from capl.virt.support import code_of, lookup, retry_busy

if TYPE_CHECKING:
    from capl.virt.connection import HostConnection
    from capl.virt.support import LockTable

__all__ = ["COMPLETE_SUFFIX", "ImageImporter", "redact_url"]

log = logging.getLogger(__name__)

COMPLETE_SUFFIX = ".capl-complete"
CHUNK = 1 << 20
QCOW2_MAGIC = b"QFI\xfb"
_NO_VOL = libvirt.VIR_ERR_NO_STORAGE_VOL


def redact_url(url: str) -> str:
    """scheme://host/path: signed URLs carry tokens in the query and userinfo."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def sniff_format(head: bytes) -> tuple[VolumeFormat, int | None]:
    """(format, virtual size if the header says) from an image's first bytes."""
    if head.startswith(QCOW2_MAGIC):
        if len(head) < 32:
            raise ImageFormatError("qcow2 image is truncated (header shorter than 32 bytes)")
        (size,) = struct.unpack(">Q", head[24:32])
        return VolumeFormat.QCOW2, int(size)
    lowered = head[:512].lstrip().lower()
    if lowered.startswith((b"<!doctype html", b"<html", b"<?xml")):
        raise ImageFormatError("the URL returned an HTML/XML document, not a disk image")
    return VolumeFormat.RAW, None


class ImageImporter:
    """In-flight de-duplication of imports (process-wide, shared by all hosts)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._inflight: dict[tuple[HostId, str, str], concurrent.futures.Future[BaseImage]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        # (host, pool, volume) -> (connection generation, the image): see the module docstring
        self._known: dict[tuple[HostId, str, str], tuple[int, BaseImage]] = {}

    def forget(self, host_id: HostId, pool: str, name: str | None = None) -> None:
        """Forget the remembered base image ``name`` (every one of ``pool`` when None)."""
        with self._lock:
            for key in [k for k in self._known if k[:2] == (host_id, pool)]:
                if name is None or name in (key[2], key[2] + COMPLETE_SUFFIX):
                    del self._known[key]

    def inflight(self) -> int:
        with self._lock:
            return len(self._inflight)

    async def ensure(
        self,
        conn: HostConnection,
        locks: LockTable,
        drivers: PoolDrivers,
        *,
        pool: str,
        name: str,
        source: ImageSource,
    ) -> BaseImage:
        key = (conn.host_id, pool, name)
        generation = conn.generation
        with self._lock:
            known = self._known.get(key)
            if known is not None and known[0] == generation:
                return known[1]
            future = self._inflight.get(key)
            starter = future is None
            if future is None:
                future = self._inflight[key] = concurrent.futures.Future()
        if starter:
            task = asyncio.get_running_loop().create_task(
                self._run(conn, locks, drivers, key, future, pool=pool, name=name, source=source)
            )
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return await asyncio.wrap_future(future)

    async def _run(
        self,
        conn: HostConnection,
        locks: LockTable,
        drivers: PoolDrivers,
        key: tuple[HostId, str, str],
        future: concurrent.futures.Future[BaseImage],
        *,
        pool: str,
        name: str,
        source: ImageSource,
    ) -> None:
        generation = conn.generation  # remembered for this connection only
        try:
            result = await _import(conn, locks, drivers, pool=pool, name=name, source=source)
        except asyncio.CancelledError:
            future.set_exception(ImageError(f"import of {name} into pool {pool} was interrupted"))
            raise
        except BaseException as exc:
            future.set_exception(exc)
        else:
            with self._lock:
                self._known[key] = (generation, result)
            future.set_result(result)
        finally:
            with self._lock:
                self._inflight.pop(key, None)


async def _import(
    conn: HostConnection,
    locks: LockTable,
    drivers: PoolDrivers,
    *,
    pool: str,
    name: str,
    source: ImageSource,
) -> BaseImage:
    if isinstance(source, ImageFromVolume) and source.pool in (None, pool):
        return await conn.run(
            f"use volume {source.name} as base image", lambda c: _use_in_place(c, pool, source.name)
        )
    marker = name + COMPLETE_SUFFIX
    existing = await conn.run(
        f"check base image {name}", lambda c: _complete_or_reset(c, locks, pool, name, marker)
    )
    if existing is not None:
        return existing
    if isinstance(source, ImageFromURL):
        image = await _download(conn, locks, drivers, pool=pool, name=name, source=source)
    elif isinstance(source, ImageFromPath):
        image = await conn.run(
            f"copy image {source.path} into pool {pool}",
            lambda c: _copy_from_path(c, locks, drivers, pool, name, source),
        )
    else:
        image = await conn.run(
            f"clone volume {source.name} into pool {pool}",
            lambda c: _clone_volume(c, locks, drivers, pool, name, source),
        )
    await conn.run(
        f"mark base image {name} complete", lambda c: _mark(c, locks, drivers, pool, marker)
    )
    log.info("base image %s imported into pool %s on %s", name, pool, conn.host_id)
    return image


def _use_in_place(c: Any, pool_name: str, name: str) -> BaseImage:
    info = storage.get_volume(c, pool_name, name)
    if info is None:
        raise ImageError(
            f"base image volume {name!r} does not exist in pool {pool_name!r}",
            reason="ImageNotFound",
        )
    return BaseImage(volume=info, virtual_size_bytes=info.capacity_bytes, imported=False)


def _complete_or_reset(
    c: Any, locks: LockTable, pool_name: str, name: str, marker: str
) -> BaseImage | None:
    """The imported image if complete; otherwise remove leftovers of a crashed import."""
    with locks.get("pool", pool_name):
        pool = storage.lookup_pool(c, pool_name)
        volume = storage.lookup_volume(pool, name)
        done = storage.lookup_volume(pool, marker)
        if volume is not None and done is not None:
            info = storage.volume_info(volume, pool=pool_name)
            return BaseImage(volume=info, virtual_size_bytes=info.capacity_bytes, imported=True)
        if volume is not None and not is_capl_name(name):
            # only capl-named volumes can be leftovers of capl's own imports
            raise AlreadyExists(
                f"volume {name!r} exists in pool {pool_name!r} and was not imported by capl; "
                "use it as an existing volume or choose another name"
            )
        for leftover, what in ((volume, name), (done, marker)):
            if leftover is not None:
                log.warning(
                    "removing %s in pool %s: left by an interrupted import", what, pool_name
                )
                storage.delete_handle(leftover)
        return None


def _mark(c: Any, locks: LockTable, drivers: PoolDrivers, pool_name: str, marker: str) -> None:
    with locks.get("pool", pool_name):
        storage.create_volume(
            c, pool_name, marker, drivers=drivers, capacity_bytes=0, format=VolumeFormat.RAW
        )


def _delete_quietly(c: Any, locks: LockTable, pool_name: str, name: str) -> None:
    with locks.get("pool", pool_name):
        try:
            storage.delete_volume(c, pool_name, name)
        except (libvirt.libvirtError, VirtError) as exc:
            log.error("could not remove partial image %s from pool %s: %s", name, pool_name, exc)


async def _download(
    conn: HostConnection,
    locks: LockTable,
    drivers: PoolDrivers,
    *,
    pool: str,
    name: str,
    source: ImageFromURL,
) -> BaseImage:
    shown = redact_url(source.url)
    expected = (source.sha256 or "").strip().lower() or None
    if expected is not None and (
        len(expected) != 64 or any(ch not in "0123456789abcdef" for ch in expected)
    ):
        raise ImageError(
            f"sha256 {source.sha256!r} for {shown} is not 64 hex digits",
            reason="ImageChecksumInvalid",
        )
    upload = _Upload(conn, locks, drivers, pool=pool, name=name)
    try:
        try:
            image_format, virtual, total = await _stream_into(upload, source, shown, expected)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ImageDownloadError(f"download {shown}: {type(exc).__name__}: {exc}") from exc
        await upload.finish()
        info = await conn.run(f"read volume {name}", lambda c: storage.get_volume(c, pool, name))
    except BaseException:
        await upload.discard()
        raise
    if info is None:
        raise ImageError(f"image volume {name} vanished from pool {pool} after the upload")
    volume = VolumeInfo(
        pool=info.pool,
        name=info.name,
        path=info.path,
        format=image_format.value,
        capacity_bytes=virtual or total,
        allocation_bytes=info.allocation_bytes,
    )
    return BaseImage(volume=volume, virtual_size_bytes=virtual or total, imported=True)


async def _stream_into(
    upload: _Upload, source: ImageFromURL, shown: str, expected: str | None
) -> tuple[VolumeFormat, int | None, int]:
    """GET the URL and push it through ``upload``; returns (format, virtual size, bytes)."""
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=120)
    digest = hashlib.sha256()
    total = 0
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.get(source.url) as response,
    ):
        if response.status != 200:
            raise ImageDownloadError(
                f"download {shown}: HTTP {response.status} {response.reason or ''}".rstrip()
            )
        length = response.content_length
        chunks = response.content.iter_chunked(CHUNK)
        head = b""
        async for chunk in chunks:
            head += chunk
            if len(head) >= 512:
                break
        if not head:
            raise ImageFormatError(f"{shown} is empty")
        image_format, virtual = sniff_format(head)
        declared = source.format
        if (
            declared is not None
            and declared is not image_format
            and not (declared is VolumeFormat.ISO and image_format is VolumeFormat.RAW)
        ):
            raise ImageFormatError(f"{shown} is {image_format.value}, expected {declared.value}")
        await upload.begin(size_hint=virtual or length or 0, length=length)
        pending = head
        while pending:
            digest.update(pending)
            total += len(pending)
            await upload.send(pending)
            try:
                pending = await chunks.__anext__()
            except StopAsyncIteration:
                pending = b""
    if length is not None and total != length:
        raise ImageDownloadError(f"download {shown}: got {total} of {length} bytes")
    actual = digest.hexdigest()
    if expected is not None and actual != expected:
        raise ImageChecksumError(
            f"image {shown}: sha256 is {actual}, expected {expected}",
            expected=expected,
            actual=actual,
        )
    return image_format, virtual, total


class _Upload:
    """The target volume and its upload stream; ``discard`` undoes everything."""

    def __init__(
        self, conn: HostConnection, locks: LockTable, drivers: PoolDrivers, *, pool: str, name: str
    ) -> None:
        self._conn = conn
        self._locks = locks
        self._drivers = drivers
        self._pool = pool
        self._name = name
        self._stream: Any = None
        self._created = False

    async def begin(self, *, size_hint: int, length: int | None) -> None:
        self._stream = await self._conn.run(
            f"create volume {self._name} in pool {self._pool}",
            lambda c: _begin_upload(
                c, self._locks, self._drivers, self._pool, self._name, size_hint, length
            ),
        )
        self._created = True

    async def send(self, data: bytes) -> None:
        stream = self._stream
        if stream is not None:
            await self._conn.run(
                f"upload image {self._name}", lambda _c: storage.send_all(stream, data)
            )

    async def finish(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            await self._conn.run(f"finish upload of {self._name}", lambda _c: stream.finish())

    async def discard(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            await _abort(self._conn, stream)
        if self._created:
            self._created = False
            await self._conn.run(
                f"remove partial image {self._name}",
                lambda c: _delete_quietly(c, self._locks, self._pool, self._name),
            )


async def _abort(conn: HostConnection, stream: Any) -> None:
    def abort(_c: Any) -> None:
        with contextlib.suppress(libvirt.libvirtError):
            stream.abort()

    try:
        await conn.run("abort upload", abort)
    except VirtError as exc:
        log.warning("aborting an upload stream: %s", exc)


def _begin_upload(
    c: Any,
    locks: LockTable,
    drivers: PoolDrivers,
    pool_name: str,
    name: str,
    size_hint: int,
    length: int | None,
) -> Any:
    """Create the target volume and open its upload stream (None on the test driver)."""
    test_driver = storage.is_test_driver(c)
    with locks.get("pool", pool_name):
        pool = storage.lookup_pool(c, pool_name)
        xml = drivers.of(pool).volume_xml(
            VolumeRequest(
                name=name, capacity_bytes=size_hint if test_driver else 0, format=VolumeFormat.RAW
            )
        )
        volume = retry_busy(lambda: pool.createXML(xml, 0))
    if test_driver:
        return None
    stream = c.newStream(0)
    try:
        volume.upload(stream, 0, length or 0, 0)
    except BaseException:
        with contextlib.suppress(libvirt.libvirtError):
            stream.abort()
        raise
    return stream


def _import_pool_name(path: str) -> str:
    return f"capl-import-{short_hash(path, length=12)}"


def _source_volume_for_path(c: Any, path: str) -> tuple[Any, Any | None]:
    """(volume, transient pool to destroy afterwards or None). The caller holds the path's
    import lock, so a transient import pool of this path that exists already was left by a
    process killed mid-import: it is used and destroyed like a new one."""
    volume = lookup(lambda: c.storageVolLookupByPath(path), _NO_VOL)
    if volume is not None:
        holder = volume.storagePoolLookupByVolume()
        if holder.name() == _import_pool_name(path) and not holder.isPersistent():
            return volume, holder
        return volume, None
    directory, filename = os.path.split(os.path.normpath(path))
    transient = c.storagePoolCreateXML(
        build_pool_xml(name=_import_pool_name(path), path=directory or "/"), 0
    )
    try:
        volume = lookup(lambda: transient.storageVolLookupByName(filename), _NO_VOL)
        if volume is None:
            raise ImageError(
                f"image file {path!r} does not exist on the host", reason="ImageNotFound"
            )
    except BaseException:
        _destroy_quietly(transient)
        raise
    return volume, transient


def _destroy_quietly(pool: Any) -> None:
    try:
        retry_busy(lambda: pool.destroy())
    except libvirt.libvirtError as exc:
        log.warning("removing a transient import pool: %s", exc.get_error_message())


def _clone_into(
    c: Any,
    locks: LockTable,
    drivers: PoolDrivers,
    pool_name: str,
    name: str,
    source_volume: Any,
    declared: VolumeFormat | None,
) -> BaseImage:
    source_info = storage.volume_info(source_volume, pool="")
    fmt = declared or (VolumeFormat.QCOW2 if source_info.format == "qcow2" else VolumeFormat.RAW)
    request = VolumeRequest(name=name, capacity_bytes=source_info.capacity_bytes, format=fmt)
    with locks.get("pool", pool_name):
        pool = storage.lookup_pool(c, pool_name)
        xml = drivers.of(pool).volume_xml(request)
        try:
            volume = retry_busy(lambda: pool.createXMLFrom(xml, source_volume, 0))
        except BaseException:
            storage.delete_volume(c, pool_name, name)
            raise
    info = storage.volume_info(volume, pool=pool_name)
    return BaseImage(volume=info, virtual_size_bytes=info.capacity_bytes, imported=True)


def _copy_from_path(
    c: Any, locks: LockTable, drivers: PoolDrivers, pool_name: str, name: str, source: ImageFromPath
) -> BaseImage:
    with locks.get("import", source.path):
        try:
            volume, transient = _source_volume_for_path(c, source.path)
        except libvirt.libvirtError as exc:
            raise ImageError(
                f"image file {source.path!r} on the host: {exc.get_error_message()}",
                code=code_of(exc),
                reason="ImageNotFound",
            ) from exc
        try:
            return _clone_into(c, locks, drivers, pool_name, name, volume, source.format)
        finally:
            if transient is not None:
                _destroy_quietly(transient)


def _clone_volume(
    c: Any,
    locks: LockTable,
    drivers: PoolDrivers,
    pool_name: str,
    name: str,
    source: ImageFromVolume,
) -> BaseImage:
    assert source.pool is not None
    try:
        source_pool = storage.lookup_pool(c, source.pool)
    except NotFound as exc:
        raise ImageError(str(exc), reason="ImageNotFound") from exc
    volume = storage.lookup_volume(source_pool, source.name)
    if volume is None:
        raise ImageError(
            f"base image volume {source.name!r} does not exist in pool {source.pool!r}",
            reason="ImageNotFound",
        )
    return _clone_into(c, locks, drivers, pool_name, name, volume, None)
