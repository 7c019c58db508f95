"""Endpoint DNS record planning: which names, which addresses, never a foreign name."""

from __future__ import annotations

from capl.controllers.cluster_dns import (
    DnsChange,
    addresses_in_network,
    api_names,
    endpoint_host,
    plan_api_records,
)
from capl.ports.virt import DnsHost

DOMAIN = "c1.ns.capl.internal"


def test_names_on_a_network_capl_created() -> None:
    names = api_names(dns_domain=DOMAIN, network_domain=DOMAIN, exclusive=True)
    # dnsmasq's expand-hosts answers api.<domain> for the short name
    assert names.publish == ("api", "api-int")
    assert names.owned == {"api", "api-int", f"api.{DOMAIN}", f"api-int.{DOMAIN}"}
    # the network's own domain differs (or is missing): the FQDNs are published too
    other = api_names(dns_domain=DOMAIN, network_domain="other.test", exclusive=True)
    assert other.publish == ("api", "api-int", f"api.{DOMAIN}", f"api-int.{DOMAIN}")
    assert api_names(dns_domain=DOMAIN, network_domain=None, exclusive=True).publish == (
        other.publish
    )
    # case and a trailing dot do not matter
    assert api_names(
        dns_domain=DOMAIN, network_domain=DOMAIN.upper() + ".", exclusive=True
    ).publish == ("api", "api-int")


def test_names_on_an_adopted_network_are_scoped_to_the_cluster_domain() -> None:
    names = api_names(dns_domain=DOMAIN, network_domain=DOMAIN, exclusive=False)
    assert names.publish == (f"api.{DOMAIN}", f"api-int.{DOMAIN}")
    assert names.owned == set(names.publish)
    assert endpoint_host(DOMAIN) == f"api.{DOMAIN}"


def test_plan_adds_missing_names_and_keeps_machine_names() -> None:
    names = api_names(dns_domain=DOMAIN, network_domain=DOMAIN, exclusive=True)
    current = [
        DnsHost(ip="10.0.0.5", hostnames=(f"m1.{DOMAIN}",)),  # the machine controller's
        DnsHost(ip="10.0.0.6", hostnames=(f"m2.{DOMAIN}", "api")),
    ]
    changes = plan_api_records(current, ["10.0.0.6", "10.0.0.5"], names)
    assert changes == [
        DnsChange(ip="10.0.0.5", add=("api", "api-int")),
        DnsChange(ip="10.0.0.6", add=("api-int",)),
    ]


def test_plan_removes_only_owned_names_from_addresses_no_longer_wanted() -> None:
    names = api_names(dns_domain=DOMAIN, network_domain=DOMAIN, exclusive=True)
    current = [
        DnsHost(ip="10.0.0.5", hostnames=(f"m1.{DOMAIN}", "api", "api-int")),
        DnsHost(ip="10.0.0.7", hostnames=("api", "api-int", f"api.{DOMAIN}")),
        DnsHost(ip="10.0.0.9", hostnames=("printer",)),
    ]
    changes = plan_api_records(current, ["10.0.0.7"], names)
    assert changes == [
        DnsChange(ip="10.0.0.5", remove=("api", "api-int")),
        # the FQDN is not needed on this network: dropped as stale
        DnsChange(ip="10.0.0.7", remove=(f"api.{DOMAIN}",)),
    ]


def test_plan_on_a_shared_network_leaves_other_clusters_alone() -> None:
    mine = api_names(dns_domain=DOMAIN, network_domain="lan", exclusive=False)
    current = [
        DnsHost(ip="192.168.1.5", hostnames=("api", "api.c2.ns.capl.internal")),
        DnsHost(ip="192.168.1.6", hostnames=(f"api.{DOMAIN}", f"api-int.{DOMAIN}")),
    ]
    assert plan_api_records(current, [], mine) == [
        DnsChange(ip="192.168.1.6", remove=(f"api-int.{DOMAIN}", f"api.{DOMAIN}"))
    ]
    assert plan_api_records(current, ["192.168.1.6"], mine) == []


def test_plan_is_empty_when_in_sync_and_sorted_by_address() -> None:
    names = api_names(dns_domain=DOMAIN, network_domain=DOMAIN, exclusive=True)
    current = [DnsHost(ip="10.0.0.10", hostnames=("api", "api-int"))]
    assert plan_api_records(current, ["10.0.0.10"], names) == []
    changes = plan_api_records([], ["10.0.0.10", "10.0.0.9", "10.0.0.100"], names)
    assert [ch.ip for ch in changes] == ["10.0.0.9", "10.0.0.10", "10.0.0.100"]


def test_addresses_in_network() -> None:
    addresses = ["10.1.0.5", "192.168.9.1", "fe80::1", "not-an-ip", "10.1.0.5", "10.1.0.6"]
    assert addresses_in_network(addresses, "10.1.0.0/24") == ["10.1.0.5", "10.1.0.6"]
    assert addresses_in_network(addresses, None) == ["10.1.0.5", "192.168.9.1", "10.1.0.6"]
