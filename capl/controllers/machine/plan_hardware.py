"""Pure decisions about a machine's hardware: the ``DomainHardware`` of a spec, and whether a
host can give it (placement).

`refusal` says why a host cannot take the machine, checked against what the host reports
(``Host.hardware``): a named CPU model the host cannot provide (when the host lists its
models), pinned host CPUs it does not have, more NUMA cells than it has, an emulated TPM or
UEFI secure boot its domain capabilities do not offer, too few free
hugepages (per guest cell on host cell i, else over all cells), and PCI or mediated devices
of which no free match is left — free meaning not given to a domain on the host nor wanted
by a machine already placed there whose domain is not defined yet (`pending`). None: the
host can take it. No I/O (see `capl.controllers.machine.plan`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from capl.api.hardware import HostDevice, MediatedDevice
from capl.api.machine import LibvirtMachineSpec
from capl.ports.virt import (
    CpuSpec,
    DomainHardware,
    HostHardware,
    MdevSelector,
    NumaCellSpec,
    PciSelector,
    XmlPatchSpec,
)

__all__ = ["domain_hardware", "pending_selectors", "refusal"]

_PAGE_KIB = {"2Mi": 2048, "1Gi": 1048576}


def _pci(device: HostDevice) -> PciSelector:
    return PciSelector(
        name=device.name,
        address=device.pci_address,
        vendor=device.vendor,
        product=device.product,
    )


def _mdev(device: MediatedDevice) -> MdevSelector:
    return MdevSelector(name=device.name, uuid=device.uuid, type=device.type)


def domain_hardware(spec: LibvirtMachineSpec) -> DomainHardware:
    """What the machine's domain asks of the host (device selectors not resolved yet)."""
    cpu = None
    if spec.cpu is not None:
        top = spec.cpu.topology
        cpu = CpuSpec(
            mode=spec.cpu.mode,
            model=spec.cpu.model,
            sockets=top.sockets if top else None,
            cores=top.cores if top else None,
            threads=top.threads if top else None,
            pins=tuple(spec.cpu.dedicated_cpus or ()),
            numa=tuple(
                NumaCellSpec(cpus=cell.cpus, memory_mib=cell.memory_mib)
                for cell in spec.cpu.numa_cells or ()
            ),
        )
    return DomainHardware(
        cpu=cpu,
        hugepage_kib=_PAGE_KIB[spec.hugepages.page_size] if spec.hugepages else None,
        pci=tuple(_pci(d) for d in spec.host_devices or ()),
        mdevs=tuple(_mdev(d) for d in spec.mediated_devices or ()),
        tpm=spec.tpm is not None,
        secure_boot=bool(spec.secure_boot),
        patches=tuple(
            XmlPatchSpec(op=p.op, path=p.path, xml=p.xml, attribute=p.attribute, value=p.value)
            for p in spec.xml_patches or ()
        ),
    )


def pending_selectors(
    machines: Iterable[Mapping[str, Any]], *, skip_uid: str, defined: frozenset[str]
) -> tuple[list[PciSelector], list[MdevSelector]]:
    """Device selectors of other machines placed on the host and not provisioned yet
    (`plan_placement.pending_on_host`, the cache index the caller read): their devices
    count as taken although their domains may not be defined yet. Those whose domain is
    defined (UUID in `defined`) are left out: the host reports their devices as used."""
    pci: list[PciSelector] = []
    mdevs: list[MdevSelector] = []
    for obj in machines:
        if (obj.get("metadata") or {}).get("uid") == skip_uid:
            continue
        spec = obj.get("spec") or {}
        if str(spec.get("domainUUID") or "").lower() in defined:
            continue
        for raw in spec.get("hostDevices") or ():
            pci.append(_pci(HostDevice.model_validate(raw)))
        for raw in spec.get("mediatedDevices") or ():
            mdevs.append(_mdev(MediatedDevice.model_validate(raw)))
    return pci, mdevs


