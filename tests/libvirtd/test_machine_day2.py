"""Day-2 changes of a running LibvirtMachine on the real libvirtd with the test guest (TCG):
one machine (one guest boot) goes through every change in turn, and the guest itself is
asked what it sees, on its serial console's shell (hack/guest/inittab):

- the root disk grown 1 -> 2 GiB (QEMU's block resize: /sys/block/vda/size), an extra disk
  hot-plugged (/sys/block/vdb, its serial the disk's name), a NIC hot-plugged (eth1), one
  vCPU hot-plugged up to maxCPUs (cpu1 present; onlined by the guest), memory raised within
  maxMemoryMiB (the balloon deflated: the guest's MemTotal grows by the difference; the
  test guest loads virtio_balloon, hack/guest/modules.boot);
- admission: a shrinking rootVolume.sizeGiB and cpus above maxCPUs are refused by the API
  server naming the field, and nothing changes;
- the disk and NIC removed again (unplugged live, the volume deleted);
- every change made under a disk-only snapshot, as the manager does
  (capl.controllers.machine.day2_snapshot): merged away after it worked (no snapshot, no
  overlay, the grown size carried down to the root volume); a change that fails partway
  (root disk grown and a disk hot-plugged, then a NIC on a network that does not exist) is
  reverted: the guest is restarted from its disk as it was (its size, a marker written after
  the snapshot gone), the hot-plugged disk's volume deleted, HardwareUpdated
  False/HardwareReverted with a Warning event; the growth alone then works; a change left
  unfinished (its snapshot and a growth made by hand, as a manager dying mid-change leaves
  them) is finished by the next reconcile (merged, the growth kept);
- the reboot path: cpus above the maximum the running QEMU was started with wait for the
  next power cycle (HardwareUpdated False/RestartRequired); the domain destroyed (a power
  cycle), the controller starts it again with the vCPUs and the condition turns True;
- the machine deleted with nothing left (a change's snapshot left on it included).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import re
import secrets
import select
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import libvirt
import pytest

from capl.api import constants as c
from capl.controllers.machine.day2_snapshot import DAY2_SNAPSHOT
from capl.ports.virt import Host
from capl.ports.virt.snapshots import SnapshotInfo
from capl.runtime.errors import ApiError
from capl.runtime.resources import LIBVIRT_MACHINE
from capl.testing.harness import ControllerHarness
from capl.testing.objects import condition_of
from capl.virt.snapshot import snapshots_of
from tests.controllers.conftest import events_of, harness, leftovers
from tests.fixtures.libvirt import record_timing
from tests.libvirtd.test_machine_real import SETUP, URI, guest_spec

__all__ = ["harness"]  # fixtures used by this module

pytestmark = [pytest.mark.apiserver, pytest.mark.libvirtd, pytest.mark.guest]

BOOT_TIMEOUT = 300.0  # TCG on two shared cores, under load
GIB = 1024**3


class _AfterSnapshot:
    """The real `LibvirtSnapshots` of a host; once a snapshot is taken, the armed step runs
    (once): the test writes into the guest there, after the snapshot and before the change
    fails (a real change gives no time for that in between)."""

    armed: list[Callable[[], Awaitable[None]]] = []

    def __init__(self, host: Host) -> None:
        self._real = snapshots_of(host)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    async def create_snapshot(self, uuid: str, name: str, **kwargs: Any) -> SnapshotInfo:
        info = await self._real.create_snapshot(uuid, name, **kwargs)
        while self.armed:
            await self.armed.pop()()
        return info


@pytest.fixture
async def real(harness: ControllerHarness, libvirtd_uri: str) -> ControllerHarness:
    # the manager's snapshots (as the harness has them), with the test's hook
    harness.deps = dataclasses.replace(harness.deps, snapshots=_AfterSnapshot)
    await harness.start(SETUP)
    return harness


def _console(domain: libvirt.virDomain, command: str, *, timeout: float = 10.0) -> str | None:
    """Run `command` in the guest's console shell; its output (words joined by spaces), or
    None when no answer came within `timeout` (the shell is not up yet)."""
    root = ElementTree.fromstring(domain.XMLDesc(0))
    source = root.find("./devices/serial[@type='pty']/source")
    assert source is not None, "no serial console"
    assert source.get("path"), "no serial pty"
    tag = "T" + secrets.token_hex(3)
    # the shell computes the markers: the echoed command line never matches
    line = f"echo {tag}$((1+1)) $({command}) {tag}$((1+2))"
    pattern = re.compile(rf"{tag}2 (.*?) ?{tag}3")
    fd = os.open(str(source.get("path")), os.O_RDWR | os.O_NOCTTY)
    try:
        os.write(fd, b"\n" + line.encode() + b"\n")
        seen = b""
        deadline = time.monotonic() + timeout
        while True:
            found = pattern.search(seen.decode("utf-8", "replace"))
            if found:
                return found.group(1).strip()
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], min(left, 1.0))
            if ready:
                seen += os.read(fd, 4096)
    finally:
        os.close(fd)


async def _guest_sees(
    domain: libvirt.virDomain, command: str, expect: Any, *, within: float = 60.0
) -> str:
    """Ask the guest until `expect(answer)` holds (a hot-plug reaches the guest a little
    after libvirt returns)."""
    deadline = time.monotonic() + within
    while True:
        answer = await asyncio.to_thread(_console, domain, command)
        if answer is not None and expect(answer):
            return answer
        assert time.monotonic() < deadline, f"guest: {command!r} -> {answer!r}"
        await asyncio.sleep(0.5)


async def _eventually(check: Callable[[], bool], what: str, within: float = 60.0) -> None:
    deadline = time.monotonic() + within
    while not await asyncio.to_thread(check):
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.5)


def _hardware_updated(generation: int | None = None, status: str = "True") -> Any:
    def check(obj: dict[str, Any]) -> bool:
        cond = condition_of(obj, c.ConditionType.HARDWARE_UPDATED)
        wanted = generation or obj["metadata"]["generation"]
        return bool(
            cond.get("status") == status
            and cond.get("observedGeneration") == wanted
            and (obj.get("status") or {}).get("observedGeneration") == wanted
        )

    return check


async def _change(h: ControllerHarness, name: str, spec: dict[str, Any], **wait: Any) -> Any:
    changed = await h.patch(LIBVIRT_MACHINE, name, {"spec": spec})
    generation = changed["metadata"]["generation"]
    return await h.wait_for(
        LIBVIRT_MACHINE,
        name,
        _hardware_updated(generation, **wait),
        within=90,
        what=f"HardwareUpdated after {spec}",
    )


def _assert_no_snapshot(
    dom: libvirt.virDomain, pool: libvirt.virStoragePool, root_gib: int
) -> None:
    """No snapshot, no overlay: the root disk is the root volume, of `root_gib` GiB."""
    assert dom.listAllSnapshots(0) == []
    pool.refresh(0)
    assert [v.name() for v in pool.listAllVolumes(0) if "-snap-" in v.name()] == []
    source = ElementTree.fromstring(dom.XMLDesc(0)).find("./devices/disk/source")
    assert source is not None
    root = pool.storageVolLookupByName(str(source.get("file")).rsplit("/", 1)[-1])
    assert root.name().endswith("-root.qcow2"), root.name()
    assert root.info()[1] == root_gib * GIB  # the merge carried the grown size down


MEM_TOTAL = "grep MemTotal /proc/meminfo | tr -dc 0-9"  # KiB
MARK_SECTOR = 2 * GIB // 512 - 8  # the last 4 KiB of the 2 GiB root disk: unused by FAT
READ_MARK = (
    f"echo 3 > /proc/sys/vm/drop_caches; dd if=/dev/vda bs=512 skip={MARK_SECTOR} count=1"
    " 2>/dev/null | tr -dc 'A-Za-z0-9-' | head -c 40"
)


async def _failed_change_is_reverted(
    h: ControllerHarness, name: str, dom: libvirt.virDomain, pool: libvirt.virStoragePool
) -> None:
    """A change that fails partway (the disk grown and a disk hot-plugged, then libvirt
    refuses a NIC on a network that does not exist) is reverted to the snapshot taken
    before it; the same growth without the bad NIC then works."""
    before = await _guest_sees(dom, READ_MARK, lambda a: "CAPL-MARK" not in a)
    token = "CAPL-MARK-" + secrets.token_hex(4)

    async def write_after_snapshot() -> None:
        write = f"echo {token} | dd of=/dev/vda bs=512 seek={MARK_SECTOR} conv=fsync; sync"
        await _guest_sees(dom, f"{write}; {READ_MARK}", lambda a: token in a, within=30)

    _AfterSnapshot.armed.append(write_after_snapshot)
    started = time.monotonic()
    bad = {
        "rootVolume": {"sizeGiB": 3},
        "extraDisks": [{"name": "scratch", "sizeGiB": 1}],
        "networkInterfaces": [{}, {"network": "capl-day2-no-such-network"}],
    }
    obj = await _change(h, name, bad, status="False")
    assert not _AfterSnapshot.armed, "the change was made without a snapshot"
    cond = condition_of(obj, c.ConditionType.HARDWARE_UPDATED)
    assert cond["reason"] == c.Reason.HARDWARE_REVERTED, cond
    assert "capl-day2-no-such-network" in cond["message"], cond
    events = await events_of(h, name)
    assert any(r == c.Reason.HARDWARE_REVERTED and t == "Warning" for t, r, _m in events)
    # the guest was restarted from its disk as it was: 2 GiB, without what was written
    await _guest_sees(dom, "cat /sys/block/vda/size", lambda a: a == str(2 * GIB // 512))
    assert await _guest_sees(dom, READ_MARK, lambda a: token not in a) == before
    await _guest_sees(dom, "ls /sys/block", lambda a: "vdb" not in a.split())
    config = ElementTree.fromstring(dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))
    assert len(config.findall("./devices/interface")) == 1  # the definition as it was
    assert config.findall("./devices/disk/serial") == []
    _assert_no_snapshot(dom, pool, root_gib=2)
    assert not [v for v in pool.listAllVolumes(0) if "-disk-scratch" in v.name()]
    record_timing("day-2 failed change reverted (guest restarted)", time.monotonic() - started)

    # not retried for this generation (a retry would restart the guest again)
    assert (
        condition_of(await h.get(LIBVIRT_MACHINE, name), c.ConditionType.HARDWARE_UPDATED)["reason"]
        == c.Reason.HARDWARE_REVERTED
    )

    started = time.monotonic()
    await _change(
        h, name, {"rootVolume": {"sizeGiB": 3}, "extraDisks": None, "networkInterfaces": None}
    )
    await _guest_sees(dom, "cat /sys/block/vda/size", lambda a: a == str(3 * GIB // 512))
    _assert_no_snapshot(dom, pool, root_gib=3)
    record_timing("day-2 change after a revert applied", time.monotonic() - started)


async def _interrupted_change_is_finished(
    h: ControllerHarness, name: str, dom: libvirt.virDomain, pool: libvirt.virStoragePool
) -> None:
    """A change the manager did not finish (its snapshot taken and the disk grown on the
    overlay, then the process gone: done here by hand) is finished by the next reconcile
    of the machine: the snapshot merged, the growth kept and carried down to the volume."""
    started = time.monotonic()
    await snapshots_of(h.hosts.get(uri=URI)).create_snapshot(dom.UUIDString(), DAY2_SNAPSHOT)
    await asyncio.to_thread(dom.blockResize, "vda", 4 * GIB, libvirt.VIR_DOMAIN_BLOCK_RESIZE_BYTES)
    await _change(h, name, {"rootVolume": {"sizeGiB": 4}})
    _assert_no_snapshot(dom, pool, root_gib=4)
    await _guest_sees(dom, "cat /sys/block/vda/size", lambda a: a == str(4 * GIB // 512))
    record_timing("day-2 interrupted change finished", time.monotonic() - started)


def _refused(exc: pytest.ExceptionInfo[ApiError], field: str) -> None:
    assert exc.value.code == 422, exc.value
    assert field in str(exc.value), exc.value


async def test_day2_changes_reach_the_running_guest(
    real: ControllerHarness, guest_image: Path, libvirtd_conn: libvirt.virConnect
) -> None:
    h = real
    cluster = await h.make_cluster(
        hosts=[{"name": "kvm1", "uri": URI}], dns_domain="day2.example", base_image=False
    )
    network = str(cluster.layout_model().spec.network.name)  # type: ignore[union-attr]
    spec = guest_spec(guest_image, maxCPUs=2, maxMemoryMiB=384, rootVolume={"sizeGiB": 1})
    m = await h.make_machine(cluster, "day2-node", spec=spec)
    begin = time.monotonic()
    obj = await h.wait_ready(m.name, within=BOOT_TIMEOUT)
    record_timing("day-2 machine create to Ready (TCG)", time.monotonic() - begin)
    dom = libvirtd_conn.lookupByUUIDString(obj["spec"]["domainUUID"])
    assert condition_of(obj, c.ConditionType.HARDWARE_UPDATED) == {}  # nothing changed yet
    await _guest_sees(dom, "cat /sys/devices/system/cpu/present", lambda a: a == "0")
    await _guest_sees(dom, "cat /sys/block/vda/size", lambda a: a == str(GIB // 512))
    # the balloon holds back maxMemoryMiB - memoryMiB = 128 MiB (inflated once the driver
    # loads; libvirt's actual balloon size says when it is done)
    await _eventually(lambda: dom.info()[2] == 256 * 1024, "the balloon inflated to 256 MiB")
    mem_total = int(await _guest_sees(dom, MEM_TOTAL, lambda a: 0 < int(a or 0) < 256 * 1024))

    # grow the root disk, add a disk and a NIC, one more vCPU, more memory: all live
    started = time.monotonic()
    await _change(
        h,
        m.name,
        {
            "rootVolume": {"sizeGiB": 2},
            "extraDisks": [{"name": "data", "sizeGiB": 1}],
            "networkInterfaces": [{}, {"network": network}],
            "cpus": 2,
            "memoryMiB": 320,
        },
    )
    record_timing("day-2 change applied (condition True)", time.monotonic() - started)
    await _guest_sees(dom, "cat /sys/block/vda/size", lambda a: a == str(2 * GIB // 512))
    await _guest_sees(
        dom, "cat /sys/block/vdb/size /sys/block/vdb/serial", lambda a: a == f"{GIB // 512} data"
    )
    await _guest_sees(dom, "ls /sys/class/net", lambda a: a.split() == ["eth0", "eth1", "lo"])
    await _guest_sees(dom, "cat /sys/devices/system/cpu/present", lambda a: a == "0-1")
    online = "echo 1 > /sys/devices/system/cpu/cpu1/online; cat /sys/devices/system/cpu/online"
    await _guest_sees(dom, online, lambda a: a == "0-1")
    # memory 256 -> 320 MiB: the balloon gives the guest 64 MiB back, live
    await _guest_sees(dom, MEM_TOTAL, lambda a: abs(int(a or 0) - mem_total - 64 * 1024) < 1024)
    record_timing("day-2 change seen by the guest", time.monotonic() - started)
    pool_name = cluster.layout_model().spec.storage_pool.name  # type: ignore[union-attr]
    pool = libvirtd_conn.storagePoolLookupByName(str(pool_name))
    # made under a snapshot, merged away: the domain on its own volume, grown to 2 GiB
    _assert_no_snapshot(dom, pool, root_gib=2)
    assert dom.info()[2] == 320 * 1024  # the balloon's actual size (KiB)
    config = ElementTree.fromstring(dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))
    assert config.findtext("currentMemory") == str(320 * 1024)
    assert config.findtext("memory") == str(384 * 1024)
    assert config.find("vcpu").get("current") in (None, "2")  # type: ignore[union-attr]
    assert len(config.findall("./devices/interface")) == 2  # persistent as well
    assert [s.text for s in config.findall("./devices/disk/serial")] == ["data"]

    # admission: no shrinking, nothing above the declared maximum
    with pytest.raises(ApiError) as shrink:
        await h.patch(LIBVIRT_MACHINE, m.name, {"spec": {"rootVolume": {"sizeGiB": 1}}})
    _refused(shrink, "rootVolume.sizeGiB")
    with pytest.raises(ApiError) as shrink_extra:
        await h.patch(
            LIBVIRT_MACHINE, m.name, {"spec": {"extraDisks": [{"name": "data", "sizeGiB": 0}]}}
        )
    assert shrink_extra.value.code == 422
    with pytest.raises(ApiError) as above:
        await h.patch(LIBVIRT_MACHINE, m.name, {"spec": {"cpus": 3}})
    _refused(above, "cpus")

    # remove the disk and the NIC again: unplugged live, the volume deleted
    started = time.monotonic()
    await _change(h, m.name, {"extraDisks": None, "networkInterfaces": None})
    await _guest_sees(dom, "ls /sys/block", lambda a: "vdb" not in a.split())
    await _guest_sees(dom, "ls /sys/class/net", lambda a: a.split() == ["eth0", "lo"])
    pool.refresh(0)
    assert not [v for v in pool.listAllVolumes(0) if "-disk-data" in v.name()]
    record_timing("day-2 removal seen by the guest", time.monotonic() - started)

    await _failed_change_is_reverted(h, m.name, dom, pool)
    await _interrupted_change_is_finished(h, m.name, dom, pool)

    # above what the running QEMU was started with: at the next power cycle, said so
    started = time.monotonic()
    obj = await _change(h, m.name, {"cpus": 3, "maxCPUs": 3}, status="False")
    cond = condition_of(obj, c.ConditionType.HARDWARE_UPDATED)
    assert cond["reason"] == c.Reason.RESTART_REQUIRED, cond
    assert "cpus=3" in cond["message"], cond
    await asyncio.to_thread(dom.destroy)  # the power cycle (the controller starts it again)
    await h.wait_for(
        LIBVIRT_MACHINE,
        m.name,
        lambda o: condition_of(o, c.ConditionType.HARDWARE_UPDATED).get("status") == "True",
        within=BOOT_TIMEOUT,
        what="HardwareUpdated True after the power cycle",
    )
    # the new QEMU process has the three vCPUs (what the guest makes of them after its boot
    # is the same as at any boot: not waited for here, it would cost a second TCG boot)
    assert ElementTree.fromstring(dom.XMLDesc(0)).findtext("vcpu") == "3"
    record_timing("day-2 power cycle path", time.monotonic() - started)

    # deleted while a change's snapshot is there (as if the manager died mid-change): the
    # overlay goes with the machine's volumes, the snapshot metadata with the domain
    await snapshots_of(h.hosts.get(uri=URI)).create_snapshot(dom.UUIDString(), DAY2_SNAPSHOT)
    await h.delete_machine(m.name, within=90)
    assert await leftovers(h, cluster, m.name, uri=URI) == []
