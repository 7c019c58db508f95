"""Networks through the adapter on the real libvirtd: DHCP/DNS entries take effect in the
network's dnsmasq at once (resolved with a DNS query to the bridge address) and persist in
the network's config; overlaps and missing bridges are refused with nothing left behind."""

from __future__ import annotations

import ipaddress
import secrets
from collections.abc import Iterator

import dns.message
import dns.query
import dns.rcode
import dns.rdatatype
import libvirt
import pytest

from capl.ports.errors import BridgeNotFound, NetworkOverlap, VirtError
from capl.ports.virt import ClusterOwner, NetworkInfo, NetworkMode, NetworkSpec
from capl.virt import LibvirtHost
from tests.fixtures.libvirt_direct import remove_network

pytestmark = pytest.mark.libvirtd

DOMAIN = "capl-test.internal"


@pytest.fixture
def network_names(libvirtd_conn: libvirt.virConnect) -> Iterator[list[str]]:
    names: list[str] = []
    yield names
    for name in names:
        remove_network(libvirtd_conn, name)


async def _create(
    host: LibvirtHost, names: list[str], owner: ClusterOwner, **spec: object
) -> NetworkInfo:
    """An isolated network on a random free 10.x.y.0/24 (retried when in use)."""
    last: Exception | None = None
    for _ in range(10):
        suffix = secrets.token_hex(3)
        name = "capl-test-" + suffix
        names.append(name)
        cidr = f"10.{150 + secrets.randbelow(100)}.{secrets.randbelow(256)}.0/24"
        try:
            return await host.ensure_network(
                NetworkSpec(
                    name=name,
                    mode=NetworkMode.ISOLATED,
                    owner=owner,
                    cidr=cidr,
                    dns_domain=DOMAIN,
                    bridge="capl-t" + suffix,
                    **spec,  # type: ignore[arg-type]
                )
            )
        except (NetworkOverlap, VirtError) as exc:
            last = exc
    raise AssertionError(f"no free test network: {last}")


def _resolve(server: str, name: str) -> tuple[int, set[str]]:
    query = dns.message.make_query(name, dns.rdatatype.A)
    answer = dns.query.udp(query, server, timeout=5)
    return answer.rcode(), {str(item) for rrset in answer.answer for item in rrset}


async def test_dhcp_and_dns_entries_resolve_and_persist(
    host: LibvirtHost, network_names: list[str], libvirtd_conn: libvirt.virConnect
) -> None:
    owner = ClusterOwner(namespace="capl-test", name="c-" + secrets.token_hex(3))
    net = await _create(host, network_names, owner)
    assert net.created
    assert net.active
    assert net.persistent
    assert net.autostart
    assert net.gateway is not None
    gateway = net.gateway
    first = await host.ensure_dhcp_host(network=net.name, mac="52:54:00:10:00:01", name="cp-0")
    second = await host.ensure_dhcp_host(network=net.name, mac="52:54:00:10:00:02", name="cp-1")
    await host.add_dns_hostnames(
        network=net.name, ip=first.ip, hostnames=["cp-0", "api", "api-int"]
    )
    await host.add_dns_hostnames(
        network=net.name, ip=second.ip, hostnames=["cp-1", "api", "api-int"]
    )

    assert _resolve(gateway, f"cp-0.{DOMAIN}") == (dns.rcode.NOERROR, {first.ip})
    assert _resolve(gateway, f"api.{DOMAIN}") == (dns.rcode.NOERROR, {first.ip, second.ip})

    config = libvirtd_conn.networkLookupByName(net.name).XMLDesc(libvirt.VIR_NETWORK_XML_INACTIVE)
    for needle in (f"ip='{first.ip}'", "52:54:00:10:00:02", "<hostname>api-int</hostname>"):
        assert needle in config  # survives a host reboot

    # cp-1 goes away: its record and reservation are removed; api keeps cp-0 only
    assert await host.remove_dns_hostnames(network=net.name, ip=second.ip)
    assert await host.remove_dhcp_host(network=net.name, mac="52:54:00:10:00:02")
    assert _resolve(gateway, f"api.{DOMAIN}") == (dns.rcode.NOERROR, {first.ip})
    assert _resolve(gateway, f"cp-1.{DOMAIN}")[0] == dns.rcode.NXDOMAIN
    # api leaves cp-0 while cp-0 keeps its own name
    assert await host.remove_dns_hostnames(
        network=net.name, ip=first.ip, hostnames=["api", "api-int"]
    )
    assert _resolve(gateway, f"api.{DOMAIN}")[0] == dns.rcode.NXDOMAIN
    assert _resolve(gateway, f"cp-0.{DOMAIN}") == (dns.rcode.NOERROR, {first.ip})

    assert await host.delete_network(name=net.name, owner=owner)
    assert await host.get_network(net.name) is None


