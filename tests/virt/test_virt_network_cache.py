"""The DHCP/DNS entry cache of a host's networks (capl.virt.network.NetworkCache).

The cache saves a read of the whole network per reservation; libvirt stays the source of
truth. These tests change the network behind the adapter's back through a second connection
to the same test driver (as another manager, virsh or an earlier run would) and check that no
duplicate address, lost record or leaked entry can come of a stale cache.
"""

from __future__ import annotations

import ipaddress
import secrets
import xml.etree.ElementTree as ET
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import libvirt
import pytest

from capl.ports.virt import ClusterOwner, NetworkMode, NetworkSpec
from capl.virt import LibvirtHost, LibvirtHosts
from capl.virt.network import NetworkCache

URI = "test:///default"
FLAGS = libvirt.VIR_NETWORK_UPDATE_AFFECT_LIVE | libvirt.VIR_NETWORK_UPDATE_AFFECT_CONFIG


@pytest.fixture
async def host() -> AsyncIterator[LibvirtHost]:
    registry = LibvirtHosts()
    yield registry.get(uri=URI)
    await registry.close()


@pytest.fixture
def other() -> Iterator[libvirt.virConnect]:
    """Another writer: a second connection to the same test driver."""
    conn = libvirt.open(URI)
    yield conn
    conn.close()


@pytest.fixture
async def network(host: LibvirtHost) -> AsyncIterator[str]:
    owner = ClusterOwner(namespace="ns", name="c-" + secrets.token_hex(3), uid="u")
    name = "capl-cache-" + secrets.token_hex(4)
    cidr = f"10.{secrets.randbelow(200) + 20}.{secrets.randbelow(256)}.0/24"
    await host.ensure_network(
        NetworkSpec(name=name, mode=NetworkMode.ISOLATED, owner=owner, cidr=cidr, dns_domain="c.t")
    )
    yield name
    await host.delete_network(name=name, owner=owner)


def _entries(
    conn: libvirt.virConnect, name: str
) -> tuple[list[dict[str, str]], dict[str, list[str]]]:
    root = ET.fromstring(conn.networkLookupByName(name).XMLDesc(0))
    dhcp = [dict(h.attrib) for h in root.findall("ip/dhcp/host")]
    dns = {
        h.get("ip", ""): [(n.text or "") for n in h.findall("hostname")]
        for h in root.findall("dns/host")
    }
    return dhcp, dns


def _add_dhcp(conn: libvirt.virConnect, name: str, mac: str, ip: str, host: str) -> None:
    conn.networkLookupByName(name).update(
        libvirt.VIR_NETWORK_UPDATE_COMMAND_ADD_LAST,
        libvirt.VIR_NETWORK_SECTION_IP_DHCP_HOST,
        -1,
        f"<host mac='{mac}' name='{host}' ip='{ip}'/>",
        FLAGS,
    )


def _next(ip: str, n: int = 1) -> str:
    return str(ipaddress.IPv4Address(ip) + n)


async def test_reservations_read_the_network_once(host: LibvirtHost, network: str) -> None:
    reads = host.network_cache.reads
    ips = []
    for i in range(20):
        reservation = await host.ensure_dhcp_host(
            network=network,
            mac=f"52:54:00:10:00:{i:02x}",
            name=f"m{i}",
            dns_hostnames=[f"m{i}.c.t"],
        )
        ips.append(reservation.ip)
    assert host.network_cache.reads == reads + 1
    assert len(set(ips)) == 20
    assert ips == sorted(ips, key=ipaddress.IPv4Address)  # first free address, in order
    info = await host.get_network(network)
    assert info is not None
    assert {h.ip for h in info.dhcp_hosts} == set(ips)
    assert {(d.ip, d.hostnames) for d in info.dns_hosts} == {
        (ip, (f"m{i}.c.t",)) for i, ip in enumerate(ips)
    }


