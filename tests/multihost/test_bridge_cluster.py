"""A cluster on two real hosts in bridge mode: nodes on different hosts share the LAN.

The bed (tests/multihost/conftest.py): kvm1 (``qemu+tls://``) and kvm3 (``qemu+ssh://``),
each with bridge ``br-lan`` on one LAN whose DHCP server is the bed's dnsmasq (the site's).
A real `capl manager` process (tests/fixtures/capl.py) reaches both hosts by their URIs and
credentials Secrets; `tests/fixtures/bed.py` `ManagerBed` stands in for the Cluster API core.

The LibvirtCluster has ``network: {mode: bridge, bridge: br-lan}`` and, as bridge mode
requires (README "Bridge mode"), ``spec.controlPlaneEndpoint``: the virtual IP
``10.231.0.50:6443`` on the LAN, outside its DHCP range. The control-plane machine (on kvm1)
takes that address as a second address of its NIC, as kube-vip on a control-plane node does,
so "the endpoint answers" means what it means on a real site: a node on *another* host
reaches the address the cluster's API would be served on, across the LAN.

Two TCG guests of the test guest image, one per host (``spec.hostName``), boot and get their
addresses from the LAN's DHCP server; capl reports them in ``status.addresses`` (read through
the guest agent: libvirt serves no DHCP on a host bridge). Then, typed on the serial consoles
through capl's console adapter, each guest pings the other guest and the endpoint; the
worker's VNC display (``spec.vnc``) answers the RFB handshake through `capl vnc` over kvm3's
ssh (``ssh -L`` to the display's socket: the beds' sshd allows local forwards). Deleting
the cluster through the manager leaves nothing in libvirt on either host.
"""

from __future__ import annotations

import asyncio
import ipaddress
import time
from collections.abc import AsyncIterator
from pathlib import Path
from xml.etree import ElementTree

import libvirt
import pytest

from capl.ports.naming import machine_names
from capl.runtime.resources import LIBVIRT_MACHINE
from capl.testbed import ControlPlane
from capl.testbed.multihost import BedHost, MultihostBed
from capl.testing.objects import create_machine_objects
from capl.virt import LibvirtHost, LibvirtHosts
from capl.virt.domainxml import GUEST_AGENT_CHANNEL
from tests.e2e.harness import internal_ip
from tests.fixtures.bed import BedCluster, ManagerBed, bed_for
from tests.fixtures.capl import CaplManagerFactory
from tests.fixtures.common import eventually
from tests.fixtures.libvirt import record_timing
from tests.fixtures.libvirt_direct import open_libvirt
from tests.fixtures.vnc import vnc_session
from tests.multihost.guest import run_in_guest
from tests.multihost.machines import create_cluster

pytestmark = [pytest.mark.apiserver, pytest.mark.libvirtd, pytest.mark.guest]

ENDPOINT = "10.231.0.50"
BOOT = 240.0  # TCG guests on two shared cores
ON = {"cp": "kvm1", "worker": "kvm3"}  # a TLS host and the ssh host


@pytest.fixture
async def bed(
    control_plane: ControlPlane, capi_crds: list[str], namespace: str
) -> AsyncIterator[ManagerBed]:
    async with bed_for(ManagerBed, control_plane, namespace) as made:
        yield made


def guest_spec(image: Path, host: str, *, vnc: bool = False) -> dict[str, object]:
    return {
        "image": {"path": str(image), "format": "qcow2"},
        "cpus": 1,
        "memoryMiB": 256,
        "domainType": "qemu",
        "hostName": host,
        "vnc": vnc,
    }


async def create_bridge_cluster(bed: ManagerBed, lan: MultihostBed, name: str) -> BedCluster:
    """The bridge-mode cluster on the hosts of `ON` with the VIP as its endpoint."""
    return await create_cluster(bed, lan, name, on=sorted(set(ON.values())), endpoint=ENDPOINT)


