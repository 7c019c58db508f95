"""TPM and secure boot at placement, against the real libvirtd's domain capabilities (no
guest): the test bed installs swtpm and OVMF (hack/install-deps.sh), so the host offers an
emulated TPM 2.0 and secure boot — on q35, the machine type capl gives a secure-boot domain;
libvirt's default machine type (pc) offers no secure loader, which is why q35's capabilities
are the ones asked. The refusals when a host offers neither: tests/unit/virt/
test_host_security_caps.py."""

from __future__ import annotations

import libvirt
import pytest

from capl.virt.hardware import SECURE_BOOT_MACHINE, parse_secure_boot, parse_tpm_emulator
from capl.virt.host import LibvirtHost

pytestmark = pytest.mark.libvirtd


async def test_the_host_offers_tpm_and_secure_boot_on_q35(
    host: LibvirtHost, libvirtd_conn: libvirt.virConnect
) -> None:
    hardware = await host.hardware()
    assert hardware.tpm_emulator is True
    assert hardware.secure_boot is True
    default = libvirtd_conn.getDomainCapabilities(None, "x86_64", None, None, 0)
    q35 = libvirtd_conn.getDomainCapabilities(None, "x86_64", SECURE_BOOT_MACHINE, None, 0)
    assert parse_tpm_emulator(default)
    assert not parse_secure_boot(default)  # pc: no SMM, no secure loader
    assert parse_secure_boot(q35)
