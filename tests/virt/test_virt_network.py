"""Networks, DHCP reservations and DNS records through the adapter on the test driver."""

from __future__ import annotations

import ipaddress
import secrets
from collections.abc import AsyncIterator
from typing import Any

import libvirt
import pytest

from capl.ports.errors import (
    AddressConflict,
    AddressExhausted,
    ForeignObjectError,
    InvalidSpec,
    NetworkNotFound,
    NetworkOverlap,
)
from capl.ports.virt import ClusterOwner, NetworkMode, NetworkSpec
from capl.virt import LibvirtHost

URI = "test:///default"


def _owner() -> ClusterOwner:
    return ClusterOwner(namespace="ns", name="c-" + secrets.token_hex(3), uid="u")


def _cidr() -> str:
    return f"10.{secrets.randbelow(200) + 20}.{secrets.randbelow(256)}.0/24"


@pytest.fixture
async def network(host: LibvirtHost) -> AsyncIterator[tuple[str, ClusterOwner]]:
    owner = _owner()
    name = "capl-test-" + secrets.token_hex(4)
    spec = NetworkSpec(
        name=name, mode=NetworkMode.ISOLATED, owner=owner, cidr=_cidr(), dns_domain="c.test"
    )
    info = await host.ensure_network(spec)
    assert info.created
    yield name, owner
    await host.delete_network(name=name, owner=owner)


async def test_create_is_idempotent_and_tagged(host: LibvirtHost) -> None:
    owner = _owner()
    name = "capl-test-" + secrets.token_hex(4)
    spec = NetworkSpec(
        name=name, mode=NetworkMode.NAT, owner=owner, cidr=_cidr(), dns_domain="x.test"
    )
    created = await host.ensure_network(spec)
    assert (created.created, created.active, created.persistent, created.autostart) == (
        True,
        True,
        True,
        True,
    )
    assert created.owner == owner
    assert created.mode is NetworkMode.NAT
    again = await host.ensure_network(spec)
    assert not again.created
    assert again.uuid == created.uuid
    # another cluster cannot take it over, and cannot delete it
    other = _owner()
    with pytest.raises(ForeignObjectError) as info:
        await host.ensure_network(
            NetworkSpec(name=name, mode=NetworkMode.NAT, owner=other, cidr=spec.cidr)
        )
    assert info.value.kind == "network"
    assert not await host.delete_network(name=name, owner=other)
    assert await host.delete_network(name=name, owner=owner)
    assert await host.get_network(name) is None
    assert not await host.delete_network(name=name, owner=owner)


async def test_adopted_network_is_left_alone(host: LibvirtHost) -> None:
    owner = _owner()
    adopted = await host.ensure_network(
        NetworkSpec(name="default", mode=NetworkMode.NAT, owner=owner), adopt=True
    )
    assert adopted.owner is None
    assert not adopted.created
    assert not await host.delete_network(name="default", owner=owner)  # not ours
    assert await host.get_network("default") is not None
    with pytest.raises(ForeignObjectError):
        await host.ensure_network(
            NetworkSpec(name="default", mode=NetworkMode.NAT, owner=owner, cidr=_cidr())
        )
    with pytest.raises(NetworkNotFound):
        await host.ensure_network(
            NetworkSpec(name="capl-test-missing", mode=NetworkMode.NAT, owner=owner), adopt=True
        )


async def test_cidr_overlap_names_the_other_network(host: LibvirtHost) -> None:
    # the test driver's "default" network is 192.168.122.0/24
    spec = NetworkSpec(
        name="capl-test-" + secrets.token_hex(4),
        mode=NetworkMode.ISOLATED,
        owner=_owner(),
        cidr="192.168.122.128/25",
    )
    with pytest.raises(NetworkOverlap) as info:
        await host.ensure_network(spec)
    assert info.value.other_network == "default"
    assert info.value.other_cidr == "192.168.122.0/24"
    assert info.value.reason == "NetworkOverlap"
    assert await host.get_network(spec.name) is None  # nothing half-created


def _raw_network(name: str, ip: str) -> str:
    """A network capl did not create (no owner tag); ``ip``: its ``<ip>`` elements."""
    return f"<network><name>{name}</name><bridge name='v{name[-8:]}'/>{ip}</network>"


async def test_network_cidrs_lists_every_defined_ipv4_network(
    host: LibvirtHost, network: tuple[str, ClusterOwner]
) -> None:
    name, owner = network
    ours = await host.get_network(name)
    assert ours is not None
    assert ours.cidr is not None
    suffix = secrets.token_hex(4)
    foreign, ipv6, bare = (f"capl-test-{kind}-{suffix}" for kind in ("foreign", "v6", "bare"))
    before = await host.network_cidrs()
    assert "192.168.122.0/24" in before  # the test driver's own "default"
    assert ours.cidr in before
    foreign_cidr = next(cidr for cidr in iter(_cidr, "") if cidr not in before)
    documents = [
        _raw_network(foreign, f"<ip address='{foreign_cidr[:-4]}1' netmask='255.255.255.0'/>"),
        _raw_network(ipv6, "<ip family='ipv6' address='fd00:c::1' prefix='64'/>"),
        _raw_network(bare, ""),
    ]

    def define(c: Any) -> None:
        for document in documents:
            c.networkDefineXML(document)  # defined, never started

    def undefine(c: Any) -> None:
        for other in (foreign, ipv6, bare):
            c.networkLookupByName(other).undefine()

    await host.connection.run("define raw networks", define)
    try:
        after = await host.network_cidrs()
    finally:
        await host.connection.run("undefine raw networks", undefine)
    # an inactive network nobody tagged counts; networks without IPv4 are left out
    assert sorted(after) == sorted([*before, foreign_cidr])
    await host.delete_network(name=name, owner=owner)
    assert ours.cidr not in await host.network_cidrs()


