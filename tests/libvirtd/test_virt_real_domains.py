"""Domains through the adapter on the real libvirtd (TCG): the generated XML is accepted and
runs, graceful stop falls back to destroy, UEFI NVRAM goes with undefine, a dropped
connection is noticed and healed, and the test guest boots with what capl delivers
(Ignition over fw_cfg, cloud-init from the in-process NoCloud ISO), reporting the domain UUID
as its SMBIOS UUID and the reserved address."""

from __future__ import annotations

import asyncio
import hashlib
import os
import secrets
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import libvirt
import pytest

from capl.ports.bootstrap import build_nocloud_iso
from capl.ports.errors import VirtError
from capl.ports.naming import MachineNames, machine_mac, machine_names
from capl.ports.virt import (
    AddressSource,
    ClusterOwner,
    DhcpHost,
    DiskBus,
    DiskDevice,
    DiskSpec,
    DomainEvent,
    DomainEventKind,
    DomainOwner,
    DomainSpec,
    DomainState,
    Firmware,
    FwCfgEntry,
    HostEvent,
    HostEventKind,
    ImageFromPath,
    NetworkMode,
    NetworkSpec,
    NicSpec,
    PoolSpec,
    StopResult,
    VolumeFormat,
)
from capl.virt import LibvirtHost, LibvirtHosts
from tests.fixtures.common import eventually
from tests.fixtures.guest import ignition_config, wait_for_marker
from tests.fixtures.libvirt import record_timing
from tests.fixtures.libvirt_direct import remove_domain, remove_network, remove_pool
from tests.fixtures.virt import EventRecorder

pytestmark = pytest.mark.libvirtd

POOL_ROOT = Path("/var/lib/libvirt/images")
MIB = 1024**2
DOMAIN = "capl-test.internal"


@dataclass
class Bed:
    host: LibvirtHost
    hosts: LibvirtHosts
    owner: ClusterOwner
    pool: str
    pool_path: Path
    network: str
    cluster: str


def _cleanup(conn: libvirt.virConnect, bed_names: dict[str, list[str]]) -> None:
    for name in bed_names["domains"]:
        remove_domain(conn, name)
    for name in bed_names["pools"]:
        remove_pool(conn, name)
    for name in bed_names["networks"]:
        remove_network(conn, name)


@pytest.fixture
def bed_names(libvirtd_conn: libvirt.virConnect) -> Iterator[dict[str, list[str]]]:
    names: dict[str, list[str]] = {"domains": [], "pools": [], "networks": []}
    yield names
    _cleanup(libvirtd_conn, names)


@pytest.fixture
async def bed(libvirtd_uri: str, bed_names: dict[str, list[str]]) -> AsyncIterator[Bed]:
    hosts = LibvirtHosts()
    host = hosts.get(uri=libvirtd_uri)
    cluster = "c-" + secrets.token_hex(3)
    owner = ClusterOwner(namespace="capl-test", name=cluster)
    pool = "capl-test-" + secrets.token_hex(4)
    bed_names["pools"].append(pool)
    await host.ensure_pool(PoolSpec(name=pool, path=str(POOL_ROOT / pool), owner=owner))
    network = ""
    for _ in range(10):
        suffix = secrets.token_hex(3)
        network = "capl-test-" + suffix
        bed_names["networks"].append(network)
        try:
            await host.ensure_network(
                NetworkSpec(
                    name=network,
                    mode=NetworkMode.ISOLATED,
                    owner=owner,
                    cidr=f"10.{150 + secrets.randbelow(100)}.{secrets.randbelow(256)}.0/24",
                    dns_domain=DOMAIN,
                    bridge="capl-t" + suffix,
                )
            )
            break
        except VirtError:
            continue
    yield Bed(
        host=host,
        hosts=hosts,
        owner=owner,
        pool=pool,
        pool_path=POOL_ROOT / pool,
        network=network,
        cluster=cluster,
    )
    await hosts.close()


def _machine(bed: Bed, bed_names: dict[str, list[str]]) -> tuple[DomainOwner, str]:
    name = "m-" + secrets.token_hex(3)
    owner = DomainOwner(
        cluster=bed.cluster, namespace="capl-test", name=name, uid=str(uuid.uuid4())
    )
    domain = machine_names(namespace=owner.namespace, name=owner.name).domain
    bed_names["domains"].append(domain)
    return owner, domain


async def _blank_disk(bed: Bed, name: str) -> str:
    volume = await bed.host.create_volume(pool=bed.pool, name=name, capacity_bytes=16 * MIB)
    return volume.path


