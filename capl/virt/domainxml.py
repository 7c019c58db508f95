"""Domain XML: built from a ``DomainSpec``, and the bits capl reads back (owner tag, disks).

Choices baked into every domain (see libvirt-notes.md and testbed-facts.md for why):

- each disk's type and ``<source>`` from the driver of the pool its volume lives in
  (``capl.virt.pools``): ``<disk type='file'>`` with the volume's path for a directory pool
  (AppArmor cannot resolve ``type='volume'``);
- ``<features><acpi/><apic/></features>``: ACPI is needed for graceful shutdown and for the
  guest to see fw_cfg entries;
- Ignition and other fw_cfg blobs as ``<sysinfo type='fwcfg'>`` entries pointing at files;
- an SMBIOS ``<sysinfo>`` whose system UUID is the domain UUID (so the guest reads the UUID
  that the providerID ``libvirt:///<uuid>`` names) and ``<smbios mode='sysinfo'/>``;
- one serial port as a pty with its output also logged to ``console_log`` (virtlogd), and the
  console bound to it: ``virsh console`` works and the log survives for debugging;
- with ``vnc``: a VNC display on a unix socket in libvirt's per-domain directory (no TCP
  listener, no password; ``capl vnc`` reaches it through libvirt);
- the QEMU guest agent channel, a virtio RNG (faster first boot), on_poweroff=destroy,
  on_reboot=restart, on_crash=restart;
- UEFI either with an explicit loader/NVRAM template or ``<os firmware='efi'>``, which lets
  libvirt pick OVMF from the host's firmware descriptors;
- the machine hardware (CPU, hugepages, host and mediated devices, TPM, secure boot) and the
  XML patches: ``capl.virt.hardwarexml``.
"""

from __future__ import annotations

import uuid as uuidlib
import xml.etree.ElementTree as ET
from collections.abc import Mapping

from capl.ports.errors import InvalidSpec
from capl.ports.naming import normalize_mac
from capl.ports.virt import (
    DiskBus,
    DiskDevice,
    DiskSpec,
    DomainOwner,
    DomainSpec,
    Firmware,
    NicSpec,
    VolumeFormat,
)
from capl.virt.hardwarexml import apply_hardware
from capl.virt.pools import POOL_DRIVERS, PoolDriver, pool_driver
from capl.virt.xmlutil import capl_tag, line, parse, serialize, sub, text

__all__ = [
    "GUEST_AGENT_CHANNEL",
    "build_domain_xml",
    "build_owner_metadata",
    "owner_from_domain_xml",
    "owner_from_metadata_xml",
]

GUEST_AGENT_CHANNEL = "org.qemu.guest_agent.0"
_OWNER_ELEMENT = "machine"


def build_owner_metadata(owner: DomainOwner, *, namespaced: bool = True) -> ET.Element:
    """``<capl:machine>`` with cluster, namespace, name, uid and kind children."""

    def tag(local: str) -> str:
        return capl_tag(local) if namespaced else local

    element = ET.Element(tag(_OWNER_ELEMENT))
    for key, value in (
        ("cluster", owner.cluster),
        ("namespace", owner.namespace),
        ("name", owner.name),
        ("uid", owner.uid),
        ("kind", owner.kind),
    ):
        sub(element, tag(key), line(value, field=f"owner {key}"))
    return element


def owner_metadata_xml(owner: DomainOwner) -> str:
    """The owner element for ``virDomainSetMetadata``: without a namespace declaration,
    libvirt puts the element into the namespace given as the call's key/URI (a declared one
    makes it fail with "failed to create a new XML namespace")."""
    return ET.tostring(build_owner_metadata(owner, namespaced=False), encoding="unicode")


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def _owner_from_element(element: ET.Element | None) -> DomainOwner | None:
    """Read the tag by local names: ``virDomainGetMetadata`` returns it without namespace."""
    if element is None:
        return None
    values = {_local(child.tag): (child.text or "").strip() for child in element}
    if not values.get("namespace") or not values.get("name"):
        return None
    return DomainOwner(
        cluster=values.get("cluster", ""),
        namespace=values["namespace"],
        name=values["name"],
        uid=values.get("uid", ""),
        kind=values.get("kind") or "LibvirtMachine",
    )


def owner_from_domain_xml(document: str) -> DomainOwner | None:
    root = parse(document)
    return _owner_from_element(root.find(f"metadata/{capl_tag(_OWNER_ELEMENT)}"))


def owner_from_metadata_xml(document: str) -> DomainOwner | None:
    """Parse what ``virDomainGetMetadata(ELEMENT)`` returns (the element itself)."""
    root = parse(document)
    if _local(root.tag) != _OWNER_ELEMENT:
        return None
    return _owner_from_element(root)