def _cpu_refusal(cpu: CpuSpec, host: HostHardware) -> str | None:
    if cpu.model and host.cpu_models is not None and cpu.model not in host.cpu_models:
        return f"CPU model {cpu.model} is not usable on the host"
    missing = sorted(set(cpu.pins) - host.cpu_ids)
    if missing:
        return f"host CPUs {missing} (dedicatedCPUs) do not exist (host CPUs: {len(host.cpu_ids)})"
    if cpu.numa and len(cpu.numa) > len(host.cells):
        return f"{len(cpu.numa)} NUMA cells asked, the host has {len(host.cells)}"
    return None


def _pages_refusal(hw: DomainHardware, memory_mib: int, host: HostHardware) -> str | None:
    size = hw.hugepage_kib
    if not size:
        return None
    per_cell = hw.cpu.numa if hw.cpu is not None and hw.cpu.numa else ()
    if per_cell:
        for i, cell in enumerate(per_cell):
            need = cell.memory_mib * 1024 // size
            free = host.cells[i].free_pages.get(size, 0) if i < len(host.cells) else 0
            if free < need:
                return f"host NUMA cell {i} has {free} free {size} KiB pages, {need} needed"
        return None
    need = memory_mib * 1024 // size
    free = sum(cell.free_pages.get(size, 0) for cell in host.cells)
    if free < need:
        return f"the host has {free} free {size} KiB hugepages, {need} needed"
    return None


def _claim(selectors: Iterable[Any], devices: Sequence[Any], taken: set[str], key: str) -> Any:
    """Claim a free device for each selector in turn; the first selector left without one
    (None: all got one)."""
    for selector in selectors:
        device = next(
            (d for d in devices if selector.matches(d) and getattr(d, key) not in taken), None
        )
        if device is None:
            return selector
        taken.add(getattr(device, key))
    return None


def _device_refusal(
    hw: DomainHardware,
    host: HostHardware,
    pending: tuple[Sequence[PciSelector], Sequence[MdevSelector]],
) -> str | None:
    # machines placed before this one (domains not defined yet) claim first
    taken, taken_mdevs = set(host.used_pci), set(host.used_mdevs)
    for selector in pending[0]:
        _claim((selector,), host.pci, taken, "address")
    for wanted in pending[1]:
        _claim((wanted,), host.mdevs, taken_mdevs, "uuid")
    left = _claim(hw.pci, host.pci, taken, "address")
    if left is not None:
        return f"no free PCI device {left.describe()} (hostDevices {left.name})"
    left = _claim(hw.mdevs, host.mdevs, taken_mdevs, "uuid")
    if left is not None:
        return f"no free {left.describe()} (mediatedDevices {left.name})"
    return None


def refusal(
    hw: DomainHardware,
    *,
    memory_mib: int,
    host: HostHardware,
    pending: tuple[Sequence[PciSelector], Sequence[MdevSelector]] = ((), ()),
) -> str | None:
    """Why the host cannot give the machine its hardware (None: it can)."""
    if hw.cpu is not None:
        problem = _cpu_refusal(hw.cpu, host)
        if problem:
            return problem
    return (
        _security_refusal(hw, host)
        or _pages_refusal(hw, memory_mib, host)
        or _device_refusal(hw, host, pending)
    )


def _security_refusal(hw: DomainHardware, host: HostHardware) -> str | None:
    """TPM and secure boot against the host's domain capabilities (a host that does not say,
    None, is not refused: the definition would fail there with libvirt's reason)."""
    if hw.tpm and host.tpm_emulator is False:
        return (
            "no emulated TPM 2.0 (tpm): the host's domain capabilities offer no TPM backend"
            " 'emulator' version 2.0 with model tpm-crb (is swtpm installed?)"
        )
    if hw.secure_boot and host.secure_boot is False:
        return (
            "no UEFI secure boot (secureBoot): the host's domain capabilities for machine type"
            " q35 offer no secure-boot firmware (an OVMF with the secure-boot feature)"
        )
    return None