async def test_domain_runs_and_stop_falls_back_to_destroy(
    bed: Bed, bed_names: dict[str, list[str]]
) -> None:
    recorder = EventRecorder()
    bed.hosts.subscribe(recorder)
    owner, domain_name = _machine(bed, bed_names)
    names = machine_names(namespace=owner.namespace, name=owner.name)
    disk = await _blank_disk(bed, names.root_volume)
    ignition = await bed.host.upload_volume(pool=bed.pool, name=names.ignition_volume, data=b"{}")
    spec = DomainSpec(
        name=domain_name,
        uuid=str(uuid.uuid4()),
        owner=owner,
        vcpus=1,
        memory_mib=128,
        domain_type="qemu",
        disks=(DiskSpec(path=disk),),
        nics=(
            NicSpec(
                mac=machine_mac(cluster=bed.cluster, namespace="capl-test", name=owner.name),
                network=bed.network,
            ),
        ),
        fw_cfg=(FwCfgEntry(name="opt/com.coreos/config", file=ignition.path),),
        console_log=str(bed.pool_path / names.console_log),
    )
    await bed.host.define_domain(spec)
    running = await bed.host.start_domain(spec.uuid, owner=owner)
    assert running.state is DomainState.RUNNING
    started = await recorder.wait_for(
        lambda e: (
            isinstance(e, DomainEvent) and e.uuid == spec.uuid and e.kind is DomainEventKind.STARTED
        ),
        "started",
    )
    assert started.host_id == "qemu:///system"
    assert await asyncio.to_thread((bed.pool_path / names.console_log).exists)
    # no OS answers the ACPI power button: destroyed after the grace period
    assert (
        await bed.host.stop_domain(spec.uuid, owner=owner, grace_period=1) is StopResult.DESTROYED
    )
    info = await bed.host.get_domain(spec.uuid)
    assert info is not None
    assert (info.state, info.reason) == (DomainState.SHUTOFF, "destroyed")
    assert await bed.host.undefine_domain(spec.uuid, owner=owner)
    # the console log is not a libvirt volume until the pool is rescanned
    refs = await bed.host.list_volumes(pool=bed.pool, prefix=names.prefix, refresh=True)
    assert names.console_log in {r.name for r in refs}


async def test_uefi_nvram_is_removed_with_the_domain(
    bed: Bed, bed_names: dict[str, list[str]]
) -> None:
    info = await bed.host.info()
    if not info.uefi_supported:
        pytest.skip("no UEFI firmware on this host")
    assert info.libvirt_version.startswith("9.")
    owner, domain_name = _machine(bed, bed_names)
    disk = await _blank_disk(bed, f"capl-t-{owner.name}-root.qcow2")
    spec = DomainSpec(
        name=domain_name,
        uuid=str(uuid.uuid4()),
        owner=owner,
        vcpus=1,
        memory_mib=256,
        domain_type="qemu",
        machine="q35",
        firmware=Firmware.UEFI,
        disks=(DiskSpec(path=disk),),
    )
    await bed.host.define_domain(spec)
    await bed.host.start_domain(spec.uuid, owner=owner)
    nvram = Path(f"/var/lib/libvirt/qemu/nvram/{domain_name}_VARS.fd")
    assert await asyncio.to_thread(nvram.exists)
    assert await bed.host.undefine_domain(spec.uuid, owner=owner)
    assert not await asyncio.to_thread(nvram.exists)


