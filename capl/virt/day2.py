"""Day-2 changes of a defined domain on libvirt (the ``HostDay2`` port, see
``capl.ports.virt.day2``): blocking functions run in the host's worker threads, and
``Day2Operations``, the coroutine methods ``LibvirtHost`` inherits.

Every change checks the owner tag first (``domain.checked``), is made to the persistent
definition, and while the domain runs to the running guest as well
(VIR_DOMAIN_AFFECT_LIVE|AFFECT_CONFIG); what the running QEMU cannot take (vCPUs or memory
above the maximum it was started with) is made persistent only (``Applied(live=False)``).

- Disks grow through QEMU while the domain runs (``virDomainBlockResize``: QEMU holds the
  image open and locked, so resizing the volume underneath would be refused), else by resizing
  the volume (``virStorageVolResize``).
- vCPUs: ``<vcpu current=N>MAX`` (capl.virt.domainxml): ``virDomainSetVcpusFlags`` LIVE
  hot-plugs CPUs up to MAX (QEMU's hotpluggable CPUs; the guest onlines them); above MAX the
  persistent maximum is raised (VCPU_MAXIMUM|CONFIG) and the count waits for a power cycle.
  Fewer vCPUs are persistent only (an unplug needs the guest's cooperation).
- Memory: ``<memory>`` is the size, ``<currentMemory>`` what the virtio balloon leaves the
  guest: ``virDomainSetMemoryFlags`` LIVE moves the balloon up to the size; above it the
  persistent size is raised (MEM_MAXIMUM|CONFIG) and waits for a power cycle.
- Disks and NICs: ``virDomainAttachDeviceFlags``/``DetachDeviceFlags``; a live unplug is
  asynchronous (the guest acknowledges it), the persistent definition changes at once.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import TYPE_CHECKING, Any

import libvirt

from capl.ports.errors import DomainNotFound, InvalidSpec
from capl.ports.naming import normalize_mac
from capl.ports.virt import (
    Applied,
    DiskSpec,
    DomainDisk,
    DomainOwner,
    DomainResources,
    NicSpec,
)
from capl.virt.domain import checked, nics_from_xml
from capl.virt.domainxml import disk_device_xml, nic_device_xml
from capl.virt.support import lookup
from capl.virt.xmlutil import parse

if TYPE_CHECKING:
    from capl.virt.connection import HostConnection

__all__ = ["Day2Operations", "hardware_from_xml"]

_LIVE = libvirt.VIR_DOMAIN_AFFECT_LIVE
_CONFIG = libvirt.VIR_DOMAIN_AFFECT_CONFIG
_INACTIVE = libvirt.VIR_DOMAIN_XML_INACTIVE
_KIB_PER_MIB = 1024


def _require(c: Any, uuid: str, owner: DomainOwner) -> Any:
    domain = checked(c, uuid, owner)
    if domain is None:
        raise DomainNotFound(f"domain {uuid} does not exist")
    return domain


def _affect(domain: Any) -> int:
    return int(_CONFIG | (_LIVE if domain.isActive() else 0))


# -- reading ----------------------------------------------------------------------------------


def _vcpus(root: ET.Element) -> tuple[int, int]:
    """(current, maximum) of a definition's ``<vcpu>``."""
    element = root.find("vcpu")
    maximum = int((element.text or "1").strip()) if element is not None else 1
    current = int(element.get("current", maximum)) if element is not None else maximum
    return current, maximum


def _memory_mib(root: ET.Element) -> tuple[int, int]:
    """(current, size) in MiB of a definition (libvirt writes KiB)."""

    def mib(tag: str) -> int:
        element = root.find(tag)
        if element is None or not (element.text or "").strip():
            return 0
        unit = element.get("unit", "KiB")
        value = int((element.text or "0").strip())
        factor = {"b": 1 / 1024**2, "bytes": 1 / 1024**2, "KiB": 1 / 1024, "MiB": 1, "GiB": 1024}
        return int(value * factor.get(unit, 1 / 1024))

    size = mib("memory")
    return (mib("currentMemory") or size), size


def _disks(root: ET.Element) -> list[tuple[str, str, str | None]]:
    """(target, source path, serial) of the writable disks of a definition."""
    found = []
    for element in root.findall("./devices/disk"):
        if element.get("device", "disk") != "disk" or element.find("readonly") is not None:
            continue
        target = element.find("target")
        source = element.find("source")
        if target is None or source is None:
            continue
        path = source.get("file") or source.get("dev") or source.get("volume") or ""
        serial = element.findtext("serial")
        found.append((target.get("dev", ""), path, serial.strip() if serial else None))
    return found


