"""Cluster API IPAM: NICs that take their address from an IPAddressClaim, with the real
in-cluster IPAM provider (`make ipam`, capl.testbed.ipam) allocating from an InClusterIPPool
beside the test API server and the libvirt test driver.

One provider process for the module. What is checked: the claim capl makes (name, owner,
label, clusterName, poolRef), the bound address as the NIC's DHCP reservation on the
cluster network (isolated mode) and in status.addresses, an exhausted pool (condition naming
the pool, Warning Event, no domain and no identity written) that recovers when a deleted
machine's claim frees its address, the claim deleted after the domain, and an address
outside the network's CIDR refused with a clear condition and nothing made.
"""

from __future__ import annotations

import functools
import ipaddress
from typing import Any

import pytest

from capl.api import constants as c
from capl.controllers import libvirtcluster
from capl.controllers import machine as libvirtmachine
from capl.controllers.common import layout
from capl.controllers.libvirtcluster import LibvirtClusterOptions
from capl.runtime.conditions import get_condition
from capl.runtime.errors import Invalid
from capl.runtime.objects import Obj, get_path
from capl.runtime.resources import IP_ADDRESS_CLAIM, IPAM_GROUP, LIBVIRT_MACHINE, Resource
from capl.testbed.ipam import InClusterIpam
from capl.testing.harness import ControllerHarness
from capl.testing.objects import libvirt_machine_spec
from tests.controllers.conftest import events_of, leftovers
from tests.fixtures.common import eventually

pytestmark = pytest.mark.apiserver

POOL = Resource(IPAM_GROUP, "v1alpha2", "InClusterIPPool", "inclusterippools")
MACHINES = functools.partial(
    libvirtmachine.setup,
    options=libvirtmachine.MachineOptions(
        address_poll=0.2, retry_first=0.2, retry_max=1.0, orphan_sweep_interval=0
    ),
)
CLUSTERS = functools.partial(
    libvirtcluster.setup,
    options=LibvirtClusterOptions(health_interval=None, unreachable_retry=1.0, terminal_retry=5.0),
)


def _pool_nic(pool: str) -> dict[str, Any]:
    ref = {"apiGroup": IPAM_GROUP, "kind": "InClusterIPPool", "name": pool}
    return libvirt_machine_spec(networkInterfaces=[{"addressesFromPools": [ref]}])


async def _make_pool(harness: ControllerHarness, name: str, first: str, last: str) -> None:
    await harness.create(
        POOL,
        {
            "apiVersion": POOL.api_version,
            "kind": POOL.kind,
            "metadata": {"name": name, "namespace": harness.namespace},
            "spec": {"addresses": [f"{first}-{last}"], "prefix": 24},
        },
    )


def _condition(obj: Obj) -> dict[str, Any]:
    return get_condition(obj, c.ConditionType.IP_ADDRESSES_CLAIMED) or {}


def _internal_ips(obj: Obj) -> list[str]:
    return [
        str(a["address"])
        for a in get_path(obj, "status", "addresses") or []
        if a.get("type") == c.AddressType.INTERNAL_IP
    ]


async def _dhcp(harness: ControllerHarness, network: str, name: str) -> set[str]:
    info = await harness.host().get_network(network)
    assert info is not None
    return {h.ip for h in info.dhcp_hosts if h.name == name}