def _client_ids() -> set[str]:
    out = subprocess.run(
        ["virt-admin", "-q", "client-list", "libvirtd"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


async def test_dropped_connection_is_reported_and_healed(libvirtd_uri: str) -> None:
    try:
        before = await asyncio.to_thread(_client_ids)
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"virt-admin is not usable here: {exc}")
    hosts = LibvirtHosts()
    try:
        recorder = EventRecorder()
        hosts.subscribe(recorder)
        host = hosts.get(uri=libvirtd_uri)
        await host.info()
        ours = await asyncio.to_thread(_client_ids) - before
        assert len(ours) == 1, f"cannot tell our client apart: {ours}"
        await asyncio.to_thread(
            subprocess.run,
            ["virt-admin", "client-disconnect", "libvirtd", ours.pop()],
            check=True,
            capture_output=True,
            timeout=30,
        )
        await recorder.wait_for(
            lambda e: isinstance(e, HostEvent) and e.kind is HostEventKind.DISCONNECTED,
            "disconnected",
        )
        await recorder.wait_for(
            lambda e: (
                isinstance(e, HostEvent)
                and e.kind is HostEventKind.CONNECTED
                and host.connection.generation >= 2
            ),
            "reconnected",
        )
        info = await host.info()
        assert info.hypervisor == "QEMU"
    finally:
        await hosts.close()


@pytest.fixture
def guest_base(guest_image: Path) -> Path:
    return guest_image


async def _deliver_bootstrap(
    bed: Bed, names: MachineNames, owner: DomainOwner, *, bootstrap: str, hostname: str
) -> tuple[bytes, list[DiskSpec], tuple[FwCfgEntry, ...]]:
    """Upload the bootstrap payload as capl does: (payload, extra disks, fw_cfg entries)."""
    if bootstrap == "ignition":
        payload = ignition_config(hostname=hostname)
        volume = await bed.host.upload_volume(
            pool=bed.pool, name=names.ignition_volume, data=payload
        )
        return payload, [], (FwCfgEntry(name="opt/com.coreos/config", file=volume.path),)
    payload = f"#cloud-config\nhostname: {hostname}\n".encode()
    iso = build_nocloud_iso(user_data=payload, instance_id=owner.uid, hostname=hostname)
    volume = await bed.host.upload_volume(pool=bed.pool, name=names.cidata_volume, data=iso)
    cidata = DiskSpec(
        path=volume.path,
        format=VolumeFormat.ISO,
        device=DiskDevice.CDROM,
        bus=DiskBus.SCSI,
        readonly=True,
    )
    return payload, [cidata], ()


async def _remove_machine(
    bed: Bed, names: MachineNames, spec: DomainSpec, reservation: DhcpHost
) -> None:
    """Undefine, delete the volumes and network entries; nothing of the machine is left."""
    assert await bed.host.undefine_domain(spec.uuid, owner=spec.owner)
    for volume_name in (
        names.root_volume,
        names.ignition_volume,
        names.cidata_volume,
        names.console_log,
    ):
        await bed.host.delete_volume(pool=bed.pool, name=volume_name)
    await bed.host.remove_dns_hostnames(network=bed.network, ip=reservation.ip)
    assert await bed.host.remove_dhcp_host(network=bed.network, mac=reservation.mac)
    assert not [
        r for r in await bed.host.list_volumes(pool=bed.pool, prefix=names.prefix, refresh=True)
    ]


@pytest.mark.guest
@pytest.mark.parametrize("bootstrap", ["ignition", "cloud-config"])
async def test_guest_boots_with_what_capl_delivers(
    bed: Bed, bed_names: dict[str, list[str]], guest_base: Path, bootstrap: str
) -> None:
    started_at = asyncio.get_running_loop().time()
    owner, domain_name = _machine(bed, bed_names)
    names = machine_names(namespace=owner.namespace, name=owner.name)
    base = await bed.host.ensure_base_image(
        pool=bed.pool, name="capl-base-guest", source=ImageFromPath(path=str(guest_base))
    )
    root = await bed.host.create_overlay(
        pool=bed.pool, name=names.root_volume, backing=base, capacity_bytes=64 * MIB
    )
    mac = machine_mac(cluster=bed.cluster, namespace=owner.namespace, name=owner.name)
    reservation = await bed.host.ensure_dhcp_host(network=bed.network, mac=mac, name=owner.name)
    await bed.host.add_dns_hostnames(network=bed.network, ip=reservation.ip, hostnames=[owner.name])
    hostname = "guest-" + secrets.token_hex(2)
    payload, bootstrap_disks, fw_cfg = await _deliver_bootstrap(
        bed, names, owner, bootstrap=bootstrap, hostname=hostname
    )
    disks = [DiskSpec(path=root.path), *bootstrap_disks]
    spec = DomainSpec(
        name=domain_name,
        uuid=str(uuid.uuid4()),
        owner=owner,
        vcpus=1,
        memory_mib=256,
        domain_type="qemu",
        disks=tuple(disks),
        nics=(NicSpec(mac=mac, network=bed.network),),
        fw_cfg=fw_cfg,
        console_log=str(bed.pool_path / names.console_log),
    )
    await bed.host.define_domain(spec)
    await bed.host.start_domain(spec.uuid, owner=owner)
    log = bed.pool_path / names.console_log
    source = await asyncio.to_thread(wait_for_marker, log, "source", timeout=120)
    assert source.value == ("ignition" if bootstrap == "ignition" else "cloud-init")
    assert source.fields["sha256"] == hashlib.sha256(payload).hexdigest()
    guest_uuid = await asyncio.to_thread(wait_for_marker, log, "uuid", timeout=60)
    assert guest_uuid.value == spec.uuid  # SMBIOS UUID == domain UUID == providerID's
    named = await asyncio.to_thread(wait_for_marker, log, "hostname", timeout=60)
    assert named.value == hostname
    ip = await asyncio.to_thread(wait_for_marker, log, "ip", timeout=120)
    assert ip.value == reservation.ip

    # dnsmasq's lease helper records the lease a moment after the guest has it
    async def leased() -> bool:
        addresses = await bed.host.domain_addresses(spec.uuid)
        leases = await bed.host.dhcp_leases(network=bed.network)
        return (AddressSource.LEASE, reservation.ip) in {
            (a.source, a.ip) for a in addresses
        } and any(lease.mac == mac and lease.ip == reservation.ip for lease in leases)

    await eventually(leased, within=30, what="the lease in libvirt's view")
    record_timing(
        f"capl adapter: {bootstrap} guest to lease", asyncio.get_running_loop().time() - started_at
    )
    await asyncio.to_thread(wait_for_marker, log, "ready", timeout=60)
    result = await bed.host.stop_domain(spec.uuid, owner=owner, grace_period=60)
    assert result is StopResult.SHUTDOWN  # the guest handled the ACPI power button
    await _remove_machine(bed, names, spec, reservation)
    if os.environ.get("CAPL_KEEP_GUEST_LOG"):
        print(log.read_text(errors="replace"))