def hardware_from_xml(
    config_xml: str, live_xml: str | None, capacities: dict[str, int]
) -> DomainResources:
    """The ``DomainResources`` of a persistent definition and, when it runs, the live one;
    ``capacities``: bytes per disk target (what the guest or the volume says)."""
    config = parse(config_xml)
    live = parse(live_xml) if live_xml is not None else config
    config_vcpus, config_max_vcpus = _vcpus(config)
    vcpus, max_vcpus = _vcpus(live)
    config_memory, config_max_memory = _memory_mib(config)
    memory, max_memory = _memory_mib(live)
    return DomainResources(
        running=live_xml is not None,
        vcpus=vcpus,
        max_vcpus=max_vcpus,
        config_vcpus=config_vcpus,
        config_max_vcpus=config_max_vcpus,
        memory_mib=memory,
        max_memory_mib=max_memory,
        config_memory_mib=config_memory,
        config_max_memory_mib=config_max_memory,
        disks=tuple(
            DomainDisk(target=t, path=p, serial=s, capacity_bytes=capacities.get(t, 0))
            for t, p, s in _disks(config)
        ),
        nics=tuple(nics_from_xml(config_xml)),
    )


def hardware(c: Any, uuid: str) -> DomainResources:
    domain = lookup(lambda: c.lookupByUUIDString(uuid), libvirt.VIR_ERR_NO_DOMAIN)
    if domain is None:
        raise DomainNotFound(f"domain {uuid} does not exist")
    config_xml = str(domain.XMLDesc(_INACTIVE))
    running = bool(domain.isActive())
    live_xml = str(domain.XMLDesc(0)) if running else None
    capacities: dict[str, int] = {}
    for target, path, _serial in _disks(parse(live_xml or config_xml)):
        capacities[target] = _capacity(c, domain, target, path, running=running)
    return hardware_from_xml(config_xml, live_xml, capacities)


def _capacity(c: Any, domain: Any, target: str, path: str, *, running: bool) -> int:
    if running:
        return int(domain.blockInfo(target, 0)[0])
    try:
        return int(c.storageVolLookupByPath(path).info()[1])
    except libvirt.libvirtError:
        return 0


# -- changes ----------------------------------------------------------------------------------


def grow_disk(c: Any, uuid: str, owner: DomainOwner, target: str, capacity: int) -> Applied:
    domain = _require(c, uuid, owner)
    running = bool(domain.isActive())
    paths = {t: p for t, p, _s in _disks(parse(str(domain.XMLDesc(0 if running else _INACTIVE))))}
    if target not in paths:
        raise InvalidSpec(f"domain {uuid} has no writable disk {target!r}")
    now = _capacity(c, domain, target, paths[target], running=running)
    if capacity < now:
        raise InvalidSpec(
            f"disk {target} of domain {uuid} is {now} bytes; it cannot shrink to {capacity}"
        )
    if capacity == now:
        return Applied(live=True)
    if running:
        domain.blockResize(target, capacity, libvirt.VIR_DOMAIN_BLOCK_RESIZE_BYTES)
    else:
        c.storageVolLookupByPath(paths[target]).resize(capacity, 0)
    return Applied(live=True)


def _targets(domain: Any) -> set[str]:
    taken = set()
    for flags in (0, _INACTIVE):
        for element in parse(str(domain.XMLDesc(flags))).findall("./devices/disk/target"):
            taken.add(element.get("dev", ""))
    return taken


def _free_vd(taken: set[str]) -> str:
    for index in range(1, 26 * 27):
        letters, n = "", index + 1
        while n:
            n, rem = divmod(n - 1, 26)
            letters = chr(ord("a") + rem) + letters
        if "vd" + letters not in taken:
            return "vd" + letters
    raise InvalidSpec("no free virtio disk name")  # pragma: no cover - 700 disks


def attach_disk(c: Any, uuid: str, owner: DomainOwner, disk: DiskSpec) -> str:
    domain = _require(c, uuid, owner)
    for target, _path, serial in _disks(parse(str(domain.XMLDesc(_INACTIVE)))):
        if disk.serial and serial == disk.serial:
            return target
    target = _free_vd(_targets(domain))
    domain.attachDeviceFlags(disk_device_xml(disk, target), _affect(domain))
    return target


def _device(document: str, path: str, match: Any) -> str | None:
    for element in parse(document).findall(path):
        if match(element):
            return ET.tostring(element, encoding="unicode")
    return None


def detach_disk(c: Any, uuid: str, owner: DomainOwner, serial: str) -> bool:
    domain = _require(c, uuid, owner)

    def match(element: ET.Element) -> bool:
        return (element.findtext("serial") or "").strip() == serial

    return _detach(domain, "./devices/disk", match)


def _detach(domain: Any, path: str, match: Any) -> bool:
    """Unplug the matching device from the live domain and the persistent definition (each
    where it is: a device hot-plugged live only, or defined only, is handled too)."""
    done = False
    config = _device(str(domain.XMLDesc(_INACTIVE)), path, match)
    if domain.isActive():
        live = _device(str(domain.XMLDesc(0)), path, match)
        if live is not None:
            domain.detachDeviceFlags(live, _LIVE)
            done = True
    if config is not None:
        domain.detachDeviceFlags(config, _CONFIG)
        done = True
    return done


