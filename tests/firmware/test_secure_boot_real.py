"""UEFI secure boot on the real libvirtd (TCG), shown by the firmware's own log.

A machine with `secureBoot: true` (and a TPM) gets OVMF's secure-boot build with the
Microsoft keys enrolled (libvirt picks it from the firmware descriptors by the features
`secure-boot` and `enrolled-keys`). Its disk is a FAT file system whose removable-media
boot path (\\EFI\\BOOT\\BOOTX64.EFI) holds the test guest's kernel: an EFI program signed by
Debian's key only, which the enrolled keys do not trust. OVMF writes to the serial console
(logged by virtlogd) that loading it was denied — secure boot enforced — and the UEFI shell
is refused as well. The NVRAM copy goes with undefine.

Not in `make test`: OVMF with SMM under TCG takes tens of seconds to reach its boot
manager even on an idle machine; run with `make test-firmware`.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from capl.ports.naming import machine_names
from capl.ports.virt import DiskSpec, DomainHardware, DomainSpec, Firmware, VolumeFormat
from tests.fixtures.guest import wait_for
from tests.fixtures.libvirt import record_timing
from tests.libvirtd.test_virt_real_domains import (  # noqa: F401 - fixtures
    Bed,
    _machine,
    bed,
    bed_names,
)

pytestmark = [pytest.mark.libvirtd, pytest.mark.guest]

DENIED = re.compile(r"BdsDxe: failed to load Boot\d+ .*: Access Denied")


def _efi_disk(guest_image: Path) -> bytes:
    """A 20 MiB FAT image with the guest's kernel (an EFI-stub PE) as BOOTX64.EFI."""
    with tempfile.TemporaryDirectory() as tmp:
        raw, kernel, disk = Path(tmp, "guest.raw"), Path(tmp, "vmlinuz"), Path(tmp, "efi.img")
        run = {"check": True, "capture_output": True, "timeout": 120}
        subprocess.run(["qemu-img", "convert", "-O", "raw", str(guest_image), str(raw)], **run)
        subprocess.run(["mcopy", "-i", str(raw), "::/vmlinuz", str(kernel)], **run)
        subprocess.run(["mkfs.vfat", "-C", "-n", "CAPLSB", str(disk), "20480"], **run)
        subprocess.run(["mmd", "-i", str(disk), "::/EFI", "::/EFI/BOOT"], **run)
        subprocess.run(["mcopy", "-i", str(disk), str(kernel), "::/EFI/BOOT/BOOTX64.EFI"], **run)
        return disk.read_bytes()


async def test_secure_boot_refuses_an_untrusted_loader(
    bed: Bed,  # noqa: F811
    bed_names: dict[str, list[str]],  # noqa: F811
    guest_image: Path,
) -> None:
    info = await bed.host.info()
    if not info.uefi_supported:
        pytest.skip("no UEFI firmware on this host")
    started = time.monotonic()
    owner, domain_name = _machine(bed, bed_names)
    names = machine_names(namespace=owner.namespace, name=owner.name)
    data = await asyncio.to_thread(_efi_disk, guest_image)
    disk = await bed.host.upload_volume(pool=bed.pool, name=names.root_volume, data=data)
    spec = DomainSpec(
        name=domain_name,
        uuid=str(uuid.uuid4()),
        owner=owner,
        vcpus=1,
        memory_mib=256,
        domain_type="qemu",
        machine="q35",
        firmware=Firmware.UEFI,
        disks=(DiskSpec(path=disk.path, format=VolumeFormat.RAW),),
        console_log=str(bed.pool_path / names.console_log),
        hardware=DomainHardware(secure_boot=True, tpm=True),
    )
    await bed.host.define_domain(spec)
    await bed.host.start_domain(spec.uuid, owner=owner)
    live = await bed.host.connection.run(
        "read the live XML", lambda c: c.lookupByUUIDString(spec.uuid).XMLDesc(0)
    )
    assert re.search(r"<loader[^>]*secure='yes'[^>]*>/usr/share/OVMF/OVMF_CODE[^<]*\.ms\.fd<", live)
    log = bed.pool_path / names.console_log

    def denied() -> str | None:
        text = log.read_text(errors="replace") if log.exists() else ""
        found = DENIED.search(text)
        return found.group(0) if found else None

    line = await asyncio.to_thread(wait_for, denied, timeout=600, what="OVMF denying the loader")
    record_timing("secure boot: OVMF to the denied loader", time.monotonic() - started)
    assert "EFI Internal Shell" not in line
    await bed.host.destroy_domain(spec.uuid, owner=owner)
    assert await bed.host.undefine_domain(spec.uuid, owner=owner)
    nvram = Path(f"/var/lib/libvirt/qemu/nvram/{domain_name}_VARS.fd")
    assert not await asyncio.to_thread(nvram.exists)
