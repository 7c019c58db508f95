"""Who may start and stop the multi-host bed while several sessions share it (see
`capl.testbed.multihost`: one bed per machine, fixed names).

Two ``flock(2)`` locks beside the state directory (``<state>.lock``, ``<state>.users``;
they outlive the bed, so a waiter never locks a file that `stop` just removed):

- the *admin* lock (exclusive): held while the bed is checked, started or stopped, so two
  sessions never build or tear it down at once;
- the *users* lock: every session using the bed holds it shared for as long as it uses it.
  A session that wants to stop the bed takes the admin lock, then tries the users lock
  exclusively without waiting: it gets it only when no other session holds it shared.

A lock dies with the process that holds it (a killed test session frees the bed).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from capl.testbed.multihost_net import BedError

__all__ = ["LOCK_WAIT", "BedLocks"]

LOCK_WAIT: Final = 300.0
"""How long to wait for another session's start or stop of the bed (a start takes ~10 s)."""
_POLL: Final = 0.1


def _open(path: Path) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)


def _try_lock(fd: int, kind: int) -> bool:
    try:
        fcntl.flock(fd, kind | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


class BedLocks:
    """The two locks of the bed whose state directory is `root`."""

    def __init__(self, root: Path) -> None:
        self.admin_path = root.with_name(root.name + ".lock")
        self.users_path = root.with_name(root.name + ".users")
        self._users_fd: int | None = None

    @contextlib.contextmanager
    def admin(self, *, within: float = LOCK_WAIT) -> Iterator[None]:
        """The admin lock, waited for up to `within` seconds (BedError after that)."""
        fd = _open(self.admin_path)
        try:
            deadline = time.monotonic() + within
            while not _try_lock(fd, fcntl.LOCK_EX):
                if time.monotonic() >= deadline:
                    raise BedError(
                        f"another session has been starting or stopping the multi-host bed "
                        f"for {within:g} s (it holds {self.admin_path})"
                    )
                time.sleep(_POLL)
            yield
        finally:
            os.close(fd)  # releases the lock

    def join(self) -> None:
        """Hold the users lock shared (call with the admin lock held: no one is stopping)."""
        if self._users_fd is not None:
            return
        fd = _open(self.users_path)
        if not _try_lock(fd, fcntl.LOCK_SH):
            os.close(fd)
            raise BedError(f"{self.users_path} is held exclusively outside the admin lock")
        self._users_fd = fd

    def leave(self) -> None:
        """Stop holding the users lock (idempotent)."""
        if self._users_fd is not None:
            os.close(self._users_fd)
            self._users_fd = None

    @property
    def joined(self) -> bool:
        return self._users_fd is not None

    @contextlib.contextmanager
    def alone(self) -> Iterator[bool]:
        """Whether no session uses the bed (call with the admin lock held, after `leave`:
        this object's own share counts too). While the block runs with True the users lock
        is held exclusively."""
        fd = _open(self.users_path)
        try:
            yield _try_lock(fd, fcntl.LOCK_EX)
        finally:
            os.close(fd)