def _device_name(prefix: str, index: int) -> str:
    letters = ""
    index += 1
    while index:
        index, rem = divmod(index - 1, 26)
        letters = chr(ord("a") + rem) + letters
    return prefix + letters


def _check_uuid(value: str) -> str:
    try:
        return str(uuidlib.UUID(value))
    except ValueError:
        raise InvalidSpec(f"domain UUID {value!r} is not a UUID") from None


def _disk(
    devices: ET.Element,
    disk: DiskSpec,
    target: str,
    index: int,
    drivers: Mapping[str, PoolDriver],
) -> None:
    field = f"disk {index}"
    if disk.device is DiskDevice.CDROM and disk.bus is DiskBus.VIRTIO:
        raise InvalidSpec(f"{field}: a cdrom cannot sit on the virtio bus (use sata or scsi)")
    source = pool_driver(disk.pool_type, drivers).disk_source(disk, field=field)
    element = sub(devices, "disk", type=source.disk_type, device=disk.device.value)
    driver_type = "raw" if disk.format is VolumeFormat.ISO else disk.format.value
    driver = sub(element, "driver", name="qemu", type=driver_type)
    if disk.device is DiskDevice.DISK and not disk.readonly:
        driver.set("discard", "unmap")
    element.append(source.source)
    sub(element, "target", dev=target, bus=disk.bus.value)
    if disk.readonly or disk.device is DiskDevice.CDROM:
        sub(element, "readonly")
    if disk.serial:
        sub(element, "serial", line(disk.serial, field=f"{field} serial"))
    if disk.boot_order is not None:
        sub(element, "boot", order=str(disk.boot_order))


def _nic(devices: ET.Element, nic: NicSpec, index: int) -> None:
    field = f"interface {index}"
    if (nic.network is None) == (nic.bridge is None):
        raise InvalidSpec(f"{field}: set exactly one of network or bridge")
    if nic.network is not None:
        element = sub(devices, "interface", type="network")
        sub(element, "mac", address=normalize_mac(nic.mac))
        sub(element, "source", network=line(nic.network, field=f"{field} network"))
    else:
        assert nic.bridge is not None
        element = sub(devices, "interface", type="bridge")
        sub(element, "mac", address=normalize_mac(nic.mac))
        sub(element, "source", bridge=line(nic.bridge, field=f"{field} bridge"))
    sub(element, "model", type=line(nic.model, field=f"{field} model"))


def _identity(root: ET.Element, spec: DomainSpec, domain_uuid: str) -> None:
    """Name, UUID, title, description, the owner tag, memory and vCPUs."""
    sub(root, "name", line(spec.name, field="domain name"))
    sub(root, "uuid", domain_uuid)
    if spec.title:
        sub(root, "title", line(spec.title, field="domain title"))
    if spec.description:
        sub(root, "description", text(spec.description, field="domain description"))
    metadata = sub(root, "metadata")
    metadata.append(build_owner_metadata(spec.owner))
    max_memory = max(spec.memory_mib, spec.max_memory_mib or 0)
    sub(root, "memory", str(max_memory), unit="MiB")
    sub(root, "currentMemory", str(spec.memory_mib), unit="MiB")
    max_vcpus = max(spec.vcpus, spec.max_vcpus or 0)
    vcpu = sub(root, "vcpu", str(max_vcpus), placement="static")
    if max_vcpus > spec.vcpus:
        vcpu.set("current", str(spec.vcpus))  # the rest hot-pluggable (day-2)


def _sysinfo(root: ET.Element, spec: DomainSpec, domain_uuid: str) -> None:
    """The SMBIOS system entries and the fw_cfg blobs (each name once)."""
    smbios = sub(root, "sysinfo", type="smbios")
    system = sub(smbios, "system")
    sub(system, "entry", "capl", name="manufacturer")
    sub(system, "entry", line(spec.smbios_product, field="SMBIOS product"), name="product")
    sub(system, "entry", domain_uuid, name="uuid")
    if not spec.fw_cfg:
        return
    fwcfg = sub(root, "sysinfo", type="fwcfg")
    seen: set[str] = set()
    for entry in spec.fw_cfg:
        name = line(entry.name, field="fw_cfg entry name")
        if name in seen:
            raise InvalidSpec(f"fw_cfg entry {name!r} given twice")
        seen.add(name)
        sub(fwcfg, "entry", name=name, file=line(entry.file, field=f"fw_cfg {name} file"))