async def test_address_taken_elsewhere_is_not_handed_out_twice(
    host: LibvirtHost, network: str, other: libvirt.virConnect
) -> None:
    first = await host.ensure_dhcp_host(network=network, mac="52:54:00:20:00:01", name="a")
    # another writer takes the address the cache would pick next, and gives it a DNS record
    _add_dhcp(other, network, "52:54:00:20:00:02", _next(first.ip), "b")
    other.networkLookupByName(network).update(
        libvirt.VIR_NETWORK_UPDATE_COMMAND_ADD_LAST,
        libvirt.VIR_NETWORK_SECTION_DNS_HOST,
        -1,
        f"<host ip='{_next(first.ip, 2)}'><hostname>elsewhere.c.t</hostname></host>",
        FLAGS,
    )
    mine = await host.ensure_dhcp_host(
        network=network, mac="52:54:00:20:00:03", name="c", dns_hostnames=["c.c.t"]
    )
    # neither the reserved address nor the one the other writer's DNS record names (no
    # reservation holds it: handed out, the two would share one record)
    assert mine.ip == _next(first.ip, 3)
    dhcp, dns = _entries(other, network)
    assert sorted(h["ip"] for h in dhcp) == sorted({h["ip"] for h in dhcp})  # no duplicate
    assert dns[_next(first.ip, 2)] == ["elsewhere.c.t"]  # the other writer's record untouched
    assert dns[mine.ip] == ["c.c.t"]


async def test_dns_record_made_elsewhere_is_merged_not_duplicated(
    host: LibvirtHost, network: str, other: libvirt.virConnect
) -> None:
    first = await host.ensure_dhcp_host(
        network=network, mac="52:54:00:21:00:01", name="a", dns_hostnames=["a.c.t"]
    )
    # the cache knows the network now; a record for the next address appears behind it
    other.networkLookupByName(network).update(
        libvirt.VIR_NETWORK_UPDATE_COMMAND_ADD_LAST,
        libvirt.VIR_NETWORK_SECTION_DNS_HOST,
        -1,
        f"<host ip='{_next(first.ip)}'><hostname>alias.c.t</hostname></host>",
        FLAGS,
    )
    reads = host.network_cache.reads
    second = await host.ensure_dhcp_host(
        network=network, mac="52:54:00:21:00:02", name="b", dns_hostnames=["b.c.t"]
    )
    assert second.ip == _next(first.ip)
    assert host.network_cache.reads == reads + 1  # the refused ADD made it read again
    _, dns = _entries(other, network)
    assert dns == {first.ip: ["a.c.t"], second.ip: ["alias.c.t", "b.c.t"]}


async def test_reservation_removed_elsewhere_is_made_again(
    host: LibvirtHost, network: str, other: libvirt.virConnect
) -> None:
    mac = "52:54:00:30:00:01"
    first = await host.ensure_dhcp_host(network=network, mac=mac, name="a")
    other.networkLookupByName(network).update(
        libvirt.VIR_NETWORK_UPDATE_COMMAND_DELETE,
        libvirt.VIR_NETWORK_SECTION_IP_DHCP_HOST,
        -1,
        f"<host mac='{mac}'/>",
        FLAGS,
    )
    again = await host.ensure_dhcp_host(network=network, mac=mac, name="a")
    assert again.ip == first.ip
    dhcp, _ = _entries(other, network)
    assert [h["mac"] for h in dhcp] == [mac]


async def test_removal_never_trusts_the_cache(
    host: LibvirtHost, network: str, other: libvirt.virConnect
) -> None:
    first = await host.ensure_dhcp_host(network=network, mac="52:54:00:40:00:01", name="a")
    _add_dhcp(other, network, "52:54:00:40:00:02", _next(first.ip, 5), "b")
    other.networkLookupByName(network).update(
        libvirt.VIR_NETWORK_UPDATE_COMMAND_ADD_LAST,
        libvirt.VIR_NETWORK_SECTION_DNS_HOST,
        -1,
        f"<host ip='{_next(first.ip, 5)}'><hostname>b.c.t</hostname></host>",
        FLAGS,
    )
    assert await host.remove_dhcp_host(network=network, mac="52:54:00:40:00:02")
    assert await host.remove_dns_hostnames(network=network, ip=_next(first.ip, 5))
    assert not await host.remove_dhcp_host(network=network, mac="52:54:00:40:00:02")
    dhcp, dns = _entries(other, network)
    assert [h["mac"] for h in dhcp] == ["52:54:00:40:00:01"]
    assert dns == {}


