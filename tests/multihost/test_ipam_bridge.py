"""Cluster API IPAM on a bridge-mode network: TCG guests come up with the addresses the real
in-cluster IPAM provider allocated, given to them as static configuration.

On the multi-host bed's LAN (bridge ``br-lan``, 10.231.0.0/24; the LAN's dnsmasq hands out
.100-.200) an InClusterIPPool holds 10.231.0.55-10.231.0.60, outside the DHCP range and
away from the bridge test's endpoint (.50). A real `capl manager` process (as in
test_bridge_cluster.py; `ManagerBed` stands in for the Cluster API core) reconciles two
machines whose NIC has ``addressesFromPools``: one with cloud-config bootstrap data on kvm1
(the address in the NoCloud ``network-config``) and one with Ignition on kvm3 (a networkd
unit in ``storage.files``). In bridge mode capl runs no DHCP, so the address goes into the
bootstrap data; the test guest applies it (hack/guest/init) instead of asking the LAN's DHCP.

What is checked: each guest prints the static marker for its IPAM address on its console, the
guest agent reports it and capl puts it into status.addresses, the LAN's DHCP server leased
nothing to them, and deleting the machines deletes their IPAddressClaims (the addresses go
back to the pool) and leaves nothing in libvirt.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from capl.api import constants as c
from capl.runtime.conditions import get_condition
from capl.runtime.resources import IP_ADDRESS_CLAIM, IPAM_GROUP, LIBVIRT_MACHINE, Resource
from capl.testbed import ControlPlane
from capl.testbed.ipam import InClusterIpam
from capl.testbed.multihost import MultihostBed
from tests.e2e.harness import internal_ip
from tests.fixtures.bed import ManagerBed, bed_for
from tests.fixtures.capl import CaplManagerFactory
from tests.fixtures.common import eventually
from tests.fixtures.libvirt import record_timing
from tests.multihost.machines import create_cluster
from tests.multihost.test_bridge_cluster import console_log, left_on

pytestmark = [pytest.mark.apiserver, pytest.mark.libvirtd, pytest.mark.guest]

POOL = Resource(IPAM_GROUP, "v1alpha2", "InClusterIPPool", "inclusterippools")
POOL_RANGE = ("10.231.0.55", "10.231.0.60")
BOOT = 240.0  # TCG guests on two shared cores
IGNITION = b'{"ignition":{"version":"3.4.0"}}'
# machine -> (host, bootstrap format)
MACHINES = {"ipam-cc": ("kvm1", "cloud-config"), "ipam-ign": ("kvm3", "ignition")}


@pytest.fixture
async def bed(
    control_plane: ControlPlane, capi_crds: list[str], namespace: str
) -> AsyncIterator[ManagerBed]:
    async with bed_for(ManagerBed, control_plane, namespace) as made:
        yield made


def _spec(image: Path, host: str) -> dict[str, object]:
    pool = {"apiGroup": IPAM_GROUP, "kind": "InClusterIPPool", "name": "lan-pool"}
    return {
        "image": {"path": str(image), "format": "qcow2"},
        "cpus": 1,
        "memoryMiB": 256,
        "domainType": "qemu",
        "hostName": host,
        "networkInterfaces": [{"addressesFromPools": [pool]}],
    }


@pytest.mark.timeout(900)
async def test_bridge_guests_come_up_with_their_ipam_addresses(
    bed: ManagerBed,
    multihost_bed: MultihostBed,
    capl_manager_factory: CaplManagerFactory,
    control_plane: ControlPlane,
    ipam_provider: InClusterIpam,
    guest_image: Path,
) -> None:
    lan = multihost_bed
    await bed.create(
        POOL,
        {
            "apiVersion": POOL.api_version,
            "kind": POOL.kind,
            "metadata": {"name": "lan-pool", "namespace": bed.namespace},
            "spec": {
                "addresses": ["-".join(POOL_RANGE)],
                "prefix": lan.prefix_len,
                "gateway": lan.gateway,
            },
        },
    )
    manager = await capl_manager_factory(
        control_plane, name="capl-ipam", webhooks=False, namespace=bed.namespace
    )
    await manager.start()
    try:
        cluster = await create_cluster(
            bed, lan, "ipam", on=sorted({h for h, _ in MACHINES.values()})
        )
        started = time.monotonic()
        for name, (host, fmt) in MACHINES.items():
            ignition = fmt == "ignition"
            await bed.create_machine(
                cluster,
                name,
                host=host,
                spec=_spec(guest_image, host),
                bootstrap=IGNITION if ignition else b"#cloud-config\n",
                format="ignition" if ignition else None,
            )
        found: dict[str, str] = {}

        async def addressed() -> bool:
            for name in MACHINES:
                obj = await bed.get(LIBVIRT_MACHINE, name) or {}
                ip = internal_ip(obj)
                if ip and name not in found:
                    found[name] = ip
                    record_timing(
                        f"multihost ipam: {name} created -> InternalIP {ip}",
                        time.monotonic() - started,
                    )
            return len(found) == len(MACHINES)

        await eventually(addressed, within=BOOT, interval=1.0, what="both machines addressed")
        low, high = (int(a.rsplit(".", 1)[1]) for a in POOL_RANGE)
        leases = lan.leases()
        for name, ip in found.items():
            assert low <= int(ip.rsplit(".", 1)[1]) <= high, (name, ip)
            assert ip not in leases, f"{name}: {ip} came from the LAN's DHCP server"
            obj = await bed.get(LIBVIRT_MACHINE, name)
            assert obj is not None
            claimed = get_condition(obj, c.ConditionType.IP_ADDRESSES_CLAIMED) or {}
            assert claimed.get("status") == "True"
            assert f"nic0 {ip}/{lan.prefix_len}" in str(claimed.get("message"))
            log = console_log(lan, MACHINES[name][0], str(obj["spec"]["domainUUID"]))
            assert log is not None
            assert f"CAPL-GUEST: static={ip}/{lan.prefix_len}" in log.read_text(errors="replace")
        assert len(set(found.values())) == len(found)

        t0 = time.monotonic()
        for name in MACHINES:
            await bed.delete_machine(name)
        for name in MACHINES:
            await bed.wait_gone(LIBVIRT_MACHINE, name, within=120)

            async def released(claim: str = f"{name}-nic0") -> bool:
                return await bed.get(IP_ADDRESS_CLAIM, claim) is None

            await eventually(released, within=30, what=f"{name}'s IPAddressClaim deleted")
        record_timing("multihost ipam: machines deleted, claims released", time.monotonic() - t0)
        await bed.delete_cluster(cluster, within=120)
        for host in {h for h, _ in MACHINES.values()}:
            assert left_on(lan.host(host), bed.namespace) == [], host
    finally:
        await manager.stop()
