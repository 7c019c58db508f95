"""`capl vnc` and `capl snapshot` end to end: a real API server, the real libvirtd and one
real TCG guest shared by the module (booted once; the tests run in file order).

The guest is the test bed's guest with a VNC display on a unix socket only
(``<graphics type='vnc'><listen type='socket'/>``, what capl writes for ``spec.vnc``). The
LibvirtCluster/LibvirtMachine objects are made by hand and point at it (no manager runs).

- VNC: the port `capl vnc` prints answers the RFB handshake, and the ServerInit names this
  guest's QEMU (so the bytes come from its display); QEMU listens on no TCP port. The same
  through a qemu+ssh:// host (``ssh -L`` to the display's socket, the Secret's key) whose
  sshd has the test beds' policy (capl.testbed.sshd: local forwards); one that allows no
  forwards is reported with the cause.
- Snapshots: what the guest writes after a memory snapshot (a file in its RAM-backed root, a
  marker on its disk) is gone after `capl snapshot revert`, which resumes the guest without
  a boot; ``snapshot_guard`` (the day-2 library form, disk-only) keeps a change that works
  and reverts one that raises (the disk checked on the host: no boot is waited for).
- Bad input: an unknown machine, an unknown snapshot, a bad name, a machine without VNC.
"""

from __future__ import annotations

import asyncio
import base64
import os
import re
import secrets
import select
import subprocess
import time
import uuid as uuidlib
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import libvirt
import pytest
from kubernetes_asyncio import client

from capl.ports.virt.snapshots import SnapshotKind, snapshot_guard
from capl.testing.objects import random_mac
from capl.virt import LibvirtHost
from capl.virt.snapshot import LibvirtSnapshots
from tests.fixtures.guest import guest_domain_xml
from tests.fixtures.libvirt import Guest, LibvirtBed, record_timing
from tests.fixtures.transports import SshServer, running_sshd, ssh_server
from tests.fixtures.vnc import CAPL, vnc_session
from tests.libvirtd.test_console_cli import create_objects

__all__ = ["ssh_server"]  # the session fixture, registered by this import

pytestmark = [pytest.mark.libvirtd, pytest.mark.apiserver]

BOOT_TIMEOUT = 420  # a TCG boot takes ~10-30 s; 300 s was seen with the 2 cores shared
CLI_TIMEOUT = 120
GUEST_MIB = 128  # what a memory snapshot saves and a revert restores: keep it small
VNC_XML = "<graphics type='vnc'><listen type='socket'/></graphics>"
# the last 4 KiB of the guest's disk: outside what the FAT boot files use
LAST_SECTORS = "S=$(( $(cat /sys/block/vda/size) - 8 ))"


@pytest.fixture(scope="module")
def vnc_guest(
    libvirtd_conn: libvirt.virConnect, guest_image: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Guest]:
    """One TCG guest with a socket-only VNC display for the whole module."""
    bed = LibvirtBed(libvirtd_conn, workdir=tmp_path_factory.mktemp("vnc"))
    try:
        bed.open()
        name, mac = f"{bed.name}-vnc", random_mac()
        disk = bed.overlay(f"{name}-root.qcow2", guest_image)
        serial_log = bed.workdir / f"{name}-serial.log"
        xml = guest_domain_xml(
            name=name,
            disk=str(disk),
            network=bed.name,
            mac=mac,
            serial_log=str(serial_log),
            memory_mib=GUEST_MIB,
        ).replace("<memballoon", VNC_XML + "<memballoon")
        domain = bed.define_domain(xml)
        domain.create()
        guest = Guest(bed, domain, name, mac, serial_log, time.monotonic())
        guest.wait_for_marker("ready", timeout=BOOT_TIMEOUT)
        record_timing("vnc guest: boot to ready", time.monotonic() - guest.started_at)
        yield guest
    finally:
        bed.close()


