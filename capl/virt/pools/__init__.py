"""Storage pool drivers: one module per libvirt pool type behind ``PoolDriver`` (``base``).

``POOL_DRIVERS`` is the registry by pool type; ``directory.DirPool`` (``dir`` pools of file
volumes) is the only driver today. ``PoolDrivers`` is a host's memory of which driver serves
each existing pool: the pool's type is read from its definition once (and noted for free
whenever capl reads the definition anyway), so volume operations cost no extra call. A pool
whose type has no driver (a ``netfs`` or ``fs`` pool adopted by name) is served by the
directory driver, as capl always did: its volumes are files too.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from capl.ports.errors import InvalidSpec
from capl.ports.virt import DIR_POOL
from capl.virt.pools.base import DiskSource, PoolDriver, VolumeRequest
from capl.virt.pools.directory import DirPool
from capl.virt.storagexml import parse_pool_xml

__all__ = [
    "POOL_DRIVERS",
    "DiskSource",
    "PoolDriver",
    "PoolDrivers",
    "VolumeRequest",
    "pool_driver",
]

POOL_DRIVERS: Mapping[str, PoolDriver] = MappingProxyType({DIR_POOL: DirPool()})
"""The pool drivers by libvirt pool type."""


def pool_driver(pool_type: str, drivers: Mapping[str, PoolDriver] = POOL_DRIVERS) -> PoolDriver:
    """The driver of ``pool_type``; InvalidSpec when there is none."""
    driver = drivers.get(pool_type)
    if driver is None:
        known = ", ".join(sorted(drivers))
        raise InvalidSpec(f"storage pool type {pool_type!r} is not supported (supported: {known})")
    return driver


class PoolDrivers:
    """Per host: the driver of each existing pool, by the pool's UUID (see the module
    docstring). Thread-safe; a re-created pool has a new UUID and is read again."""

    def __init__(self, drivers: Mapping[str, PoolDriver] = POOL_DRIVERS) -> None:
        self._drivers = drivers
        self._lock = threading.Lock()
        self._types: dict[str, str] = {}

    def for_type(self, pool_type: str) -> PoolDriver:
        """The driver that creates a new pool of ``pool_type``; InvalidSpec when none."""
        return pool_driver(pool_type, self._drivers)

    def note(self, uuid: str, pool_type: str) -> None:
        """Remember the type of pool ``uuid`` (read from its definition by the caller)."""
        with self._lock:
            self._types[uuid.lower()] = pool_type

    def of(self, pool: Any) -> PoolDriver:
        """The driver of the pool behind handle ``pool``: its UUID is local to the handle; its
        type is read (one ``XMLDesc``) only the first time."""
        uuid = str(pool.UUIDString()).lower()
        with self._lock:
            pool_type = self._types.get(uuid)
        if pool_type is None:
            pool_type = parse_pool_xml(pool.XMLDesc(0)).pool_type
            self.note(uuid, pool_type)
        return self._drivers.get(pool_type) or self._drivers[DIR_POOL]
