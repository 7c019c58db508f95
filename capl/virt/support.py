"""Small worker-thread helpers shared by the storage, network and domain operations.

Locks here are ``threading`` locks, taken inside the worker thread that runs a sequence of
libvirt calls: they serialize read-modify-write sequences per pool or per network (volume
creation in one pool, DHCP/DNS entry updates in one network) independently of which asyncio
loop the caller runs on.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import libvirt

from capl.virt.errors import is_async_jobs_busy

__all__ = ["LockTable", "code_of", "ignore_codes", "lookup", "retry_busy"]

T = TypeVar("T")

BUSY_DELAYS = (0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 2.0, 2.0, 2.0, 2.0)


def code_of(exc: libvirt.libvirtError) -> int:
    return int(exc.get_error_code() or 0)


def lookup(fn: Callable[[], T], *codes: int) -> T | None:
    """``fn()``, or None when it fails with one of ``codes`` (a not-found code)."""
    try:
        return fn()
    except libvirt.libvirtError as exc:
        if code_of(exc) in codes:
            return None
        raise


def ignore_codes(fn: Callable[[], Any], *codes: int) -> bool:
    """Run ``fn``; True if it ran, False if it failed with one of ``codes``."""
    try:
        fn()
    except libvirt.libvirtError as exc:
        if code_of(exc) in codes:
            return False
        raise
    return True


def retry_busy(fn: Callable[[], T], *, delays: tuple[float, ...] = BUSY_DELAYS) -> T:
    """Retry while libvirt says the pool "has asynchronous jobs running" (worker thread)."""
    for delay in delays:
        try:
            return fn()
        except libvirt.libvirtError as exc:
            if not is_async_jobs_busy(exc):
                raise
        time.sleep(delay)
    return fn()


class LockTable:
    """Named ``threading.Lock``s created on demand (per pool, per network)."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[tuple[str, str], threading.Lock] = {}

    def get(self, kind: str, name: str) -> threading.Lock:
        with self._guard:
            lock = self._locks.get((kind, name))
            if lock is None:
                lock = self._locks[(kind, name)] = threading.Lock()
            return lock
