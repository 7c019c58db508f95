"""The libvirt XML builders and parsers: golden files, escaping, control characters.

Golden files live in tests/unit/virt/golden/. After an intended change of a builder,
regenerate them with ``CAPL_UPDATE_GOLDEN=1 .venv/bin/pytest tests/unit/virt/test_virt_xml.py``
and review the diff like code.
"""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from capl.ports.errors import InvalidSpec
from capl.ports.virt import (
    CAPL_XML_NAMESPACE,
    ClusterOwner,
    DhcpHost,
    DiskBus,
    DiskDevice,
    DiskSpec,
    DnsHost,
    DomainOwner,
    DomainSpec,
    Firmware,
    FwCfgEntry,
    NetworkMode,
    NetworkSpec,
    NicSpec,
    VolumeFormat,
)
from capl.virt.domainxml import (
    build_domain_xml,
    owner_from_domain_xml,
    owner_from_metadata_xml,
    owner_metadata_xml,
)
from capl.virt.networkxml import (
    address_plan,
    build_dhcp_host_xml,
    build_dns_host_match_xml,
    build_dns_host_xml,
    build_network_xml,
    parse_network_xml,
)
from capl.virt.pools.directory import build_pool_xml, build_volume_xml
from capl.virt.storagexml import (
    parse_domain_caps,
    parse_host_caps,
    parse_pool_xml,
    parse_volume_xml,
)

GOLDEN = Path(__file__).parent / "golden"
UUID = "5d9f6a5e-3b0c-4d4a-9a52-0c1d2e3f4a5b"
OWNER = DomainOwner(cluster="demo", namespace="default", name="demo-cp-0", uid="uid-1234")
CLUSTER = ClusterOwner(namespace="default", name="demo", uid="cluster-uid")


