"""Domain XML of the machine hardware (``DomainHardware``), and the XML patches.

Added to the document ``build_domain_xml`` made (libvirt reads elements by name, so their
order does not matter):

- ``<cpu mode=...>`` with ``<model fallback='forbid'>`` (custom), ``<topology>`` and guest
  ``<numa>`` cells; ``<cputune><vcpupin>`` per pinned vCPU; ``<numatune><memnode>`` binding
  guest cell i to host cell i (strict) when there are cells;
- ``<memoryBacking><hugepages><page size=... unit='KiB'/>``;
- ``<hostdev mode='subsystem' type='pci' managed='yes'>`` per PCI device (its address must be
  resolved: the adapter picks free devices before building) and ``type='mdev'
  model='vfio-pci'`` per mediated device;
- ``<tpm model='tpm-crb'><backend type='emulator' version='2.0'/>`` (swtpm);
- secure boot: ``<os firmware='efi'>`` with the firmware features ``secure-boot`` and
  ``enrolled-keys`` (libvirt picks OVMF's secure-boot code and the Microsoft-enrolled
  variables from the firmware descriptors), ``<loader secure='yes'/>`` and ``<smm/>``.

Then the XML patches, last: each path must select at least one element; a selected element
must not be, or sit inside, an element capl owns (checked on the real tree, so wildcards and
predicates cannot reach them either), and the document must still name the same domain,
UUID and owner afterwards.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

from capl.api.hardware import PROTECTED_XML_ELEMENTS, xml_patch_path_error
from capl.ports.errors import InvalidSpec
from capl.ports.virt import DomainHardware, XmlPatchSpec
from capl.virt.xmlutil import line, sub

__all__ = ["apply_hardware", "apply_patches"]


def _child(parent: ET.Element, tag: str) -> ET.Element:
    found = parent.find(tag)
    return found if found is not None else sub(parent, tag)


def _cpu(root: ET.Element, hw: DomainHardware) -> None:
    cpu = hw.cpu
    if cpu is None:
        return
    element = _child(root, "cpu")
    mode = cpu.mode or ("custom" if cpu.model else None)
    if mode:
        element.set("mode", mode)
    if cpu.model:
        element.set("match", "exact")
        sub(element, "model", line(cpu.model, field="cpu model"), fallback="forbid")
    if cpu.sockets:
        sub(
            element,
            "topology",
            sockets=str(cpu.sockets),
            dies="1",
            cores=str(cpu.cores or 1),
            threads=str(cpu.threads or 1),
        )
    if cpu.numa:
        numa = sub(element, "numa")
        for i, cell in enumerate(cpu.numa):
            sub(numa, "cell", id=str(i), cpus=cell.cpus, memory=str(cell.memory_mib), unit="MiB")
        tune = sub(root, "numatune")
        for i in range(len(cpu.numa)):
            sub(tune, "memnode", cellid=str(i), mode="strict", nodeset=str(i))
    if cpu.pins:
        cputune = sub(root, "cputune")
        for vcpu, host_cpu in enumerate(cpu.pins):
            sub(cputune, "vcpupin", vcpu=str(vcpu), cpuset=str(host_cpu))


def _pci_address(address: str) -> dict[str, str]:
    domain, bus, rest = address.split(":")
    slot, function = rest.split(".")
    return {
        "domain": f"0x{domain}",
        "bus": f"0x{bus}",
        "slot": f"0x{slot}",
        "function": f"0x{function}",
    }


def _devices(root: ET.Element, hw: DomainHardware) -> None:
    devices = _child(root, "devices")
    for pci in hw.pci:
        if pci.address is None:
            raise InvalidSpec(f"host device {pci.name}: no host device chosen for {pci.describe()}")
        element = sub(devices, "hostdev", mode="subsystem", type="pci", managed="yes")
        sub(sub(element, "source"), "address", **_pci_address(pci.address))
    for mdev in hw.mdevs:
        if mdev.uuid is None:
            raise InvalidSpec(f"mediated device {mdev.name}: no mdev chosen for {mdev.describe()}")
        element = sub(devices, "hostdev", mode="subsystem", type="mdev", model="vfio-pci")
        sub(sub(element, "source"), "address", uuid=mdev.uuid)
    if hw.tpm:
        tpm = sub(devices, "tpm", model="tpm-crb")
        sub(tpm, "backend", type="emulator", version="2.0")


def _secure_boot(root: ET.Element) -> None:
    os_element = _child(root, "os")
    os_element.set("firmware", "efi")
    firmware = sub(os_element, "firmware")
    sub(firmware, "feature", enabled="yes", name="enrolled-keys")
    sub(firmware, "feature", enabled="yes", name="secure-boot")
    loader = os_element.find("loader")
    if loader is None:
        loader = ET.Element("loader")
        os_element.insert(1, loader)
    loader.set("secure", "yes")
    sub(_child(root, "features"), "smm", state="on")


def apply_hardware(root: ET.Element, hw: DomainHardware) -> None:
    """Add the hardware of ``hw`` to the domain element ``root``, then apply the patches."""
    _cpu(root, hw)
    if hw.hugepage_kib:
        backing = sub(root, "memoryBacking")
        sub(sub(backing, "hugepages"), "page", size=str(hw.hugepage_kib), unit="KiB")
    _devices(root, hw)
    if hw.secure_boot:
        _secure_boot(root)
    apply_patches(root, hw.patches)


def _owned(root: ET.Element) -> set[int]:
    """ids of capl's elements and everything inside them."""
    owned: set[int] = set()
    for element in root.iter():
        if element is not root and element.tag.rsplit("}", 1)[-1] in PROTECTED_XML_ELEMENTS:
            owned.update(id(node) for node in element.iter())
    return owned


def _fragment(patch: XmlPatchSpec, field: str) -> ET.Element:
    if patch.xml is None or "<!" in patch.xml or "<?" in patch.xml:
        raise InvalidSpec(f"{field}.xml: one XML element is needed (no DOCTYPE or entities)")
    try:
        return ET.fromstring(patch.xml)
    except ET.ParseError as exc:
        raise InvalidSpec(f"{field}.xml: not well-formed: {exc}") from None


def apply_patches(root: ET.Element, patches: tuple[XmlPatchSpec, ...]) -> None:
    """Apply the XML patches (see the module docstring); ``InvalidSpec`` names the patch."""
    for i, patch in enumerate(patches):
        field = f"xmlPatches[{i}]"
        problem = xml_patch_path_error(patch.path)
        if problem is not None:
            raise InvalidSpec(f"{field}.path: {problem}")
        try:
            targets = root.findall(patch.path)
        except (SyntaxError, KeyError) as exc:
            raise InvalidSpec(f"{field}.path: {exc}") from None
        if not targets:
            raise InvalidSpec(f"{field}.path: {patch.path!r} selects no element")
        owned = _owned(root)
        for target in targets:
            if target is root or id(target) in owned:
                raise InvalidSpec(f"{field}.path: selects an element capl owns")
            if patch.op == "add":
                added = _fragment(patch, field)
                if any(n.tag.rsplit("}", 1)[-1] in PROTECTED_XML_ELEMENTS for n in added.iter()):
                    raise InvalidSpec(f"{field}.xml: adds an element capl owns")
                target.append(added)
            elif patch.op == "set" and patch.value is not None:
                value = line(patch.value, field=f"{field}.value") if patch.value else ""
                if patch.attribute:
                    target.set(patch.attribute, value)
                else:
                    target.text = value
            else:
                raise InvalidSpec(f"{field}: op {patch.op!r} needs its operands")
