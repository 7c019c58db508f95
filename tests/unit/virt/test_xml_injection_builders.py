"""Hostile strings through every libvirt XML builder: valid XML with the value intact, or a
typed refusal that names the field.

For each string-valued input of the domain, owner-metadata, network, DHCP host, DNS host,
pool and volume builders, hypothesis feeds strings assembled from XML metacharacters
(``<``, ``&``, quotes, ``]]>``, comment/CDATA/DOCTYPE/entity openers, fake closing tags),
control characters (C0, DEL, C1), line separators, lone surrogates and non-characters,
plus arbitrary text. Each outcome must be one of:

- ``InvalidSpec`` (and nothing else: no ValueError, TypeError, UnicodeError) whose message
  names the field (``domain title``, ``disk 0 path``, ``bridge name``, ...);
- a document that encodes as UTF-8, parses with a strict XML 1.0 parser (expat), has the
  same element/attribute structure as with a harmless value (nothing injected), and holds
  the value unchanged where the field goes.

A carriage return in free text (the domain description) is refused: XML parsers normalise
it to a line feed, so it could not read back as written.
"""

from __future__ import annotations

import dataclasses
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from capl.ports.errors import InvalidSpec
from capl.ports.virt import (
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
from capl.virt.networkxml import build_dhcp_host_xml, build_dns_host_xml, build_network_xml
from capl.virt.pools.directory import build_pool_xml, build_volume_xml
from capl.virt.xmlutil import capl_tag

UUID = "5d9f6a5e-3b0c-4d4a-9a52-0c1d2e3f4a5b"
MAC = "52:54:00:12:34:56"
OWNER = DomainOwner(
    cluster="demo",
    namespace="default",
    name="demo-cp-0",
    uid="1b4e28ba-2fa1-11d2-883f-0016d3cca427",
)
CLUSTER = ClusterOwner(namespace="default", name="demo", uid="c-uid")
BASE_DOMAIN = DomainSpec(
    name="capl-default-demo-cp-0",
    uuid=UUID,
    owner=OWNER,
    vcpus=1,
    memory_mib=128,
    domain_type="qemu",
    title="default/demo-cp-0",
    description="machine default/demo-cp-0",
    disks=(DiskSpec(path="/pool/root.qcow2", serial="root"),),
    nics=(NicSpec(mac=MAC, network="capl-demo"),),
    fw_cfg=(FwCfgEntry(name="opt/com.coreos/config", file="/pool/ignition"),),
    console_log="/pool/console.log",
    machine="pc",
    cpu_mode="host-model",
)
BASE_NETWORK = NetworkSpec(
    name="capl-demo",
    mode=NetworkMode.ISOLATED,
    owner=CLUSTER,
    cidr="10.77.0.0/24",
    dns_domain="demo.internal",
    bridge="capl-br0",
)

# --- hostile strings -------------------------------------------------------------------------

NASTY = [
    "<",
    ">",
    "&",
    '"',
    "'",
    "]]>",
    "<![CDATA[",
    "<!--",
    "-->",
    "<?xml version='1.0'?>",
    "<!DOCTYPE d [<!ENTITY e SYSTEM 'file:///etc/shadow'>]>",
    "&e;",
    "&amp;",
    "&#0;",
    "&#x1F;",
    "</name><name>",
    "<capl:machine/>",
    "' injected='1",
    '" injected="1',
    "\x00",
    "\x01",
    "\x08",
    "\x0b",
    "\x0c",
    "\x1b",
    "\x1f",
    "\x7f",
    "\x85",
    "\x9f",
    "\t",
    "\n",
    "\r",
    "\r\n",
    "\u2028",
    "\ud800",
    "\udfff",
    "\ufffe",
    "\uffff",
    "\ufeff",
    "\U0001f600",
    " ",
    "/",
    "a",
    "-",
    ".",
]

hostile = st.lists(
    st.one_of(st.sampled_from(NASTY), st.text(max_size=4)), min_size=0, max_size=6
).map("".join)

# --- the fields ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Field:
    label: str
    """What the refusal must name (and the test id)."""
    build: Callable[[str], str]
    extract: Callable[[ET.Element], str | None]
    benign: str = "x"
    """A value the builder accepts: the reference structure."""
    error_words: tuple[str, ...] = ()
    """Words that name the field in refusals (default: the label)."""
    empty_is_default: bool = False
    """An empty value means "unset": the builder writes its default instead."""


def _domain(**changes: object) -> str:
    return build_domain_xml(dataclasses.replace(BASE_DOMAIN, **changes))  # type: ignore[arg-type]


def _owner_domain(key: str) -> Callable[[str], str]:
    return lambda v: _domain(owner=dataclasses.replace(OWNER, **{key: v}))


def _metadata_owner(key: str) -> Callable[[str], str]:
    return lambda v: owner_metadata_xml(dataclasses.replace(OWNER, **{key: v}))


def _network(**changes: object) -> str:
    return build_network_xml(dataclasses.replace(BASE_NETWORK, **changes))  # type: ignore[arg-type]


def _network_owner(key: str) -> Callable[[str], str]:
    return lambda v: _network(owner=dataclasses.replace(CLUSTER, **{key: v}))


def _text(path: str) -> Callable[[ET.Element], str | None]:
    def extract(root: ET.Element) -> str | None:
        found = root.find(path)
        return None if found is None else found.text

    return extract


def _attr(path: str, name: str) -> Callable[[ET.Element], str | None]:
    def extract(root: ET.Element) -> str | None:
        found = root if path == "." else root.find(path)
        return None if found is None else found.get(name)

    return extract


_MACHINE = f"metadata/{capl_tag('machine')}"
_NETOWNER = f"metadata/{capl_tag('network')}"

FIELDS: list[Field] = [
    Field("domain name", lambda v: _domain(name=v), _text("name")),
    Field("domain title", lambda v: _domain(title=v), _text("title")),
    Field("domain description", lambda v: _domain(description=v), _text("description")),
    Field("domain type", lambda v: _domain(domain_type=v), _attr(".", "type")),
    *(
        Field(f"owner {key}", _owner_domain(key), _text(f"{_MACHINE}/{capl_tag(key)}"))
        for key in ("cluster", "namespace", "name", "uid", "kind")
    ),
    Field(
        "disk 0 path",
        lambda v: _domain(disks=(DiskSpec(path=v),)),
        _attr("devices/disk/source", "file"),
    ),
    Field(
        "disk 0 serial",
        lambda v: _domain(disks=(DiskSpec(path="/p/d", serial=v),)),
        _text("devices/disk/serial"),
    ),
    Field(
        "interface 0 network",
        lambda v: _domain(nics=(NicSpec(mac=MAC, network=v),)),
        _attr("devices/interface/source", "network"),
    ),
    Field(
        "interface 0 bridge",
        lambda v: _domain(nics=(NicSpec(mac=MAC, bridge=v),)),
        _attr("devices/interface/source", "bridge"),
    ),
    Field(
        "interface 0 model",
        lambda v: _domain(nics=(NicSpec(mac=MAC, network="n", model=v),)),
        _attr("devices/interface/model", "type"),
    ),
    Field(
        "interface 0 mac",
        lambda v: _domain(nics=(NicSpec(mac=v, network="n"),)),
        _attr("devices/interface/mac", "address"),
        benign=MAC,
        error_words=("MAC address",),
    ),
    Field(
        "fw_cfg entry name",
        lambda v: _domain(fw_cfg=(FwCfgEntry(name=v, file="/p/ign"),)),
        _attr("sysinfo[@type='fwcfg']/entry", "name"),
    ),
    Field(
        "fw_cfg file",
        lambda v: _domain(fw_cfg=(FwCfgEntry(name="opt/x", file=v),)),
        _attr("sysinfo[@type='fwcfg']/entry", "file"),
        error_words=("fw_cfg opt/x file",),
    ),
    Field(
        "SMBIOS product",
        lambda v: _domain(smbios_product=v),
        _text("sysinfo[@type='smbios']/system/entry[@name='product']"),
    ),
    Field("arch", lambda v: _domain(arch=v), _attr("os/type", "arch")),
    Field("machine type", lambda v: _domain(machine=v), _attr("os/type", "machine")),
    Field(
        "UEFI loader",
        lambda v: _domain(firmware=Firmware.UEFI, uefi_loader=v),
        _text("os/loader"),
    ),
    Field(
        "UEFI NVRAM template",
        lambda v: _domain(firmware=Firmware.UEFI, uefi_loader="/l", uefi_nvram_template=v),
        _attr("os/nvram", "template"),
    ),
    Field("cpu mode", lambda v: _domain(cpu_mode=v), _attr("cpu", "mode")),
    Field(
        "console log path",
        lambda v: _domain(console_log=v),
        _attr("devices/serial/log", "file"),
    ),
    Field(
        "domain UUID",
        lambda v: _domain(uuid=v),
        _text("uuid"),
        benign=UUID,
        error_words=("UUID",),
    ),
    *(
        Field(
            f"metadata owner {key}",
            _metadata_owner(key),
            _text(key),
            error_words=(f"owner {key}",),
        )
        for key in ("cluster", "namespace", "name", "uid", "kind")
    ),
    Field("network name", lambda v: _network(name=v), _text("name")),
    *(
        Field(
            f"network owner {key}",
            _network_owner(key),
            _text(f"{_NETOWNER}/{capl_tag(key)}"),
            error_words=(f"owner {key}",),
        )
        for key in ("namespace", "name", "uid")
    ),
    Field("bridge name", lambda v: _network(bridge=v), _attr("bridge", "name")),
    Field(
        "bridge-mode bridge name",
        lambda v: _network(mode=NetworkMode.BRIDGE, bridge=v, cidr=None, dns_domain=None),
        _attr("bridge", "name"),
        error_words=("bridge name", "bridge's name"),
    ),
    Field(
        "DNS domain",
        lambda v: _network(dns_domain=v),
        _attr("domain", "name"),
        benign="demo.internal",
    ),
    Field(
        "network CIDR",
        lambda v: _network(cidr=v),
        lambda root: None,
        benign="10.0.0.0/24",
        error_words=("CIDR", "needs a CIDR"),
    ),
    Field(
        "DHCP start",
        lambda v: _network(dhcp_start=v),
        _attr("ip/dhcp/range", "start"),
        benign="10.77.0.200",
        error_words=("DHCP range", "DHCP start"),
        empty_is_default=True,
    ),
    Field(
        "DHCP host name",
        lambda v: build_dhcp_host_xml(DhcpHost(mac=MAC, ip="10.77.0.9", name=v)),
        _attr(".", "name"),
    ),
    Field(
        "DHCP host mac",
        lambda v: build_dhcp_host_xml(DhcpHost(mac=v, ip="10.77.0.9")),
        _attr(".", "mac"),
        benign=MAC,
        error_words=("MAC address",),
    ),
    Field(
        "DHCP host ip",
        lambda v: build_dhcp_host_xml(DhcpHost(mac=MAC, ip=v)),
        _attr(".", "ip"),
        benign="10.77.0.9",
        error_words=("IPv4 address",),
    ),
    Field(
        "DNS hostname",
        lambda v: build_dns_host_xml(DnsHost(ip="10.77.0.9", hostnames=(v,))),
        _text("hostname"),
        error_words=("hostname",),
    ),
    Field(
        "DNS host ip",
        lambda v: build_dns_host_xml(DnsHost(ip=v, hostnames=("api",))),
        _attr(".", "ip"),
        benign="10.77.0.9",
        error_words=("IPv4 address",),
    ),
    Field("pool name", lambda v: build_pool_xml(name=v, path="/pool"), _text("name")),
    Field("pool path", lambda v: build_pool_xml(name="p", path=v), _text("target/path")),
    Field(
        "volume name",
        lambda v: build_volume_xml(name=v, capacity_bytes=1, format=VolumeFormat.QCOW2),
        _text("name"),
    ),
    Field(
        "backing store path",
        lambda v: build_volume_xml(
            name="v", capacity_bytes=1, format=VolumeFormat.QCOW2, backing_path=v
        ),
        _text("backingStore/path"),
    ),
    Field(
        "backing store format",
        lambda v: build_volume_xml(
            name="v",
            capacity_bytes=1,
            format=VolumeFormat.QCOW2,
            backing_path="/base",
            backing_format=v,
        ),
        _attr("backingStore/format", "type"),
    ),
]


def _shape(root: ET.Element) -> list[tuple[str, tuple[str, ...]]]:
    """Element tags and attribute names in document order: what an injection would change."""
    return [(element.tag, tuple(sorted(element.attrib))) for element in root.iter()]


_REFERENCES: dict[str, list[tuple[str, tuple[str, ...]]]] = {}


def _reference_shape(field: Field) -> list[tuple[str, tuple[str, ...]]]:
    if field.label not in _REFERENCES:
        _REFERENCES[field.label] = _shape(ET.fromstring(field.build(field.benign)))
    return _REFERENCES[field.label]


def _check(field: Field, value: str, *, normalize: Callable[[str], str] = str) -> str | None:
    """Build with `value`; assert the property; return the refusal message if refused."""
    try:
        document = field.build(value)
    except InvalidSpec as exc:
        message = str(exc)
        words = field.error_words or (field.label,)
        assert any(word in message for word in words), (
            f"refusal of {value!r} does not name {field.label!r}: {message}"
        )
        return message
    document.encode("utf-8")  # what libvirt-python does with it; fails on lone surrogates
    root = ET.fromstring(document)
    reference = _reference_shape(field)
    got = field.extract(root)
    if got is None:
        # an optional value the builder leaves out when empty
        assert value == "" or field.label == "network CIDR", (field.label, value, document)
        return None
    assert _shape(root) == reference, f"{field.label}: structure changed by {value!r}"
    if value == "" and field.empty_is_default:
        return None
    assert got == normalize(value), f"{field.label}: {value!r} came back as {got!r}"
    return None


@pytest.mark.parametrize("field", FIELDS, ids=[f.label for f in FIELDS])
@settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,
)
@given(value=hostile)
@example(value="<script>&amp;\"']]></name>")
@example(value="a\x00b")
@example(value="\ud800")
@example(value="")
def test_hostile_value_is_escaped_or_refused_naming_the_field(field: Field, value: str) -> None:
    _check(field, value)


