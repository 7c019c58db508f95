"""Machine hardware: what a domain asks of its host (``DomainHardware``, part of
``DomainSpec``) and what a host offers (``HostHardware``, read by ``Host.hardware``).

Devices are asked for by selector (a PCI address, or vendor/product; an mdev UUID, or mdev
type): the libvirt adapter resolves the selectors to free devices of the host when it
defines the domain, under one lock per host, so two machines never get one device.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

__all__ = [
    "CpuSpec",
    "DomainHardware",
    "HostCell",
    "HostHardware",
    "HostHardwarePart",
    "HostMdev",
    "HostPci",
    "MdevSelector",
    "NumaCellSpec",
    "PciSelector",
    "XmlPatchSpec",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class NumaCellSpec:
    cpus: str
    """vCPU set, ``0-1``."""
    memory_mib: int


@dataclass(frozen=True, slots=True, kw_only=True)
class CpuSpec:
    mode: str | None = None
    """host-passthrough, host-model, custom; None with a model means custom."""
    model: str | None = None
    sockets: int | None = None
    cores: int | None = None
    threads: int | None = None
    pins: tuple[int, ...] = ()
    """Host CPU of each vCPU, in vCPU order."""
    numa: tuple[NumaCellSpec, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class PciSelector:
    name: str
    address: str | None = None
    """``0000:65:00.0``; None: any free device with ``vendor``/``product``."""
    vendor: str | None = None
    product: str | None = None

    def matches(self, device: HostPci) -> bool:
        if self.address is not None:
            return device.address == self.address
        return device.vendor == self.vendor and device.product == self.product

    def describe(self) -> str:
        return self.address or f"vendor {self.vendor} product {self.product}"


@dataclass(frozen=True, slots=True, kw_only=True)
class MdevSelector:
    name: str
    uuid: str | None = None
    type: str | None = None

    def matches(self, device: HostMdev) -> bool:
        return device.uuid == self.uuid if self.uuid is not None else device.type == self.type

    def describe(self) -> str:
        return f"mdev {self.uuid}" if self.uuid else f"mdev type {self.type}"


@dataclass(frozen=True, slots=True, kw_only=True)
class XmlPatchSpec:
    op: str
    path: str
    xml: str | None = None
    attribute: str | None = None
    value: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class DomainHardware:
    cpu: CpuSpec | None = None
    hugepage_kib: int | None = None
    pci: tuple[PciSelector, ...] = ()
    mdevs: tuple[MdevSelector, ...] = ()
    tpm: bool = False
    secure_boot: bool = False
    patches: tuple[XmlPatchSpec, ...] = ()

    @property
    def wants_host_check(self) -> bool:
        """Something placement must check against the host's capabilities."""
        cpu = self.cpu
        return bool(
            self.pci
            or self.mdevs
            or self.hugepage_kib
            or self.tpm
            or self.secure_boot
            or (cpu is not None and (cpu.model or cpu.pins or cpu.numa))
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class HostCell:
    id: int
    cpus: tuple[int, ...]
    memory_kib: int
    free_pages: dict[int, int] = field(default_factory=dict)
    """Free pages by page size in KiB."""


@dataclass(frozen=True, slots=True, kw_only=True)
class HostPci:
    address: str
    vendor: str
    product: str
    name: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class HostMdev:
    uuid: str
    type: str
    parent: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class HostHardware:
    cells: tuple[HostCell, ...] = ()
    cpu_models: tuple[str, ...] | None = None
    """CPU models usable for custom mode (None: the host does not say)."""
    pci: tuple[HostPci, ...] = ()
    mdevs: tuple[HostMdev, ...] = ()
    used_pci: frozenset[str] = frozenset()
    """PCI addresses given to domains defined on the host."""
    used_mdevs: frozenset[str] = frozenset()
    domain_uuids: frozenset[str] = frozenset()
    """UUIDs (lower case) of the domains defined on the host."""
    tpm_emulator: bool | None = None
    """An emulated TPM 2.0 can be given (domain capabilities: TPM model ``tpm-crb``, backend
    ``emulator``, version 2.0, i.e. libvirt found swtpm); None: the host does not say (a
    driver without domain capabilities: not checked)."""
    secure_boot: bool | None = None
    """UEFI secure boot can be given on the ``q35`` machine type capl uses for it (domain
    capabilities: firmware ``efi`` with a loader that can be ``secure``, i.e. an OVMF with
    the secure-boot feature in its firmware descriptor); None: the host does not say."""

    @property
    def cpu_ids(self) -> frozenset[int]:
        return frozenset(cpu for cell in self.cells for cpu in cell.cpus)


class HostHardwarePart(Protocol):
    async def hardware(self) -> HostHardware:
        """NUMA cells and free hugepages, usable CPU models, PCI and mediated devices and
        which of them domains on the host use, whether it offers an emulated TPM 2.0 and
        UEFI secure boot."""
        ...