def assert_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("CAPL_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"{path} is missing: run with CAPL_UPDATE_GOLDEN=1 once and review it"
    assert text == path.read_text(), f"{name} differs from its golden file"


def _domain(**changes: object) -> DomainSpec:
    base: dict[str, object] = {
        "name": "capl-default-demo-cp-0-1a2b3c4d",
        "uuid": UUID,
        "owner": OWNER,
        "vcpus": 2,
        "memory_mib": 2048,
        "domain_type": "qemu",
        "title": "default/demo-cp-0",
        "disks": (
            DiskSpec(path="/var/lib/capl/demo/capl-default-demo-cp-0-1a2b3c4d-root.qcow2"),
            DiskSpec(
                path="/var/lib/capl/demo/capl-default-demo-cp-0-1a2b3c4d-data0.qcow2",
                serial="data0",
            ),
        ),
        "nics": (NicSpec(mac="52:54:00:aa:bb:cc", network="capl-demo"),),
        "fw_cfg": (
            FwCfgEntry(
                name="opt/com.coreos/config",
                file="/var/lib/capl/demo/capl-default-demo-cp-0-1a2b3c4d-ignition.ign",
            ),
        ),
        "console_log": "/var/lib/capl/demo/capl-default-demo-cp-0-1a2b3c4d-console.log",
    }
    base.update(changes)
    return DomainSpec(**base)  # type: ignore[arg-type]


# --- golden files ----------------------------------------------------------------------------


def test_domain_ignition_bios_golden() -> None:
    assert_golden("domain-ignition-bios.xml", build_domain_xml(_domain()))


def test_domain_cloudinit_uefi_golden() -> None:
    spec = _domain(
        machine="q35",
        firmware=Firmware.UEFI,
        uefi_loader="/usr/share/OVMF/OVMF_CODE_4M.fd",
        uefi_nvram_template="/usr/share/OVMF/OVMF_VARS_4M.fd",
        fw_cfg=(),
        disks=(
            DiskSpec(path="/pool/root.qcow2"),
            DiskSpec(
                path="/pool/cidata.iso",
                format=VolumeFormat.ISO,
                device=DiskDevice.CDROM,
                bus=DiskBus.SCSI,
                readonly=True,
            ),
        ),
        nics=(
            NicSpec(mac="52:54:00:aa:bb:cc", network="capl-demo"),
            NicSpec(mac="52:54:00:aa:bb:cd", bridge="br0"),
        ),
        cpu_mode="host-passthrough",
        domain_type="kvm",
        guest_agent=False,
    )
    assert_golden("domain-cloudinit-uefi.xml", build_domain_xml(spec))


def test_domain_uefi_autoselect_uses_firmware_attribute() -> None:
    root = ET.fromstring(build_domain_xml(_domain(firmware=Firmware.UEFI)))
    assert root.find("os").get("firmware") == "efi"  # type: ignore[union-attr]
    assert root.find("os/loader") is None


def test_network_nat_golden() -> None:
    spec = NetworkSpec(
        name="capl-demo",
        mode=NetworkMode.NAT,
        owner=CLUSTER,
        cidr="10.42.0.0/24",
        dns_domain="demo.capl.test",
        bridge="capl-demo0",
    )
    assert_golden("network-nat.xml", build_network_xml(spec))


def test_network_isolated_golden() -> None:
    spec = NetworkSpec(
        name="capl-iso",
        mode=NetworkMode.ISOLATED,
        owner=CLUSTER,
        cidr="192.168.150.0/24",
        dhcp_start="192.168.150.10",
        dhcp_end="192.168.150.99",
    )
    assert_golden("network-isolated.xml", build_network_xml(spec))


def test_network_bridge_golden() -> None:
    spec = NetworkSpec(name="capl-br", mode=NetworkMode.BRIDGE, owner=CLUSTER, bridge="br0")
    assert_golden("network-bridge.xml", build_network_xml(spec))


def test_volume_overlay_golden() -> None:
    xml = build_volume_xml(
        name="capl-default-demo-cp-0-1a2b3c4d-root.qcow2",
        capacity_bytes=20 * 1024**3,
        format=VolumeFormat.QCOW2,
        backing_path="/var/lib/capl/demo/capl-base-fcos-0123456789ab",
        backing_format="qcow2",
        pretty=True,
    )
    assert_golden("volume-overlay.xml", xml)
    compact = build_volume_xml(
        name="capl-default-demo-cp-0-1a2b3c4d-root.qcow2",
        capacity_bytes=20 * 1024**3,
        format=VolumeFormat.QCOW2,
        backing_path="/var/lib/capl/demo/capl-base-fcos-0123456789ab",
        backing_format="qcow2",
    )
    assert "\n " not in compact  # what libvirt gets: not indented, the same document
    assert compact == _unindent(xml) + "\n"


def _unindent(document: str) -> str:
    """The document without the whitespace-only text that indenting adds."""
    root = ET.fromstring(document)
    for element in root.iter():
        if element.text is not None and not element.text.strip():
            element.text = None
        if element.tail is not None and not element.tail.strip():
            element.tail = None
    return ET.tostring(root, encoding="unicode")


def test_pool_golden() -> None:
    assert_golden("pool-dir.xml", build_pool_xml(name="capl-demo", path="/var/lib/capl/demo"))


def test_dhcp_and_dns_host_snippets() -> None:
    assert (
        build_dhcp_host_xml(DhcpHost(mac="52:54:00:AA:BB:CC", ip="10.42.0.129", name="cp-0"))
        == '<host mac="52:54:00:aa:bb:cc" name="cp-0" ip="10.42.0.129" />'
    )
    assert (
        build_dns_host_xml(DnsHost(ip="10.42.0.129", hostnames=("cp-0", "api")))
        == '<host ip="10.42.0.129"><hostname>cp-0</hostname><hostname>api</hostname></host>'
    )
    assert build_dns_host_match_xml("10.42.0.129") == '<host ip="10.42.0.129" />'


# --- escaping and control characters ---------------------------------------------------------


NASTY = "a<b>&\"c'd"


def test_special_characters_are_escaped_and_round_trip() -> None:
    owner = DomainOwner(cluster=NASTY, namespace="ns", name="m&1", uid='"uid"')
    spec = _domain(owner=owner, title=NASTY, description=f"line1\n{NASTY}\tend")
    document = build_domain_xml(spec)
    root = ET.fromstring(document)  # well-formed
    assert root.findtext("title") == NASTY
    assert root.findtext("description") == f"line1\n{NASTY}\tend"
    assert owner_from_domain_xml(document) == owner


@pytest.mark.parametrize("bad", ["\x00", "\x07", "\x1b[31m", "\x7f", "\ud800", "\ufffe"])
def test_control_characters_are_rejected_with_the_field_named(bad: str) -> None:
    with pytest.raises(InvalidSpec, match="domain title contains the control character"):
        build_domain_xml(_domain(title=f"evil{bad}"))
    with pytest.raises(InvalidSpec, match="owner name"):
        build_domain_xml(_domain(owner=DomainOwner(cluster="c", namespace="n", name=bad, uid="u")))


def test_line_breaks_are_rejected_in_single_line_values() -> None:
    with pytest.raises(InvalidSpec, match="domain name must be a single line"):
        build_domain_xml(_domain(name="a\nb"))
    with pytest.raises(InvalidSpec, match="fw_cfg"):
        build_domain_xml(_domain(fw_cfg=(FwCfgEntry(name="opt/x", file="/a\r/b"),)))


@pytest.mark.parametrize(
    "hostname", ["bad name", "-lead", "trail-", "a" * 64, "x.\x00", "under_score", ""]
)
def test_dns_hostnames_are_validated(hostname: str) -> None:
    with pytest.raises(InvalidSpec):
        build_dns_host_xml(DnsHost(ip="10.0.0.5", hostnames=(hostname,)))


def test_bad_inputs_are_typed_errors() -> None:
    with pytest.raises(InvalidSpec, match="not a UUID"):
        build_domain_xml(_domain(uuid="nope"))
    with pytest.raises(InvalidSpec, match="not a MAC"):
        build_domain_xml(_domain(nics=(NicSpec(mac="52:54:00:zz:00:00", network="n"),)))
    with pytest.raises(InvalidSpec, match="cdrom cannot sit on the virtio bus"):
        build_domain_xml(_domain(disks=(DiskSpec(path="/a.iso", device=DiskDevice.CDROM),)))
    with pytest.raises(InvalidSpec, match="exactly one of network or bridge"):
        build_domain_xml(_domain(nics=(NicSpec(mac="52:54:00:00:00:01"),)))
    entry = FwCfgEntry(name="opt/a", file="/a")
    with pytest.raises(InvalidSpec, match="given twice"):
        build_domain_xml(_domain(fw_cfg=(entry, entry)))
    with pytest.raises(InvalidSpec, match="CIDR"):
        build_network_xml(
            NetworkSpec(name="n", mode=NetworkMode.NAT, owner=CLUSTER, cidr="10.0.0.0/33")
        )
    with pytest.raises(InvalidSpec, match="not a usable address"):
        build_network_xml(
            NetworkSpec(
                name="n",
                mode=NetworkMode.NAT,
                owner=CLUSTER,
                cidr="10.0.0.0/24",
                dhcp_start="10.0.0.1",
            )
        )


# --- parsers ---------------------------------------------------------------------------------


def test_owner_metadata_as_libvirt_returns_it() -> None:
    # virDomainGetMetadata returns the element with the namespace prefix stripped
    plain = (
        "<machine><cluster>demo</cluster><namespace>default</namespace>"
        "<name>demo-cp-0</name><uid>uid-1234</uid><kind>LibvirtMachine</kind></machine>"
    )
    assert owner_from_metadata_xml(plain) == OWNER
    assert owner_from_metadata_xml(owner_metadata_xml(OWNER)) == OWNER
    assert owner_from_metadata_xml("<other/>") is None
    assert CAPL_XML_NAMESPACE not in owner_metadata_xml(OWNER)  # libvirt adds it


def test_network_round_trip_and_libvirt_output() -> None:
    spec = NetworkSpec(
        name="capl-demo",
        mode=NetworkMode.NAT,
        owner=CLUSTER,
        cidr="10.42.0.0/24",
        dns_domain="demo.test",
    )
    info = parse_network_xml(build_network_xml(spec), active=True, persistent=True, autostart=True)
    plan = address_plan(spec)
    assert info.mode is NetworkMode.NAT
    assert info.cidr == "10.42.0.0/24"
    assert info.gateway == str(plan.gateway) == "10.42.0.1"
    assert (info.dhcp_start, info.dhcp_end) == ("10.42.0.128", "10.42.0.254")
    assert info.owner == CLUSTER
    # what libvirt 9.0 returns after DHCP/DNS updates (netmask form, no prefix)
    dumped = """<network>
      <name>x</name><uuid>u</uuid>
      <bridge name='virbr9'/>
      <dns><host ip='10.1.0.5'><hostname>m1</hostname><hostname>api</hostname></host></dns>
      <ip address='10.1.0.1' netmask='255.255.255.0'>
        <dhcp><range start='10.1.0.10' end='10.1.0.20'/>
          <host mac='52:54:00:00:00:01' name='m1' ip='10.1.0.5'/></dhcp>
      </ip>
      <ip family='ipv6' address='fd00::1' prefix='64'/>
    </network>"""
    other = parse_network_xml(dumped, active=False, persistent=True, autostart=False)
    assert other.mode is NetworkMode.ISOLATED
    assert other.cidr == "10.1.0.0/24"
    assert other.owner is None
    assert other.dhcp_hosts == (DhcpHost(mac="52:54:00:00:00:01", ip="10.1.0.5", name="m1"),)
    assert other.dns_hosts == (DnsHost(ip="10.1.0.5", hostnames=("m1", "api")),)


def test_volume_and_pool_parsers() -> None:
    document = """<volume type='file'><name>ov</name><key>/p/ov</key>
      <capacity unit='bytes'>33554432</capacity><allocation unit='bytes'>200704</allocation>
      <target><path>/p/ov</path><format type='qcow2'/></target>
      <backingStore><path>/p/base</path><format type='qcow2'/></backingStore></volume>"""
    info = parse_volume_xml(document, pool="p")
    assert (info.name, info.path, info.format) == ("ov", "/p/ov", "qcow2")
    assert (info.capacity_bytes, info.allocation_bytes) == (33554432, 200704)
    assert (info.backing_path, info.backing_format) == ("/p/base", "qcow2")
    pool = parse_pool_xml(build_pool_xml(name="p", path="/var/p"))
    assert (pool.name, pool.path, pool.pool_type) == ("p", "/var/p", "dir")


def test_capabilities_parsers() -> None:
    caps = """<capabilities><host><cpu><arch>x86_64</arch></cpu></host>
      <guest><os_type>hvm</os_type><arch name='i686'><domain type='qemu'/></arch></guest>
      <guest><os_type>hvm</os_type><arch name='x86_64'><domain type='qemu'/>
        <domain type='kvm'/></arch></guest></capabilities>"""
    parsed = parse_host_caps(caps)
    assert parsed.arch == "x86_64"
    assert parsed.domain_types == ("qemu", "kvm")
    domcaps = """<domainCapabilities><os supported='yes'>
      <enum name='firmware'><value>efi</value></enum>
      <loader supported='yes'><value>/usr/share/OVMF/OVMF_CODE_4M.fd</value></loader>
      </os></domainCapabilities>"""
    dc = parse_domain_caps(domcaps)
    assert dc.efi
    assert dc.loaders == ("/usr/share/OVMF/OVMF_CODE_4M.fd",)
    assert not parse_domain_caps("<domainCapabilities/>").efi
