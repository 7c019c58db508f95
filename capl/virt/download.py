"""Reading the end of a volume back from its host (blocking; runs in worker threads).

The use: a domain's serial console log. virtlogd writes it into the cluster's pool directory
(``<serial><log file=...>``, see ``capl.virt.domainxml``), so on any host, remote ones
included, it can be read through libvirt's storage API with ``virStorageVolDownload``:
no SSH, no file access on the manager's side. The log is a file libvirt did not create, so
it becomes a volume only after a rescan of the pool; ``read_tail`` looks it up first and
rescans once (under the pool's lock, like ``storage.delete_volume``) when libvirt does not
know it yet.

Only the last ``limit`` bytes are asked for (offset and length of the download), and the
stream is read until it ends or ``limit`` bytes arrived, so the cost is bounded however
large the file grows. The test driver stores no content and has no download support:
``None`` there, without a call. The bytes may hold secrets (a console shows what the guest
prints): they are returned, never logged.
"""

from __future__ import annotations

import contextlib
from typing import Any

import libvirt

from capl.ports.virt import VolumeTail
from capl.virt.storage import is_test_driver, lookup_pool, lookup_volume
from capl.virt.support import retry_busy

__all__ = ["read_tail"]

_CHUNK = 64 * 1024


def read_tail(c: Any, pool_name: str, name: str, limit: int) -> VolumeTail | None:
    """The last ``limit`` bytes of volume ``name`` in pool ``pool_name``; None when the
    driver cannot download or the volume does not exist (after one rescan)."""
    if is_test_driver(c) or limit <= 0:
        return None
    pool = lookup_pool(c, pool_name)
    volume = lookup_volume(pool, name)
    if volume is None and pool.isActive():
        retry_busy(lambda: pool.refresh(0))
        volume = lookup_volume(pool, name)
    if volume is None:
        return None
    size = int(volume.info()[1])  # a file's capacity is its size (refreshed by the call)
    offset = max(0, size - limit)
    if size <= offset:
        return VolumeTail(data=b"", offset=offset)
    stream = c.newStream(0)
    try:
        volume.download(stream, offset, size - offset, 0)
        data = bytearray()
        while len(data) < limit:
            chunk = stream.recv(min(_CHUNK, limit - len(data)))
            if isinstance(chunk, int) or not chunk:  # -2 cannot happen on a blocking stream
                break
            data += chunk
        if len(data) < limit:
            stream.finish()
        else:
            _abort(stream)
    except BaseException:
        _abort(stream)
        raise
    return VolumeTail(data=bytes(data), offset=offset)


def _abort(stream: Any) -> None:
    with contextlib.suppress(libvirt.libvirtError):
        stream.abort()
