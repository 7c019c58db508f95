"""The order in which a machine's network entries are removed (deletion, rollback, clean-up)."""

from __future__ import annotations

import dataclasses
from typing import Any, cast

from capl.controllers.machine.network import default_nic, remove_network_entries
from capl.controllers.machine.plan import mac_candidates
from capl.controllers.machine.target import Identity
from capl.ports.virt import DhcpHost, DnsHost, Host, NetworkInfo, NetworkMode

IDENT = Identity.of(namespace="ns", name="m1", uid="u1", cluster="c1")
FQDN = f"{IDENT.hostname}.example"


class _Host:
    """The three network calls remove_network_entries makes, recorded in order."""

    def __init__(self, info: NetworkInfo) -> None:
        self.info = info
        self.calls: list[tuple[str, str]] = []

    async def get_network(self, name: str) -> NetworkInfo:
        return self.info

    async def remove_dhcp_host(self, *, network: str, mac: str) -> bool:
        self.calls.append(("dhcp", mac))
        return True

    async def remove_dns_hostnames(
        self, *, network: str, ip: str, hostnames: list[str] | None
    ) -> bool:
        self.calls.append(("dns", ip))
        return True


def _network(**changes: Any) -> NetworkInfo:
    info = NetworkInfo(
        name="net",
        uuid="n",
        mode=NetworkMode.ISOLATED,
        forward_mode="none",
        bridge="virbr9",
        active=True,
        persistent=True,
        autostart=True,
        cidr="10.0.0.0/24",
        gateway="10.0.0.1",
        dhcp_start="10.0.0.100",
        dhcp_end="10.0.0.200",
        dns_domain="example",
        dhcp_hosts=(),
        dns_hosts=(),
        owner=None,
    )
    return dataclasses.replace(info, **changes)


async def test_the_dns_name_goes_before_the_reservation_that_holds_its_address() -> None:
    """Interrupted between the two, the address must still be reserved: released first, it
    went to a new machine whose name then shared the left-over record and was lost with it
    (tests/chaos/test_manager_kill.py)."""
    mac = next(mac_candidates(default_nic("net"), cluster="c1", namespace="ns", name="m1"))
    host = _Host(
        _network(
            dhcp_hosts=(
                DhcpHost(mac=mac, ip="10.0.0.100", name=IDENT.hostname),
                DhcpHost(mac="52:54:00:00:00:09", ip="10.0.0.101", name="other"),
            ),
            dns_hosts=(
                DnsHost(ip="10.0.0.100", hostnames=(FQDN,)),
                DnsHost(ip="10.0.0.101", hostnames=("other.example",)),
            ),
        )
    )
    await remove_network_entries(cast(Host, host), "net", None, IDENT, FQDN)
    assert host.calls == [("dns", "10.0.0.100"), ("dhcp", mac)]
