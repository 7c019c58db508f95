"""The LibvirtCluster controller against the real libvirtd (and the real apiserver).

What only the real daemon shows: networks with a bridge and a running dnsmasq that answers
the endpoint records (queried over DNS at the network's gateway address from the host), pool
directories on disk, two URIs that reach one daemon, an adopted network left byte-for-byte as
it was, and the real failures (overlapping CIDR, missing bridge, a pool directory that cannot
be created). Networks are isolated: no traffic leaves the machine.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import dns.asyncquery
import dns.message
import dns.rdatatype
import libvirt
import pytest

from capl.api import constants as c
from capl.runtime.objects import get_path
from capl.runtime.resources import LIBVIRT_CLUSTER
from capl.testing.harness import ControllerHarness
from capl.testing.objects import BRIDGE_ENDPOINT
from tests.controllers.conftest import harness
from tests.controllers.test_cluster_support import (
    cached,
    clusters,
    condition_of,
    create_cluster,
    create_machine,
    delete_machine,
    has_condition,
    random_cidr,
    settle,
    unique,
    wait_condition,
    wait_provisioned,
)
from tests.fixtures.common import eventually
from tests.fixtures.libvirt import LibvirtBed

__all__ = ["clusters", "harness"]  # fixtures used by this module

pytestmark = [pytest.mark.apiserver, pytest.mark.libvirtd]

URI = "qemu:///system"
SECOND_URI = "qemu+unix:///system"  # the same daemon through another URI (another host id)
UNREACHABLE_URI = "qemu+unix:///session?socket=/nonexistent/capl-test.sock"


@pytest.fixture
def real(clusters: ControllerHarness, libvirtd_uri: str) -> ControllerHarness:
    """The running cluster controller, with the real daemon required."""
    return clusters


def isolated(cidr: str, *hosts: tuple[str, str]) -> dict[str, object]:
    return {
        "hosts": [{"name": name, "uri": uri} for name, uri in hosts or (("kvm1", URI),)],
        "network": {"mode": "isolated", "cidr": cidr},
    }


def exists(path: Path) -> bool:
    return path.exists()


def is_dir(path: Path) -> bool:
    return path.is_dir()


def entries(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir())


async def resolve(server: str, name: str) -> set[str]:
    """A records of `name` as dnsmasq at `server` answers them (empty on NXDOMAIN)."""
    query = dns.message.make_query(name, dns.rdatatype.A)
    response = await dns.asyncquery.udp(query, server, timeout=2.0)
    return {item.address for rrset in response.answer for item in rrset}


async def resolves_to(server: str, name: str, wanted: set[str], *, within: float = 15.0) -> None:
    deadline = time.monotonic() + within
    got: set[str] = set()
    while time.monotonic() < deadline:
        got = await resolve(server, name)
        if got == wanted:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{name} @ {server}: {sorted(got)}, wanted {sorted(wanted)}")


def endpoint_message(h: ControllerHarness, name: str) -> str:
    cond = condition_of(cached(h, name), c.ConditionType.CONTROL_PLANE_ENDPOINT_READY)
    return str(cond.get("message"))


async def test_network_pool_endpoint_and_dns_follow_machines(
    real: ControllerHarness, libvirtd_conn: libvirt.virConnect
) -> None:
    h = real
    name = unique("c")
    cidr = random_cidr()
    base = cidr.rsplit(".", 1)[0]
    await create_cluster(h, name, isolated(cidr))
    other = await create_cluster(h, unique("o"), isolated(random_cidr()))
    for each in (name, other):
        await wait_condition(h, each, c.ConditionType.READY, "True", within=60)
    obj = await wait_provisioned(h, name)
    spec, status = obj["spec"], obj["status"]
    domain = spec["network"]["dnsDomain"]
    assert spec["controlPlaneEndpoint"] == {"host": f"api.{domain}", "port": 6443}
    [fd] = status["failureDomains"]
    assert fd["name"] == "kvm1"
    assert fd["controlPlane"] is True
    assert fd["attributes"]["uri"] == URI
    assert fd["attributes"]["cpus"] == str(libvirtd_conn.getInfo()[2])
    assert fd["attributes"]["memoryMiB"] == str(libvirtd_conn.getInfo()[1])
    assert fd["attributes"]["libvirtVersion"].count(".") == 2
    # the network: isolated, persistent, autostarted, with its bridge and DNS domain
    network = libvirtd_conn.networkLookupByName(spec["network"]["name"])
    assert network.isActive()
    assert network.isPersistent()
    assert network.autostart()
    xml = network.XMLDesc(0)
    assert "<forward" not in xml
    assert f"<domain name='{domain}' localOnly='yes'/>" in xml
    assert status["hosts"][0]["bridge"] == network.bridgeName()
    # the pool: a directory holding capl's owner marker
    pool_path = Path(spec["storagePool"]["path"])
    assert is_dir(pool_path)
    assert exists(pool_path / f".capl-owner.{h.namespace}.{name}")
    pool = libvirtd_conn.storagePoolLookupByName(spec["storagePool"]["name"])
    assert pool.isActive()
    assert pool.autostart()
    # the other cluster's network coexists on the same host
    other_network = (cached(h, other) or {})["spec"]["network"]["name"]
    assert libvirtd_conn.networkLookupByName(other_network).isActive()

    # endpoint records follow the control-plane machines (addresses written as the machine
    # controller would; with real guests: test_cluster_guests.py)
    gateway = f"{base}.1"
    await create_machine(h, "cp1", cluster=name, control_plane=True, addresses=[f"{base}.10"])
    await create_machine(h, "cp2", cluster=name, control_plane=True, addresses=[f"{base}.11"])
    await create_machine(h, "w1", cluster=name, control_plane=False, addresses=[f"{base}.12"])
    both = {f"{base}.10", f"{base}.11"}
    await resolves_to(gateway, f"api.{domain}", both)
    await resolves_to(gateway, f"api-int.{domain}", both)
    await resolves_to(gateway, "api", both)
    await delete_machine(h, "cp1")
    await resolves_to(gateway, f"api.{domain}", {f"{base}.11"})
    await resolves_to(gateway, f"api-int.{domain}", {f"{base}.11"})
    # the records are persistent config too (they survive a host reboot)
    inactive = network.XMLDesc(libvirt.VIR_NETWORK_XML_INACTIVE)
    assert f"<host ip='{base}.11'>" in inactive
    assert f"<host ip='{base}.10'>" not in inactive

    # delete: waits for the machines, then the network and the pool go
    await h.delete(LIBVIRT_CLUSTER, name)
    await h.wait_for(
        LIBVIRT_CLUSTER,
        name,
        lambda o: (
            "waiting for 2 LibvirtMachine(s)"
            in str(condition_of(o, c.ConditionType.READY).get("message"))
        ),
        what="deletion waiting for the machines",
    )
    await delete_machine(h, "cp2")
    await delete_machine(h, "w1")
    await h.wait_gone(LIBVIRT_CLUSTER, name, within=60)
    networks = libvirtd_conn.listNetworks() + libvirtd_conn.listDefinedNetworks()
    assert spec["network"]["name"] not in networks
    pools = libvirtd_conn.listStoragePools() + libvirtd_conn.listDefinedStoragePools()
    assert spec["storagePool"]["name"] not in pools
    assert not exists(pool_path)
    assert other_network in networks


async def test_two_uris_of_one_daemon_and_an_unreachable_host(
    real: ControllerHarness, libvirtd_conn: libvirt.virConnect, libvirt_bed: LibvirtBed
) -> None:
    h = real
    # several hosts: bridge mode (a created nat/isolated network on several hosts is
    # refused), onto a bridge that exists on this host: the test network's
    name = await create_cluster(
        h,
        unique("fd"),
        {
            "hosts": [
                {"name": "kvm-a", "uri": URI},
                {"name": "kvm-b", "uri": SECOND_URI, "controlPlane": False},
                {"name": "kvm-c", "uri": UNREACHABLE_URI, "controlPlane": False},
            ],
            "network": {"mode": "bridge", "bridge": libvirt_bed.bridge},
            "controlPlaneEndpoint": dict(BRIDGE_ENDPOINT),
        },
    )
    cond = await wait_condition(h, name, c.ConditionType.HOSTS_REACHABLE, "False", within=60)
    assert cond["reason"] == c.Reason.UNREACHABLE
    assert "kvm-c (qemu+unix:///session)" in cond["message"]
    assert "kvm-a" not in cond["message"]
    assert "kvm-b" not in cond["message"]
    await wait_condition(h, name, c.ConditionType.NETWORK_READY, "True", within=60)
    obj = await wait_provisioned(h, name)
    domains = {d["name"]: d for d in obj["status"]["failureDomains"]}
    assert sorted(domains) == ["kvm-a", "kvm-b"]
    assert domains["kvm-a"]["attributes"]["uri"] == URI
    assert domains["kvm-b"]["attributes"]["uri"] == SECOND_URI
    assert domains["kvm-b"]["controlPlane"] is False
    assert domains["kvm-a"]["attributes"]["cpus"] == domains["kvm-b"]["attributes"]["cpus"]
    network = obj["spec"]["network"]["name"]
    assert libvirtd_conn.networkLookupByName(network).isActive()
    # kvm-c never held anything of the cluster: it does not block the deletion
    await h.delete(LIBVIRT_CLUSTER, name)
    await h.wait_gone(LIBVIRT_CLUSTER, name, within=60)
    assert network not in libvirtd_conn.listNetworks() + libvirtd_conn.listDefinedNetworks()


async def test_adopted_network_is_untouched(
    real: ControllerHarness, libvirt_bed: LibvirtBed
) -> None:
    h = real
    assert libvirt_bed.network is not None
    live_before = libvirt_bed.network.XMLDesc(0)
    config_before = libvirt_bed.network.XMLDesc(libvirt.VIR_NETWORK_XML_INACTIVE)
    name = await create_cluster(
        h,
        unique("adopt"),
        {"hosts": [{"name": "kvm1", "uri": URI}], "network": {"name": libvirt_bed.name}},
    )
    obj = await h.wait_for(
        LIBVIRT_CLUSTER,
        name,
        lambda o: (
            get_path(o, "spec", "controlPlaneEndpoint", "host") is not None
            and has_condition(o, c.ConditionType.READY, "True")
        ),
        within=60,
        what="endpoint decided and Ready",
    )
    domain = obj["spec"]["network"]["dnsDomain"]
    assert obj["status"]["hosts"][0]["networkCreated"] is False
    base = libvirt_bed.subnet.rsplit(".", 1)[0]
    await create_machine(h, "cp1", cluster=name, control_plane=True, addresses=[f"{base}.50"])
    # the bed's network has no DNS domain of its own: dnsmasq answers the FQDN anyway
    await resolves_to(f"{base}.1", f"api.{domain}", {f"{base}.50"})
    await delete_machine(h, "cp1")
    await resolves_to(f"{base}.1", f"api.{domain}", set())
    await h.delete(LIBVIRT_CLUSTER, name)
    await h.wait_gone(LIBVIRT_CLUSTER, name, within=60)
    assert libvirt_bed.network.isActive()
    assert libvirt_bed.network.XMLDesc(0) == live_before
    assert libvirt_bed.network.XMLDesc(libvirt.VIR_NETWORK_XML_INACTIVE) == config_before


@pytest.fixture
def immutable_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory even root cannot create entries in (chattr +i)."""
    directory = tmp_path / "read-only"
    directory.mkdir()
    subprocess.run(["chattr", "+i", str(directory)], check=True)
    try:
        yield directory
    finally:
        subprocess.run(["chattr", "-i", str(directory)], check=False)


