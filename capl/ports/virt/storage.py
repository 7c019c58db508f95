"""Storage: pools, volumes and base images, and the storage part of the ``Host`` port."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol

from capl.ports.naming import pool_owner_marker
from capl.ports.virt.identity import ClusterOwner

__all__ = [
    "DIR_POOL",
    "BaseImage",
    "HostStorage",
    "ImageFromPath",
    "ImageFromURL",
    "ImageFromVolume",
    "ImageSource",
    "PoolInfo",
    "PoolSpec",
    "VolumeFormat",
    "VolumeInfo",
    "VolumeRef",
    "VolumeTail",
]


DIR_POOL = "dir"
"""The pool type of a directory pool: volumes are files (qcow2 overlays, raw uploads)."""


class VolumeFormat(enum.StrEnum):
    RAW = "raw"
    QCOW2 = "qcow2"
    ISO = "iso"


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolSpec:
    name: str
    path: str
    """The pool's target: the directory of a ``dir`` pool."""
    owner: ClusterOwner
    pool_type: str = DIR_POOL
    """The libvirt pool type; it picks the pool driver (``capl.virt.pools``) that defines the
    pool, writes its volumes and hands them to domains. Only ``dir`` today."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolInfo:
    name: str
    uuid: str
    pool_type: str
    path: str
    active: bool
    persistent: bool
    autostart: bool
    capacity_bytes: int
    allocation_bytes: int
    available_bytes: int
    owner_markers: tuple[str, ...]
    """Names of the capl owner marker volumes in the pool (empty: not created by capl)."""
    created: bool = False
    """True when this very ``ensure_pool`` call created the pool."""

    def owned_by(self, owner: ClusterOwner) -> bool:
        return pool_owner_marker(namespace=owner.namespace, name=owner.name) in self.owner_markers


@dataclass(frozen=True, slots=True, kw_only=True)
class VolumeRef:
    """A volume as a listing names it (no per-volume round trip)."""

    pool: str
    name: str
    path: str


@dataclass(frozen=True, slots=True, kw_only=True)
class VolumeInfo:
    pool: str
    name: str
    path: str
    format: str
    capacity_bytes: int
    allocation_bytes: int
    backing_path: str | None = None
    backing_format: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class VolumeTail:
    """The end of a volume's content (``read_volume_tail``)."""

    data: bytes
    offset: int
    """Where ``data`` starts in the volume: 0 means it is the whole content, more means the
    first line of ``data`` is most likely cut."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ImageFromURL:
    """Download over HTTP(S), streamed into the pool; verified when ``sha256`` is given."""

    url: str
    sha256: str | None = None
    format: VolumeFormat | None = None
    """Expected format; detected from the content when None (qcow2 magic, else raw)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ImageFromPath:
    """A file on the host (not on the manager's machine); copied into the pool by libvirt."""

    path: str
    format: VolumeFormat | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ImageFromVolume:
    """An existing volume. In the target pool it is used as is (and never deleted by capl);
    in another pool it is cloned into the target pool."""

    name: str
    pool: str | None = None


ImageSource = ImageFromURL | ImageFromPath | ImageFromVolume


@dataclass(frozen=True, slots=True, kw_only=True)
class BaseImage:
    volume: VolumeInfo
    virtual_size_bytes: int
    imported: bool
    """True when capl wrote this volume (now or earlier); False for a user's volume used as is."""


class HostStorage(Protocol):
    """The storage operations of a ``Host``."""

    async def ensure_pool(self, spec: PoolSpec) -> PoolInfo:
        """Create (define, build, start, autostart, owner marker) or adopt a pool of
        ``spec.pool_type`` (``dir`` today; another type raises InvalidSpec).

        An existing pool is adopted as is, apart from starting it when inactive; it counts
        as capl's only if it holds this owner's marker. A different target path on an
        existing pool raises AlreadyExists.
        """
        ...

    async def get_pool(self, name: str) -> PoolInfo | None: ...

    async def delete_pool(self, *, name: str, owner: ClusterOwner) -> bool:
        """Remove the pool if ``owner`` created it and it holds no volumes but capl ones
        (all removed first). A pool with foreign volumes or without our marker is left
        alone (returns False). Not found: False."""
        ...

    async def ensure_base_image(self, *, pool: str, name: str, source: ImageSource) -> BaseImage:
        """Make ``pool`` hold the base image as volume ``name``; concurrent callers for the
        same (host, pool, name) share one import. Raises ImageError subclasses (nothing of a
        failed import is left behind)."""
        ...

    async def create_overlay(
        self,
        *,
        pool: str,
        name: str,
        backing: BaseImage,
        capacity_bytes: int,
    ) -> VolumeInfo:
        """A qcow2 volume backed by ``backing``; capacity is raised to the backing image's
        virtual size when smaller. Existing volume with that name: returned as is."""
        ...

    async def create_volume(
        self,
        *,
        pool: str,
        name: str,
        capacity_bytes: int,
        format: VolumeFormat = VolumeFormat.QCOW2,
    ) -> VolumeInfo:
        """An empty volume; existing: returned as is."""
        ...

    async def upload_volume(self, *, pool: str, name: str, data: bytes) -> VolumeInfo:
        """Write ``data`` as volume ``name`` (replacing an existing one). The content is
        secret material: it is never logged."""
        ...

    async def get_volume(self, *, pool: str, name: str) -> VolumeInfo | None: ...

    async def read_volume_tail(self, *, pool: str, name: str, limit: int) -> VolumeTail | None:
        """The last ``limit`` bytes of volume ``name`` through libvirt's storage API (so it
        works on remote hosts), e.g. a domain's serial console log, which virtlogd writes
        into the pool directory (the pool is rescanned once when libvirt does not know the
        file yet). None when there is no such volume or the driver cannot download volumes
        (the test driver). The content may be secret material: it is never logged."""
        ...

    async def list_volumes(
        self, *, pool: str, prefix: str = "", refresh: bool = False
    ) -> list[VolumeRef]:
        """Volumes whose name starts with ``prefix``; ``refresh`` rescans the directory
        first (needed to see files libvirt did not create, e.g. console logs)."""
        ...

    async def delete_volume(self, *, pool: str, name: str) -> bool:
        """Not found: the pool is rescanned once (files libvirt did not create, such as the
        console log, are volumes only after a rescan), then False."""
        ...
