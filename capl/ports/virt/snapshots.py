"""The snapshot port: external snapshots of a domain, for operators and for day-2 changes.

A snapshot is *external*: taking it freezes each disk's current image and lets the domain
write to a new qcow2 overlay on top of it (``<disk>-snap-<name>.qcow2`` beside the disk, so a
capl machine's overlays carry its volume prefix and are removed with its volumes); with
``memory=True`` the guest's RAM is saved too (``<domain>-snap-<name>.mem``), so reverting
resumes the running guest where it was instead of booting it from the disks.

Snapshots form a chain: each new one is taken on top of the current state. ``revert``
brings the domain back to a snapshot and discards everything written after it (its later
snapshots included); ``delete`` merges a snapshot's overlay into the image below it (a
block commit: nothing written is lost) and removes it. How revert works on libvirt 9.0,
which cannot revert external snapshots itself, is in ``capl.virt.snapshot``.

A revert restores the disks (and, for a memory snapshot, the RAM and the running
configuration saved with it); the domain's persistent definition stays as it is now
(libvirt 9.0 snapshots record only the live definition): a change to the definition (vCPUs,
memory, hot-plugged devices) is undone by whoever made it.

``snapshot_guard`` is the library form for a change that must not leave a broken machine
behind (the day-2 in-place update): snapshot, change, and revert if the change fails.
"""

from __future__ import annotations

import contextlib
import datetime
import enum
import re
from collections.abc import AsyncIterator, Callable, Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeAlias

from capl.ports.errors import InvalidSpec, NotFound
from capl.ports.virt.identity import HostId

if TYPE_CHECKING:
    from capl.ports.virt.hosts import Host

__all__ = [
    "DAY2_SNAPSHOT",
    "SnapshotInfo",
    "SnapshotKind",
    "SnapshotNotFound",
    "Snapshots",
    "SnapshotsOf",
    "check_snapshot_name",
    "snapshot_guard",
]

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")

DAY2_SNAPSHOT = "capl-day2"
"""The snapshot the manager takes before a day-2 change and merges or reverts after it
(`capl.controllers.machine.day2_snapshot`): reserved, an operator's would be merged away."""


class SnapshotNotFound(NotFound):
    REASON = "SnapshotNotFound"


class SnapshotKind(enum.StrEnum):
    DISK = "disk"
    """Disks only: a revert boots the guest from the disks as they were (crash-consistent)."""
    MEMORY = "memory"
    """Disks and RAM: a revert resumes the guest where it was."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SnapshotInfo:
    name: str
    kind: SnapshotKind
    created: datetime.datetime
    state: str
    """The domain's state when the snapshot was taken (libvirt's word: running, shutoff...)."""
    parent: str | None
    current: bool
    """The snapshot the domain's disks sit on now (the last taken or reverted to)."""
    overlays: tuple[str, ...]
    """The overlay files the domain wrote to after this snapshot (one per disk)."""
    description: str = ""


def check_snapshot_name(name: str) -> str:
    """A snapshot name is also part of file names: letters, digits, ``._-``, 1-63 chars."""
    if not _NAME.fullmatch(name):
        raise InvalidSpec(
            f"snapshot name {name!r} is invalid: use 1-63 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return name


class Snapshots(Protocol):
    """The external snapshots of one host's domains."""

    @property
    def host_id(self) -> HostId: ...

    async def create_snapshot(
        self,
        uuid: str,
        name: str,
        *,
        memory: bool = False,
        description: str = "",
        exclude: Collection[str] = (),
    ) -> SnapshotInfo:
        """Take an external snapshot of every file-backed writable disk but the targets in
        ``exclude`` (with RAM when ``memory`` and the domain runs). Raises DomainNotFound,
        InvalidSpec (bad name), AlreadyExists, OperationInvalid (e.g. a memory snapshot of a
        stopped domain)."""
        ...

    async def persistent_definition(self, uuid: str) -> str:
        """The domain's persistent definition as it is now, for ``revert_snapshot``'s
        ``definition`` (it may hold secrets, e.g. a VNC password: keep it in memory, never
        log it). Raises DomainNotFound."""
        ...

    async def list_snapshots(self, uuid: str) -> list[SnapshotInfo]:
        """Oldest first. Raises DomainNotFound."""
        ...

    async def revert_snapshot(
        self, uuid: str, name: str, *, start: bool | None = None, definition: str | None = None
    ) -> SnapshotInfo:
        """Bring the domain back to ``name``: what was written after it is discarded.
        ``start`` None: a memory snapshot resumes the guest as it was, after a disk-only one
        the domain is started when it ran before the revert; True/False force it.
        ``definition`` (from ``persistent_definition`` when the snapshot was taken): the
        persistent definition to put back, so that devices, vCPUs and memory changed after
        the snapshot are undone too (its disks are pointed at the snapshot's overlays).
        Raises DomainNotFound, SnapshotNotFound, OperationInvalid."""
        ...

    async def delete_snapshot(self, uuid: str, name: str) -> bool:
        """Merge ``name``'s overlay into the image below it and forget it; False when there
        was no such snapshot. Raises DomainNotFound."""
        ...


SnapshotsOf: TypeAlias = "Callable[[Host], Snapshots]"
"""How a controller gets the snapshots of a host it holds: the manager injects
``capl.virt.snapshot.snapshots_of``; tests may inject a fake."""


@contextlib.asynccontextmanager
async def snapshot_guard(
    snapshots: Snapshots,
    uuid: str,
    *,
    name: str,
    memory: bool = False,
    keep: bool = False,
) -> AsyncIterator[SnapshotInfo]:
    """Snapshot the domain, run the block, revert to the snapshot if the block raises.

    On success the snapshot is deleted (merged) unless ``keep``; after a revert it is
    deleted too (its overlay is empty then) and the block's exception propagates. While the
    block runs the disks' active images are the overlays: resize a disk through the domain
    (block resize of its target), not through its volume.
    """
    check_snapshot_name(name)
    info = await snapshots.create_snapshot(
        uuid, name, memory=memory, description="taken before an in-place change"
    )
    try:
        yield info
    except BaseException:
        await snapshots.revert_snapshot(uuid, name)
        if not keep:
            await snapshots.delete_snapshot(uuid, name)
        raise
    if not keep:
        await snapshots.delete_snapshot(uuid, name)