def attach_nic(c: Any, uuid: str, owner: DomainOwner, nic: NicSpec) -> bool:
    domain = _require(c, uuid, owner)
    mac = normalize_mac(nic.mac)
    if any(n.mac == mac for n in nics_from_xml(str(domain.XMLDesc(_INACTIVE)))):
        return False
    domain.attachDeviceFlags(nic_device_xml(nic), _affect(domain))
    return True


def detach_nic(c: Any, uuid: str, owner: DomainOwner, mac: str) -> bool:
    domain = _require(c, uuid, owner)
    wanted = normalize_mac(mac)

    def match(element: ET.Element) -> bool:
        found = element.find("mac")
        return found is not None and (found.get("address") or "").lower() == wanted

    return _detach(domain, "./devices/interface", match)


def set_vcpus(c: Any, uuid: str, owner: DomainOwner, count: int, maximum: int) -> Applied:
    domain = _require(c, uuid, owner)
    config_count, config_max = _vcpus(parse(str(domain.XMLDesc(_INACTIVE))))
    want_max = max(count, maximum)
    if want_max > config_max:
        domain.setVcpusFlags(want_max, _CONFIG | libvirt.VIR_DOMAIN_VCPU_MAXIMUM)
    if count != config_count or want_max > config_max:
        domain.setVcpusFlags(count, _CONFIG)
    if not domain.isActive():
        return Applied(live=True)
    live_count, live_max = _vcpus(parse(str(domain.XMLDesc(0))))
    if count == live_count:
        return Applied(live=True)
    if count > live_max or count < live_count:
        return Applied(live=False)  # above the running maximum, or an unplug: power cycle
    domain.setVcpusFlags(count, _LIVE)
    return Applied(live=True)


def set_memory(c: Any, uuid: str, owner: DomainOwner, mib: int, maximum: int) -> Applied:
    domain = _require(c, uuid, owner)
    config_current, config_size = _memory_mib(parse(str(domain.XMLDesc(_INACTIVE))))
    want_size = max(mib, maximum)
    if want_size > config_size:
        domain.setMemoryFlags(want_size * _KIB_PER_MIB, _CONFIG | libvirt.VIR_DOMAIN_MEM_MAXIMUM)
    if mib != config_current or want_size > config_size:
        domain.setMemoryFlags(mib * _KIB_PER_MIB, _CONFIG)
    if not domain.isActive():
        return Applied(live=True)
    live_current, live_size = _memory_mib(parse(str(domain.XMLDesc(0))))
    if mib > live_size:
        return Applied(live=False)
    if mib != live_current:
        domain.setMemoryFlags(mib * _KIB_PER_MIB, _LIVE)
    return Applied(live=True)


# -- the coroutine methods of LibvirtHost -----------------------------------------------------


class Day2Operations:
    """``HostDay2`` on a ``HostConnection`` (a base class of ``LibvirtHost``)."""

    _conn: HostConnection

    async def domain_hardware(self, uuid: str) -> DomainResources:
        return await self._conn.run(
            f"read the hardware of domain {uuid}", lambda c: hardware(c, uuid)
        )

    async def grow_disk(
        self, uuid: str, *, owner: DomainOwner, target: str, capacity_bytes: int
    ) -> Applied:
        return await self._conn.run(
            f"grow disk {target} of domain {uuid}",
            lambda c: grow_disk(c, uuid, owner, target, capacity_bytes),
        )

    async def attach_disk(self, uuid: str, *, owner: DomainOwner, disk: DiskSpec) -> str:
        return await self._conn.run(
            f"attach a disk to domain {uuid}", lambda c: attach_disk(c, uuid, owner, disk)
        )

    async def detach_disk(self, uuid: str, *, owner: DomainOwner, serial: str) -> bool:
        return await self._conn.run(
            f"detach disk {serial} from domain {uuid}",
            lambda c: detach_disk(c, uuid, owner, serial),
        )

    async def attach_nic(self, uuid: str, *, owner: DomainOwner, nic: NicSpec) -> bool:
        return await self._conn.run(
            f"attach a NIC to domain {uuid}", lambda c: attach_nic(c, uuid, owner, nic)
        )

    async def detach_nic(self, uuid: str, *, owner: DomainOwner, mac: str) -> bool:
        return await self._conn.run(
            f"detach NIC {mac} from domain {uuid}", lambda c: detach_nic(c, uuid, owner, mac)
        )

    async def set_vcpus(
        self, uuid: str, *, owner: DomainOwner, count: int, maximum: int
    ) -> Applied:
        return await self._conn.run(
            f"set the vCPUs of domain {uuid}",
            lambda c: set_vcpus(c, uuid, owner, count, maximum),
        )

    async def set_memory(self, uuid: str, *, owner: DomainOwner, mib: int, maximum: int) -> Applied:
        return await self._conn.run(
            f"set the memory of domain {uuid}",
            lambda c: set_memory(c, uuid, owner, mib, maximum),
        )
