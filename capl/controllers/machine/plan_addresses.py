"""Pure decisions about a machine's addresses.

- `merge_addresses`: status.addresses from the DHCP lease and the guest agent, the last
  known address kept while a source reports nothing;
- `restore_plan`: which reservations to make again in a re-created network: the MACs the
  domain's definition holds, the addresses the machine had;
- `internal_ips`, `recorded_ips`: the InternalIPs machines report (the controller asks an
  index of its cache instead, through `RecordedIps`: a membership test, not a copy).

No I/O, no clock (see `capl.controllers.machine.plan`).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from capl.api import constants as c
from capl.controllers.machine.plan import NicPlan
from capl.ports.virt import AddressSource, DomainNic, InterfaceAddress

__all__ = [
    "RecordedIps",
    "Restore",
    "internal_ips",
    "merge_addresses",
    "recorded_ips",
    "restore_plan",
]


def _ip_key(ip: str) -> tuple[int, int]:
    try:
        parsed = ipaddress.ip_address(ip)
    except ValueError:
        return (9, 0)
    return (parsed.version, int(parsed))


def merge_addresses(
    observed: Iterable[InterfaceAddress],
    *,
    previous: Sequence[Mapping[str, Any]] | None,
    hostname: str,
    fqdn: str | None,
) -> tuple[list[dict[str, str]], bool]:
    """status.addresses and whether an IP is known.

    InternalIP: every address the DHCP lease and the guest agent report (lease first, IPv4
    before IPv6, each once). When they report nothing (a lease being renewed, an agent
    restarting), the InternalIPs of `previous` are kept. Then Hostname and InternalDNS.
    """
    seen: dict[str, tuple[int, tuple[int, int]]] = {}
    for address in observed:
        if address.ip in seen:
            continue
        rank = 0 if address.source is AddressSource.LEASE else 1
        seen[address.ip] = (rank, _ip_key(address.ip))
    ips = sorted(seen, key=lambda ip: (seen[ip][1][0], seen[ip][0], seen[ip][1][1]))
    if not ips:
        ips = [
            str(a.get("address"))
            for a in previous or ()
            if a.get("type") == c.AddressType.INTERNAL_IP and a.get("address")
        ]
    result = [{"type": c.AddressType.INTERNAL_IP.value, "address": ip} for ip in ips]
    result.append({"type": c.AddressType.HOSTNAME.value, "address": hostname})
    if fqdn:
        result.append({"type": c.AddressType.INTERNAL_DNS.value, "address": fqdn})
    return result, bool(ips)


@dataclass(frozen=True, slots=True, kw_only=True)
class Restore:
    """One DHCP reservation to restore: the NIC, the MAC its domain uses, the address."""

    plan: NicPlan
    mac: str
    ip: str | None
    """None: no address known for this NIC (a free one is picked)."""


def restore_plan(
    plans: Sequence[NicPlan],
    nics: Sequence[DomainNic],
    *,
    network: str,
    observed: Iterable[InterfaceAddress],
    recorded: Sequence[str],
    cidr: str | None,
) -> list[Restore]:
    """The reservations of a running machine in its cluster network, to be made again after
    the network was re-created (its DHCP hosts and DNS records went with it).

    NICs pair with the domain's interfaces by position (the domain was defined from the
    same plans, in that order); the MAC is the domain's, which may be a collision fallback
    rather than the first candidate. The address, per NIC: the spec's `ip`, else what the
    lease or guest agent reports for that MAC, else the machine's recorded InternalIPs in
    the network's CIDR that no other NIC took, in order (the guest keeps its address until
    its lease runs out, so the reservation must give it the same one)."""
    net = ipaddress.IPv4Network(cidr, strict=False) if cidr else None

    def inside(ip: str) -> bool:
        try:
            address = ipaddress.ip_address(ip)
        except ValueError:
            return False
        return address.version == 4 and (net is None or address in net)

    by_mac: dict[str, str] = {}
    for address in observed:  # lease first (merge order), then agent
        if inside(address.ip):
            by_mac.setdefault(address.mac.lower(), address.ip)
    result: list[Restore] = []
    for plan, nic in zip(plans, nics, strict=False):
        if not plan.cluster_network or nic.network != network:
            continue
        result.append(Restore(plan=plan, mac=nic.mac, ip=plan.ip or by_mac.get(nic.mac)))
    taken = {r.ip for r in result if r.ip}
    spare = [ip for ip in recorded if inside(ip) and ip not in taken]
    filled: list[Restore] = []
    for item in result:
        if item.ip is None and spare:
            item = Restore(plan=item.plan, mac=item.mac, ip=spare.pop(0))
        filled.append(item)
    return filled


def internal_ips(obj: Mapping[str, Any]) -> tuple[str, ...]:
    """The InternalIP addresses a LibvirtMachine reports in status.addresses."""
    return tuple(
        str(address["address"])
        for address in (obj.get("status") or {}).get("addresses") or ()
        if address.get("type") == c.AddressType.INTERNAL_IP and address.get("address")
    )


def recorded_ips(machines: Iterable[Mapping[str, Any]], *, skip_uid: str) -> set[str]:
    """InternalIPs that other LibvirtMachines report (excluded when picking an address).
    The controller gets the same set from an index of its cache instead of scanning."""
    taken: set[str] = set()
    for obj in machines:
        if (obj.get("metadata") or {}).get("uid") == skip_uid:
            continue
        taken.update(internal_ips(obj))
    return taken


class RecordedIps(Collection[str]):
    """The InternalIPs other machines report, answered from a live index by address
    (`taken`) less the addresses only this machine holds (`own`), plus those `add`ed here.

    A reservation only asks "is this address taken?" of a few candidates: copying every
    machine's addresses into a set for it was O(machines) per machine created. The view
    is read where the host picks the address (a worker thread): a dict look-up there is
    atomic, and an address recorded meanwhile is seen, not missed."""

    __slots__ = ("_added", "_own", "_taken")

    def __init__(self, taken: Mapping[str, object], own: Iterable[str] = ()) -> None:
        self._taken = taken
        self._own = frozenset(own)
        self._added: set[str] = set()

    def add(self, ip: str) -> None:
        self._added.add(ip)

    def __contains__(self, ip: object) -> bool:
        return ip in self._added or (ip in self._taken and ip not in self._own)

    def __iter__(self) -> Iterator[str]:
        seen = [ip for ip in list(self._taken) if ip not in self._own]
        return iter(seen + sorted(self._added.difference(seen)))

    def __len__(self) -> int:
        return sum(1 for _ in self)
