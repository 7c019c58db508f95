"""TPM and secure boot at placement: what the host's domain capabilities say
(capl.virt.hardware.parse_tpm_emulator / parse_secure_boot) and the refusal naming why
(capl.controllers.machine.plan_hardware). The documents are shaped as libvirt 9.0 writes
them; the real libvirtd's are read in tests/libvirtd/test_hardware_caps.py."""

from __future__ import annotations

import pytest

from capl.controllers.machine.plan_hardware import refusal
from capl.ports.virt import DomainHardware, HostHardware
from capl.virt.hardware import parse_secure_boot, parse_tpm_emulator


def _domcaps(*, tpm: str = "", secure: tuple[str, ...] = ("no",), firmware: str = "efi") -> str:
    values = "".join(f"<value>{v}</value>" for v in secure)
    return f"""<domainCapabilities><machine>pc-q35-7.2</machine>
      <os supported='yes'>
        <enum name='firmware'><value>{firmware}</value></enum>
        <loader supported='yes'><value>/usr/share/OVMF/OVMF_CODE_4M.fd</value>
          <enum name='type'><value>rom</value><value>pflash</value></enum>
          <enum name='secure'>{values}</enum>
        </loader>
      </os>
      <devices>{tpm}</devices>
    </domainCapabilities>"""


TPM_FULL = """<tpm supported='yes'>
  <enum name='model'><value>tpm-tis</value><value>tpm-crb</value></enum>
  <enum name='backendModel'><value>passthrough</value><value>emulator</value></enum>
  <enum name='backendVersion'><value>1.2</value><value>2.0</value></enum>
</tpm>"""


@pytest.mark.parametrize(
    ("tpm", "offered"),
    [
        (TPM_FULL, True),
        (TPM_FULL.replace("<value>emulator</value>", ""), False),  # no swtpm found
        (TPM_FULL.replace("<value>2.0</value>", ""), False),  # TPM 1.2 only
        (TPM_FULL.replace("<value>tpm-crb</value>", ""), False),
        (TPM_FULL.replace("<enum name='backendVersion'>", "<enum name='other'>"), True),
        (TPM_FULL.replace("supported='yes'", "supported='no'"), False),
        ("", False),
    ],
)
def test_tpm_emulator_from_domain_capabilities(tpm: str, offered: bool) -> None:
    assert parse_tpm_emulator(_domcaps(tpm=tpm)) is offered


@pytest.mark.parametrize(
    ("secure", "firmware", "offered"),
    [
        (("yes", "no"), "efi", True),
        (("no",), "efi", False),  # e.g. the pc machine type: no SMM
        (("yes",), "bios", False),
        ((), "efi", False),
    ],
)
def test_secure_boot_from_domain_capabilities(
    secure: tuple[str, ...], firmware: str, offered: bool
) -> None:
    assert parse_secure_boot(_domcaps(secure=secure, firmware=firmware)) is offered


def test_placement_refuses_a_host_without_tpm_or_secure_boot_naming_why() -> None:
    tpm = DomainHardware(tpm=True)
    secure = DomainHardware(secure_boot=True)
    assert tpm.wants_host_check
    assert secure.wants_host_check
    without = HostHardware(tpm_emulator=False, secure_boot=False)
    problem = refusal(tpm, memory_mib=256, host=without)
    assert problem is not None
    assert "no emulated TPM 2.0 (tpm)" in problem
    assert "swtpm" in problem
    problem = refusal(secure, memory_mib=256, host=without)
    assert problem is not None
    assert "no UEFI secure boot (secureBoot)" in problem
    assert "q35" in problem
    offering = HostHardware(tpm_emulator=True, secure_boot=True)
    assert (
        refusal(DomainHardware(tpm=True, secure_boot=True), memory_mib=256, host=offering) is None
    )
    # a host that does not say (a driver without domain capabilities) is not refused
    assert (
        refusal(DomainHardware(tpm=True, secure_boot=True), memory_mib=256, host=HostHardware())
        is None
    )
    assert not DomainHardware().wants_host_check