def shell(guest: Guest, command: str, *, timeout: float = 60) -> str:
    """Run `command` in the guest's serial shell; its output (the echoed line excluded)."""
    token = secrets.token_hex(4)
    line = f"{command}; echo CAPL-RC-{token}=$?\n".encode()
    answer = re.compile(rb"CAPL-RC-" + token.encode() + rb"=(\d+)")
    fd = os.open(guest.console_pty(), os.O_RDWR | os.O_NOCTTY)
    try:
        os.write(fd, b"\n" + line)
        seen, deadline, resend = b"", time.monotonic() + timeout, time.monotonic() + 15
        while not answer.search(seen):
            left = deadline - time.monotonic()
            assert left > 0, f"no answer to {command!r} from the guest; got {seen[-600:]!r}"
            if time.monotonic() > resend:  # the shell was not there yet (a guest booting)
                os.write(fd, b"\n" + line)
                resend = time.monotonic() + 15
            if select.select([fd], [], [], min(left, 1.0))[0]:
                seen += os.read(fd, 65536)
        found = answer.search(seen)
        assert found is not None
        assert found.group(1) == b"0", seen[-600:]
        text = seen[: found.start()].decode(errors="replace")
        return text.rsplit(f"CAPL-RC-{token}=$?", 1)[-1]
    finally:
        os.close(fd)


async def capl(*args: str) -> tuple[int | None, str, str]:
    proc = await asyncio.create_subprocess_exec(
        CAPL,
        *args,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), CLI_TIMEOUT)
    return proc.returncode, out.decode(), err.decode()


@dataclass(frozen=True)
class Cli:
    """`capl` against the test's namespace and API server, and the machines it acts on."""

    api_client: client.ApiClient
    namespace: str
    kubeconfig: Path

    @property
    def args(self) -> list[str]:
        return ["-n", self.namespace, "--kubeconfig", str(self.kubeconfig)]

    async def ok(self, *command: str) -> str:
        """`capl COMMAND...` must succeed; its stdout."""
        code, out, err = await capl(*command, *self.args)
        assert code == 0, err
        return out

    async def refused(self, code: int, *command: str, says: str) -> None:
        """`capl COMMAND...` must exit with `code`, saying `says` and no traceback."""
        got, _, err = await capl(*command, *self.args)
        assert got == code, err
        assert says in err, err
        assert "Traceback" not in err, err

    async def local_machine(self, machine: str, guest: Guest) -> None:
        """A LibvirtMachine `machine` on qemu:///system pointing at `guest`."""
        await create_objects(
            self.api_client,
            self.namespace,
            uri="qemu:///system",
            domain_uuid=guest.uuid,
            machine=machine,
            network=guest.bed.name,
        )

    async def ssh_machine(self, machine: str, guest: Guest, server: SshServer) -> None:
        """A LibvirtMachine `machine` pointing at `guest` through `server`'s qemu+ssh:// URI
        (host ``remote``), with a credentials Secret (the key and pinned host key)."""
        secret = {k: base64.b64encode(v).decode() for k, v in server.credentials().items()}
        await client.CoreV1Api(self.api_client).create_namespaced_secret(
            self.namespace,
            client.V1Secret(metadata=client.V1ObjectMeta(name=f"{machine}-ssh"), data=secret),
        )
        await create_objects(
            self.api_client,
            self.namespace,
            uri=server.uri(),
            domain_uuid=guest.uuid,
            machine=machine,
            network=guest.bed.name,
            host="remote",
            credentials=f"{machine}-ssh",
        )


@pytest.fixture
def cli(api_client: client.ApiClient, namespace: str, kubeconfig: Path) -> Cli:
    return Cli(api_client, namespace, kubeconfig)


def _vnc_session(guest: Guest, cli: Cli, *, machine: str, host: str) -> float:
    """`capl vnc` on `machine` (pointing at `guest`): the display of this guest's QEMU."""
    return vnc_session(
        machine, *cli.args, namespace=cli.namespace, uuid=guest.uuid, host=host, desktop=guest.name
    )


async def test_vnc_serves_the_guest_display_on_a_loopback_port(vnc_guest: Guest, cli: Cli) -> None:
    await cli.local_machine("vnc-0", vnc_guest)
    graphics = ET.fromstring(vnc_guest.domain.XMLDesc(0)).find("./devices/graphics")
    assert graphics is not None
    assert graphics.get("port") is None, "a TCP port was opened"
    assert [listen.get("type") for listen in graphics.findall("listen")] == ["socket"]

    seconds = await asyncio.to_thread(_vnc_session, vnc_guest, cli, machine="vnc-0", host="local")
    record_timing("capl vnc: start to ServerInit", seconds)


@pytest.fixture(scope="module")
def strict_sshd() -> Iterator[SshServer]:
    """A private sshd on loopback that allows no forwarding at all."""
    with running_sshd(forwarding=False, name="sshd-strict") as server:
        yield server


