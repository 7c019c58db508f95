"""The host's hardware as machines need it (blocking; runs in worker threads).

- ``read``: NUMA cells with their CPUs and free hugepages (capabilities, and
  ``virNodeGetFreePages`` where the driver has it), the CPU models usable in custom mode and
  whether an emulated TPM 2.0 (swtpm) and UEFI secure boot (on q35) can be given (domain
  capabilities; None when the driver has none), the PCI devices and mediated
  devices (node devices, ``pci`` and ``mdev`` capabilities), and which of them domains
  defined on the host use (their ``<hostdev>`` elements, every domain, not only capl's).
- ``resolve``: the ``DomainSpec`` with every device selector bound to one free device;
  ``DeviceUnavailable`` (nothing defined) when the host has none free. The caller runs it and the
  definition in one serial section per host (``LibvirtHost.define_domain``), so two
  machines never get one device.
"""

from __future__ import annotations

import dataclasses
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeVar

import libvirt

from capl.ports.errors import DeviceUnavailable
from capl.ports.virt import (
    DomainSpec,
    HostCell,
    HostHardware,
    HostMdev,
    HostPci,
    MdevSelector,
    PciSelector,
)
from capl.virt.errors import is_unsupported_flags
from capl.virt.xmlutil import parse

__all__ = [
    "SECURE_BOOT_MACHINE",
    "parse_cpu_models",
    "parse_node_device",
    "parse_secure_boot",
    "parse_topology",
    "parse_tpm_emulator",
    "read",
    "resolve",
    "used_devices",
]

S = TypeVar("S", PciSelector, MdevSelector)

SECURE_BOOT_MACHINE: Final = "q35"
"""The machine type of a secure-boot domain (SMM), `capl.controllers.machine.plan`."""


def parse_topology(caps: str) -> tuple[HostCell, ...]:
    """NUMA cells of a capabilities document, with the pages each cell reports."""
    cells = []
    for cell in parse(caps).findall("host/topology/cells/cell"):
        pages = {
            int(p.get("size", "0")): int(p.text or 0)
            for p in cell.findall("pages")
            if p.get("unit", "KiB") == "KiB"
        }
        memory = cell.find("memory")
        cells.append(
            HostCell(
                id=int(cell.get("id", "0")),
                cpus=tuple(int(c.get("id", "0")) for c in cell.findall("cpus/cpu")),
                memory_kib=int(memory.text or 0) if memory is not None else 0,
                free_pages=pages,
            )
        )
    return tuple(cells)


def _hex4(text: str | None) -> str:
    return f"0x{int(text or '0', 0):04x}"


def parse_node_device(document: str) -> HostPci | HostMdev | None:
    """A PCI device or a mediated device from its node device XML (None: another kind)."""
    root = parse(document)
    pci = root.find("capability[@type='pci']")
    if pci is not None:
        address = "{:04x}:{:02x}:{:02x}.{:x}".format(
            *(int(pci.findtext(k) or "0", 0) for k in ("domain", "bus", "slot", "function"))
        )
        vendor, product = pci.find("vendor"), pci.find("product")
        return HostPci(
            address=address,
            vendor=_hex4(vendor.get("id") if vendor is not None else None),
            product=_hex4(product.get("id") if product is not None else None),
            name=root.findtext("name") or "",
        )
    mdev = root.find("capability[@type='mdev']")
    if mdev is not None:
        type_ = mdev.find("type")
        uuid = mdev.findtext("uuid") or (root.findtext("name") or "").removeprefix("mdev_")
        return HostMdev(
            uuid=uuid.replace("_", "-").lower(),
            type=type_.get("id", "") if type_ is not None else "",
            parent=root.findtext("parent") or "",
        )
    return None


def used_devices(document: str) -> tuple[set[str], set[str]]:
    """PCI addresses and mdev UUIDs a domain's XML gives to the guest."""
    pci: set[str] = set()
    mdevs: set[str] = set()
    for hostdev in parse(document).findall("devices/hostdev"):
        address = hostdev.find("source/address")
        if address is None:
            continue
        if hostdev.get("type") == "pci":
            pci.add(
                "{:04x}:{:02x}:{:02x}.{:x}".format(
                    *(int(address.get(k, "0"), 0) for k in ("domain", "bus", "slot", "function"))
                )
            )
        elif hostdev.get("type") == "mdev" and address.get("uuid"):
            mdevs.add(address.get("uuid", "").lower())
    return pci, mdevs


def _domain_capabilities(c: Any, arch: str | None, machine: str | None) -> str | None:
    """``virConnectGetDomainCapabilities`` (None: the driver has none, e.g. the test driver,
    or not for this machine type)."""
    try:
        return str(c.getDomainCapabilities(None, arch, machine, None, 0))
    except libvirt.libvirtError as exc:
        if is_unsupported_flags(exc) or exc.get_error_code() in (
            libvirt.VIR_ERR_NO_SUPPORT,
            libvirt.VIR_ERR_INVALID_ARG,
            libvirt.VIR_ERR_INTERNAL_ERROR,
            libvirt.VIR_ERR_CONFIG_UNSUPPORTED,
        ):
            return None
        raise


def parse_cpu_models(domcaps: str) -> tuple[str, ...] | None:
    """The CPU models usable in custom mode (None: the document lists none)."""
    custom = parse(domcaps).find("cpu/mode[@name='custom']")
    if custom is None:
        return None
    return tuple(m.text or "" for m in custom.findall("model") if m.get("usable") != "no")


def _enum(element: ET.Element | None, name: str) -> set[str] | None:
    """The values of ``<enum name=...>`` under ``element`` (None: no such enum)."""
    found = element.find(f"enum[@name='{name}']") if element is not None else None
    return None if found is None else {v.text or "" for v in found.findall("value")}


