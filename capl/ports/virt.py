"""The infrastructure port: what the controllers ask of a KVM host.

The machine and cluster controllers program against the Protocols and frozen value types in
this module; ``capl.virt`` implements them on libvirt, tests may implement them with fakes.
Nothing here imports libvirt.

Shape of the API
----------------
``Hosts`` is the process-wide registry: ``hosts.get(uri=..., credentials=...)`` returns a
``Host`` without I/O (the connection opens lazily on the first call, in a thread, and is
shared by every caller of that URI). A ``Host`` offers idempotent, level-friendly operations
grouped by object kind: host info, storage pools and volumes, networks (plus DHCP/DNS
entries), and domains. Every ``Host`` method is a coroutine; blocking libvirt calls run in a
bounded per-host thread pool. Errors are the typed hierarchy of ``capl.ports.errors``.

Ownership (how capl recognises what it created)
-----------------------------------------------
- Domains carry a ``<capl:machine>`` element in their libvirt ``<metadata>`` (namespace
  ``https://capl.dev/xmlns/v1alpha1``) with cluster, machine namespace/name/UID and owner
  kind. Every destructive domain call takes the expected ``DomainOwner`` and raises
  ``ForeignDomainError`` (touching nothing) unless the tag matches, UID included.
- Networks carry a ``<capl:network>`` element in the network ``<metadata>`` (kept by libvirt
  9.0's network XML) naming the owning cluster (namespace/name; the UID is recorded but not
  compared, so ownership survives ``clusterctl move``).
- Storage pool XML has no metadata. A pool capl created holds a zero-byte marker volume
  ``.capl-owner.<namespace>.<name>`` (see ``capl.ports.naming.pool_owner_marker``).
- Volumes cannot carry metadata: their names are deterministic, derived from the machine
  (``capl.ports.naming.MachineNames``) and start with ``capl-``; a name is the ownership.

  The marker is written right after the pool starts; a crash in between leaves an empty pool
  that later reconciles adopt instead of owning (it is never deleted by capl then).
- Domains moved by ``clusterctl move`` get new machine UIDs: ``retag_domain`` rewrites the tag
  when cluster/namespace/name match.

Events
------
``Hosts.subscribe(listener)`` delivers ``DomainEvent`` (lifecycle: defined, started, stopped,
...) and ``HostEvent`` (connected / disconnected) for every host, on the asyncio loop that
subscribed. They are triggers to requeue keys; state is always read again.

Idempotency contract
--------------------
``ensure_*`` converges (create what is missing, adopt/keep what exists); ``delete_*``,
``remove_*`` treat not-found as success and return whether something was removed;
``get_*`` return ``None`` for not-found.
"""

from __future__ import annotations

import enum
import ipaddress
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import NewType, Protocol, runtime_checkable

from capl.ports.naming import pool_owner_marker

__all__ = [
    "CAPL_XML_NAMESPACE",
    "CAPL_XML_PREFIX",
    "AddressSource",
    "BaseImage",
    "ClusterOwner",
    "DhcpHost",
    "DhcpLease",
    "DiskBus",
    "DiskDevice",
    "DiskSpec",
    "DnsHost",
    "DomainEvent",
    "DomainEventKind",
    "DomainInfo",
    "DomainNic",
    "DomainOwner",
    "DomainSpec",
    "DomainState",
    "Firmware",
    "FwCfgEntry",
    "GuestFile",
    "GuestFileState",
    "Host",
    "HostEvent",
    "HostEventKind",
    "HostId",
    "HostInfo",
    "HostOptions",
    "Hosts",
    "ImageFromPath",
    "ImageFromURL",
    "ImageFromVolume",
    "ImageSource",
    "InterfaceAddress",
    "NetworkInfo",
    "NetworkMode",
    "NetworkSpec",
    "NicSpec",
    "PoolInfo",
    "PoolSpec",
    "StopResult",
    "Subscription",
    "VirtEvent",
    "VirtEventListener",
    "VolumeFormat",
    "VolumeInfo",
    "VolumeRef",
    "VolumeTail",
]

CAPL_XML_NAMESPACE = "https://capl.dev/xmlns/v1alpha1"
CAPL_XML_PREFIX = "capl"

HostId = NewType("HostId", str)
"""A host's stable identity in logs, events and maps: its URI without query parameters."""


