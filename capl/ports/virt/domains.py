"""Domains: what a machine's VM is made of, what capl reads back, and the domain part of the
``Host`` port."""

from __future__ import annotations

import enum
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Protocol

from capl.ports.virt.hardware import DomainHardware
from capl.ports.virt.identity import DomainOwner, HostId
from capl.ports.virt.storage import DIR_POOL, BaseImage, VolumeFormat

__all__ = [
    "AddressSource",
    "DiskBus",
    "DiskDevice",
    "DiskSpec",
    "DomainInfo",
    "DomainNic",
    "DomainSpec",
    "DomainState",
    "Firmware",
    "FwCfgEntry",
    "GuestFile",
    "GuestFileState",
    "HostDomains",
    "InterfaceAddress",
    "MachineVolumePaths",
    "MachineVolumes",
    "NicSpec",
    "StopResult",
]


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
    pool_type: str = DIR_POOL
    """The type of the pool whose volume ``path`` names: its driver writes the disk's
    ``<source>`` (a ``dir`` pool's volume is a file)."""


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
    max_vcpus: int | None = None
    """vCPUs the domain can hot-plug up to (``<vcpu current=vcpus>max_vcpus``); None: vcpus."""
    max_memory_mib: int | None = None
    """The domain's memory size, of which the balloon gives the guest ``memory_mib``
    (``<memory>``/``<currentMemory>``); None: memory_mib."""
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
    hardware: DomainHardware = field(default_factory=DomainHardware)
    """CPU model/topology/pinning/NUMA, hugepages, devices, TPM, secure boot, XML patches."""
    vnc: bool = False
    """A VNC display listening only on a unix socket in libvirt's per-domain directory on the
    host (no TCP port, no password: reaching it needs access to libvirt; ``capl vnc``)."""


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


@dataclass(frozen=True, slots=True, kw_only=True)
class MachineVolumes:
    """The volumes of a new domain, made in one operation (``create_machine_volumes``): a
    qcow2 overlay of ``backing``, empty qcow2 extra disks, and the bootstrap volume (raw,
    ``bootstrap_data``: secret material, never shown)."""

    pool: str
    domain_name: str
    domain_uuid: str
    root: str
    backing: BaseImage
    root_capacity_bytes: int
    extras: tuple[tuple[str, int], ...] = ()
    """(volume name, capacity in bytes) of each extra disk."""
    bootstrap: str
    bootstrap_data: bytes = field(repr=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class MachineVolumePaths:
    """What ``create_machine_volumes`` made: the paths to hand to the domain definition, or
    nothing when ``holder`` is a domain of that name with another UUID."""

    holder: DomainInfo | None
    """The domain called ``domain_name`` before anything was made; None when there was none."""
    root: str = ""
    extras: tuple[str, ...] = ()
    bootstrap: str = ""


class HostDomains(Protocol):
    """The domain operations of a ``Host``."""

    async def create_machine_volumes(
        self, request: MachineVolumes, *, on_step: Callable[[str], None] | None = None
    ) -> MachineVolumePaths:
        """The storage of a domain about to be defined, as one operation on the pool's
        thread (one hand-off instead of one per volume and one for the name check): look
        up ``domain_name`` first (a holder with another UUID: nothing is made, see
        ``MachineVolumePaths.holder``); then the root overlay (its capacity raised to the
        backing image's virtual size), the extra disks and the bootstrap volume (replacing
        an existing one, as ``upload_volume``), each kept when it exists. ``on_step`` runs
        after each of the three, on the worker thread, with "root-volume", "extra-volumes",
        "bootstrap-volume" (the crash tests' fault points). A failure leaves what was made
        for the caller to remove."""
        ...

    async def define_domain(self, spec: DomainSpec, *, absent: bool = False) -> DomainInfo:
        """Define (persistent) and set autostart. Existing domain with ``spec.uuid`` and our
        tag: returned unchanged. A name or UUID held by a foreign domain:
        ForeignDomainError. ``absent``: the caller has just found neither ``spec.uuid``
        (``get_domain``) nor ``spec.name`` (``find_domain``), so these look-ups are not
        repeated; a domain that appeared since is refused by libvirt's define itself (a
        UUID under another name, a name under another UUID)."""
        ...

    async def create_domain(
        self,
        spec: DomainSpec,
        *,
        absent: bool = False,
        on_defined: Callable[[], None] | None = None,
    ) -> tuple[DomainInfo, list[InterfaceAddress]]:
        """``define_domain``, ``start_domain(defined=...)`` and, when it runs,
        ``domain_addresses`` in one operation: the domain just defined is started and asked
        for its addresses without being looked up again (two calls and two round trips
        through a worker thread fewer per machine). ``on_defined`` runs between the
        definition and the start, on the worker thread (the crash tests' fault point). A
        domain started by this call is asked for its DHCP lease only (its guest agent cannot
        answer yet: it starts with the guest)."""
        ...

    async def get_domain(self, uuid: str) -> DomainInfo | None: ...

    async def find_domain(self, name: str) -> DomainInfo | None:
        """The domain called ``name``, whoever owns it (``owner`` None: not capl's); None
        when no domain has that name. Lets a caller detect a name collision before it
        creates anything."""
        ...

    async def start_domain(
        self, uuid: str, *, owner: DomainOwner, defined: DomainInfo | None = None
    ) -> DomainInfo:
        """Start if not running (running: no-op); resumes a paused domain. ``defined``: what
        ``define_domain`` has just returned for it (shut off, tagged ``owner``): its tag and
        state are not read again and the answer is derived from it."""
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

    async def list_domains(
        self, *, cluster: str | None = None, skip_uuids: Collection[str] = ()
    ) -> list[DomainInfo]:
        """Domains with a capl tag (of ``cluster`` when given). A domain whose UUID (lower
        case) is in ``skip_uuids`` is left out unread: reading a tag costs a call per
        domain, the listing one call for all."""
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
