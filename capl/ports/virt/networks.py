"""Networks: libvirt networks, DHCP reservations, DNS host records, and the network part of
the ``Host`` port."""

from __future__ import annotations

import enum
import ipaddress
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Protocol

from capl.ports.virt.identity import ClusterOwner

__all__ = [
    "DhcpHost",
    "DhcpLease",
    "DnsHost",
    "HostNetworks",
    "NetworkInfo",
    "NetworkMode",
    "NetworkSpec",
]


class NetworkMode(enum.StrEnum):
    NAT = "nat"
    ISOLATED = "isolated"
    BRIDGE = "bridge"


@dataclass(frozen=True, slots=True, kw_only=True)
class NetworkSpec:
    """A libvirt network capl may create.

    NAT/isolated: ``cidr`` (IPv4) is required; the gateway is the first host address;
    ``dhcp_start``/``dhcp_end`` default to the second half of the range. Bridge mode: only
    ``bridge`` (an existing host bridge) is used; libvirt runs no DHCP/DNS there.
    """

    name: str
    mode: NetworkMode
    owner: ClusterOwner
    cidr: str | None = None
    dhcp_start: str | None = None
    dhcp_end: str | None = None
    dns_domain: str | None = None
    bridge: str | None = None
    """Bridge-mode: the existing bridge. NAT/isolated: an optional name for the new bridge."""
    mtu: int | None = None

    def network(self) -> ipaddress.IPv4Network | None:
        return ipaddress.IPv4Network(self.cidr, strict=False) if self.cidr else None


@dataclass(frozen=True, slots=True, kw_only=True)
class DhcpHost:
    mac: str
    ip: str
    name: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class DnsHost:
    ip: str
    hostnames: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class NetworkInfo:
    name: str
    uuid: str
    mode: NetworkMode | None
    """None for forward modes capl does not create (route, open, hostdev, ...)."""
    forward_mode: str
    bridge: str | None
    active: bool
    persistent: bool
    autostart: bool
    cidr: str | None
    gateway: str | None
    dhcp_start: str | None
    dhcp_end: str | None
    dns_domain: str | None
    dhcp_hosts: tuple[DhcpHost, ...]
    dns_hosts: tuple[DnsHost, ...]
    owner: ClusterOwner | None
    """The capl owner tag, None when capl did not create the network."""
    created: bool = False
    """True when this very ``ensure_network`` call created the network."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DhcpLease:
    mac: str
    ip: str
    prefix: int
    hostname: str | None
    expiry_time: int
    """Unix seconds; 0 when unknown."""


class HostNetworks(Protocol):
    """The network operations of a ``Host``."""

    async def ensure_network(self, spec: NetworkSpec, *, adopt: bool = False) -> NetworkInfo:
        """Create (persistent, autostarted, started) or adopt by name.

        ``adopt=True``: the network must exist; it is never changed (only started when
        inactive). ``adopt=False``: an existing network must carry this owner's tag, else
        ForeignObjectError. Before creating, the CIDR is checked against every other
        network on the host (NetworkOverlap) and a bridge-mode bridge must exist
        (BridgeNotFound); a failed start leaves nothing defined."""
        ...

    async def get_network(self, name: str) -> NetworkInfo | None: ...

    async def network_cidrs(self) -> list[str]:
        """The IPv4 CIDR of every network defined on the host (active or not, whoever owns
        it; networks without IPv4 are left out): what ``ensure_network`` checks a new CIDR
        against."""
        ...

    async def delete_network(self, *, name: str, owner: ClusterOwner) -> bool:
        """Destroy + undefine if tagged with ``owner``; untagged/foreign: left alone, False."""
        ...

    async def ensure_dhcp_host(
        self,
        *,
        network: str,
        mac: str,
        name: str | None = None,
        ip: str | None = None,
        exclude: Collection[str] = (),
        dns_hostnames: Sequence[str] = (),
    ) -> DhcpHost:
        """Reserve an address for ``mac`` (LIVE|CONFIG). Already reserved for this MAC: that
        reservation is returned (a different explicit ``ip`` raises AddressConflict). With
        ``ip=None`` a free address of the DHCP range is picked: not reserved, not leased,
        not in ``exclude`` (addresses recorded in API objects). ``exclude`` is not copied:
        the host asks it ``in`` on a worker thread while it picks, so a live read-only view
        fits. Serialized per network.

        ``dns_hostnames`` are merged into the DNS host record of the reserved address in
        the same locked read-modify-write (as ``add_dns_hostnames`` would), but only when the
        reservation carries ``name``: a reservation found under another name is returned
        untouched."""
        ...

    async def remove_dhcp_host(self, *, network: str, mac: str) -> bool: ...

    async def add_dns_hostnames(
        self, *, network: str, ip: str, hostnames: Sequence[str]
    ) -> DnsHost:
        """Merge ``hostnames`` into the DNS host record of ``ip`` (libvirt keeps one record
        per IP). LIVE|CONFIG; serialized per network."""
        ...

    async def remove_dns_hostnames(
        self, *, network: str, ip: str, hostnames: Sequence[str] | None = None
    ) -> bool:
        """Drop ``hostnames`` (None: all) from the record of ``ip``; the record is removed
        when no name is left (deleted by IP, which works with shared hostnames)."""
        ...

    async def dhcp_leases(self, *, network: str) -> list[DhcpLease]: ...

    async def find_free_ip(self, *, network: str, exclude: Collection[str] = ()) -> str: ...
