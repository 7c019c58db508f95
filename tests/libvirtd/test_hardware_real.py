"""Machine hardware on the real libvirtd with the TCG test guest (one guest, BIOS): an
emulated TPM 2.0 (swtpm, started by libvirt) and a CPU topology, both as the guest's Linux
sees them — /sys/class/tpm/tpm0 reports major version 2, and the two vCPUs are two cores of
one socket (libvirt's default for 2 vCPUs would be two sockets). UEFI secure boot is shown
by tests/firmware (OVMF under TCG is too slow for make test; `make test-firmware`)."""

from __future__ import annotations

import asyncio
import os
import select
import time
import uuid
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from capl.ports.naming import machine_mac, machine_names
from capl.ports.virt import CpuSpec, DiskSpec, DomainHardware, DomainSpec, ImageFromPath, NicSpec
from tests.fixtures.guest import wait_for_marker
from tests.fixtures.libvirt import record_timing
from tests.libvirtd.test_virt_real_domains import (  # noqa: F401 - fixtures
    MIB,
    Bed,
    _machine,
    bed,
    bed_names,
    guest_base,
)

pytestmark = [pytest.mark.libvirtd, pytest.mark.guest]


def _ask(pty: str, command: str, *, timeout: float = 60) -> str:
    """Run `command` in the guest's serial shell; its output line after the `HW-42` tag."""
    fd = os.open(pty, os.O_RDWR | os.O_NOCTTY)
    try:
        os.write(fd, f"\necho HW-$((6*7)) {command}\n".encode())
        seen = b""
        deadline = time.monotonic() + timeout
        while b"HW-42 " not in seen or not seen.split(b"HW-42 ", 1)[1].count(b"\n"):
            left = deadline - time.monotonic()
            assert left > 0, f"no answer on the console; got {seen[-300:]!r}"
            ready, _, _ = select.select([fd], [], [], min(left, 1.0))
            if ready:
                seen += os.read(fd, 4096)
        return seen.split(b"HW-42 ", 1)[1].split(b"\n", 1)[0].decode().strip()
    finally:
        os.close(fd)


async def test_guest_sees_the_tpm_and_the_cpu_topology(
    bed: Bed,  # noqa: F811
    bed_names: dict[str, list[str]],  # noqa: F811
    guest_base: Path,  # noqa: F811
) -> None:
    started = time.monotonic()
    owner, domain_name = _machine(bed, bed_names)
    names = machine_names(namespace=owner.namespace, name=owner.name)
    base = await bed.host.ensure_base_image(
        pool=bed.pool, name="capl-base-guest", source=ImageFromPath(path=str(guest_base))
    )
    root = await bed.host.create_overlay(
        pool=bed.pool, name=names.root_volume, backing=base, capacity_bytes=64 * MIB
    )
    mac = machine_mac(cluster=bed.cluster, namespace=owner.namespace, name=owner.name)
    await bed.host.ensure_dhcp_host(network=bed.network, mac=mac, name=owner.name)
    spec = DomainSpec(
        name=domain_name,
        uuid=str(uuid.uuid4()),
        owner=owner,
        vcpus=2,
        memory_mib=256,
        domain_type="qemu",
        disks=(DiskSpec(path=root.path),),
        nics=(NicSpec(mac=mac, network=bed.network),),
        console_log=str(bed.pool_path / names.console_log),
        hardware=DomainHardware(cpu=CpuSpec(sockets=1, cores=2, threads=1), tpm=True),
    )
    await bed.host.define_domain(spec)
    await bed.host.start_domain(spec.uuid, owner=owner)
    log = bed.pool_path / names.console_log
    await asyncio.to_thread(wait_for_marker, log, "ready", timeout=600)
    record_timing("hardware guest (TPM, topology) to ready", time.monotonic() - started)
    conn = bed.host.connection
    live = await conn.run("read the live XML", lambda c: c.lookupByUUIDString(spec.uuid).XMLDesc(0))
    pty = ET.fromstring(live).find("devices/serial/source")
    assert pty is not None
    answer = await asyncio.to_thread(
        _ask,
        str(pty.get("path")),
        "$(cat /sys/class/tpm/tpm0/tpm_version_major)"
        " $(cat /sys/devices/system/cpu/cpu1/topology/physical_package_id)"
        " $(cat /sys/devices/system/cpu/cpu1/topology/core_id)",
    )
    assert answer.split() == ["2", "0", "1"], answer  # TPM 2.0; cpu1: socket 0, core 1
    await bed.host.destroy_domain(spec.uuid, owner=owner)
    assert await bed.host.undefine_domain(spec.uuid, owner=owner)
