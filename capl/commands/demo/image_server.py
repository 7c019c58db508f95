"""The VM-only demo's base image, served to capl's image import from 127.0.0.1.

``image_source`` picks the image: ``--image`` (a file or an http(s) URL), else
``$CAPL_GUEST_IMAGE``, else the newest test guest ``make guest-image`` built; on the test
driver, which keeps volume metadata only, a synthetic qcow2 header (``synthetic_qcow2``)
does. A local file is served by ``ImageServer`` (aiohttp on a free loopback port) with its
sha256, so the import is the same verified download production uses, and the demo can show
its progress from the bytes served.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import struct
from pathlib import Path
from typing import TYPE_CHECKING, Final

from capl.commands.demo.assets import cache_dir
from capl.commands.demo.plan import is_test_driver
from capl.errors import EXIT_USAGE, CliError

if TYPE_CHECKING:
    from aiohttp import web


__all__ = ["ImageServer", "image_source", "sha256_of", "synthetic_qcow2"]

IMAGE_FILE: Final = "capl-demo-base.qcow2"


def synthetic_qcow2(virtual_size: int = 1 << 30) -> bytes:
    """A qcow2 header (magic, version 3, 64 KiB clusters, ``virtual_size``), for the test
    driver, which keeps volume metadata only: enough for capl's format sniffing."""
    header = b"QFI\xfb" + struct.pack(">IQIIQ", 3, 0, 0, 16, virtual_size)
    return header.ljust(512, b"\0")


class ImageServer:
    """Serves one base image on 127.0.0.1 to capl's image import; counts the bytes sent."""

    def __init__(self, *, path: Path | None, data: bytes | None = None) -> None:
        self.path = path
        self.data = data
        self.size = path.stat().st_size if path is not None else len(data or b"")
        self.sent = 0
        self.requests = 0
        self.port = 0
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/{IMAGE_FILE}"

    async def start(self) -> None:
        from aiohttp import web

        app = web.Application()
        app.router.add_get(f"/{IMAGE_FILE}", self._get)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert server is not None
        self.port = int(server.sockets[0].getsockname()[1])  # type: ignore[attr-defined]

    async def _get(self, request: web.Request) -> web.StreamResponse:
        from aiohttp import web

        self.requests += 1
        response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        response.content_length = self.size
        await response.prepare(request)
        if request.method == "HEAD":
            return response
        if self.data is not None:
            await response.write(self.data)
            self.sent += len(self.data)
        else:
            assert self.path is not None
            with self.path.open("rb") as handle:
                while chunk := await asyncio.to_thread(handle.read, 1 << 20):
                    await response.write(chunk)
                    self.sent += len(chunk)
        await response.write_eof()
        return response

    def progress(self) -> str:
        if not self.requests:
            return "image: not requested yet"
        mib = 1024 * 1024
        done = min(self.sent, self.size * self.requests)
        return f"image: {done / mib:.1f}/{self.size * self.requests / mib:.1f} MiB served"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def image_source(image: str | None, *, uri: str) -> tuple[Path | None, str | None]:
    """(local file, URL): exactly one, or neither on the test driver (synthetic)."""
    image = image or os.environ.get("CAPL_GUEST_IMAGE") or None
    if image is None and is_test_driver(uri):
        return None, None
    if image is None:
        cached = sorted(
            cache_dir().glob("guest/*/capl-guest.qcow2"), key=lambda p: p.stat().st_mtime
        )
        image = str(cached[-1]) if cached else None
    if image is None:
        raise CliError(
            "no guest image: pass --image PATH|URL (`make guest-image` builds the test "
            "guest and prints its path; `make demo` passes it for you)",
            code=EXIT_USAGE,
        )
    if re.match(r"^https?://", image):
        return None, image
    path = Path(image).expanduser().resolve()
    if not path.is_file():
        raise CliError(f"--image {image}: no such file", code=EXIT_USAGE)
    return path, None
