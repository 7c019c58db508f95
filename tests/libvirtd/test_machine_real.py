"""LibvirtMachines on the real libvirtd with the test guest (TCG): the real paths.

The machine controller runs in this process against the session API server and
`qemu:///system`; the cluster's network (isolated, random /24) and pool are made through the
Hosts port (standing in for the cluster controller). Each machine boots the CoreOS stand-in
guest (hack/guest), whose serial console markers tell what it received:

- Ignition: the guest read exactly the Secret's bytes through fw_cfg; the machine reports the
  IP of the guest's DHCP lease and providerID `libvirt:///<uuid>` equal to the providerID
  the guest derives from its SMBIOS UUID;
- cloud-config: the NoCloud ISO on a virtio-scsi cdrom; the hostname from meta-data applied;
- delete: no domain, volume, DHCP host or DNS record is left (asserted by listing libvirt);
- a full pool (a tiny tmpfs): the real ENOSPC surfaces as the condition, nothing is left.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import secrets
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import libvirt
import pytest
import yaml

from capl.api import constants as c
from capl.controllers import machine as libvirtmachine
from capl.ports.naming import machine_hostname, machine_names
from capl.runtime.resources import LIBVIRT_MACHINE
from capl.testing.harness import ClusterObjects, ControllerHarness
from capl.testing.objects import condition
from tests.controllers.conftest import harness, leftovers
from tests.fixtures.common import require_part
from tests.fixtures.guest import GuestMarker, ignition_config, read_markers
from tests.fixtures.libvirt import record_timing

__all__ = ["harness"]  # fixtures used by this module

pytestmark = [pytest.mark.apiserver, pytest.mark.libvirtd, pytest.mark.guest]

URI = "qemu:///system"
BOOT_TIMEOUT = 180.0
SETUP = functools.partial(
    libvirtmachine.setup,
    options=libvirtmachine.MachineOptions(address_poll=0.5, shutdown_timeout=20, shutdown_poll=0.5),
)


def guest_spec(guest_image: Path, **extra: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "image": {"path": str(guest_image), "format": "qcow2"},
        "cpus": 1,
        "memoryMiB": 256,
        "domainType": "qemu",
    }
    spec.update(extra)
    return spec


@pytest.fixture
async def real(harness: ControllerHarness, libvirtd_uri: str) -> ControllerHarness:
    await harness.start(SETUP)
    return harness


def _serial_log(harness: ControllerHarness, cluster: ClusterObjects, machine: str) -> Path:
    pool = cluster.layout_model().spec.storage_pool
    assert pool is not None
    assert pool.path is not None
    names = machine_names(namespace=harness.namespace, name=machine)
    return Path(pool.path) / names.console_log


def _tail(log: Path) -> str:
    return log.read_text(errors="replace")[-600:] if log.exists() else "no log"


def _files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if not p.name.startswith(".capl-owner"))


async def _marker(log: Path, name: str, *, within: float = BOOT_TIMEOUT) -> GuestMarker:
    deadline = time.monotonic() + within
    while True:
        for marker in reversed(read_markers(log)):
            if marker.name == name:
                return marker
        if time.monotonic() > deadline:
            tail = _tail(log)
            raise AssertionError(f"no marker {name!r} in {log} within {within:.0f}s: {tail}")
        await asyncio.sleep(0.2)


def _libvirt_listing(
    conn: libvirt.virConnect, cluster: ClusterObjects, machine: str, namespace: str
) -> list[str]:
    """What of the machine libvirt lists, asked directly (not through capl)."""
    lay = cluster.layout_model()
    names = machine_names(namespace=namespace, name=machine)
    hostname = machine_hostname(machine)
    found = [d.name() for d in conn.listAllDomains(0) if d.name() == names.domain]
    pool = conn.storagePoolLookupByName(str(lay.spec.storage_pool.name))  # type: ignore[union-attr]
    pool.refresh(0)
    found += [v.name() for v in pool.listAllVolumes(0) if v.name().startswith(names.prefix)]
    network_xml = conn.networkLookupByName(str(lay.spec.network.name)).XMLDesc(0)
    if f"name='{hostname}'" in network_xml or f">{hostname}." in network_xml:
        found.append(f"network entries for {hostname}: {network_xml}")
    return found


async def test_ignition_machine_boots_with_lease_and_provider_id(
    real: ControllerHarness, guest_image: Path, libvirtd_conn: libvirt.virConnect
) -> None:
    h = real
    cluster = await h.make_cluster(
        hosts=[{"name": "kvm1", "uri": URI}], dns_domain="ign.example", base_image=False
    )
    token = secrets.token_hex(8)
    config = ignition_config(hostname="ign-node", files={"/etc/capl-token": token})
    started = time.monotonic()
    m = await h.make_machine(
        cluster, "ign-node", spec=guest_spec(guest_image), bootstrap=config, format="ignition"
    )
    obj = await h.wait_ready(m.name, within=BOOT_TIMEOUT)
    record_timing("Ignition LibvirtMachine create to Ready (TCG)", time.monotonic() - started)

    log = _serial_log(h, cluster, m.name)
    source = await _marker(log, "source")
    assert source.value == "ignition"
    assert source.fields["sha256"] == hashlib.sha256(config).hexdigest()
    ignition = await _marker(log, "ignition")
    assert ignition.payload_bytes() == config
    assert token in ignition.payload_bytes().decode()
    provider = await _marker(log, "providerID")
    assert provider.value == obj["spec"]["providerID"]
    assert (await _marker(log, "uuid")).value == obj["spec"]["domainUUID"]
    ip_marker = await _marker(log, "ip")

    # the address is the DHCP lease's, and the lease is the reservation's
    addresses = {a["type"]: a["address"] for a in obj["status"]["addresses"]}
    assert addresses["InternalIP"] == ip_marker.value
    lay = cluster.layout_model()
    network = libvirtd_conn.networkLookupByName(str(lay.spec.network.name))
    leases = [lease for lease in network.DHCPLeases() if lease["ipaddr"] == addresses["InternalIP"]]
    assert leases, network.DHCPLeases()
    assert leases[0]["mac"] == ip_marker.fields["mac"]
    assert f"ip='{addresses['InternalIP']}'" in network.XMLDesc(0)  # reserved, not random
    assert addresses["InternalDNS"] == "ign-node.ign.example"

    # the bootstrap data is nowhere in the domain XML, the object, or the events
    dom = libvirtd_conn.lookupByUUIDString(obj["spec"]["domainUUID"])
    assert token not in dom.XMLDesc(0)
    assert token not in json.dumps(await h.get(LIBVIRT_MACHINE, m.name))

    await h.delete_machine(m.name, within=90)
    assert _libvirt_listing(libvirtd_conn, cluster, m.name, h.namespace) == []


async def test_cloud_config_machine_gets_its_hostname(
    real: ControllerHarness, guest_image: Path, libvirtd_conn: libvirt.virConnect
) -> None:
    h = real
    cluster = await h.make_cluster(
        hosts=[{"name": "kvm1", "uri": URI}], dns_domain="ci.example", base_image=False
    )
    user_data = b"#cloud-config\nruncmd:\n  - echo hello\n"  # no hostname: meta-data's applies
    started = time.monotonic()
    m = await h.make_machine(cluster, "ci-node", spec=guest_spec(guest_image), bootstrap=user_data)
    obj = await h.wait_ready(m.name, within=BOOT_TIMEOUT)
    record_timing("cloud-config LibvirtMachine create to Ready (TCG)", time.monotonic() - started)

    log = _serial_log(h, cluster, m.name)
    source = await _marker(log, "source")
    assert source.value == "cloud-init"
    assert source.fields["sha256"] == hashlib.sha256(user_data).hexdigest()
    meta_data = (await _marker(log, "meta-data")).payload_bytes().decode()
    # YAML, as cloud-init reads it (the manager writes plain values double-quoted)
    assert yaml.safe_load(meta_data)["instance-id"] == obj["metadata"]["uid"]
    assert (await _marker(log, "hostname")).value == "ci-node"
    assert (await _marker(log, "providerID")).value == obj["spec"]["providerID"]
    ip_marker = await _marker(log, "ip")
    addresses = {a["type"]: a["address"] for a in obj["status"]["addresses"]}
    assert addresses["InternalIP"] == ip_marker.value
    assert "error" not in {mk.name for mk in read_markers(log)}

    await h.delete_machine(m.name, within=90)
    assert _libvirt_listing(libvirtd_conn, cluster, m.name, h.namespace) == []
    assert await leftovers(h, cluster, m.name, uri=URI) == []


@pytest.fixture
def tiny_pool_dir(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs: too small for the 16 MB test guest image."""
    if shutil.which("mount") is None:
        require_part("mount(8) for a tmpfs pool", "install util-linux")
    path = Path("/var/lib/libvirt/images") / f"capl-test-tiny-{secrets.token_hex(4)}"
    path.mkdir(parents=True)
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m,mode=0755", "tmpfs", str(path)],
        capture_output=True,
        check=False,
    )
    if result.returncode != 0:
        path.rmdir()
        require_part("a tmpfs mount (root)", result.stderr.decode(errors="replace").strip())
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)
        with contextlib.suppress(OSError):
            path.rmdir()


async def test_full_pool_is_reported_and_leaves_nothing(
    tiny_pool_dir: Path, real: ControllerHarness, guest_image: Path
) -> None:
    # tiny_pool_dir first: torn down last, after the harness removed the pool from libvirt
    h = real
    cluster = await h.make_cluster(
        hosts=[{"name": "kvm1", "uri": URI}], pool_path=str(tiny_pool_dir), base_image=False
    )
    m = await h.make_machine(cluster, "full", spec=guest_spec(guest_image))
    obj = await h.wait_for(
        LIBVIRT_MACHINE,
        m.name,
        lambda o: (
            condition(o, c.ConditionType.DOMAIN_PROVISIONED, "reason")
            == c.Reason.STORAGE_UNAVAILABLE
        ),
        within=60,
        what="StorageUnavailable",
    )
    assert "No space left on device" in (
        condition(obj, c.ConditionType.DOMAIN_PROVISIONED, "message") or ""
    )
    assert await leftovers(h, cluster, m.name, uri=URI) == []
    assert _files(tiny_pool_dir) == []
    await h.delete_machine(m.name, within=30)