def agent_channel_state(lan: MultihostBed, host: str, uuid: str) -> str:
    """The state libvirt has for the domain's guest agent channel (``connected`` once the
    agent in the guest opened its port and libvirt connected to it)."""
    conn = open_libvirt(lan.host(host).local_uri)
    try:
        document = ElementTree.fromstring(conn.lookupByUUIDString(uuid).XMLDesc(0))
    finally:
        conn.close()
    for target in document.iterfind("./devices/channel/target"):
        if target.get("name") == GUEST_AGENT_CHANNEL:
            return target.get("state") or "unknown"
    return "no agent channel"


def console_log(lan: MultihostBed, host: str, uuid: str) -> Path | None:
    """The guest's serial console log, seen from the root namespace (the path in the domain
    is inside the host's /var/lib/libvirt)."""
    conn = open_libvirt(lan.host(host).local_uri)
    try:
        document = ElementTree.fromstring(conn.lookupByUUIDString(uuid).XMLDesc(0))
    finally:
        conn.close()
    element = document.find("./devices/serial/log")
    if element is None or not element.get("file"):
        return None
    inside = Path(str(element.get("file"))).relative_to("/var/lib/libvirt")
    return lan.root / host / "lib" / inside


async def why_no_address(bed: ManagerBed, lan: MultihostBed) -> str:
    """Where each machine's address is stuck: the agent channel's state, the DHCP lease the
    guest printed on its console, the LAN dnsmasq's leases."""
    lines = []
    for name, host in ON.items():
        obj = await bed.get(LIBVIRT_MACHINE, name)
        uuid = str(((obj or {}).get("spec") or {}).get("domainUUID") or "")
        if not uuid:
            lines.append(f"{name}: no domain yet")
            continue
        try:
            state = agent_channel_state(lan, host, uuid)
            log = console_log(lan, host, uuid)
        except libvirt.libvirtError as exc:
            lines.append(f"{name}: {exc}")
            continue
        text = log.read_text(errors="replace") if log is not None and log.exists() else ""
        leased = [m for m in text.splitlines() if "CAPL-GUEST: ip=" in m or "dhcp=" in m]
        lines.append(
            f"{name} on {host}: agent channel {state}; console: "
            f"{leased[-1].strip() if leased else 'no DHCP marker'}"
        )
    lines.append("LAN leases:\n" + (lan.leases().strip() or "(none)"))
    return "\n".join(lines)


async def wait_for_addresses(bed: ManagerBed, lan: MultihostBed, started: float) -> dict[str, str]:
    """Every machine Ready with an InternalIP; records each one's time to its address."""
    found: dict[str, str] = {}

    async def probe() -> bool:
        for name in ON:
            obj = await bed.get(LIBVIRT_MACHINE, name)
            ip = internal_ip(obj or {})
            if ip and name not in found:
                found[name] = ip
                record_timing(
                    f"multihost bridge: {name} on {ON[name]} created -> InternalIP {ip}",
                    time.monotonic() - started,
                )
        return len(found) == len(ON)

    await eventually(
        probe,
        within=BOOT,
        interval=1.0,
        what="both machines report an address",
        explain=lambda: why_no_address(bed, lan),
    )
    await bed.wait_converged(within=BOOT)
    return found


def assert_leased_on_the_lan(lan: MultihostBed, ips: dict[str, str]) -> None:
    """Two distinct addresses of the LAN's DHCP range, in the LAN dnsmasq's leases."""
    network = ipaddress.ip_network(f"{lan.gateway}/{lan.prefix_len}", strict=False)
    low, high = (ipaddress.ip_address(a) for a in lan.dhcp_range)
    for name, ip in ips.items():
        assert ipaddress.ip_address(ip) in network, ip
        assert low <= ipaddress.ip_address(ip) <= high, ip
        assert ip in lan.leases(), f"{name}: {ip} was not leased by the LAN's DHCP server"
    assert len(set(ips.values())) == len(ips)


async def placed_and_running(bed: ManagerBed, lan: MultihostBed) -> dict[str, str]:
    """Each machine on its host, its domain running there (looked at directly); the UUIDs."""
    uuids = {}
    for name, host in ON.items():
        obj = await bed.get(LIBVIRT_MACHINE, name)
        assert obj is not None
        assert obj["spec"]["hostName"] == host
        uuids[name] = str(obj["spec"]["domainUUID"])
        conn = open_libvirt(lan.host(host).local_uri)
        try:
            assert conn.lookupByUUIDString(uuids[name]).isActive()
        finally:
            conn.close()
    return uuids