async def test_vnc_through_ssh_to_a_remote_host(
    vnc_guest: Guest, ssh_server: SshServer, strict_sshd: SshServer, cli: Cli
) -> None:
    """`capl vnc` on a qemu+ssh:// host: ``ssh -L`` to the display's unix socket, through an
    sshd with the test beds' policy (capl.testbed.sshd: local forwards)."""
    await cli.ssh_machine("vnc-ssh", vnc_guest, ssh_server)
    seconds = await asyncio.to_thread(
        _vnc_session, vnc_guest, cli, machine="vnc-ssh", host="remote"
    )
    record_timing("capl vnc over qemu+ssh: start to ServerInit", seconds)

    # an sshd that allows no forwarding: refused with the cause, nothing left running
    await cli.ssh_machine("vnc-strict", vnc_guest, strict_sshd)
    await cli.refused(
        1,
        "vnc",
        "vnc-strict",
        says="did not forward to the VNC display's socket (sshd must allow forwarding",
    )


async def test_vnc_bad_input(shared_test_driver: str, cli: Cli) -> None:
    # a running domain without a VNC display, on libvirtd's shared test driver
    conn = libvirt.open(shared_test_driver)
    plain = str(uuidlib.uuid4())
    domain = conn.defineXML(
        f"<domain type='test'><name>capl-test-novnc-{secrets.token_hex(4)}</name>"
        f"<uuid>{plain}</uuid><memory unit='MiB'>64</memory><os><type>hvm</type></os></domain>"
    )
    domain.create()
    try:
        await create_objects(
            cli.api_client,
            cli.namespace,
            uri=shared_test_driver,
            domain_uuid=plain,
            machine="plain-0",
        )
        await cli.refused(
            1,
            "vnc",
            "plain-0",
            says=f"the domain of {cli.namespace}/plain-0 has no VNC display (set spec.vnc: true",
        )
    finally:
        domain.destroy()
        domain.undefine()
        conn.close()
    await cli.refused(3, "vnc", "nope-0", says="nope-0")
    await cli.refused(
        2,
        "vnc",
        "plain-0",
        "--address",
        "0.0.0.0",
        says="--address 0.0.0.0 is not a loopback address",
    )


def _disk_marker(guest: Guest) -> str:
    """What the last sectors of the guest's disk hold (read past the page cache)."""
    out = shell(
        guest,
        f"{LAST_SECTORS}; echo 3 > /proc/sys/vm/drop_caches; "
        "dd if=/dev/vda bs=512 skip=$S count=1 2>/dev/null | tr -dc 'A-Za-z0-9-' | head -c 40; "
        "echo; cat /root/after 2>/dev/null; echo END",
    )
    return out


def _write_after(guest: Guest, token: str) -> None:
    shell(
        guest,
        f"{LAST_SECTORS}; echo CAPL-MARK-{token} | dd of=/dev/vda bs=512 seek=$S conv=notrunc "
        f"2>/dev/null; sync; echo AFTER-{token} > /root/after",
    )
    seen = _disk_marker(guest)
    assert f"CAPL-MARK-{token}" in seen, seen
    assert f"AFTER-{token}" in seen, seen


async def test_snapshot_revert_discards_what_was_written_after_it(
    vnc_guest: Guest, cli: Cli
) -> None:
    """The operator's path: `capl snapshot create --memory`, list, revert, delete."""
    await cli.local_machine("snap-0", vnc_guest)
    namespace = cli.namespace

    t0 = time.monotonic()
    await cli.ok("snapshot", "create", "snap-0", "live", "--memory")
    record_timing(f"capl snapshot create --memory ({GUEST_MIB} MiB guest)", time.monotonic() - t0)
    token = secrets.token_hex(4)
    await asyncio.to_thread(_write_after, vnc_guest, token)
    rows = [line.split() for line in (await cli.ok("snapshot", "list", "snap-0")).splitlines()]
    assert rows[0] == ["NAME", "KIND", "CREATED", "STATE", "PARENT", "CURRENT"]
    assert [(r[0], r[1], r[3], r[4], r[5]) for r in rows[1:]] == [
        ("live", "memory", "running", "-", "*")
    ]

    t0 = time.monotonic()
    out = await cli.ok("snapshot", "revert", "snap-0", "live")
    record_timing("capl snapshot revert (memory)", time.monotonic() - t0)
    assert out.strip() == f"{namespace}/snap-0 reverted to snapshot live"
    # the guest resumed from the saved RAM (no boot): the file and the disk marker are gone
    assert vnc_guest.state() == (libvirt.VIR_DOMAIN_RUNNING, libvirt.VIR_DOMAIN_RUNNING_RESTORED)
    seen = await asyncio.to_thread(_disk_marker, vnc_guest)
    assert token not in seen, seen

    out = await cli.ok("snapshot", "delete", "snap-0", "live")
    assert out.strip() == f"snapshot live of {namespace}/snap-0 merged and deleted"
    _assert_back_on_its_own_disk(vnc_guest)


