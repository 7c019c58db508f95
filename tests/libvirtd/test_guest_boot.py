"""The test guest boots on the real libvirtd (domain type `qemu`, TCG) and does what the
controllers' tests rely on: Ignition over fw_cfg, cloud-init NoCloud, hostname, SMBIOS uuid,
a DHCP lease, a console shell, and ACPI shutdown. The serial protocol is documented in
tests/fixtures/guest.py and hack/guest/init."""

from __future__ import annotations

import hashlib
import os
import secrets
import select
import time
from pathlib import Path

import libvirt
import pytest

from tests.fixtures.guest import ignition_config, make_cidata_iso, serial_log_of, wait_for
from tests.fixtures.libvirt import Guest, LibvirtBed, record_timing

pytestmark = [pytest.mark.libvirtd, pytest.mark.guest]

BOOT_TIMEOUT = 120  # seconds; a guest reaches its lease in about 10 s under TCG here


def _lease_and_ready(guest: Guest, label: str) -> dict[str, object]:
    lease = guest.wait_for_lease(timeout=BOOT_TIMEOUT)
    record_timing(f"boot to DHCP lease ({label})", time.monotonic() - guest.started_at)
    guest.wait_for_marker("ready", timeout=BOOT_TIMEOUT)
    return lease


def _console_roundtrip(guest: Guest, command: str, expect: str, *, timeout: float = 30) -> str:
    """Send `command` to the serial console's shell and read until `expect` comes back."""
    fd = os.open(guest.console_pty(), os.O_RDWR | os.O_NOCTTY)
    try:
        os.write(fd, b"\n" + command.encode() + b"\n")
        seen = b""
        deadline = time.monotonic() + timeout
        while expect.encode() not in seen:
            left = deadline - time.monotonic()
            assert left > 0, f"no {expect!r} on the console; got {seen[-300:]!r}"
            ready, _, _ = select.select([fd], [], [], min(left, 1.0))
            if ready:
                seen += os.read(fd, 4096)
        return seen.decode("utf-8", "replace")
    finally:
        os.close(fd)


def test_ignition_guest_boots_reports_and_shuts_down(
    libvirt_bed: LibvirtBed, guest_image: Path
) -> None:
    token = secrets.token_hex(8)
    hostname = f"ign-{token[:6]}"
    config = ignition_config(hostname=hostname, files={"/etc/capl-token": token})
    assert token.encode() in config

    guest = libvirt_bed.boot_guest(guest_image, ignition=config)
    lease = _lease_and_ready(guest, "Ignition")
    assert serial_log_of(guest.domain) == guest.serial_log
    markers = {m.name: m for m in guest.markers()}

    # the guest read exactly the bytes we passed through fw_cfg
    source = markers["source"]
    assert source.value == "ignition"
    assert source.fields["sha256"] == hashlib.sha256(config).hexdigest()
    assert int(source.fields["bytes"]) == len(config)
    assert markers["ignition"].payload_bytes() == config
    assert token in markers["ignition"].payload_bytes().decode()

    assert markers["hostname"].value == hostname
    assert markers["uuid"].value == guest.uuid.lower()
    assert markers["providerID"].value == f"libvirt:///{guest.uuid.lower()}"
    assert markers["ip"].value == lease["ipaddr"]
    assert markers["ip"].fields["mac"] == guest.mac
    assert lease["mac"] == guest.mac
    assert lease["hostname"] == hostname  # udhcpc sent the Ignition hostname

    # an interactive shell on the serial console
    output = _console_roundtrip(guest, "echo $((6*7))-$(hostname)", f"42-{hostname}")
    assert f"{hostname}:" in output  # the prompt names the host

    # graceful shutdown: ACPI power button -> poweroff -> the domain ends shut off
    t0 = time.monotonic()
    guest.domain.shutdown()
    _state, reason = wait_for(
        lambda: (s := guest.state())[0] == libvirt.VIR_DOMAIN_SHUTOFF and s,
        timeout=60,
        what=f"{guest.name} to shut off after virDomainShutdown",
    )
    record_timing("ACPI shutdown to shut off", time.monotonic() - t0)
    assert reason == libvirt.VIR_DOMAIN_SHUTOFF_SHUTDOWN
    assert any(m.name == "shutdown" for m in guest.markers())


@pytest.mark.parametrize(
    ("machine", "bus", "hostname_in"),
    [("pc", "ide", "user-data"), ("q35", "scsi", "meta-data")],
    ids=["pc-ide-cdrom", "q35-virtio-scsi-cdrom"],
)
def test_cloud_init_guest(
    libvirt_bed: LibvirtBed, guest_image: Path, machine: str, bus: str, hostname_in: str
) -> None:
    token = secrets.token_hex(6)
    hostname = f"ci-{token}"
    if hostname_in == "user-data":
        user_data = f"#cloud-config\nhostname: {hostname}\nruncmd:\n  - echo {token}\n".encode()
        meta_data = f"instance-id: {token}\nlocal-hostname: not-this-one\n".encode()
    else:
        user_data = b"#cloud-config\npackages: []\n"
        meta_data = f"instance-id: {token}\nlocal-hostname: {hostname}\n".encode()
    iso = make_cidata_iso(user_data=user_data, meta_data=meta_data)

    guest = libvirt_bed.boot_guest(guest_image, cidata=iso, cidata_bus=bus, machine=machine)
    lease = _lease_and_ready(guest, f"cloud-init, {machine} {bus} cdrom")
    markers = {m.name: m for m in guest.markers()}

    assert markers["source"].value == "cloud-init"
    assert markers["source"].fields["sha256"] == hashlib.sha256(user_data).hexdigest()
    assert markers["user-data"].payload_bytes() == user_data
    assert markers["meta-data"].payload_bytes() == meta_data
    assert markers["hostname"].value == hostname
    assert markers["uuid"].value == guest.uuid.lower()
    assert lease["hostname"] == hostname
    assert "error" not in markers, markers["error"]
