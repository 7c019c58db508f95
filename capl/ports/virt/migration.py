"""Live migration of a domain between two hosts: what a controller asks (``Migrations``), the
knobs (``MigrationOptions``), what it sees while a job runs (``MigrationProgress``) and after
(``MigrationResult``, ``DomainLocation``), and the two errors (``MigrationFailed``,
``MigrationAborted``).

The shape follows KubeVirt's migration policies: a bandwidth cap, a completion timeout that
grows with the amount of data to move (150 s per GiB of memory plus disks to copy), a
progress timeout (150 s without a new low of the data remaining), auto-converge and post-copy
off unless asked for. The defaults are KubeVirt's.

One migration is four steps, each idempotent so that a controller that crashed between two of
them can run them again:

1. ``prepare``: on the destination, what the domain needs that migration does not carry
   (with storage copy: the base image by digest, the copied volumes created empty at the same
   paths and sizes; always: the Ignition file / NoCloud ISO at the same path, the DHCP
   reservation and DNS record of each NIC's address);
2. ``migrate``: the live migration itself, watched and aborted on a timeout or on request;
3. on success ``cleanup_source`` (the source's volumes, files and network entries), on failure
   ``unprepare`` (what ``prepare`` made on the destination);
4. ``locate`` at any time: where the domain is (crash recovery starts there).

Nothing here imports libvirt (``capl.virt.migration`` implements the Protocol).
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from capl.ports.errors import VirtError
from capl.ports.virt.domains import DomainInfo, DomainState
from capl.ports.virt.identity import DomainOwner, HostId
from capl.ports.virt.storage import ImageSource

if TYPE_CHECKING:
    from capl.ports.virt.hosts import Host

__all__ = [
    "GIB",
    "AbortReason",
    "DomainLocation",
    "MigrationAborted",
    "MigrationFailed",
    "MigrationOptions",
    "MigrationPhase",
    "MigrationProgress",
    "MigrationRequest",
    "MigrationResult",
    "MigrationStorage",
    "Migrations",
    "PreparedMigration",
    "ProgressCallback",
    "Whereabouts",
]

GIB = 1024**3


@dataclass(frozen=True, slots=True, kw_only=True)
class MigrationOptions:
    """How one migration may run (defaults: KubeVirt's migration policy defaults)."""

    bandwidth_mib_per_s: int | None = None
    """Cap on the transfer rate (memory and disk copy), MiB/s; None: unlimited."""
    completion_timeout_per_gib: float = 150.0
    """Seconds allowed per GiB of data to move (memory plus the disks to copy), counted from
    the start of the job; past it the job is aborted (or switched to post-copy, if allowed)."""
    progress_timeout: float = 150.0
    """Seconds without a new low of the data remaining before the job is aborted."""
    allow_auto_converge: bool = False
    """Let QEMU throttle the guest's vCPUs when memory is dirtied faster than it is sent."""
    allow_post_copy: bool = False
    """Switch to post-copy instead of aborting at the completion timeout. Post-copy can lose
    the guest if the destination dies before it ends: never on by default."""
    copy_storage: bool = False
    """Copy the disks (the pools are not shared between the hosts). With a shared pool the
    disks are not copied; ``prepare`` checks which is true and refuses a mismatch."""
    allow_unsafe: bool = False
    """Migrate disks that are not copied even where libvirt cannot tell that they are safe
    to share: it accepts only a cluster or network file system (NFS, GFS2, Ceph...) with
    ``cache='none'`` and refuses anything else ("Migration without shared storage is
    unsafe", reason ``MigrationUnsafe``), e.g. one local directory bind-mounted into two
    hosts on one machine (the test bed), which ``prepare`` has proved shared."""

    def __post_init__(self) -> None:
        if self.bandwidth_mib_per_s is not None and self.bandwidth_mib_per_s <= 0:
            raise ValueError("bandwidth_mib_per_s must be positive (or None: unlimited)")
        if self.completion_timeout_per_gib <= 0 or self.progress_timeout <= 0:
            raise ValueError("timeouts must be positive")


@dataclass(frozen=True, slots=True, kw_only=True)
class MigrationStorage:
    """The machine's storage as capl created it on the source (names in one pool)."""

    pool: str
    """The cluster's pool: the same name and target path on both hosts."""
    volumes: tuple[str, ...]
    """Volumes the migration copies when storage is not shared (root overlay, extra disks)."""
    files: tuple[str, ...] = ()
    """Volumes the domain reads that migration never copies (Ignition file, NoCloud ISO):
    copied byte for byte to the destination by ``prepare``. Secret material: never logged."""
    base_image: str | None = None
    """The base image volume the root overlay is backed by, and where to get it from on the
    destination (by digest: the name carries it, ``capl.ports.naming``)."""
    image_source: ImageSource | None = None
    leftovers: tuple[str, ...] = ()
    """Files to remove from the source after success but never copied (the console log)."""


class MigrationPhase(enum.StrEnum):
    STARTING = "Starting"
    """The job exists, no data has moved yet."""
    COPYING_STORAGE = "CopyingStorage"
    COPYING_MEMORY = "CopyingMemory"
    POST_COPY = "PostCopy"
    COMPLETED = "Completed"


@dataclass(frozen=True, slots=True, kw_only=True)
class MigrationProgress:
    """One look at a running job (from libvirt's job statistics); bytes, seconds."""

    phase: MigrationPhase
    elapsed_seconds: float
    data_total_bytes: int = 0
    data_processed_bytes: int = 0
    data_remaining_bytes: int = 0
    memory_remaining_bytes: int = 0
    disk_remaining_bytes: int = 0
    downtime_ms: int | None = None
    """The guest's pause at the switch-over (known at the end, or QEMU's expectation)."""


ProgressCallback = Callable[[MigrationProgress], Awaitable[None] | None]


@dataclass(frozen=True, slots=True, kw_only=True)
class MigrationRequest:
    """What to migrate where. ``source`` and ``destination`` are hosts of the same registry."""

    source: Host
    destination: Host
    uuid: str
    owner: DomainOwner
    storage: MigrationStorage
    migration_address: str
    """The destination's address for the migration data stream (``tcp://<address>``)."""
    options: MigrationOptions = field(default_factory=MigrationOptions)


@dataclass(frozen=True, slots=True, kw_only=True)
class PreparedMigration:
    """What ``prepare`` found and made on the destination."""

    copy_storage: bool
    disks: tuple[str, ...]
    """The target devices migration copies (``vda``...; empty with shared storage)."""
    copy_bytes: int
    """Memory plus the allocation of the disks to copy: what the completion timeout scales with."""
    volumes_created: tuple[str, ...] = ()
    files_copied: tuple[str, ...] = ()
    dhcp_hosts: tuple[tuple[str, str, str], ...] = ()
    """(network, MAC, IP) reserved on the destination."""


class Whereabouts(enum.StrEnum):
    SOURCE = "Source"
    """Active on the source only (running, or paused for a reason other than migration)."""
    DESTINATION = "Destination"
    """Active on the destination and not paused for migration; not active on the source."""
    INCOMING = "Incoming"
    """Paused on the destination for an incoming migration: a job is (or was) in flight."""
    BOTH = "Both"
    """Active on both and neither paused for migration: must never happen; act on it."""
    ABSENT = "Absent"
    """Active on neither host (it may still be defined, shut off, on one of them)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DomainLocation:
    """Where a domain is, seen on two hosts at about the same time."""

    source_host: HostId
    destination_host: HostId
    source: DomainInfo | None
    destination: DomainInfo | None

    @property
    def where(self) -> Whereabouts:
        src = self.source is not None and _active(self.source)
        dst = self.destination is not None and _active(self.destination)
        if dst and self.destination is not None and _incoming(self.destination):
            return Whereabouts.INCOMING
        if src and dst:
            return Whereabouts.BOTH
        if src:
            return Whereabouts.SOURCE
        if dst:
            return Whereabouts.DESTINATION
        return Whereabouts.ABSENT

    def describe(self) -> str:
        def one(info: DomainInfo | None) -> str:
            return "absent" if info is None else f"{info.state.value} ({info.reason})"

        return (
            f"{self.where.value}: on {self.source_host} {one(self.source)}, "
            f"on {self.destination_host} {one(self.destination)}"
        )


def _active(info: DomainInfo) -> bool:
    return info.state not in (DomainState.SHUTOFF, DomainState.NOSTATE, DomainState.CRASHED)


def _incoming(info: DomainInfo) -> bool:
    return info.state is DomainState.PAUSED and info.reason in (
        "migration",
        "starting-up",
        "postcopy",
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class MigrationResult:
    """A migration that succeeded: the domain runs on ``location.destination_host``."""

    location: DomainLocation
    elapsed_seconds: float
    downtime_ms: int | None
    data_processed_bytes: int
    copy_storage: bool
    last: MigrationProgress | None = None


class AbortReason(enum.StrEnum):
    COMPLETION_TIMEOUT = "CompletionTimeout"
    NO_PROGRESS = "NoProgress"
    CANCELLED = "Cancelled"
    DESTINATION_LOST = "DestinationLost"


class MigrationFailed(VirtError):
    """The migration did not complete. ``location`` says where the domain is afterwards
    (None when it could not be read: a host unreachable)."""

    REASON = "MigrationFailed"

    def __init__(
        self,
        message: str,
        *,
        location: DomainLocation | None = None,
        host: str | None = None,
        code: int | None = None,
        reason: str | None = None,
    ) -> None:
        super().__init__(message, host=host, code=code, reason=reason)
        self.location = location


class MigrationAborted(MigrationFailed):
    """capl aborted the job (``abort_reason``); the domain still runs on the source."""

    REASON = "MigrationAborted"

    def __init__(
        self,
        message: str,
        *,
        abort_reason: AbortReason,
        location: DomainLocation | None = None,
        host: str | None = None,
    ) -> None:
        super().__init__(message, location=location, host=host, reason=f"Migration{abort_reason}")
        self.abort_reason = abort_reason


class Migrations(Protocol):
    """Live migration between hosts of one registry (see the module docstring)."""

    async def prepare(self, request: MigrationRequest) -> PreparedMigration:
        """Check the request (InvalidSpec: the destination is the source, a disk or NIC capl
        cannot move, storage shared or not against ``copy_storage``; OperationInvalid: the
        domain is not running on the source or already exists on the destination) and make
        the destination ready. Idempotent: a retry recreates copied volumes empty."""
        ...

    async def migrate(
        self,
        request: MigrationRequest,
        prepared: PreparedMigration,
        *,
        on_progress: ProgressCallback | None = None,
    ) -> MigrationResult:
        """Run the job, report progress about once a second, abort on a timeout or on
        ``abort``. Raises MigrationAborted / MigrationFailed carrying the location found
        afterwards; a cancelled call aborts the job before it re-raises."""
        ...

    async def abort(self, uuid: str) -> bool:
        """Abort the running migration of ``uuid`` (False: none is running here)."""
        ...

    async def unprepare(self, request: MigrationRequest) -> list[str]:
        """Remove what ``prepare`` made on the destination (refused while the domain is
        active there); returns what was removed."""
        ...

    async def cleanup_source(self, request: MigrationRequest) -> list[str]:
        """After success: remove the domain's volumes, files and network entries from the
        source (refused unless the domain runs on the destination and not on the source)."""
        ...

    async def locate(self, source: Host, destination: Host, uuid: str) -> DomainLocation: ...
