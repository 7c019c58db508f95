"""The libvirt test-driver fixtures are real: a per-process driver that runs domains, and the
driver inside libvirtd that separate processes share."""

from __future__ import annotations

import secrets
import shutil
import subprocess

import libvirt
import pytest

DOMAIN_XML = """<domain type='test'>
  <name>{name}</name>
  <memory unit='MiB'>64</memory>
  <os><type arch='x86_64'>hvm</type></os>
</domain>"""


def _name() -> str:
    return "capl-test-" + secrets.token_hex(4)


def _virsh(uri: str, *args: str) -> str:
    if shutil.which("virsh") is None:
        pytest.skip("virsh is not installed (make deps installs libvirt-clients)")
    result = subprocess.run(
        ["virsh", "-q", "-c", uri, *args], capture_output=True, text=True, timeout=30, check=False
    )
    assert result.returncode == 0, f"virsh {' '.join(args)}: {result.stderr.strip()}"
    return result.stdout


def test_define_and_start_a_domain(test_driver_uri: str) -> None:
    conn = libvirt.open(test_driver_uri)
    try:
        name = _name()
        dom = conn.defineXML(DOMAIN_XML.format(name=name))
        assert dom.state()[0] == libvirt.VIR_DOMAIN_SHUTOFF
        dom.create()
        assert dom.isActive()
        assert dom.state()[0] == libvirt.VIR_DOMAIN_RUNNING
        # a second connection of this process sees the same fake hypervisor
        other = libvirt.open(test_driver_uri)
        try:
            assert other.lookupByName(name).UUIDString() == dom.UUIDString()
        finally:
            other.close()
        dom.destroy()
        dom.undefine()
        with pytest.raises(libvirt.libvirtError) as err:
            conn.lookupByName(name)
        assert err.value.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN
    finally:
        conn.close()


def test_per_process_driver_is_not_shared_with_other_processes(test_driver_uri: str) -> None:
    conn = libvirt.open(test_driver_uri)
    try:
        name = _name()
        conn.defineXML(DOMAIN_XML.format(name=name))
        # virsh runs its own test:///default: our domain is not there
        assert name not in _virsh(test_driver_uri, "list", "--all", "--name").split()
    finally:
        conn.close()


def test_shared_driver_is_seen_by_another_process(shared_test_driver: str) -> None:
    conn = libvirt.open(shared_test_driver)
    name = _name()
    try:
        dom = conn.defineXML(DOMAIN_XML.format(name=name))
        dom.create()
        assert name in _virsh(shared_test_driver, "list", "--name").split()
        # and the other way round: what the other process changes, this one sees
        _virsh(shared_test_driver, "destroy", name)
        assert dom.state()[0] == libvirt.VIR_DOMAIN_SHUTOFF
        _virsh(shared_test_driver, "undefine", name)
        with pytest.raises(libvirt.libvirtError):
            conn.lookupByName(name)
    finally:
        try:
            leftover = conn.lookupByName(name)
            if leftover.isActive():
                leftover.destroy()
            leftover.undefine()
        except libvirt.libvirtError:
            pass
        conn.close()


def test_shared_driver_state_outlives_a_closed_connection(shared_test_driver: str) -> None:
    # the session fixture's holder connection keeps the driver's state alive, as a manager
    # restart (all its connections closed) would need
    name = _name()
    first = libvirt.open(shared_test_driver)
    first.defineXML(DOMAIN_XML.format(name=name))
    first.close()
    second = libvirt.open(shared_test_driver)
    try:
        second.lookupByName(name).undefine()
    finally:
        second.close()
