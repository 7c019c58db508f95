"""The per-host cache of each network's DHCP hosts and DNS records (``NetworkCache``).

Reading a network means formatting and parsing its whole definition: with N machines on
a network, deciding each reservation by a fresh read costs O(N) per machine, O(N^2) for a
scale-out. So the per-host cache keeps what the last read said about each network's DHCP
hosts and DNS records, plus the changes this process made since. It is only a cache;
libvirt stays the source of truth, and a stale entry can never produce a duplicate:

- Negative answers ("this MAC/address/record is not there") are acted on directly: the
  ADD itself is the check, because libvirt refuses a DHCP host whose MAC, name or IP
  another entry has, and a second DNS record for an IP. When an update fails, the
  network is read again and the decision is taken again on that view (a few attempts),
  so another writer (a second manager, virsh, a previous run of this one) costs one
  extra read, never a duplicate.
- Positive answers ("this MAC is reserved", "this address has a record") are confirmed by
  a fresh read before anything is based on them (returning a reservation, raising a
  conflict, replacing a record), so a removal made elsewhere is never missed.
- Removals never trust the cache: a DHCP host is deleted by MAC straight away (libvirt
  says when nothing matched, then a fresh read tells "absent" from a real error); a DNS
  record is always read fresh before it is changed.
- An entry is refreshed on a miss and after any failed update, dropped when the network
  is created or deleted, and ignored after a reconnect (entries carry the connection
  generation they were read on) or when the network was re-created behind this
  process's back (entries carry the network UUID they were read from, compared with the
  handle's UUID, which costs no call). Handles are remembered per connection handle
  (``counting.remembered``): a handle from before the re-creation fails its first call on
  libvirtd's network driver, which finds networks by UUID; the test driver finds them by
  name and answers, so a read whose UUID is not the handle's raises ``NetworkNotFound``
  with libvirt's not-found code — either way the operation runs once more on a handle
  looked up afresh. A restarted manager starts with an empty cache.

An address picked from a stale cache may only skip addresses someone else released in
the meantime (they are picked up at the next refresh); the ``exclude`` set (addresses
the API objects report) and the current leases are applied on every pick, as before.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
from collections.abc import Collection
from typing import Any

import libvirt

from capl.ports.errors import AddressExhausted, NetworkNotFound
from capl.ports.virt import DhcpHost, DnsHost, NetworkInfo
from capl.virt.networkxml import parse_network_xml

__all__ = ["NetworkCache", "NetworkEntries", "uuid_of"]


def uuid_of(network: Any) -> str:
    """The handle's UUID (kept in the handle by the lookup: no call to the host)."""
    return str(network.UUIDString()).lower()


def _live(network: Any) -> NetworkInfo:
    """The live definition only (one call). Flags in the result are not meaningful.

    Transient networks are not checked here: the LIVE|CONFIG update itself fails on them
    ("cannot change persistent config of a transient network").
    """
    return parse_network_xml(str(network.XMLDesc(0)), active=True, persistent=True, autostart=False)


def _ip_int(value: str) -> int:
    return int.from_bytes(socket.inet_aton(value), "big")


def _ip_str(value: int) -> str:
    return socket.inet_ntoa(value.to_bytes(4, "big"))