def _os(root: ET.Element, spec: DomainSpec) -> None:
    """``<os>``: type, arch and machine, the firmware, boot order, SMBIOS from sysinfo."""
    os_element = sub(root, "os")
    os_type = sub(os_element, "type", "hvm", arch=line(spec.arch, field="arch"))
    if spec.machine:
        os_type.set("machine", line(spec.machine, field="machine type"))
    if spec.firmware is Firmware.UEFI:
        if spec.uefi_loader:
            sub(
                os_element,
                "loader",
                line(spec.uefi_loader, field="UEFI loader"),
                readonly="yes",
                type="pflash",
            )
            if spec.uefi_nvram_template:
                sub(
                    os_element,
                    "nvram",
                    template=line(spec.uefi_nvram_template, field="UEFI NVRAM template"),
                )
        else:
            os_element.set("firmware", "efi")
    if not any(disk.boot_order is not None for disk in spec.disks):
        sub(os_element, "boot", dev="hd")
    sub(os_element, "smbios", mode="sysinfo")


def _platform(root: ET.Element, spec: DomainSpec) -> None:
    """Features, CPU mode, clock and the lifecycle actions."""
    features = sub(root, "features")
    sub(features, "acpi")
    sub(features, "apic")
    if spec.cpu_mode:
        sub(root, "cpu", mode=line(spec.cpu_mode, field="cpu mode"))
    sub(root, "clock", offset="utc")
    sub(root, "on_poweroff", "destroy")
    sub(root, "on_reboot", "restart")
    sub(root, "on_crash", "restart")


def _devices(root: ET.Element, spec: DomainSpec, drivers: Mapping[str, PoolDriver]) -> None:
    """Disks (named per bus: vda, sda, hda...), NICs, the serial console, the agent channel,
    RNG and balloon."""
    devices = sub(root, "devices")
    counters = {"vd": 0, "sd": 0, "hd": 0}
    for index, disk in enumerate(spec.disks):
        prefix = {DiskBus.VIRTIO: "vd", DiskBus.IDE: "hd"}.get(disk.bus, "sd")
        _disk(devices, disk, _device_name(prefix, counters[prefix]), index, drivers)
        counters[prefix] += 1
    if any(disk.bus is DiskBus.SCSI for disk in spec.disks):
        sub(devices, "controller", type="scsi", index="0", model="virtio-scsi")
    for index, nic in enumerate(spec.nics):
        _nic(devices, nic, index)
    serial = sub(devices, "serial", type="pty")
    if spec.console_log:
        sub(serial, "log", file=line(spec.console_log, field="console log path"), append="on")
    sub(serial, "target", port="0")
    console = sub(devices, "console", type="pty")
    sub(console, "target", type="serial", port="0")
    if spec.guest_agent:
        channel = sub(devices, "channel", type="unix")
        sub(channel, "target", type="virtio", name=GUEST_AGENT_CHANNEL)
    if spec.vnc:  # a unix socket only (libvirt's per-domain dir): never a TCP listener
        sub(sub(devices, "graphics", type="vnc"), "listen", type="socket")
    rng = sub(devices, "rng", model="virtio")
    sub(rng, "backend", "/dev/urandom", model="random")
    sub(devices, "memballoon", model="virtio")


def build_domain_xml(
    spec: DomainSpec, *, drivers: Mapping[str, PoolDriver] = POOL_DRIVERS, pretty: bool = True
) -> str:
    """The domain definition of ``spec``; ``drivers``: the pool drivers by pool type, which
    write each disk's source (tests pass others)."""
    if spec.vcpus < 1:
        raise InvalidSpec(f"vcpus must be at least 1, got {spec.vcpus}")
    if spec.memory_mib < 16:
        raise InvalidSpec(f"memory must be at least 16 MiB, got {spec.memory_mib}")
    domain_uuid = _check_uuid(spec.uuid)
    root = ET.Element("domain", type=line(spec.domain_type, field="domain type"))
    _identity(root, spec, domain_uuid)
    _sysinfo(root, spec, domain_uuid)
    _os(root, spec)
    _platform(root, spec)
    _devices(root, spec, drivers)
    apply_hardware(root, spec.hardware)  # CPU, devices, TPM, secure boot; XML patches last
    return serialize(root, pretty=pretty)


def disk_device_xml(
    disk: DiskSpec, target: str, *, drivers: Mapping[str, PoolDriver] = POOL_DRIVERS
) -> str:
    """One ``<disk>`` as a domain definition has it, for hot-plugging (capl.virt.day2)."""
    holder = ET.Element("devices")
    _disk(holder, disk, target, 0, drivers)
    return serialize(holder[0])


def nic_device_xml(nic: NicSpec) -> str:
    """One ``<interface>`` as a domain definition has it, for hot-plugging (capl.virt.day2)."""
    holder = ET.Element("devices")
    _nic(holder, nic, 0)
    return serialize(holder[0])