async def test_mac_reserved_elsewhere_is_reported_not_duplicated(
    host: LibvirtHost, network: str, other: libvirt.virConnect
) -> None:
    await host.find_free_ip(network=network)  # warm the cache
    info = await host.get_network(network)
    assert info is not None
    assert info.dhcp_start is not None
    _add_dhcp(other, network, "52:54:00:50:00:01", _next(info.dhcp_start, 9), "foreign")
    found = await host.ensure_dhcp_host(network=network, mac="52:54:00:50:00:01", name="mine")
    assert (found.name, found.ip) == ("foreign", _next(info.dhcp_start, 9))
    dhcp, _ = _entries(other, network)
    assert len(dhcp) == 1


async def test_released_address_is_the_next_one_picked(host: LibvirtHost, network: str) -> None:
    reservations = [
        await host.ensure_dhcp_host(network=network, mac=f"52:54:00:60:00:{i:02x}", name=f"m{i}")
        for i in range(3)
    ]
    assert await host.remove_dhcp_host(network=network, mac=reservations[1].mac)
    assert await host.find_free_ip(network=network) == reservations[1].ip
    # and an address recorded in an API object is skipped without being consumed
    assert await host.find_free_ip(network=network, exclude=[reservations[1].ip]) == _next(
        reservations[2].ip
    )


class _FakeNetwork:
    """What NetworkCache reads of a network: its live XML."""

    def __init__(self, xml: str) -> None:
        self.xml = xml
        self.reads = 0

    def XMLDesc(self, flags: int) -> str:
        self.reads += 1
        return self.xml

    def UUIDString(self) -> str:
        found = ET.fromstring(self.xml).find("uuid")
        return found.text or "" if found is not None else ""


def test_cache_entries_from_another_connection_are_read_again() -> None:
    network: Any = _FakeNetwork(
        "<network><name>n</name><ip address='10.1.0.1' netmask='255.255.255.0'><dhcp>"
        "<range start='10.1.0.100' end='10.1.0.200'/>"
        "<host mac='52:54:00:00:00:01' name='a' ip='10.1.0.100'/></dhcp></ip></network>"
    )
    cache = NetworkCache()
    first = cache.entries(network, "n", generation=1)
    assert first.fresh
    again = cache.entries(network, "n", generation=1)
    assert again is first
    assert not again.fresh
    assert network.reads == 1
    after_reconnect = cache.entries(network, "n", generation=2)
    assert after_reconnect is not first
    assert network.reads == 2
    assert after_reconnect.pick(exclude=(), leased=()) == "10.1.0.101"
    cache.drop("n")
    cache.entries(network, "n", generation=2)
    assert network.reads == 3
    # re-created (another UUID): read again although the connection is the same
    network.xml = network.xml.replace(
        "<name>n</name>", "<name>n</name><uuid>" + "1" * 32 + "</uuid>"
    )
    recreated = cache.entries(network, "n", generation=2)
    assert network.reads == 4
    assert recreated.uuid == "1" * 32
    assert cache.entries(network, "n", generation=2) is recreated
    assert cache.cached("n", generation=2, uuid="2" * 32) is None


@dataclass
class _Counted:
    """A network of its own on a host of its own registry (whose call counts a test reads)."""

    registry: LibvirtHosts
    host: LibvirtHost
    spec: NetworkSpec


@pytest.fixture
async def counted() -> AsyncIterator[_Counted]:
    registry = LibvirtHosts()
    owner = ClusterOwner(namespace="ns", name="c-" + secrets.token_hex(3), uid="u")
    cidr = f"10.{secrets.randbelow(200) + 20}.{secrets.randbelow(256)}.0/24"
    spec = NetworkSpec(
        name="capl-cache-" + secrets.token_hex(4), mode=NetworkMode.ISOLATED, owner=owner, cidr=cidr
    )
    own = _Counted(registry, registry.get(uri=URI), spec)
    try:
        yield own
    finally:
        await own.host.delete_network(name=spec.name, owner=owner)
        await registry.close()


