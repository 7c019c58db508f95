"""Fixtures of the multihost stage (tests/multihost): three real libvirt hosts on this
machine (`capl.testbed.multihost`, ``make multihost-bed``), one bed for the whole stage.

- `multihost_session` (session): the bed through `capl.testbed.multihost.use` — started, or
  a healthy one reused (a developer's ``make multihost-bed``, another session's) — held
  until the end, when `BedUse.release` stops it only if test sessions started it and no
  other session uses it (a bed is never stopped under another session's tests). It keeps
  what the root namespace looked like before (`RootView`: the system libvirtd's PID, its
  networks, the files of /etc/libvirt) for the test that checks the bed never touched it.
- `multihost_bed`: the `capl.testbed.multihost.MultihostBed` — per host its name, URI, LAN
  address and the data of the credentials Secret capl needs (``ca.crt``/``tls.crt``/
  ``tls.key`` for TLS, ``ssh-privatekey``/``known_hosts`` for ssh).
- `in_host(name, *argv)`: run a command in a host's namespaces (its own /etc/libvirt,
  /run/libvirt, network); `ping(netns, address)`.

The test that stops the bed runs last in the stage (`pytest_collection_modifyitems`).
"""

from __future__ import annotations

import logging
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from capl.testbed import multihost
from capl.testbed.multihost import BedError, BedUse, MultihostBed
from tests.fixtures.common import require_part
from tests.fixtures.libvirt import record_timing

log = logging.getLogger(__name__)

LAST = "test_stop_leaves_nothing_behind_and_the_root_namespace_untouched"
SYSTEM_URI = "qemu:///system"


TEST_OBJECTS = "capl-"
"""What capl's tests make on the machine's own libvirtd is named ``capl-...`` (networks, their
XML files, domains): other sessions' tests (e2e, libvirtd) make and remove such objects while
this stage runs, so the root view leaves them out."""


@dataclass(frozen=True)
class RootView:
    """The machine's own libvirt, as seen from the root namespace (tests' objects aside)."""

    libvirtd_pid: int | None
    networks: tuple[str, ...]
    etc_libvirt: tuple[tuple[str, int, int], ...]
    """(path, size, mtime in ns) of every file under /etc/libvirt."""


def root_view() -> RootView:
    pid_text = (
        Path("/run/libvirtd.pid").read_text().strip() if Path("/run/libvirtd.pid").exists() else ""
    )
    listed = subprocess.run(
        ["virsh", "-q", "-c", SYSTEM_URI, "net-list", "--all", "--name"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    files = []
    for path in sorted(Path("/etc/libvirt").rglob("*")):
        if path.name.startswith(TEST_OBJECTS):
            continue
        try:
            if path.is_file():
                stat = path.stat()
                files.append((str(path), stat.st_size, stat.st_mtime_ns))
        except FileNotFoundError:  # another session's test removed it meanwhile
            continue
    networks = [n for n in listed.stdout.split() if not n.startswith(TEST_OBJECTS)]
    return RootView(
        libvirtd_pid=int(pid_text) if pid_text.isdigit() else None,
        networks=tuple(sorted(networks)) if listed.returncode == 0 else ("?",),
        etc_libvirt=tuple(files),
    )


@dataclass
class BedSession:
    bed: MultihostBed
    use: BedUse
    """This session's hold on the bed (`release` at the end)."""
    before: RootView

    @property
    def started(self) -> bool:
        """Whether this session started the bed."""
        return self.use.started


@pytest.fixture(scope="session")
def multihost_session() -> Iterator[BedSession]:
    if os.geteuid() != 0:
        require_part("root (the multi-host bed makes network and mount namespaces)", "run as root")
    before = root_view()
    t0 = time.monotonic()
    try:
        use = multihost.use(say=log.info)
    except BedError as exc:
        pytest.fail(f"the multi-host bed did not start: {exc}", pytrace=False)
    if use.started:
        record_timing("multihost: bed start", time.monotonic() - t0)
    session = BedSession(bed=use.bed, use=use, before=before)
    try:
        yield session
    finally:
        use.release(say=log.info)


@pytest.fixture
def multihost_bed(multihost_session: BedSession) -> MultihostBed:
    return multihost_session.bed


def in_host(bed: MultihostBed, name: str, *argv: str, check: bool = True) -> str:
    """Run `argv` in host `name`'s namespaces; its stdout."""
    done = subprocess.run(
        bed.in_host(name, argv), capture_output=True, text=True, timeout=60, check=False
    )
    if check and done.returncode != 0:
        raise AssertionError(f"{name}: {' '.join(argv)} exited {done.returncode}: {done.stderr}")
    return done.stdout


def ping(netns: str | None, address: str, *, count: int = 1) -> bool:
    """One ICMP echo from `netns` (None: the root namespace) answered within 2 s."""
    prefix = ["ip", "netns", "exec", netns] if netns else []
    done = subprocess.run(
        [*prefix, "busybox", "ping", "-c", str(count), "-W", "2", address],
        capture_output=True,
        timeout=30,
        check=False,
    )
    return done.returncode == 0


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.name == LAST)
