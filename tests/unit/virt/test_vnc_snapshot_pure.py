"""The pure parts of `capl vnc` and the snapshots: the VNC display read from domain XML, the
ssh forward built from a host's connection plan, the domain XML of ``spec.vnc``, snapshot
XML parsing, snapshot names, and ``snapshot_guard``'s order of calls."""

from __future__ import annotations

import datetime
import xml.etree.ElementTree as ET

import pytest

from capl.ports.console import GraphicsUnavailable, VncDisplay
from capl.ports.errors import InvalidSpec
from capl.ports.virt import DomainOwner, DomainSpec
from capl.ports.virt.identity import HostId
from capl.ports.virt.snapshots import (
    SnapshotInfo,
    SnapshotKind,
    check_snapshot_name,
    snapshot_guard,
)
from capl.virt.domainxml import build_domain_xml
from capl.virt.graphics import ssh_forward_argv, vnc_display_of
from capl.virt.snapshot import snapshot_info_of
from capl.virt.uri import plan_connection

OWNER = DomainOwner(cluster="c", namespace="ns", name="m", uid="u", kind="LibvirtMachine")
UUID = "6f1c4a4e-0a43-4b0e-9a43-6a8e43a5b0c1"


def test_vnc_display_of_a_socket_only_display() -> None:
    xml = """<domain><devices>
      <graphics type='spice' port='5900'/>
      <graphics type='vnc' socket='/var/lib/libvirt/qemu/domain-1-x/vnc.sock'>
        <listen type='socket' socket='/var/lib/libvirt/qemu/domain-1-x/vnc.sock'/>
      </graphics></devices></domain>"""
    assert vnc_display_of(xml) == VncDisplay(
        index=1, socket="/var/lib/libvirt/qemu/domain-1-x/vnc.sock", tcp=None, password=False
    )


def test_vnc_display_of_a_tcp_display_with_a_password_and_of_none() -> None:
    xml = """<domain><devices><graphics type='vnc' port='5901' passwd='s3cret'>
      <listen type='address' address='127.0.0.1'/></graphics></devices></domain>"""
    display = vnc_display_of(xml)
    assert display == VncDisplay(index=0, socket=None, tcp="127.0.0.1:5901", password=True)
    assert "s3cret" not in repr(display)
    assert vnc_display_of("<domain><devices/></domain>") is None


def test_domain_xml_of_spec_vnc_listens_on_a_socket_only() -> None:
    spec = DomainSpec(name="d", uuid=UUID, owner=OWNER, vcpus=1, memory_mib=64, vnc=True)
    graphics = ET.fromstring(build_domain_xml(spec)).findall("./devices/graphics")
    assert [(g.attrib, [lst.attrib for lst in g]) for g in graphics] == [
        ({"type": "vnc"}, [{"type": "socket"}])
    ]
    plain = DomainSpec(name="d", uuid=UUID, owner=OWNER, vcpus=1, memory_mib=64)
    assert ET.fromstring(build_domain_xml(plain)).find("./devices/graphics") is None


def test_ssh_forward_uses_the_hosts_key_and_known_hosts() -> None:
    plan = plan_connection(
        "qemu+ssh://ops@kvm1.example:2222/system",
        credentials={"ssh-privatekey": b"KEY", "known_hosts": b"kvm1.example ssh-ed25519 AAAA"},
    )
    try:
        argv = ssh_forward_argv(plan, remote_socket="/run/vnc.sock", local_port=5901)
        assert argv[0].endswith("/ssh")  # the wrapper pinning known_hosts
        assert argv[argv.index("-i") + 1].endswith("/id")
        assert argv[argv.index("-p") + 1] == "2222"
        assert argv[argv.index("-l") + 1] == "ops"
        assert argv[argv.index("-L") + 1] == "127.0.0.1:5901:/run/vnc.sock"
        assert argv[-2:] == ["--", "kvm1.example"]
        assert "KEY" not in " ".join(argv)
        six = ssh_forward_argv(
            plan, remote_socket="/run/vnc.sock", local_port=5901, local_address="::1"
        )
        assert six[six.index("-L") + 1] == "[::1]:5901:/run/vnc.sock"
    finally:
        plan.cleanup()