async def test_snapshot_guard_keeps_a_change_that_works_and_reverts_one_that_fails(
    vnc_guest: Guest, host: LibvirtHost
) -> None:
    """The library path of the day-2 change (disk-only snapshots)."""
    snapshots = LibvirtSnapshots(host)
    kept = secrets.token_hex(4)
    async with snapshot_guard(snapshots, vnc_guest.uuid, name="change-ok") as info:
        assert info.kind is SnapshotKind.DISK
        await asyncio.to_thread(_write_after, vnc_guest, kept)
    assert await snapshots.list_snapshots(vnc_guest.uuid) == []
    _assert_back_on_its_own_disk(vnc_guest)
    assert f"CAPL-MARK-{kept}" in await asyncio.to_thread(_disk_marker, vnc_guest)

    lost = secrets.token_hex(4)

    async def failing_change() -> None:
        async with snapshot_guard(snapshots, vnc_guest.uuid, name="change-bad"):
            await asyncio.to_thread(_write_after, vnc_guest, lost)
            raise RuntimeError("the change failed")

    with pytest.raises(RuntimeError, match="the change failed"):
        await failing_change()
    # reverted (the domain was stopped and booted again from the disk as it was), then the
    # snapshot merged away: the disk holds the marker of the kept change, not the lost one
    assert vnc_guest.state() == (libvirt.VIR_DOMAIN_RUNNING, libvirt.VIR_DOMAIN_RUNNING_BOOTED)
    assert await snapshots.list_snapshots(vnc_guest.uuid) == []
    disk = _assert_back_on_its_own_disk(vnc_guest)
    tail = await asyncio.to_thread(_host_read_last_sectors, disk)
    assert f"CAPL-MARK-{kept}".encode() in tail
    assert f"CAPL-MARK-{lost}".encode() not in tail


def _assert_back_on_its_own_disk(guest: Guest) -> str:
    """The domain's disk is its own overlay again and no snapshot file is left; its path."""
    source = ET.fromstring(guest.domain.XMLDesc(0)).find("./devices/disk/source")
    assert source is not None
    path = str(source.get("file"))
    assert path.endswith("-vnc-root.qcow2"), path
    assert guest.bed.pool is not None
    guest.bed.pool.refresh(0)
    left = [v for v in guest.bed.pool.listVolumes() if "-snap-" in v]
    assert left == [], left
    return path


def _host_read_last_sectors(disk: str) -> bytes:
    """The disk's last 4 KiB as the guest sees them, read on the host (shared, read-only)."""
    size = int.from_bytes(Path(disk).read_bytes()[24:32], "big")  # qcow2 virtual size
    out = subprocess.run(
        ["qemu-io", "-U", "-r", "-f", "qcow2", disk, "-c", f"read -v {size - 4096} 4096"],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    hex_bytes = [
        m.group(1) for m in re.finditer(r"^[0-9a-f]{8}:((?:\s+[0-9a-f]{2}){1,16})", out, re.M)
    ]
    return bytes.fromhex("".join(h.replace(" ", "") for h in hex_bytes))


async def test_snapshot_bad_input(vnc_guest: Guest, cli: Cli) -> None:
    await cli.local_machine("snap-1", vnc_guest)
    await cli.refused(3, "snapshot", "create", "ghost-0", "s1", says="ghost-0")
    await cli.refused(
        3,
        "snapshot",
        "revert",
        "snap-1",
        "never-taken",
        says="has no snapshot 'never-taken' (it has: none)",
    )
    await cli.refused(
        2, "snapshot", "create", "snap-1", "../etc", says="snapshot name '../etc' is invalid"
    )
    state, _ = vnc_guest.state()
    assert state == libvirt.VIR_DOMAIN_RUNNING  # nothing was stopped by the refusals