class NetworkEntries:
    """What one read of a network said about its DHCP hosts and DNS records, kept up to date
    with the changes made through it since (see the module docstring: only a cache).

    ``fresh`` is true while the entries come from a read made in the running operation.
    ``_low`` is a search hint: every address of the DHCP range below it is reserved here, so
    the first free address is found without scanning the reserved prefix again.
    """

    __slots__ = (
        "_low",
        "by_ip",
        "by_mac",
        "dhcp_end",
        "dhcp_start",
        "dns",
        "fresh",
        "gateway",
        "generation",
        "name",
        "network",
        "uuid",
    )

    def __init__(self, info: NetworkInfo, *, generation: int) -> None:
        self.name = info.name
        self.uuid = info.uuid.lower()
        self.generation = generation
        self.fresh = True
        self.gateway = info.gateway
        self.network = ipaddress.IPv4Network(info.cidr) if info.cidr else None
        self.dhcp_start = _ip_int(info.dhcp_start) if info.dhcp_start else None
        self.dhcp_end = _ip_int(info.dhcp_end) if info.dhcp_end else None
        self.by_mac: dict[str, DhcpHost] = {h.mac: h for h in info.dhcp_hosts}
        self.by_ip: dict[str, DhcpHost] = {h.ip: h for h in info.dhcp_hosts}
        self.dns: dict[str, DnsHost] = {h.ip: h for h in info.dns_hosts}
        self._low = self.dhcp_start or 0

    def pick(self, *, exclude: Collection[str], leased: Collection[str]) -> str:
        """The first address of the DHCP range that is not reserved, leased, excluded, named
        by a DNS record or the gateway. (A DNS record without a reservation is a leftover or
        someone else's: a new machine's name merged into it would be lost with it.)"""
        assert self.dhcp_start is not None
        assert self.dhcp_end is not None
        by_ip, end = self.by_ip, self.dhcp_end
        low = self._low
        while low <= end and _ip_str(low) in by_ip:
            low += 1
        self._low = low
        for value in range(low, end + 1):
            candidate = _ip_str(value)
            if (
                candidate not in by_ip
                and candidate not in exclude
                and candidate not in leased
                and candidate not in self.dns
                and candidate != self.gateway
            ):
                return candidate
        raise AddressExhausted(
            f"network {self.name!r}: no free address in "
            f"{_ip_str(self.dhcp_start)}-{_ip_str(end)} "
            f"({len(by_ip)} reserved, {len(exclude)} recorded, {len(leased)} leased)"
        )

    def reserved(self, host: DhcpHost) -> None:
        self.by_mac[host.mac] = host
        self.by_ip[host.ip] = host

    def released(self, mac: str) -> None:
        host = self.by_mac.pop(mac, None)
        if host is None:
            return
        if self.by_ip.get(host.ip) is host:
            del self.by_ip[host.ip]
        try:
            value = _ip_int(host.ip)
        except OSError:
            return
        if self.dhcp_start is not None and self.dhcp_start <= value < self._low:
            self._low = value

    def set_dns(self, ip: str, record: DnsHost | None) -> None:
        if record is None:
            self.dns.pop(ip, None)
        else:
            self.dns[ip] = record


class NetworkCache:
    """Per host: network name -> ``NetworkEntries``. Each entry is only used under its
    network's lock (``LibvirtHost``), by one worker thread at a time."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._entries: dict[str, NetworkEntries] = {}
        self.reads = 0
        """Network definitions read to fill or refresh the cache (tests, diagnostics)."""

    def entries(self, network: Any, name: str, *, generation: int) -> NetworkEntries:
        """The cached entries, read from libvirt when missing or from an older connection."""
        with self._guard:
            cached = self._entries.get(name)
        if (
            cached is not None
            and cached.generation == generation
            and cached.uuid == uuid_of(network)
        ):
            cached.fresh = False
            return cached
        return self.refresh(network, name, generation=generation)

    def refresh(self, network: Any, name: str, *, generation: int) -> NetworkEntries:
        """Read the network's live definition again (one XMLDesc) and cache it."""
        entries = NetworkEntries(_live(network), generation=generation)
        if entries.uuid != uuid_of(network):  # see the module docstring
            raise NetworkNotFound(
                f"network {name!r} was re-created since this handle looked it up",
                code=libvirt.VIR_ERR_NO_NETWORK,
            )
        with self._guard:
            self.reads += 1
            self._entries[name] = entries
        return entries

    def cached(
        self, name: str, *, generation: int, uuid: str | None = None
    ) -> NetworkEntries | None:
        """The cached entries of this connection (and of the network with ``uuid`` when
        given), or None (no read)."""
        with self._guard:
            cached = self._entries.get(name)
        if cached is None or cached.generation != generation:
            return None
        if uuid is not None and cached.uuid != uuid.lower():
            return None
        return cached

    def confirmed(self, network: Any, entries: NetworkEntries) -> NetworkEntries:
        """``entries`` if read in this operation, else a fresh read (confirms a positive
        answer of the cache before acting on it)."""
        if entries.fresh:
            return entries
        return self.refresh(network, entries.name, generation=entries.generation)

    def drop(self, name: str) -> None:
        with self._guard:
            self._entries.pop(name, None)

    def clear(self) -> None:
        with self._guard:
            self._entries.clear()