def left_on(bed_host: BedHost, namespace: str) -> list[str]:
    """What is left in libvirt on a bed host of this test's namespace (capl's names all
    start with ``capl-<namespace>``; a bed found running may hold other tests' objects)."""
    prefix = f"capl-{namespace}"
    conn = open_libvirt(bed_host.local_uri)
    try:
        left = [f"domain {d.name()}" for d in conn.listAllDomains()]
        left += [f"network {n.name()}" for n in conn.listAllNetworks()]
        left += [f"pool {p.name()}" for p in conn.listAllStoragePools()]
        return [item for item in left if item.split(" ", 1)[1].startswith(prefix)]
    finally:
        conn.close()


@pytest.mark.timeout(900)
async def test_nodes_on_two_hosts_reach_each_other_and_the_endpoint(
    bed: ManagerBed,
    multihost_bed: MultihostBed,
    capl_manager_factory: CaplManagerFactory,
    control_plane: ControlPlane,
    guest_image: Path,
) -> None:
    manager = await capl_manager_factory(
        control_plane,
        name="capl-multihost",
        webhooks=False,
        namespace=bed.namespace,
        extra_args=["--machine-shutdown-timeout=20s"],
    )
    await manager.start()
    consoles = LibvirtHosts()
    try:
        cluster = await create_bridge_cluster(bed, multihost_bed, "lan")
        started = time.monotonic()
        for name, host in ON.items():
            bed.live[name] = host
            await create_machine_objects(
                bed.create,
                name,
                bed.namespace,
                cluster=cluster.name,
                spec=guest_spec(guest_image, host, vnc=name == "worker"),
                control_plane=name == "cp",
            )
        ips = await wait_for_addresses(bed, multihost_bed, started)
        assert_leased_on_the_lan(multihost_bed, ips)
        uuids = await placed_and_running(bed, multihost_bed)
        for name, uuid in uuids.items():  # the addresses came through the agent
            assert agent_channel_state(multihost_bed, ON[name], uuid) == "connected", name

        def console(name: str) -> LibvirtHost:
            bed_host = multihost_bed.host(ON[name])
            return consoles.get(uri=bed_host.uri, credentials=bed_host.credentials)

        held = await run_in_guest(console("cp"), uuids["cp"], f"ip addr add {ENDPOINT}/24 dev eth0")
        assert held.status == 0, held.output[-1500:]
        t0 = time.monotonic()
        for name, other in (("worker", "cp"), ("cp", "worker")):
            for target in (ips[other], ENDPOINT):
                ran = await run_in_guest(console(name), uuids[name], f"ping -c 2 -w 10 {target}")
                assert ran.status == 0, f"{name} on {ON[name]} -> {target}:\n{ran.output[-1500:]}"
        record_timing("multihost bridge: 4 pings typed on the consoles", time.monotonic() - t0)

        # the worker's VNC display through kvm3's sshd (qemu+ssh://, the beds' sshd policy)
        seconds = await asyncio.to_thread(
            vnc_session,
            "worker",
            *("-n", bed.namespace, "--kubeconfig", str(control_plane.kubeconfig)),
            namespace=bed.namespace,
            uuid=uuids["worker"],
            host=ON["worker"],
            desktop=machine_names(namespace=bed.namespace, name="worker").domain,
        )
        record_timing("multihost bridge: capl vnc over qemu+ssh: start to ServerInit", seconds)

        t0 = time.monotonic()
        await bed.delete_cluster(cluster, within=180)
        record_timing("multihost bridge: cluster deleted", time.monotonic() - t0)
        for host in sorted(set(ON.values())):
            assert left_on(multihost_bed.host(host), bed.namespace) == [], host
            # the pool's directory, seen from the root namespace through the host's state
            inside = cluster.pool_path.relative_to("/var/lib/libvirt")
            assert not (multihost_bed.root / host / "lib" / inside).exists(), host
    finally:
        await consoles.close()
        await manager.stop()
