"""The per-test libvirt bed on the real daemon cleans up after itself, and the serial marker
parser reads what the test guest prints."""

from __future__ import annotations

import hashlib
from pathlib import Path

import libvirt
import pytest

from capl.testing.objects import random_mac
from tests.fixtures.guest import guest_domain_xml, ignition_config, parse_markers
from tests.fixtures.libvirt import LibvirtBed

SERIAL_LOG = """\
CAPL-GUEST: boot
CAPL-GUEST: source=ignition sha256=abc123 bytes=42
CAPL-GUEST: ignition eyJhIjoxfQ==
CAPL-GUEST: hostname=node-a
node-a login: CAPL-GUEST: ip=10.1.2.3 mac=52:54:00:aa:bb:cc\r
CAPL-GUEST: ready
node-a:/# CAPL-GUEST: shutdown
"""


def test_a_line_not_ended_yet_is_not_a_marker_yet() -> None:
    half_written = parse_markers("CAPL-GUEST: boot\nCAPL-GUEST: uuid=5024cd")
    assert [m.name for m in half_written] == ["boot"]
    (marker,) = parse_markers("CAPL-GUEST: uuid=5024cd31-303b\r\n")
    assert (marker.name, marker.value) == ("uuid", "5024cd31-303b")


def test_parse_markers() -> None:
    markers = parse_markers(SERIAL_LOG)
    assert [m.name for m in markers] == [
        "boot", "source", "ignition", "hostname", "ip", "ready", "shutdown",
    ]  # fmt: skip
    source = markers[1]
    assert (source.value, source.fields) == (
        "ignition",
        {"source": "ignition", "sha256": "abc123", "bytes": "42"},
    )
    assert markers[2].payload_bytes() == b'{"a":1}'  # base64 padding is not a key=value
    assert markers[4].value == "10.1.2.3"  # found after other output on the same line
    assert markers[4].fields["mac"] == "52:54:00:aa:bb:cc"
    assert markers[0].payload is None
    assert markers[0].value is None


def test_bed_removes_what_it_made(libvirtd_conn: libvirt.virConnect, tmp_path: Path) -> None:
    bed = LibvirtBed(libvirtd_conn, workdir=tmp_path).open()
    try:
        assert bed.network is not None
        assert bed.network.isActive()
        assert "<forward" not in bed.network.XMLDesc(0)  # isolated
        path = bed.upload("probe.ign", ignition_config(hostname="probe"))
        assert (
            hashlib.sha256(path.read_bytes()).hexdigest()
            == hashlib.sha256(ignition_config(hostname="probe")).hexdigest()
        )
        # a defined (never started) domain is removed too
        xml = guest_domain_xml(
            name=f"{bed.name}-vm0",
            disk=str(path),
            network=bed.name,
            mac=random_mac(),
            serial_log=str(tmp_path / "serial.log"),
        )
        bed.define_domain(xml)
    finally:
        bed.close()
    with pytest.raises(libvirt.libvirtError):
        libvirtd_conn.lookupByName(f"{bed.name}-vm0")
    with pytest.raises(libvirt.libvirtError):
        libvirtd_conn.networkLookupByName(bed.name)
    with pytest.raises(libvirt.libvirtError):
        libvirtd_conn.storagePoolLookupByName(bed.name)
    assert not bed.pool_path.exists()