# --- connection ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class HostOptions:
    """Per-host connection choices that are not secrets.

    - ``allow_insecure_tcp``: permit ``qemu+tcp://`` (unauthenticated, effectively root on
      the host). Refused by default.
    - ``insecure_skip_host_key_verification``: for ``qemu+ssh``/``qemu+libssh*`` without a
      ``known_hosts`` key in the credentials Secret. Refused by default.
    """

    allow_insecure_tcp: bool = False
    insecure_skip_host_key_verification: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class HostInfo:
    host_id: HostId
    hostname: str
    arch: str
    cpus: int
    memory_total_bytes: int
    memory_free_bytes: int
    libvirt_version: str
    """The daemon's libvirt version, "9.0.0"."""
    hypervisor: str
    """The driver type: "QEMU", "TEST", ..."""
    hypervisor_version: str
    domain_types: tuple[str, ...]
    """Domain types the host's capabilities offer for ``arch`` (e.g. ("qemu", "kvm"))."""
    best_domain_type: str
    """"kvm" when offered, else "qemu" (else the first offered type)."""
    uefi_supported: bool
    uefi_loaders: tuple[str, ...]
    """Firmware paths the domain capabilities list (empty when not reported)."""


# --- ownership -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterOwner:
    """The LibvirtCluster that owns a network or pool; compared by namespace/name only."""

    namespace: str
    name: str
    uid: str = ""

    def same_cluster(self, other: ClusterOwner) -> bool:
        return (self.namespace, self.name) == (other.namespace, other.name)


@dataclass(frozen=True, slots=True, kw_only=True)
class DomainOwner:
    """The identity written into a domain's capl metadata and checked before any change."""

    cluster: str
    namespace: str
    name: str
    uid: str
    kind: str = "LibvirtMachine"

    def matches(self, other: DomainOwner, *, ignore_uid: bool = False) -> bool:
        same = (self.cluster, self.namespace, self.name, self.kind) == (
            other.cluster,
            other.namespace,
            other.name,
            other.kind,
        )
        return same and (ignore_uid or self.uid == other.uid)


# --- storage -------------------------------------------------------------------------------


class VolumeFormat(enum.StrEnum):
    RAW = "raw"
    QCOW2 = "qcow2"
    ISO = "iso"


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolSpec:
    name: str
    path: str
    owner: ClusterOwner


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


# --- networks ------------------------------------------------------------------------------


class NetworkMode(enum.StrEnum):
    NAT = "nat"
    ISOLATED = "isolated"
    BRIDGE = "bridge"


@dataclass(frozen=True, slots=True, kw_only=True)
class NetworkSpec:
    """A libvirt network capl may create.

    NAT/isolated: ``cidr`` (IPv4) is required; the gateway is the first host address;
    ``dhcp_start``/``dhcp_end`` default to the second half of the range. Bridge mode: only
    ``bridge`` (an existing host bridge) is used; libvirt runs no DHCP/DNS there.
    """

    name: str
    mode: NetworkMode
    owner: ClusterOwner
    cidr: str | None = None
    dhcp_start: str | None = None
    dhcp_end: str | None = None
    dns_domain: str | None = None
    bridge: str | None = None
    """Bridge-mode: the existing bridge. NAT/isolated: an optional name for the new bridge."""
    mtu: int | None = None

    def network(self) -> ipaddress.IPv4Network | None:
        return ipaddress.IPv4Network(self.cidr, strict=False) if self.cidr else None