async def test_free_address_skips_reservations_and_recorded_addresses(
    host: LibvirtHost, network_names: list[str]
) -> None:
    owner = ClusterOwner(namespace="capl-test", name="c-" + secrets.token_hex(3))
    net = await _create(host, network_names, owner)
    assert net.dhcp_start is not None
    start = ipaddress.IPv4Address(net.dhcp_start)
    await host.ensure_dhcp_host(network=net.name, mac="52:54:00:10:01:01")
    free = await host.find_free_ip(network=net.name, exclude=[str(start + 1)])
    assert free == str(start + 2)
    assert await host.dhcp_leases(network=net.name) == []
    assert await host.delete_network(name=net.name, owner=owner)


async def test_overlapping_cidr_and_missing_bridge_are_refused(
    host: LibvirtHost, network_names: list[str]
) -> None:
    owner = ClusterOwner(namespace="capl-test", name="c-" + secrets.token_hex(3))
    net = await _create(host, network_names, owner)
    assert net.cidr is not None
    inner = list(ipaddress.IPv4Network(net.cidr).subnets(new_prefix=26))[1]
    clash = "capl-test-" + secrets.token_hex(3)
    network_names.append(clash)
    with pytest.raises(NetworkOverlap) as info:
        await host.ensure_network(
            NetworkSpec(name=clash, mode=NetworkMode.NAT, owner=owner, cidr=str(inner))
        )
    assert info.value.other_network == net.name
    assert net.name in str(info.value)
    assert await host.get_network(clash) is None

    bridged = "capl-test-" + secrets.token_hex(3)
    network_names.append(bridged)
    with pytest.raises(BridgeNotFound, match="capl-nobr0"):
        await host.ensure_network(
            NetworkSpec(name=bridged, mode=NetworkMode.BRIDGE, owner=owner, bridge="capl-nobr0")
        )
    assert await host.get_network(bridged) is None


async def test_bridge_mode_onto_an_existing_bridge(
    host: LibvirtHost, network_names: list[str]
) -> None:
    owner = ClusterOwner(namespace="capl-test", name="c-" + secrets.token_hex(3))
    net = await _create(host, network_names, owner)  # its bridge is a real host bridge
    assert net.bridge is not None
    name = "capl-test-" + secrets.token_hex(3)
    network_names.append(name)
    bridged = await host.ensure_network(
        NetworkSpec(name=name, mode=NetworkMode.BRIDGE, owner=owner, bridge=net.bridge)
    )
    assert bridged.mode is NetworkMode.BRIDGE
    assert bridged.bridge == net.bridge
    assert await host.delete_network(name=name, owner=owner)


async def test_adopted_network_is_untouched(
    host: LibvirtHost, libvirt_bed: object, libvirtd_conn: libvirt.virConnect
) -> None:
    name = libvirt_bed.name  # type: ignore[attr-defined]
    network = libvirtd_conn.networkLookupByName(name)
    before = network.XMLDesc(libvirt.VIR_NETWORK_XML_INACTIVE)
    owner = ClusterOwner(namespace="capl-test", name="adopter")
    adopted = await host.ensure_network(
        NetworkSpec(name=name, mode=NetworkMode.ISOLATED, owner=owner), adopt=True
    )
    assert adopted.owner is None
    # capl adds and removes its own entries ...
    entry = await host.ensure_dhcp_host(network=name, mac="52:54:00:10:02:01", name="w-0")
    await host.add_dns_hostnames(network=name, ip=entry.ip, hostnames=["w-0"])
    await host.remove_dns_hostnames(network=name, ip=entry.ip)
    await host.remove_dhcp_host(network=name, mac="52:54:00:10:02:01")
    # ... and never removes the network
    assert not await host.delete_network(name=name, owner=owner)
    assert network.XMLDesc(libvirt.VIR_NETWORK_XML_INACTIVE) == before
