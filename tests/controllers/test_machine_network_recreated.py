"""A cluster network re-created under Ready machines: their DHCP reservations (same MAC,
same address) and DNS records come back, driven by the LibvirtCluster's recorded network
UUID; a settled machine whose network keeps its UUID makes no libvirt write."""

from __future__ import annotations

import functools
import ipaddress

import pytest

from capl.controllers import libvirtcluster
from capl.controllers import machine as libvirtmachine
from capl.controllers.common import layout
from capl.controllers.libvirtcluster import LibvirtClusterOptions
from capl.controllers.machine.plan import nic_mac
from capl.ports.virt import ClusterOwner
from capl.runtime.objects import Obj, ObjectKey, get_path
from capl.runtime.resources import LIBVIRT_CLUSTER, LIBVIRT_MACHINE
from capl.testing.harness import ClusterObjects, ControllerHarness
from capl.testing.objects import libvirt_machine_spec
from tests.controllers.conftest import events_of
from tests.fixtures.runtime import eventually

pytestmark = pytest.mark.apiserver

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
WRITES = ("update", "define", "create", "destroy", "undefine", "setAutostart", "setMetadata")


def _network_uuid(obj: Obj) -> str | None:
    hosts = get_path(obj, "status", "hosts") or []
    return next((str(h["networkUUID"]) for h in hosts if h.get("networkUUID")), None)


def _writes(harness: ControllerHarness) -> dict[str, int]:
    return {
        method: n
        for methods in harness.hosts.calls.snapshot().values()
        for method, n in methods.items()
        if method.split(".")[-1].startswith(WRITES)
    }


async def test_reservations_and_dns_come_back_after_the_network_is_recreated(
    harness: ControllerHarness,
) -> None:
    cluster = await harness.make_cluster(dns_domain="rn.example")
    lay = layout(cluster.layout_model())
    cidr = ipaddress.IPv4Network(str(lay.cidr))
    fixed_ip = str(cidr.network_address + 200)
    host = harness.host()
    # the machine's first derived MAC is taken: its domain gets the fallback (attempt 1)
    taken = nic_mac(
        cluster=cluster.name, namespace=harness.namespace, name="m1", index=0, attempt=0
    )
    await host.ensure_dhcp_host(network=lay.network, mac=taken, name="someone-else")
    await harness.start(MACHINES, CLUSTERS)
    lc_name = str(cluster.libvirt_cluster["metadata"]["name"])
    lc = await harness.wait_for(
        LIBVIRT_CLUSTER, lc_name, lambda o: _network_uuid(o) is not None, what="networkUUID"
    )
    first_uuid = _network_uuid(lc)
    m = await harness.make_machine(cluster, "m1", spec=_spec_with_ip(fixed_ip))
    await harness.wait_ready(m.name)
    await harness.wait_for(
        LIBVIRT_MACHINE, m.name, lambda o: get_path(o, "status", "networkUUID") == first_uuid
    )
    fallback = nic_mac(
        cluster=cluster.name, namespace=harness.namespace, name="m1", index=0, attempt=1
    )
    before = await _entries(harness, lay.network)
    assert before == ({(fallback, fixed_ip, "m1")}, {(fixed_ip, ("m1.rn.example",))})

    # settled, network unchanged: a cluster reconcile changes nothing, no libvirt write
    clusters = await harness.settle(libvirtcluster.CONTROLLER_NAME)
    machines = await harness.settle(libvirtmachine.CONTROLLER_NAME)
    reconciles = machines.reconciles
    api_writes = harness.writes(LIBVIRT_MACHINE, m.name)
    harness.hosts.calls.reset()
    done = clusters.reconciles
    clusters.enqueue(ObjectKey(harness.namespace, lc_name))
    await eventually(lambda: clusters.reconciles > done, within=30, message="cluster reconciled")
    await harness.settle(libvirtcluster.CONTROLLER_NAME)
    await harness.settle(libvirtmachine.CONTROLLER_NAME)
    assert _writes(harness) == {}
    assert machines.reconciles == reconciles
    assert harness.writes(LIBVIRT_MACHINE, m.name) == api_writes

    # 1. re-created out of band (destroyed, defined again empty): the cluster controller
    # finds a new UUID, the machine restores its entries
    assert await host.delete_network(name=lay.network, owner=_owner(harness, cluster))
    await harness.prepare_hosts(cluster, base_image=False)
    assert await _entries(harness, lay.network) == (set(), set())
    second_uuid = await _recorded_after_reconcile(harness, lc_name, first_uuid)
    await harness.wait_for(
        LIBVIRT_MACHINE, m.name, lambda o: get_path(o, "status", "networkUUID") == second_uuid
    )
    dhcp, dns = await _entries(harness, lay.network)
    assert dhcp == {(fallback, fixed_ip, "m1")}
    assert (fixed_ip, ("m1.rn.example",)) in dns
    assert any(
        why == libvirtmachine.NETWORK_RESTORED_REASON and fixed_ip in message
        for _, why, message in await events_of(harness, m.name)
    )

    # 2. destroyed out of band: the cluster controller re-creates it, same outcome
    assert await host.delete_network(name=lay.network, owner=_owner(harness, cluster))
    third_uuid = await _recorded_after_reconcile(harness, lc_name, second_uuid)
    await harness.wait_for(
        LIBVIRT_MACHINE, m.name, lambda o: get_path(o, "status", "networkUUID") == third_uuid
    )
    dhcp, dns = await _entries(harness, lay.network)
    assert dhcp == {(fallback, fixed_ip, "m1")}
    assert (fixed_ip, ("m1.rn.example",)) in dns


def _spec_with_ip(ip: str) -> dict[str, object]:
    return libvirt_machine_spec(networkInterfaces=[{"ip": ip}])


def _owner(harness: ControllerHarness, cluster: ClusterObjects) -> ClusterOwner:
    lc = cluster.libvirt_cluster
    return ClusterOwner(namespace=harness.namespace, name=str(lc["metadata"]["name"]))


async def _entries(
    harness: ControllerHarness, network: str
) -> tuple[set[tuple[str, str, str | None]], set[tuple[str, tuple[str, ...]]]]:
    info = await harness.host().get_network(network)
    assert info is not None
    dhcp = {(h.mac, h.ip, h.name) for h in info.dhcp_hosts if h.name != "someone-else"}
    dns = {(d.ip, d.hostnames) for d in info.dns_hosts if "api" not in d.hostnames[0]}
    return dhcp, dns


async def _recorded_after_reconcile(
    harness: ControllerHarness, lc_name: str, previous: str | None
) -> str:
    """Stand in for the cluster's health interval: reconcile it now; the new network UUID
    it records."""
    harness.controller(libvirtcluster.CONTROLLER_NAME).enqueue(
        ObjectKey(harness.namespace, lc_name)
    )
    lc = await harness.wait_for(
        LIBVIRT_CLUSTER,
        lc_name,
        lambda o: _network_uuid(o) not in (None, previous),
        what="a new networkUUID",
    )
    found = _network_uuid(lc)
    assert found is not None
    return found
