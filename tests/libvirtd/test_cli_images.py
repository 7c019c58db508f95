"""`capl images import` on the real libvirtd (kept beside the console CLI tests): the test guest
image served over HTTP on loopback is imported into a test pool under the volume name the
machine controller derives, once; a wrong checksum leaves nothing behind."""

from __future__ import annotations

import functools
import hashlib
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from capl.ports.naming import base_image_volume_name
from tests.fixtures.libvirt import LibvirtBed

pytestmark = pytest.mark.libvirtd

CAPL = str(Path(sys.executable).with_name("capl"))


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def image_url(guest_image: Path) -> Iterator[str]:
    """The guest image over HTTP on 127.0.0.1 (a thread, stopped after the test)."""
    handler = functools.partial(_QuietHandler, directory=str(guest_image.parent))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/{guest_image.name}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def capl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CAPL, *args],
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
        check=False,
    )


def volumes(bed: LibvirtBed) -> set[str]:
    assert bed.pool is not None
    bed.pool.refresh(0)
    return {v.name() for v in bed.pool.listAllVolumes(0)}


def test_images_import_once_under_the_controllers_name(
    libvirt_bed: LibvirtBed, guest_image: Path, image_url: str
) -> None:
    digest = hashlib.sha256(guest_image.read_bytes()).hexdigest()
    expected = base_image_volume_name(image=guest_image.name, digest=digest, url=image_url)
    args = ["images", "import", image_url, "--host", "qemu:///system", "--pool", libvirt_bed.name]

    first = capl(*args, "--checksum", f"sha256:{digest}")
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith(f"imported: {expected} in pool {libvirt_bed.name} ")
    size_mib = guest_image.stat().st_size / (1024 * 1024)
    assert f"importing {expected} of {size_mib:.1f} MiB" in first.stderr
    assert {expected, expected + ".capl-complete"} <= volumes(libvirt_bed)
    assert libvirt_bed.pool is not None
    volume = libvirt_bed.pool.storageVolLookupByName(expected)
    assert volume.info()[1] > 0  # capacity: the image's virtual size

    again = capl(*args, "--checksum", f"sha256:{digest}")
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith(f"already imported: {expected} ")


def test_images_import_wrong_checksum_leaves_nothing(
    libvirt_bed: LibvirtBed, image_url: str
) -> None:
    before = volumes(libvirt_bed)
    wrong = "0" * 64
    result = capl(
        "images",
        "import",
        image_url,
        "--host",
        "qemu:///system",
        "--pool",
        libvirt_bed.name,
        "--checksum",
        f"sha256:{wrong}",
    )
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("capl: error: ")
    assert "sha256" in last
    assert volumes(libvirt_bed) == before


def test_images_import_unknown_pool_and_bad_checksum_syntax(libvirt_bed: LibvirtBed) -> None:
    result = capl(
        "images", "import", "http://127.0.0.1:9/x.qcow2", "--host", "qemu:///system",
        "--pool", libvirt_bed.name + "-missing",
    )  # fmt: skip
    assert result.returncode == 3
    assert "does not exist on qemu:///system" in result.stderr
    result = capl(
        "images", "import", "http://127.0.0.1:9/x.qcow2", "--host", "qemu:///system",
        "--pool", libvirt_bed.name, "--checksum", "md5:abc",
    )  # fmt: skip
    assert result.returncode == 2
    assert "expected sha256:<64 hex digits>" in result.stderr
    assert "x.qcow2" not in " ".join(volumes(libvirt_bed))