async def test_demo_picks_a_cidr_no_network_has(host: LibvirtHost) -> None:
    from capl.commands.demo.network import pick_network

    owner = _owner()
    name = "capl-test-" + secrets.token_hex(4)
    await host.ensure_network(
        NetworkSpec(name=name, mode=NetworkMode.ISOLATED, owner=owner, cidr="10.213.0.0/24")
    )
    try:
        picked = ipaddress.IPv4Network(await pick_network(URI, domain_type="test"))
        taken = [ipaddress.IPv4Network(cidr) for cidr in await host.network_cidrs()]
    finally:
        await host.delete_network(name=name, owner=owner)
    assert ipaddress.IPv4Network("10.213.0.0/24") in taken
    assert not any(picked.overlaps(other) for other in taken)
    assert picked.subnet_of(ipaddress.IPv4Network("10.213.0.0/16"))


async def test_dhcp_reservations(host: LibvirtHost, network: tuple[str, ClusterOwner]) -> None:
    name, _ = network
    info = await host.get_network(name)
    assert info is not None
    assert info.dhcp_start is not None
    first = await host.ensure_dhcp_host(network=name, mac="52:54:00:00:00:01", name="m1")
    assert first.ip == info.dhcp_start
    # idempotent: the same MAC keeps its address
    assert await host.ensure_dhcp_host(network=name, mac="52:54:00:00:00:01", name="m1") == first
    # the next one skips reserved addresses and those recorded in API objects
    recorded = str(ipaddress.IPv4Address(first.ip) + 1)
    second = await host.ensure_dhcp_host(
        network=name, mac="52:54:00:00:00:02", name="m2", exclude=[recorded]
    )
    assert second.ip == str(ipaddress.IPv4Address(first.ip) + 2)
    with pytest.raises(AddressConflict) as conflict:
        await host.ensure_dhcp_host(network=name, mac="52:54:00:00:00:03", ip=first.ip)
    assert conflict.value.field == "ip"
    with pytest.raises(AddressConflict):
        await host.ensure_dhcp_host(network=name, mac="52:54:00:00:00:01", ip=second.ip)
    current = await host.get_network(name)
    assert current is not None
    assert {h.mac for h in current.dhcp_hosts} == {"52:54:00:00:00:01", "52:54:00:00:00:02"}
    assert await host.remove_dhcp_host(network=name, mac="52:54:00:00:00:01")
    assert not await host.remove_dhcp_host(network=name, mac="52:54:00:00:00:01")
    assert await host.find_free_ip(network=name) == first.ip
    assert not await host.remove_dhcp_host(network="capl-test-nonexistent", mac="52:54:00:00:00:01")


async def test_address_range_exhaustion(host: LibvirtHost) -> None:
    owner = _owner()
    base = ipaddress.IPv4Network(_cidr())
    spec = NetworkSpec(
        name="capl-test-" + secrets.token_hex(4),
        mode=NetworkMode.ISOLATED,
        owner=owner,
        cidr=str(base),
        dhcp_start=str(base.network_address + 10),
        dhcp_end=str(base.network_address + 11),
    )
    await host.ensure_network(spec)
    try:
        await host.ensure_dhcp_host(network=spec.name, mac="52:54:00:00:01:01")
        with pytest.raises(AddressExhausted):
            await host.ensure_dhcp_host(
                network=spec.name, mac="52:54:00:00:01:02", exclude=[str(base.network_address + 11)]
            )
    finally:
        await host.delete_network(name=spec.name, owner=owner)


async def test_dns_records_merge_per_ip(
    host: LibvirtHost, network: tuple[str, ClusterOwner]
) -> None:
    name, _ = network
    await host.add_dns_hostnames(network=name, ip="10.0.0.5", hostnames=["m1"])
    merged = await host.add_dns_hostnames(
        network=name, ip="10.0.0.5", hostnames=["api", "api-int", "m1"]
    )
    assert merged.hostnames == ("m1", "api", "api-int")
    await host.add_dns_hostnames(network=name, ip="10.0.0.6", hostnames=["m2", "api"])
    info = await host.get_network(name)
    assert info is not None
    assert {(h.ip, h.hostnames) for h in info.dns_hosts} == {
        ("10.0.0.5", ("m1", "api", "api-int")),
        ("10.0.0.6", ("m2", "api")),
    }
    assert await host.remove_dns_hostnames(
        network=name, ip="10.0.0.5", hostnames=["api", "api-int"]
    )
    assert not await host.remove_dns_hostnames(network=name, ip="10.0.0.5", hostnames=["api"])
    assert await host.remove_dns_hostnames(network=name, ip="10.0.0.6")
    info = await host.get_network(name)
    assert info is not None
    assert [(h.ip, h.hostnames) for h in info.dns_hosts] == [("10.0.0.5", ("m1",))]
    with pytest.raises(InvalidSpec):
        await host.add_dns_hostnames(network=name, ip="10.0.0.7", hostnames=["bad name"])


async def test_updates_survive_as_persistent_config(
    host: LibvirtHost, network: tuple[str, ClusterOwner]
) -> None:
    name, _ = network
    reservation = await host.ensure_dhcp_host(network=name, mac="52:54:00:00:02:01", name="p1")
    conn = libvirt.open(URI)
    try:
        xml = conn.networkLookupByName(name).XMLDesc(0)
    finally:
        conn.close()
    assert f"ip='{reservation.ip}'" in xml