def test_ssh_forward_refuses_a_tls_host() -> None:
    plan = plan_connection("qemu+tls://kvm1.example/system")
    with pytest.raises(GraphicsUnavailable, match=r"reached through ssh; .* uses the tls"):
        ssh_forward_argv(plan, remote_socket="/run/vnc.sock", local_port=5901)


def test_snapshot_info_of_libvirts_snapshot_xml() -> None:
    xml = """<domainsnapshot><name>live</name><description>before</description>
      <state>running</state><parent><name>s0</name></parent><creationTime>1764740000</creationTime>
      <memory snapshot='external' file='/p/d-snap-live.mem'/>
      <disks><disk name='vda' snapshot='external' type='file'><driver type='qcow2'/>
        <source file='/p/d-vda-snap-live.qcow2'/></disk>
        <disk name='hdc' snapshot='no'/></disks>
      <domain><name>d</name></domain></domainsnapshot>"""
    assert snapshot_info_of(xml, current=True) == SnapshotInfo(
        name="live",
        kind=SnapshotKind.MEMORY,
        created=datetime.datetime.fromtimestamp(1764740000, tz=datetime.UTC),
        state="running",
        parent="s0",
        current=True,
        overlays=("/p/d-vda-snap-live.qcow2",),
        description="before",
    )


@pytest.mark.parametrize("bad", ["", "../etc", "a/b", "-x", "a b", "x" * 64, "ü"])
def test_bad_snapshot_names_are_refused(bad: str) -> None:
    with pytest.raises(InvalidSpec, match=r"snapshot name .* is invalid"):
        check_snapshot_name(bad)


def test_good_snapshot_names() -> None:
    for good in ("s1", "before-upgrade", "2026.12.03_x", "x" * 63):
        assert check_snapshot_name(good) == good


class RecordingSnapshots:
    """A stand-in for ``Snapshots`` that records calls (no libvirt: the order is the test)."""

    host_id = HostId("test:///default")

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    async def create_snapshot(
        self, uuid: str, name: str, *, memory: bool = False, description: str = ""
    ) -> SnapshotInfo:
        self.calls.append(("create", name))
        return self._info(name, memory=memory)

    def _info(self, name: str, *, memory: bool = False) -> SnapshotInfo:
        return SnapshotInfo(
            name=name,
            kind=SnapshotKind.MEMORY if memory else SnapshotKind.DISK,
            created=datetime.datetime.now(datetime.UTC),
            state="running",
            parent=None,
            current=True,
            overlays=(),
        )

    async def list_snapshots(self, uuid: str) -> list[SnapshotInfo]:
        return []

    async def revert_snapshot(
        self, uuid: str, name: str, *, start: bool | None = None
    ) -> SnapshotInfo:
        self.calls.append(("revert", name))
        return self._info(name)

    async def delete_snapshot(self, uuid: str, name: str) -> bool:
        self.calls.append(("delete", name))
        return True


async def test_snapshot_guard_merges_on_success_and_reverts_on_failure() -> None:
    snapshots = RecordingSnapshots()
    async with snapshot_guard(snapshots, UUID, name="ok"):
        pass
    assert snapshots.calls == [("create", "ok"), ("delete", "ok")]

    snapshots.calls.clear()
    with pytest.raises(ValueError, match="boom"):
        async with snapshot_guard(snapshots, UUID, name="bad"):
            raise ValueError("boom")
    assert snapshots.calls == [("create", "bad"), ("revert", "bad"), ("delete", "bad")]

    snapshots.calls.clear()
    async with snapshot_guard(snapshots, UUID, name="kept", keep=True):
        pass
    assert snapshots.calls == [("create", "kept")]

    with pytest.raises(InvalidSpec):
        async with snapshot_guard(snapshots, UUID, name="../x"):
            pass