def parse_tpm_emulator(domcaps: str) -> bool:
    """The domain capabilities offer capl's TPM: ``tpm-crb`` with the ``emulator`` backend
    at version 2.0 (an older libvirt without the version enum: the emulator is enough)."""
    tpm = parse(domcaps).find("devices/tpm")
    if tpm is None or tpm.get("supported") != "yes":
        return False
    versions = _enum(tpm, "backendVersion")
    return (
        "tpm-crb" in (_enum(tpm, "model") or set())
        and "emulator" in (_enum(tpm, "backendModel") or set())
        and (versions is None or "2.0" in versions)
    )


def parse_secure_boot(domcaps: str) -> bool:
    """The domain capabilities (of the machine type used for secure boot) offer UEFI with a
    secure loader: firmware ``efi`` and loader ``secure`` ``yes``."""
    os_element = parse(domcaps).find("os")
    if os_element is None or os_element.get("supported") != "yes":
        return False
    loader = os_element.find("loader")
    return (
        "efi" in (_enum(os_element, "firmware") or set())
        and loader is not None
        and loader.get("supported") == "yes"
        and "yes" in (_enum(loader, "secure") or set())
    )


@dataclass(frozen=True, slots=True)
class _Features:
    cpu_models: tuple[str, ...] | None
    tpm_emulator: bool | None
    secure_boot: bool | None


def _features(c: Any, caps: str) -> _Features:
    """CPU models and TPM from the default machine type's domain capabilities, secure boot
    from those of ``SECURE_BOOT_MACHINE`` (None each: the driver does not say)."""
    arch = parse(caps).findtext("host/cpu/arch")
    default = _domain_capabilities(c, arch, None)
    if default is None:
        return _Features(None, None, None)
    secure = _domain_capabilities(c, arch, SECURE_BOOT_MACHINE)
    return _Features(
        cpu_models=parse_cpu_models(default),
        tpm_emulator=parse_tpm_emulator(default),
        secure_boot=None if secure is None else parse_secure_boot(secure),
    )


def _free_pages(c: Any, cells: tuple[HostCell, ...]) -> tuple[HostCell, ...]:
    """The cells with their *free* page counts where the driver reports them."""
    sizes = sorted({size for cell in cells for size in cell.free_pages})
    if not cells or not sizes:
        return cells
    try:
        free = c.getFreePages(sizes, cells[0].id, len(cells), 0)
    except libvirt.libvirtError:
        return cells  # driver without it: the capabilities' counts
    return tuple(
        dataclasses.replace(
            cell, free_pages={int(k): int(v) for k, v in free.get(cell.id, {}).items()}
        )
        if cell.id in free
        else cell
        for cell in cells
    )


def read(c: Any, *, skip_uuid: str | None = None) -> HostHardware:
    """The host's hardware; ``skip_uuid``: a domain whose devices do not count as used (the
    one being defined again)."""
    caps = c.getCapabilities()
    cells = _free_pages(c, parse_topology(caps))
    pci: list[HostPci] = []
    mdevs: list[HostMdev] = []
    for name in c.listDevices(None, 0):
        try:
            device = parse_node_device(c.nodeDeviceLookupByName(name).XMLDesc(0))
        except libvirt.libvirtError:
            continue  # gone meanwhile
        if isinstance(device, HostPci):
            pci.append(device)
        elif isinstance(device, HostMdev):
            mdevs.append(device)
    used_pci: set[str] = set()
    used_mdevs: set[str] = set()
    uuids: set[str] = set()
    for domain in c.listAllDomains(0):
        uuids.add(domain.UUIDString().lower())
        if skip_uuid is not None and domain.UUIDString().lower() == skip_uuid.lower():
            continue
        try:
            p, m = used_devices(domain.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))
        except libvirt.libvirtError:
            continue
        used_pci |= p
        used_mdevs |= m
    features = _features(c, caps)
    return HostHardware(
        cells=cells,
        cpu_models=features.cpu_models,
        tpm_emulator=features.tpm_emulator,
        secure_boot=features.secure_boot,
        pci=tuple(pci),
        mdevs=tuple(mdevs),
        used_pci=frozenset(used_pci),
        used_mdevs=frozenset(used_mdevs),
        domain_uuids=frozenset(uuids),
    )


def _bind(
    selectors: Sequence[S], devices: Sequence[Any], taken: set[str], *, key: str, field: str
) -> list[S]:
    """Each selector bound to the first free device it matches (its ``key``, ``address`` or
    ``uuid``, set from the device's); DeviceUnavailable naming the first left without
    (``field``: "host device", "mediated device")."""
    bound: list[S] = []
    for selector in selectors:
        device = next(
            (d for d in devices if selector.matches(d) and getattr(d, key) not in taken), None
        )
        if device is None:
            noun = "PCI device " if isinstance(selector, PciSelector) else ""
            raise DeviceUnavailable(
                f"{field} {selector.name}: no free {noun}{selector.describe()} on the host"
            )
        taken.add(getattr(device, key))
        bound.append(dataclasses.replace(selector, **{key: getattr(device, key)}))
    return bound


def resolve(hw: HostHardware, spec: DomainSpec) -> DomainSpec:
    """``spec`` with each device selector bound to a free device of the host."""
    want = spec.hardware
    if not want.pci and not want.mdevs:
        return spec
    pci = _bind(want.pci, hw.pci, set(hw.used_pci), key="address", field="host device")
    mdevs = _bind(want.mdevs, hw.mdevs, set(hw.used_mdevs), key="uuid", field="mediated device")
    hardware = dataclasses.replace(want, pci=tuple(pci), mdevs=tuple(mdevs))
    return dataclasses.replace(spec, hardware=hardware)