@dataclass(frozen=True, slots=True, kw_only=True)
class DhcpHost:
    mac: str
    ip: str
    name: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class DnsHost:
    ip: str
    hostnames: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class NetworkInfo:
    name: str
    uuid: str
    mode: NetworkMode | None
    """None for forward modes capl does not create (route, open, hostdev, ...)."""
    forward_mode: str
    bridge: str | None
    active: bool
    persistent: bool
    autostart: bool
    cidr: str | None
    gateway: str | None
    dhcp_start: str | None
    dhcp_end: str | None
    dns_domain: str | None
    dhcp_hosts: tuple[DhcpHost, ...]
    dns_hosts: tuple[DnsHost, ...]
    owner: ClusterOwner | None
    """The capl owner tag, None when capl did not create the network."""
    created: bool = False
    """True when this very ``ensure_network`` call created the network."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DhcpLease:
    mac: str
    ip: str
    prefix: int
    hostname: str | None
    expiry_time: int
    """Unix seconds; 0 when unknown."""


# --- domains -------------------------------------------------------------------------------


class Firmware(enum.StrEnum):
    BIOS = "bios"
    UEFI = "uefi"


class DiskDevice(enum.StrEnum):
    DISK = "disk"
    CDROM = "cdrom"


class DiskBus(enum.StrEnum):
    """``scsi`` gets a virtio-scsi controller; ``ide`` works on the ``pc`` machine type only;
    ``sata`` needs an AHCI driver in the guest."""

    VIRTIO = "virtio"
    SCSI = "scsi"
    SATA = "sata"
    IDE = "ide"


@dataclass(frozen=True, slots=True, kw_only=True)
class DiskSpec:
    path: str
    format: VolumeFormat = VolumeFormat.QCOW2
    device: DiskDevice = DiskDevice.DISK
    bus: DiskBus = DiskBus.VIRTIO
    readonly: bool = False
    serial: str | None = None
    boot_order: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class NicSpec:
    """Exactly one of ``network`` (a libvirt network) or ``bridge`` (a host bridge)."""

    mac: str
    network: str | None = None
    bridge: str | None = None
    model: str = "virtio"


@dataclass(frozen=True, slots=True, kw_only=True)
class FwCfgEntry:
    """A QEMU fw_cfg blob from a file on the host (``opt/com.coreos/config`` for Ignition)."""

    name: str
    file: str


@dataclass(frozen=True, slots=True, kw_only=True)
class DomainSpec:
    name: str
    uuid: str
    owner: DomainOwner
    vcpus: int
    memory_mib: int
    domain_type: str = "kvm"
    arch: str = "x86_64"
    machine: str | None = None
    """QEMU machine type ("q35", "pc"); None lets libvirt pick its default."""
    title: str | None = None
    description: str | None = None
    disks: tuple[DiskSpec, ...] = ()
    nics: tuple[NicSpec, ...] = ()
    firmware: Firmware = Firmware.BIOS
    uefi_loader: str | None = None
    """UEFI code path; None lets libvirt auto-select the firmware (``<os firmware='efi'>``)."""
    uefi_nvram_template: str | None = None
    fw_cfg: tuple[FwCfgEntry, ...] = ()
    console_log: str | None = None
    """File the serial console is logged to (host path, e.g. in the pool directory)."""
    guest_agent: bool = True
    cpu_mode: str | None = None
    """"host-passthrough", "host-model", "maximum"; None: libvirt's default for the type."""
    smbios_product: str = "capl"


class DomainState(enum.StrEnum):
    NOSTATE = "nostate"
    RUNNING = "running"
    BLOCKED = "blocked"
    PAUSED = "paused"
    SHUTDOWN = "shutdown"
    """Being shut down."""
    SHUTOFF = "shutoff"
    CRASHED = "crashed"
    PMSUSPENDED = "pmsuspended"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True, kw_only=True)
class DomainInfo:
    host_id: HostId
    name: str
    uuid: str
    state: DomainState
    reason: str
    """The state reason in lower case as libvirt names it ("booted", "destroyed", ...)."""
    persistent: bool
    autostart: bool
    owner: DomainOwner | None
    """The capl metadata tag, None on a domain capl did not create."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DomainNic:
    """A NIC of a defined domain as its persistent definition has it (guest order).

    The MAC is the one the guest uses, which may be a collision fallback rather than the
    first derived candidate: a caller that restores a DHCP reservation takes it from here."""

    mac: str
    """Lower case, colon separated."""
    network: str | None = None
    """The libvirt network (``<interface type='network'>``), else None."""
    bridge: str | None = None
    """The host bridge (``<interface type='bridge'>``), else None."""


class StopResult(enum.StrEnum):
    ALREADY_STOPPED = "already-stopped"
    SHUTDOWN = "shutdown"
    """Stopped by the guest after an ACPI power-button press within the timeout."""
    DESTROYED = "destroyed"


class AddressSource(enum.StrEnum):
    LEASE = "lease"
    AGENT = "agent"


@dataclass(frozen=True, slots=True, kw_only=True)
class InterfaceAddress:
    mac: str
    ip: str
    prefix: int
    source: AddressSource
    interface: str | None = None
    family: int = 4


class GuestFileState(enum.StrEnum):
    """What asking the guest agent for a file found (``read_guest_file``)."""

    PRESENT = "present"
    ABSENT = "absent"
    """The agent answered: no such file."""
    AGENT_UNAVAILABLE = "agent-unavailable"
    """The agent is not connected or does not answer (yet): it may later (still booting, or
    the guest runs no agent at all; the host cannot tell those apart)."""
    UNSUPPORTED = "unsupported"
    """Asking again will not help: the driver has no guest agent support (the test driver),
    the domain has no agent channel, or the agent refuses file commands."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GuestFile:
    state: GuestFileState
    data: bytes = b""
    """PRESENT: the first bytes of the file (at most the limit asked for)."""
    detail: str = ""
    """Why the agent is unavailable or unsupported (libvirt's text), for debug logs."""


