"""The pool driver seam: what differs between libvirt storage pool types.

capl keeps every volume of a cluster in one storage pool per host. What the pool type
decides is gathered in one ``PoolDriver``: the ``<pool>`` definition, whether an existing
pool of that name can serve a ``PoolSpec``, the ``<volume>`` XML of the volumes capl writes
(overlays, empty disks, uploads, markers), and the ``<source>`` a domain's ``<disk>`` uses
to reach a volume. Everything else (define/build/start, owner markers, per-pool locks,
retries while the pool is busy, uploads, deletes) is the same for every type and stays in
``capl.virt.storage``.

A driver is pure: it builds and reads XML and makes no libvirt call, so it is tested without
a host. A new pool type (LVM ``logical``, an NFS-backed ``netfs`` directory, ``rbd``) is one
new module implementing this Protocol, registered in ``capl.virt.pools.POOL_DRIVERS``, plus
the API fields that say where its storage is (``PoolSpec``/``StoragePoolSpec``).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass
from typing import Any, Protocol

from capl.ports.virt import DiskSpec, PoolSpec, VolumeFormat
from capl.virt.storagexml import PoolXml

__all__ = ["DiskSource", "PoolDriver", "VolumeRequest"]


@dataclass(frozen=True, slots=True, kw_only=True)
class VolumeRequest:
    """A volume capl wants in a pool (``PoolDriver.volume_xml``)."""

    name: str
    capacity_bytes: int
    format: VolumeFormat
    backing_path: str | None = None
    """A copy-on-write overlay's base volume (its path), else None."""
    backing_format: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class DiskSource:
    """How a domain reaches a volume: ``<disk type=disk_type>`` holding ``source``."""

    disk_type: str
    """``file``, ``block``, ``network``, ..."""
    source: ET.Element
    """The ``<source>`` element (attributes, and children such as ``<host>`` for network
    disks)."""


class PoolDriver(Protocol):
    """One libvirt storage pool type (see the module docstring)."""

    @property
    def pool_type(self) -> str:
        """libvirt's ``<pool type=...>``: ``dir``, ``logical``, ``netfs``, ``rbd``..."""
        ...

    def pool_xml(self, spec: PoolSpec) -> str:
        """The definition of a new pool for ``spec``."""
        ...

    def adoption_conflict(self, spec: PoolSpec, existing: PoolXml) -> str | None:
        """Why the existing pool of ``spec.name`` cannot serve ``spec`` (None: it can)."""
        ...

    def volume_xml(self, request: VolumeRequest) -> str:
        """The ``<volume>`` to create in a pool of this type."""
        ...

    def volume_path(self, volume: Any) -> str:
        """The path of a volume of this pool type (a libvirt ``virStorageVol``) as a domain
        disk names it, with no call to the host when the type allows (the volume's key)."""
        ...

    def disk_source(self, disk: DiskSpec, *, field: str) -> DiskSource:
        """The domain disk source of the volume ``disk.path`` names; ``field`` names the
        disk in errors (``InvalidSpec``)."""
        ...