def test_the_benign_values_are_accepted_and_round_trip() -> None:
    for field in FIELDS:
        assert _check(field, field.benign) is None, field.label


def test_xml_metacharacters_are_accepted_in_free_text_and_round_trip() -> None:
    value = "<b>&amp;\"quoted\" 'single' ]]> <!-- c --> <![CDATA[x]]> &e; \u2028 \U0001f600"
    for label in ("domain name", "domain title", "domain description", "pool path"):
        field = next(f for f in FIELDS if f.label == label)
        assert _check(field, value) is None, label


@pytest.mark.parametrize(
    "bad", ["\x00", "\x07", "\x1b", "\x7f", "\x85", "\ud800", "\ufffe"], ids=repr
)
def test_control_characters_are_refused_everywhere(bad: str) -> None:
    for field in FIELDS:
        value = f"a{bad}b"
        with pytest.raises(InvalidSpec) as info:
            field.build(value)
        words = field.error_words or (field.label,)
        assert any(word in str(info.value) for word in words), (field.label, str(info.value))


@settings(max_examples=150, deadline=None, derandomize=True)
@given(values=st.tuples(*(hostile.map(str.strip).filter(bool) for _ in range(5))))
def test_owner_tag_reads_back_as_written(values: tuple[str, str, str, str, str]) -> None:
    """The ownership check reads back exactly the owner that was written (values without
    surrounding whitespace: the reader strips it, and Kubernetes names have none)."""
    cluster, namespace, name, uid, kind = values
    owner = DomainOwner(cluster=cluster, namespace=namespace, name=name, uid=uid, kind=kind)
    document: str | None = None
    refusal = ""
    try:
        document = _domain(owner=owner)
    except InvalidSpec as exc:
        refusal = str(exc)
    if document is None:
        assert "owner " in refusal
        return
    assert owner_from_domain_xml(document) == owner
    assert owner_from_metadata_xml(owner_metadata_xml(owner)) == owner


def test_disk_and_nic_variants_take_hostile_paths_too() -> None:
    value = "/pool/<a&b>'\"]]>.iso"
    document = _domain(
        disks=(
            DiskSpec(
                path=value,
                format=VolumeFormat.ISO,
                device=DiskDevice.CDROM,
                bus=DiskBus.SCSI,
                readonly=True,
            ),
        )
    )
    assert ET.fromstring(document).find("devices/disk/source").get("file") == value  # type: ignore[union-attr]


def test_description_carriage_return_is_refused_or_round_trips() -> None:
    field = next(f for f in FIELDS if f.label == "domain description")
    _check(field, "line one\r\nline two\rend")