async def test_reservations_look_the_network_up_once_per_connection_handle(
    counted: _Counted,
) -> None:
    """The network is remembered on the connection handle (counting.remembered), as pools
    are: a scale-out's reservations do not each pay a look-up by name first."""
    registry, host, spec = counted.registry, counted.host, counted.spec
    name, cidr = spec.name, str(spec.cidr)
    await host.ensure_network(spec)
    registry.calls.reset()
    for index in range(5):
        await host.ensure_dhcp_host(network=name, mac=f"52:54:00:41:00:0{index}", name=f"m{index}")
    await host.add_dns_hostnames(
        network=name, ip=str(ipaddress.ip_network(cidr)[9]), hostnames=["x.c.t"]
    )
    calls = registry.calls.snapshot()[host.host_id]
    assert calls.get("virConnect.networkLookupByName", 0) == 1
    assert calls.get("virNetwork.update", 0) == 6


async def test_network_recreated_elsewhere_drops_the_cached_entries(
    other: libvirt.virConnect, counted: _Counted
) -> None:
    """A network destroyed and defined again behind the adapter's back (new UUID) is read
    again before a decision: no address is picked from the old network's entries (which
    would cost a refused update) and the old reservations are not taken for present."""
    registry, host, spec = counted.registry, counted.host, counted.spec
    name = spec.name
    created = await host.ensure_network(spec)
    first = await host.ensure_dhcp_host(network=name, mac="52:54:00:40:00:01", name="a")
    # re-created elsewhere, empty, then someone reserves the address the cache thinks is
    # the next free one
    old = other.networkLookupByName(name)
    root = ET.fromstring(old.XMLDesc(0))
    for element in root.findall("uuid") + root.findall("ip/dhcp/host"):
        parent = root if element.tag == "uuid" else root.find("ip/dhcp")
        assert parent is not None
        parent.remove(element)
    old.destroy()
    old.undefine()
    new = other.networkDefineXML(ET.tostring(root, encoding="unicode"))
    new.create()
    assert new.UUIDString() != created.uuid
    nxt = str(ipaddress.IPv4Address(first.ip) + 1)
    new.update(
        libvirt.VIR_NETWORK_UPDATE_COMMAND_ADD_LAST,
        libvirt.VIR_NETWORK_SECTION_IP_DHCP_HOST,
        -1,
        f"<host mac='52:54:00:40:00:09' name='z' ip='{nxt}'/>",
        FLAGS,
    )
    registry.calls.reset()
    reads = host.network_cache.reads
    again = await host.ensure_dhcp_host(
        network=name, mac="52:54:00:40:00:01", name="a", ip=first.ip
    )
    third = await host.ensure_dhcp_host(network=name, mac="52:54:00:40:00:02", name="b")
    assert again.ip == first.ip
    assert third.ip not in (first.ip, nxt)
    assert host.network_cache.reads == reads + 1  # one read of the new network
    calls = registry.calls.snapshot()[host.host_id]
    assert calls.get("virNetwork.update", 0) == 2  # no refused update
    # the remembered handle named the old network: looked up again once, then kept
    assert calls.get("virConnect.networkLookupByName", 0) == 1
    dhcp, _ = _entries(other, name)
    assert sorted(h["mac"] for h in dhcp) == [
        "52:54:00:40:00:01",
        "52:54:00:40:00:02",
        "52:54:00:40:00:09",
    ]


def test_an_address_a_dns_record_names_is_not_handed_out() -> None:
    """A DNS record without a reservation (a removal interrupted between the two, or
    someone else's): a new machine given its address would share the record, and lose its
    name with it when the record is removed."""
    network: Any = _FakeNetwork(
        "<network><name>n</name><dns><host ip='10.1.0.100'><hostname>old</hostname></host>"
        "</dns><ip address='10.1.0.1' netmask='255.255.255.0'><dhcp>"
        "<range start='10.1.0.100' end='10.1.0.200'/></dhcp></ip></network>"
    )
    entries = NetworkCache().entries(network, "n", generation=1)
    assert "10.1.0.100" not in entries.by_ip
    assert entries.pick(exclude=(), leased=()) == "10.1.0.101"
