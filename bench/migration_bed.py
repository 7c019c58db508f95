"""The multi-host bed for bench/migration.py: found, or started when there is none, and
shared with the other sessions that use it (the bed is one per machine, with fixed names).

hack/bench.sh runs the benchmark under ``flock /tmp/capl-multihost.lock``, as the bed's
users agreed. Sessions of a newer test bed also coordinate through two ``flock(2)`` locks
beside the state directory, and this follows them too, so that neither side pulls the bed
from under the other:

- ``<state>.lock`` (exclusive): held while the bed is checked, started or stopped;
- ``<state>.users`` (shared): held by every session for as long as it uses the bed. Only a
  session that gets it exclusively — nobody else uses the bed — may stop the bed, or rebuild
  one that is unhealthy or half made. An unhealthy bed that someone uses (a test may have
  stopped one of its daemons on purpose) is waited for, never repaired.

A bed this run started is marked ``owner: tests`` (``<state>/owner``: so sessions that know
owners stop it when they are the last to leave) and stopped at the end if no one else uses it
and no other session's domain runs on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import libvirt

from capl.testbed import multihost
from capl.testbed.multihost import BedError, MultihostBed

OWNER_FILE = "owner"
_POLL = 0.1


def _open(path: Path) -> int:
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)


def _try(fd: int, kind: int) -> bool:
    try:
        fcntl.flock(fd, kind | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


@dataclass
class SharedBed:
    say: Any
    root: Path = field(default_factory=multihost.state_root)
    bed: MultihostBed | None = None
    started: bool = False
    _users: int | None = None

    @property
    def admin_path(self) -> Path:
        return self.root.with_name(self.root.name + ".lock")

    @property
    def users_path(self) -> Path:
        return self.root.with_name(self.root.name + ".users")

    @contextlib.asynccontextmanager
    async def _admin(self, within: float) -> Any:
        self.root.parent.mkdir(parents=True, exist_ok=True)
        fd = _open(self.admin_path)
        try:
            deadline = time.monotonic() + within
            while not _try(fd, fcntl.LOCK_EX):
                if time.monotonic() > deadline:
                    raise SystemExit(
                        f"bench: another session has held {self.admin_path} for {within:g} s "
                        "(starting or stopping the multi-host bed)"
                    )
                await asyncio.sleep(_POLL)
            yield
        finally:
            os.close(fd)

    def _alone(self) -> bool:
        """Whether no session holds the users lock (checked, not kept)."""
        fd = _open(self.users_path)
        try:
            return _try(fd, fcntl.LOCK_EX)
        finally:
            os.close(fd)

    def _join(self) -> None:
        fd = _open(self.users_path)
        if not _try(fd, fcntl.LOCK_SH):
            os.close(fd)
            raise SystemExit(f"bench: {self.users_path} is held exclusively by another session")
        self._users = fd

    async def acquire(self, *, start: bool, within: float) -> MultihostBed:
        """The healthy bed (started when there is none, or only a stale one, and `start`);
        waits up to `within` seconds while someone uses an unhealthy one."""
        deadline = time.monotonic() + within
        while True:
            async with self._admin(within):
                found, problems = multihost.status(self.root)
                if found is not None and not problems:
                    self._join()
                    self.bed = found
                    return found
                unused = not (found is not None or self.root.exists()) or self._alone()
                if unused and not start:
                    raise SystemExit(
                        "bench: no healthy multi-host bed ("
                        + ("; ".join(problems) or "none, or a half-made one")
                        + "): `make multihost-bed`, or pass --start-bed"
                    )
                if unused:
                    try:
                        self.bed, self.started = multihost.start(self.root, say=self.say)
                    except BedError as exc:
                        raise SystemExit(
                            f"bench: the multi-host bed did not start: {exc}"
                        ) from None
                    if self.started:
                        (self.root / OWNER_FILE).write_text("tests\n")
                    self._join()
                    return self.bed
            if time.monotonic() > deadline:
                why = "; ".join(problems) or "it is half made (no bed.json)"
                raise SystemExit(
                    f"bench: the multi-host bed is not healthy after {within:g} s ({why}) and "
                    "another session uses it: not this benchmark's to repair"
                )
            await asyncio.sleep(2.0)

    async def release(self, *, within: float = 300.0) -> None:
        """Stop using the bed; stop it if this run started it and no one else uses it."""
        if self._users is None:
            return
        async with self._admin(within):
            os.close(self._users)
            self._users = None
            if not self.started or self.bed is None:
                return
            others = await asyncio.to_thread(domains_on, self.bed)
            if others:
                self.say(f"leaving the bed this run started: other domains run on it {others}")
            elif not self._alone():
                self.say("leaving the bed this run started: another session uses it")
            else:
                multihost.stop(self.root, say=self.say)


def domains_on(bed: MultihostBed) -> list[str]:
    """Domains on the bed's hosts (another session's, once this run's are gone)."""
    found = []
    for host in bed.hosts:
        with contextlib.suppress(libvirt.libvirtError):
            conn = libvirt.open(host.local_uri)
            try:
                found += [f"{host.name}: {d.name()}" for d in conn.listAllDomains(0)]
            finally:
                conn.close()
    return found