# --- events --------------------------------------------------------------------------------


class DomainEventKind(enum.StrEnum):
    DEFINED = "defined"
    UNDEFINED = "undefined"
    STARTED = "started"
    SUSPENDED = "suspended"
    RESUMED = "resumed"
    STOPPED = "stopped"
    SHUTDOWN = "shutdown"
    PMSUSPENDED = "pmsuspended"
    CRASHED = "crashed"
    UNKNOWN = "unknown"


class HostEventKind(enum.StrEnum):
    CONNECTED = "connected"
    """A connection was (re)established; events are registered again."""
    DISCONNECTED = "disconnected"
    """The connection dropped (keepalive timeout, daemon restart, EOF)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DomainEvent:
    host_id: HostId
    uuid: str
    name: str
    kind: DomainEventKind
    detail: str


@dataclass(frozen=True, slots=True, kw_only=True)
class HostEvent:
    host_id: HostId
    kind: HostEventKind
    message: str = ""


VirtEvent = DomainEvent | HostEvent
VirtEventListener = Callable[[VirtEvent], None]


@runtime_checkable
class Subscription(Protocol):
    def close(self) -> None:
        """Stop delivering events to the listener (idempotent)."""


# --- the protocols -------------------------------------------------------------------------


class Host(Protocol):
    """One KVM host. Coroutine methods; typed errors; not-found on delete is success."""

    @property
    def host_id(self) -> HostId: ...

    # -- host --
    async def info(self) -> HostInfo:
        """Connects if needed; raises HostUnreachable when the host cannot be reached."""
        ...

    async def reachable(self) -> bool: ...

    # -- storage --
    async def ensure_pool(self, spec: PoolSpec) -> PoolInfo:
        """Create (define, build, start, autostart, owner marker) or adopt a dir pool.

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

    # -- networks --
    async def ensure_network(self, spec: NetworkSpec, *, adopt: bool = False) -> NetworkInfo:
        """Create (persistent, autostarted, started) or adopt by name.

        ``adopt=True``: the network must exist; it is never changed (only started when
        inactive). ``adopt=False``: an existing network must carry this owner's tag, else
        ForeignObjectError. Before creating, the CIDR is checked against every other
        network on the host (NetworkOverlap) and a bridge-mode bridge must exist
        (BridgeNotFound); a failed start leaves nothing defined."""
        ...

    async def get_network(self, name: str) -> NetworkInfo | None: ...

    async def delete_network(self, *, name: str, owner: ClusterOwner) -> bool:
        """Destroy + undefine if tagged with ``owner``; untagged/foreign: left alone, False."""
        ...

    async def ensure_dhcp_host(
        self,
        *,
        network: str,
        mac: str,
        name: str | None = None,
        ip: str | None = None,
        exclude: Collection[str] = (),
        dns_hostnames: Sequence[str] = (),
    ) -> DhcpHost:
        """Reserve an address for ``mac`` (LIVE|CONFIG). Already reserved for this MAC: that
        reservation is returned (a different explicit ``ip`` raises AddressConflict). With
        ``ip=None`` a free address of the DHCP range is picked: not reserved, not leased,
        not in ``exclude`` (addresses recorded in API objects). Serialized per network.

        ``dns_hostnames`` are merged into the DNS host record of the reserved address in
        the same locked read-modify-write (as ``add_dns_hostnames`` would), but only when the
        reservation carries ``name``: a reservation found under another name is returned
        untouched."""
        ...

    async def remove_dhcp_host(self, *, network: str, mac: str) -> bool: ...

    async def add_dns_hostnames(
        self, *, network: str, ip: str, hostnames: Sequence[str]
    ) -> DnsHost:
        """Merge ``hostnames`` into the DNS host record of ``ip`` (libvirt keeps one record
        per IP). LIVE|CONFIG; serialized per network."""
        ...

    async def remove_dns_hostnames(
        self, *, network: str, ip: str, hostnames: Sequence[str] | None = None
    ) -> bool:
        """Drop ``hostnames`` (None: all) from the record of ``ip``; the record is removed
        when no name is left (deleted by IP, which works with shared hostnames)."""
        ...

    async def dhcp_leases(self, *, network: str) -> list[DhcpLease]: ...

    async def find_free_ip(self, *, network: str, exclude: Collection[str] = ()) -> str: ...

    # -- domains --
    async def define_domain(self, spec: DomainSpec) -> DomainInfo:
        """Define (persistent) and set autostart. Existing domain with ``spec.uuid`` and our
        tag: returned unchanged. A name or UUID held by a foreign domain:
        ForeignDomainError."""
        ...

    async def get_domain(self, uuid: str) -> DomainInfo | None: ...

    async def find_domain(self, name: str) -> DomainInfo | None:
        """The domain called ``name``, whoever owns it (``owner`` None: not capl's); None
        when no domain has that name. Lets a caller detect a name collision before it
        creates anything."""
        ...

    async def start_domain(self, uuid: str, *, owner: DomainOwner) -> DomainInfo:
        """Start if not running (running: no-op); resumes a paused domain."""
        ...

    async def request_shutdown(self, uuid: str, *, owner: DomainOwner) -> None:
        """ACPI power button; returns at once."""
        ...

    async def stop_domain(
        self, uuid: str, *, owner: DomainOwner, grace_period: float
    ) -> StopResult:
        """Graceful shutdown, waiting up to ``grace_period`` seconds, then destroy."""
        ...

    async def destroy_domain(self, uuid: str, *, owner: DomainOwner) -> bool: ...

    async def undefine_domain(self, uuid: str, *, owner: DomainOwner) -> bool:
        """Destroy if running, then undefine with NVRAM, snapshot, checkpoint and
        managed-save metadata; not found: False."""
        ...

    async def retag_domain(self, uuid: str, *, owner: DomainOwner) -> DomainInfo:
        """Rewrite the capl tag with ``owner`` (same cluster/namespace/name, new UID: after
        ``clusterctl move``). A different identity raises ForeignDomainError."""
        ...

    async def list_domains(self, *, cluster: str | None = None) -> list[DomainInfo]:
        """Domains with a capl tag (of ``cluster`` when given)."""
        ...

    async def domain_addresses(self, uuid: str) -> list[InterfaceAddress]:
        """DHCP lease and guest agent addresses, merged (one entry per source and IP)."""
        ...

    async def domain_nics(self, uuid: str) -> list[DomainNic]:
        """The NICs of the domain's persistent definition, in guest order (one read, no
        change). DomainNotFound when the domain does not exist."""
        ...

    async def read_guest_file(self, uuid: str, path: str, *, limit: int = 4096) -> GuestFile:
        """Read ``path`` inside the running guest through qemu-guest-agent (guest-file-open,
        -read, -close; at most ``limit`` bytes; a short time limit per agent command). An
        agent that is missing, not connected, slow or refuses file commands is a state of
        the answer, not an error (see ``GuestFileState``); a domain that is not running
        counts as AGENT_UNAVAILABLE. DomainNotFound when the domain does not exist. The
        content may be secret material: it is never logged."""
        ...


class Hosts(Protocol):
    """The process-wide registry of hosts and the event fan-out."""

    def get(
        self,
        *,
        uri: str,
        credentials: Mapping[str, bytes] | None = None,
        options: HostOptions | None = None,
    ) -> Host:
        """The Host for ``uri``; no I/O. Invalid URI/credentials raise CredentialsError.
        Changed credentials or options replace the host's connection."""
        ...

    def host_id(self, uri: str) -> HostId: ...

    def subscribe(self, listener: VirtEventListener) -> Subscription:
        """Deliver domain lifecycle and host connection events of every host to
        ``listener``, called on the event loop that was running when subscribing."""
        ...

    async def forget(self, uri: str) -> None:
        """Close the host's connection and remove its credential files."""
        ...

    async def close(self) -> None: ...
