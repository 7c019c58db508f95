"""Which DHCP reservations a machine restores in a re-created network (plan_addresses.restore_plan)
and how a domain definition's NICs are read (capl.virt.domain.nics_from_xml)."""

from __future__ import annotations

from capl.controllers.machine.plan import NicPlan
from capl.controllers.machine.plan_addresses import restore_plan
from capl.ports.virt import AddressSource, DomainNic, InterfaceAddress
from capl.virt.domain import nics_from_xml


def _plan(index: int, *, cluster: bool = True, ip: str | None = None) -> NicPlan:
    return NicPlan(
        index=index, network="net", bridge=None, cluster_network=cluster, mac=None, ip=ip
    )


def test_mac_from_the_domain_address_by_mac_then_recorded() -> None:
    plans = [_plan(0), _plan(1), _plan(2, cluster=False), _plan(3, ip="10.0.0.9")]
    nics = [
        DomainNic(mac="52:54:00:00:00:0a", network="net"),
        DomainNic(mac="52:54:00:00:00:0b", network="net"),
        DomainNic(mac="52:54:00:00:00:0c", bridge="br0"),
        DomainNic(mac="52:54:00:00:00:0d", network="net"),
    ]
    observed = [
        InterfaceAddress(
            mac="52:54:00:00:00:0B", ip="10.0.0.7", prefix=24, source=AddressSource.AGENT
        ),
        InterfaceAddress(
            mac="52:54:00:00:00:0c", ip="192.168.1.5", prefix=24, source=AddressSource.AGENT
        ),
    ]
    items = restore_plan(
        plans,
        nics,
        network="net",
        observed=observed,
        recorded=["192.168.1.5", "10.0.0.7", "10.0.0.5", "fd00::1"],
        cidr="10.0.0.0/24",
    )
    assert [(i.plan.index, i.mac, i.ip) for i in items] == [
        (0, "52:54:00:00:00:0a", "10.0.0.5"),  # recorded, in the CIDR, not taken
        (1, "52:54:00:00:00:0b", "10.0.0.7"),  # reported for its MAC
        (3, "52:54:00:00:00:0d", "10.0.0.9"),  # the spec's
    ]


def test_unknown_address_is_left_to_the_host() -> None:
    items = restore_plan(
        [_plan(0)],
        [DomainNic(mac="52:54:00:00:00:0a", network="net")],
        network="net",
        observed=[],
        recorded=["192.168.122.3"],
        cidr="10.0.0.0/24",
    )
    assert [(i.mac, i.ip) for i in items] == [("52:54:00:00:00:0a", None)]


def test_nics_from_domain_xml() -> None:
    document = """<domain type='kvm'><devices>
      <interface type='network'><mac address='52:54:00:AA:00:01'/><source network='n'/></interface>
      <interface type='bridge'><mac address='52:54:00:aa:00:02'/><source bridge='br0'/></interface>
      <interface type='user'><mac address='52:54:00:aa:00:03'/></interface>
      <interface type='network'><source network='n'/></interface>
    </devices></domain>"""
    assert nics_from_xml(document) == [
        DomainNic(mac="52:54:00:aa:00:01", network="n"),
        DomainNic(mac="52:54:00:aa:00:02", bridge="br0"),
        DomainNic(mac="52:54:00:aa:00:03"),
    ]
