"""The machine hardware in the domain XML (golden files) and the XML patches' guard rails.

Golden files live in tests/unit/virt/golden/ (regenerate with CAPL_UPDATE_GOLDEN=1, review
the diff like code)."""

from __future__ import annotations

import dataclasses
import xml.etree.ElementTree as ET

import pytest

from capl.ports.errors import InvalidSpec
from capl.ports.virt import (
    CpuSpec,
    DomainHardware,
    Firmware,
    HostCell,
    HostHardware,
    HostMdev,
    HostPci,
    MdevSelector,
    NumaCellSpec,
    PciSelector,
    XmlPatchSpec,
)
from capl.virt.domainxml import build_domain_xml
from capl.virt.hardware import parse_node_device, parse_topology, resolve, used_devices
from tests.unit.virt.test_virt_xml import _domain, assert_golden

HW = DomainHardware(
    cpu=CpuSpec(
        model="Skylake-Server",
        sockets=1,
        cores=2,
        threads=2,
        pins=(4, 5, 6, 7),
        numa=(NumaCellSpec(cpus="0-1", memory_mib=1024), NumaCellSpec(cpus="2-3", memory_mib=1024)),
    ),
    hugepage_kib=2048,
    pci=(PciSelector(name="gpu", address="0000:65:00.0"),),
    mdevs=(MdevSelector(name="vgpu", uuid="b1ae8bf6-38b0-4c81-9d44-78ce3f520496"),),
    tpm=True,
    secure_boot=True,
    patches=(
        XmlPatchSpec(op="add", path="devices", xml="<watchdog model='i6300esb' action='reset'/>"),
        XmlPatchSpec(op="set", path="clock", attribute="offset", value="localtime"),
    ),
)


def test_domain_hardware_golden() -> None:
    spec = _domain(vcpus=4, machine="q35", firmware=Firmware.UEFI, hardware=HW)
    assert_golden("domain-hardware.xml", build_domain_xml(spec))


def test_cpu_mode_only_and_no_hardware_is_unchanged() -> None:
    plain = build_domain_xml(_domain())
    assert plain == build_domain_xml(_domain(hardware=DomainHardware()))
    root = ET.fromstring(
        build_domain_xml(_domain(hardware=DomainHardware(cpu=CpuSpec(mode="host-model"))))
    )
    cpus = root.findall("cpu")
    assert [cpu.get("mode") for cpu in cpus] == ["host-model"]


def test_unresolved_device_selector_is_refused() -> None:
    hw = DomainHardware(pci=(PciSelector(name="gpu", vendor="0x10de", product="0x2236"),))
    with pytest.raises(InvalidSpec, match="host device gpu: no host device chosen"):
        build_domain_xml(_domain(hardware=hw))


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        (XmlPatchSpec(op="set", path="uuid", value="x"), "owned by capl"),
        (XmlPatchSpec(op="set", path="name", value="other"), "owned by capl"),
        (XmlPatchSpec(op="add", path="metadata", xml="<a/>"), "owned by capl"),
        (XmlPatchSpec(op="set", path="devices/disk/source", attribute="file", value="/x"), "owned"),
        (XmlPatchSpec(op="set", path="devices/*/mac", attribute="address", value="x"), "capl owns"),
        (XmlPatchSpec(op="set", path="devices/*[1]/source", attribute="file", value="/x"), "owns"),
        (XmlPatchSpec(op="set", path=".//source", attribute="file", value="/x"), "'//'"),
        (XmlPatchSpec(op="set", path="devices/../uuid", value="x"), "'..'"),
        (XmlPatchSpec(op="add", path="devices", xml="<disk type='file'/>"), "adds an element"),
        (XmlPatchSpec(op="add", path="devices", xml="<x><interface/></x>"), "adds an element"),
        (XmlPatchSpec(op="add", path="devices", xml="<!DOCTYPE x><x/>"), "DOCTYPE"),
        (XmlPatchSpec(op="set", path="nosuch", value="x"), "selects no element"),
        (XmlPatchSpec(op="set", path=".", attribute="type", value="kvm"), "step '.'"),
    ],
)
def test_xml_patches_cannot_touch_what_capl_owns(patch: XmlPatchSpec, message: str) -> None:
    with pytest.raises(InvalidSpec, match=r"xmlPatches\[0\]") as caught:
        build_domain_xml(_domain(hardware=DomainHardware(patches=(patch,))))
    assert message in str(caught.value)


# --- reading the host and choosing devices (pure parts of capl.virt.hardware) ---------------

PCI_XML = """<device><name>pci_0000_65_00_0</name><parent>computer</parent>
<capability type='pci'><class>0x030000</class><domain>0</domain><bus>101</bus><slot>0</slot>
<function>0</function><product id='0x2236'>GA102GL</product><vendor id='0x10de'>NVIDIA</vendor>
</capability></device>"""
MDEV_XML = """<device><name>mdev_b1ae8bf6_38b0_4c81_9d44_78ce3f520496</name>
<parent>pci_0000_65_00_0</parent><capability type='mdev'><type id='nvidia-558'/>
<uuid>b1ae8bf6-38b0-4c81-9d44-78ce3f520496</uuid><iommuGroup number='3'/></capability></device>"""


def test_node_devices_and_domain_hostdevs_parse() -> None:
    assert parse_node_device(PCI_XML) == HostPci(
        address="0000:65:00.0", vendor="0x10de", product="0x2236", name="pci_0000_65_00_0"
    )
    assert parse_node_device(MDEV_XML) == HostMdev(
        uuid="b1ae8bf6-38b0-4c81-9d44-78ce3f520496", type="nvidia-558", parent="pci_0000_65_00_0"
    )
    assert parse_node_device("<device><name>computer</name></device>") is None
    xml = build_domain_xml(_domain(vcpus=4, hardware=HW))
    assert used_devices(xml) == ({"0000:65:00.0"}, {"b1ae8bf6-38b0-4c81-9d44-78ce3f520496"})


def test_topology_reads_cells_cpus_and_pages() -> None:
    caps = """<capabilities><host><topology><cells num='1'><cell id='0'>
    <memory unit='KiB'>2097152</memory><pages unit='KiB' size='4'>524288</pages>
    <pages unit='KiB' size='2048'>16</pages><cpus num='2'><cpu id='0'/><cpu id='1'/></cpus>
    </cell></cells></topology></host></capabilities>"""
    assert parse_topology(caps) == (
        HostCell(id=0, cpus=(0, 1), memory_kib=2097152, free_pages={4: 524288, 2048: 16}),
    )


def test_resolve_takes_free_devices_only() -> None:
    pci = tuple(
        HostPci(address=f"0000:65:00.{f}", vendor="0x10de", product="0x2236") for f in range(2)
    )
    host = HostHardware(pci=pci, used_pci=frozenset({"0000:65:00.0"}))
    want = DomainHardware(pci=(PciSelector(name="gpu", vendor="0x10de", product="0x2236"),))
    resolved = resolve(host, _domain(hardware=want))
    assert resolved.hardware.pci[0].address == "0000:65:00.1"
    two = dataclasses.replace(want, pci=want.pci * 2)
    with pytest.raises(InvalidSpec, match="no free PCI device vendor 0x10de product 0x2236"):
        resolve(host, _domain(hardware=two))