async def test_machines_take_addresses_from_the_pool_wait_when_exhausted_and_release(
    harness: ControllerHarness, ipam_provider: InClusterIpam
) -> None:
    cluster = await harness.make_cluster(mode="isolated")
    lay = layout(cluster.layout_model())
    net = ipaddress.IPv4Network(str(lay.cidr))
    first, second = str(net.network_address + 50), str(net.network_address + 51)
    await _make_pool(harness, "pool-a", first, second)
    await harness.start(MACHINES, CLUSTERS)

    m1 = await harness.make_machine(cluster, "ipam-1", spec=_pool_nic("pool-a"))
    ready1 = await harness.wait_ready(m1.name)
    claim = await harness.get(IP_ADDRESS_CLAIM, "ipam-1-nic0")
    assert claim is not None
    (owner,) = claim["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == (
        "LibvirtMachine",
        "ipam-1",
        ready1["metadata"]["uid"],
    )
    assert claim["metadata"]["labels"][c.CLUSTER_NAME_LABEL] == cluster.name
    assert claim["spec"]["clusterName"] == cluster.name
    assert claim["spec"]["poolRef"] == {
        "apiGroup": IPAM_GROUP,
        "kind": "InClusterIPPool",
        "name": "pool-a",
    }
    ip1 = _condition(ready1)["message"].split()[-1].split("/")[0]
    assert ip1 in (first, second)
    assert _condition(ready1)["status"] == "True"
    assert await _dhcp(harness, lay.network, "ipam-1") == {ip1}
    assert _internal_ips(ready1)[0] == ip1

    m2 = await harness.make_machine(cluster, "ipam-2", spec=_pool_nic("pool-a"))
    ready2 = await harness.wait_ready(m2.name)
    ip2 = ({first, second} - {ip1}).pop()
    assert await _dhcp(harness, lay.network, "ipam-2") == {ip2}
    assert _internal_ips(ready2)[0] == ip2

    # the pool is exhausted: the third machine waits, named pool, Warning, nothing made
    m3 = await harness.make_machine(cluster, "ipam-3", spec=_pool_nic("pool-a"))
    waiting = await harness.wait_for(
        LIBVIRT_MACHINE,
        m3.name,
        lambda o: _condition(o).get("reason") == c.Reason.POOL_EXHAUSTED,
        within=30,
        what="PoolExhausted",
    )
    message = _condition(waiting)["message"]
    assert f"InClusterIPPool {harness.namespace}/pool-a has no free address" in message
    assert "(2 of 2 in use)" in message
    assert get_path(waiting, "spec", "domainUUID") is None
    assert get_path(waiting, "spec", "hostName") is None
    assert await leftovers(harness, cluster, "ipam-3") == []
    events = await events_of(harness, m3.name)
    assert ("Warning", c.Reason.POOL_EXHAUSTED, message) in events

    # deleting the first machine frees its address (claim deleted after the domain): the
    # third one gets it and comes up
    await harness.delete_machine(m1.name)
    assert await leftovers(harness, cluster, "ipam-1") == []
    await eventually(
        lambda: _gone(harness, "ipam-1-nic0"), within=30, what="ipam-1's claim deleted"
    )
    ready3 = await harness.wait_ready(m3.name, within=60)
    assert await _dhcp(harness, lay.network, "ipam-3") == {ip1}
    assert _internal_ips(ready3)[0] == ip1

    for name in (m2.name, m3.name):
        await harness.delete_machine(name)
        await eventually(
            lambda n=name: _gone(harness, f"{n}-nic0"), within=30, what=f"{name}'s claim deleted"
        )


async def _gone(harness: ControllerHarness, claim: str) -> bool:
    return await harness.get(IP_ADDRESS_CLAIM, claim) is None


async def test_an_address_outside_the_dhcp_network_is_refused_and_nothing_is_made(
    harness: ControllerHarness, ipam_provider: InClusterIpam
) -> None:
    cluster = await harness.make_cluster(mode="isolated")
    lay = layout(cluster.layout_model())
    outside = ipaddress.IPv4Network(str(lay.cidr)).network_address + 256 * 7 + 50
    await _make_pool(harness, "pool-out", str(outside), str(outside))
    await harness.start(MACHINES, CLUSTERS)

    # ip and addressesFromPools together: refused by the API server (CEL), naming both
    both = _pool_nic("pool-out")
    both["networkInterfaces"][0]["ip"] = str(outside)
    with pytest.raises(Invalid) as raised:
        await harness.make_machine(cluster, "ipam-both", spec=both)
    assert "ip and addressesFromPools are mutually exclusive" in str(raised.value)

    m = await harness.make_machine(cluster, "ipam-out", spec=_pool_nic("pool-out"))
    refused = await harness.wait_for(
        LIBVIRT_MACHINE,
        m.name,
        lambda o: _condition(o).get("reason") == c.Reason.ADDRESS_OUTSIDE_NETWORK,
        within=30,
        what="AddressOutsideNetwork",
    )
    message = _condition(refused)["message"]
    assert f"networkInterfaces[0]: the IPAM address {outside}" in message
    assert f"outside the cluster network {lay.network} ({lay.cidr})" in message
    assert get_path(refused, "spec", "domainUUID") is None
    assert await leftovers(harness, cluster, "ipam-out") == []
    assert any(
        t == "Warning" and r == c.Reason.ADDRESS_OUTSIDE_NETWORK
        for t, r, _ in await events_of(harness, m.name)
    )
    await harness.delete_machine(m.name)
    await eventually(lambda: _gone(harness, "ipam-out-nic0"), within=30, what="claim deleted")