async def test_bad_input_names_the_cause_and_creates_nothing(
    real: ControllerHarness,
    libvirt_bed: LibvirtBed,
    libvirtd_conn: libvirt.virConnect,
    immutable_dir: Path,
) -> None:
    h = real

    def defined_networks() -> set[str]:
        return set(libvirtd_conn.listNetworks() + libvirtd_conn.listDefinedNetworks())

    def defined_pools() -> set[str]:
        return set(libvirtd_conn.listStoragePools() + libvirtd_conn.listDefinedStoragePools())

    async def never_left(listing: Callable[[], set[str]], name: str) -> None:
        """Not on the host once the controller is idle. A failed attempt undoes what it
        defined, but the status patch's echo brings a retry that defines it for a moment."""
        await settle(h)
        await eventually(lambda: name not in listing(), within=30, what=f"{name} left over")

    # a CIDR overlapping the bed's network
    overlap = await create_cluster(h, unique("ovl"), isolated(libvirt_bed.subnet))
    cond = await wait_condition(h, overlap, c.ConditionType.NETWORK_READY, "False", within=60)
    assert cond["reason"] == c.Reason.NETWORK_CONFLICT
    assert f"'{libvirt_bed.name}'" in cond["message"]
    await never_left(defined_networks, (cached(h, overlap) or {})["spec"]["network"]["name"])
    # a bridge that does not exist
    bridged = await create_cluster(
        h,
        unique("br"),
        {
            "hosts": [{"name": "kvm1", "uri": URI}],
            "network": {"mode": "bridge", "bridge": "capl-nobr9"},
            "controlPlaneEndpoint": {"host": "192.0.2.10", "port": 6443},
        },
    )
    cond = await wait_condition(h, bridged, c.ConditionType.NETWORK_READY, "False", within=60)
    assert cond["reason"] == c.Reason.BRIDGE_NOT_FOUND
    assert "capl-nobr9" in cond["message"]
    await never_left(defined_networks, (cached(h, bridged) or {})["spec"]["network"]["name"])
    # a pool directory that cannot be created
    pool_path = immutable_dir / "pool"
    unwritable = await create_cluster(
        h,
        unique("ro"),
        {**isolated(random_cidr()), "storagePool": {"path": str(pool_path)}},
    )
    cond = await wait_condition(h, unwritable, c.ConditionType.STORAGE_READY, "False", within=60)
    assert cond["reason"] == c.Reason.STORAGE_UNAVAILABLE
    assert str(pool_path) in cond["message"]
    await never_left(defined_pools, (cached(h, unwritable) or {})["spec"]["storagePool"]["name"])
    assert not exists(pool_path)
    assert entries(immutable_dir) == []
    for name in (overlap, bridged, unwritable):
        obj = await h.get(LIBVIRT_CLUSTER, name) or {}
        assert has_condition(obj, c.ConditionType.READY, "False")
        assert get_path(obj, "status", "initialization", "provisioned") is None
