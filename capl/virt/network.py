"""Networks, DHCP reservations and DNS host records (blocking; runs in worker threads).

- Networks are defined persistently, started and autostarted: ``AFFECT_CONFIG`` updates fail
  on transient networks, and live-only entries vanish on a host reboot (libvirt-notes.md).
- Before creating a NAT/isolated network its CIDR is compared with every other network on
  the host (active or not); a bridge-mode network needs its bridge to exist (libvirt itself
  starts a bridge-mode network on a missing bridge without complaint). A network whose start
  fails is undefined again: nothing half-created stays.
- DHCP host and DNS host updates use ``AFFECT_LIVE | AFFECT_CONFIG`` and are serialized per
  network by the caller (``LibvirtHost``'s per-network lock). libvirt keeps at most one DNS
  host record per IP, so hostnames are merged into that record (delete by ``<host ip=.../>``,
  then add); a record shared by several hostnames across IPs (round-robin ``api``) is fine
  because deletes go by IP.
- A free IP is the first address of the DHCP range that is neither reserved (DHCP hosts), nor
  leased, nor the gateway, nor in the caller's ``exclude`` set (the addresses recorded in the
  API objects): no in-process IPAM state.

The entry cache (``NetworkCache``)
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
      looked-up handle's UUID, which costs no call). A restarted manager starts with an
      empty cache.

    An address picked from a stale cache may only skip addresses someone else released in
    the meantime (they are picked up at the next refresh); the ``exclude`` set (addresses
    the API objects report) and the current leases are applied on every pick, as before.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import socket
import threading
from collections.abc import Collection, Sequence
from typing import Any

import libvirt

from capl.ports.errors import (
    AddressConflict,
    AddressExhausted,
    BridgeNotFound,
    ForeignObjectError,
    InvalidSpec,
    NetworkNotFound,
    NetworkOverlap,
    Unsupported,
    VirtError,
)
from capl.ports.naming import normalize_mac
from capl.ports.virt import (
    ClusterOwner,
    DhcpHost,
    DhcpLease,
    DnsHost,
    NetworkInfo,
    NetworkMode,
    NetworkSpec,
)
from capl.virt.errors import is_unsupported_flags
from capl.virt.networkxml import (
    address_plan,
    build_dhcp_host_match_xml,
    build_dhcp_host_xml,
    build_dns_host_match_xml,
    build_dns_host_xml,
    build_network_xml,
    check_hostname,
    parse_network_xml,
)
from capl.virt.storage import is_test_driver
from capl.virt.support import code_of, lookup

__all__ = [
    "NetworkCache",
    "NetworkEntries",
    "add_dns_hostnames",
    "delete_network",
    "dhcp_leases",
    "ensure_dhcp_host",
    "ensure_network",
    "find_free_ip",
    "get_network",
    "remove_dhcp_host",
    "remove_dns_hostnames",
]

log = logging.getLogger(__name__)

_NO_NET = libvirt.VIR_ERR_NO_NETWORK
_UPDATE_FLAGS = libvirt.VIR_NETWORK_UPDATE_AFFECT_LIVE | libvirt.VIR_NETWORK_UPDATE_AFFECT_CONFIG


def _lookup(c: Any, name: str) -> Any | None:
    return lookup(lambda: c.networkLookupByName(name), _NO_NET)


def _require(c: Any, name: str) -> Any:
    network = _lookup(c, name)
    if network is None:
        raise NetworkNotFound(f"network {name!r} does not exist")
    return network


def _uuid_of(network: Any) -> str:
    """The handle's UUID (kept in the handle by the lookup: no call to the host)."""
    return str(network.UUIDString()).lower()


def network_info(network: Any, *, created: bool = False, inactive_xml: bool = False) -> NetworkInfo:
    active = bool(network.isActive())
    info = parse_network_xml(
        network_xml(network, inactive=inactive_xml or not active),
        active=active,
        persistent=bool(network.isPersistent()),
        autostart=bool(network.autostart()),
    )
    return dataclasses.replace(info, created=True) if created else info


def network_xml(network: Any, *, inactive: bool) -> str:
    """The persistent (inactive) or live definition; the test driver knows only one."""
    if inactive:
        try:
            return str(network.XMLDesc(libvirt.VIR_NETWORK_XML_INACTIVE))
        except libvirt.libvirtError as exc:
            if not is_unsupported_flags(exc):
                raise
    return str(network.XMLDesc(0))


def get_network(c: Any, name: str) -> NetworkInfo | None:
    network = _lookup(c, name)
    return network_info(network) if network is not None else None


def _check_overlap(c: Any, spec: NetworkSpec) -> None:
    wanted = address_plan(spec).network
    for other in c.listAllNetworks(0):
        other_name = other.name()
        if other_name == spec.name:
            continue
        try:
            parsed = parse_network_xml(
                network_xml(other, inactive=True),
                active=False,
                persistent=True,
                autostart=False,
            )
        except libvirt.libvirtError as exc:
            if code_of(exc) == _NO_NET:  # went away meanwhile
                continue
            raise
        if parsed.cidr and wanted.overlaps(ipaddress.IPv4Network(parsed.cidr)):
            raise NetworkOverlap(
                f"network {spec.name!r}: CIDR {wanted} overlaps network {other_name!r} "
                f"({parsed.cidr}) on this host",
                other_network=other_name,
                other_cidr=parsed.cidr,
            )


def _check_bridge(c: Any, bridge: str) -> None:
    try:
        c.interfaceLookupByName(bridge)
    except libvirt.libvirtError as exc:
        if code_of(exc) == libvirt.VIR_ERR_NO_INTERFACE:
            raise BridgeNotFound(f"bridge {bridge!r} does not exist on the host") from exc
        if is_unsupported_flags(exc):  # no interface driver: libvirt will tell at VM start
            log.info("cannot check bridge %s on this host: %s", bridge, exc.get_error_message())
            return
        raise


def ensure_network(c: Any, spec: NetworkSpec, *, adopt: bool) -> NetworkInfo:
    network = _lookup(c, spec.name)
    if network is not None:
        info = network_info(network, inactive_xml=True)
        if adopt:
            if not network.isActive():
                network.create()
            return network_info(network)
        if info.owner is None or not info.owner.same_cluster(spec.owner):
            owner = (
                f"{info.owner.namespace}/{info.owner.name}"
                if info.owner
                else "nobody (no capl tag)"
            )
            raise ForeignObjectError(
                f"network {spec.name!r} exists and belongs to {owner}; set it to be adopted "
                "or choose another name",
                kind="network",
                name=spec.name,
            )
        if not network.isActive():
            network.create()
        if not network.autostart():
            network.setAutostart(1)
        return network_info(network)
    if adopt:
        raise NetworkNotFound(f"network {spec.name!r} to adopt does not exist")
    if spec.mode is NetworkMode.BRIDGE:
        if not spec.bridge:
            raise InvalidSpec(f"network {spec.name!r}: bridge mode needs the host bridge's name")
        _check_bridge(c, spec.bridge)
    else:
        _check_overlap(c, spec)
    xml = build_network_xml(spec)
    network = c.networkDefineXML(xml)
    try:
        network.create()
        network.setAutostart(1)
    except BaseException:
        _undo_network(network, spec.name)
        raise
    return network_info(network, created=True)


def _undo_network(network: Any, name: str) -> None:
    """Best-effort removal of a network this call defined (nothing half-created is left)."""
    try:
        if network.isActive():
            network.destroy()
    except libvirt.libvirtError as exc:
        log.warning("cleanup of network %s: %s", name, exc.get_error_message())
    try:
        network.undefine()
    except libvirt.libvirtError as exc:
        log.warning("cleanup of network %s: %s", name, exc.get_error_message())


def delete_network(c: Any, name: str, owner: ClusterOwner) -> bool:
    network = _lookup(c, name)
    if network is None:
        return False
    info = network_info(network, inactive_xml=True)
    if info.owner is None or not info.owner.same_cluster(owner):
        log.info(
            "network %s is not owned by %s/%s: left in place", name, owner.namespace, owner.name
        )
        return False
    if network.isActive():
        network.destroy()
    try:
        network.undefine()
    except libvirt.libvirtError as exc:
        if code_of(exc) != _NO_NET:
            raise
    return True


def _update(network: Any, command: int, section: int, xml: str) -> None:
    """LIVE|CONFIG; CONFIG alone when the network is not running (nothing live to change)."""
    try:
        network.update(command, section, -1, xml, _UPDATE_FLAGS)
    except libvirt.libvirtError as exc:
        if code_of(exc) != libvirt.VIR_ERR_OPERATION_INVALID or network.isActive():
            raise
        network.update(command, section, -1, xml, libvirt.VIR_NETWORK_UPDATE_AFFECT_CONFIG)


def _live(network: Any) -> NetworkInfo:
    """The live definition only (one call). Flags in the result are not meaningful.

    Transient networks are not checked here: the LIVE|CONFIG update itself fails on them
    ("cannot change persistent config of a transient network").
    """
    return parse_network_xml(str(network.XMLDesc(0)), active=True, persistent=True, autostart=False)


def _dhcp_capable(entries: NetworkEntries) -> None:
    if entries.dhcp_start is None or entries.dhcp_end is None:
        raise Unsupported(f"network {entries.name!r} has no DHCP range managed by libvirt")


def _leases(network: Any) -> list[DhcpLease]:
    return [
        _lease(item)
        for item in network.DHCPLeases() or []
        if item.get("type", 0) == libvirt.VIR_IP_ADDR_TYPE_IPV4
    ]


def _leased(c: Any, network: Any) -> set[str]:
    """Currently leased addresses, or none where the driver has no DHCP server (test driver)."""
    if is_test_driver(c):
        return set()
    try:
        return {lease.ip for lease in _leases(network)}
    except libvirt.libvirtError as exc:
        if is_unsupported_flags(exc):
            return set()
        raise


def _lease(item: dict[str, Any]) -> DhcpLease:
    return DhcpLease(
        mac=str(item.get("mac", "")).lower(),
        ip=str(item.get("ipaddr", "")),
        prefix=int(item.get("prefix", 0) or 0),
        hostname=item.get("hostname") or None,
        expiry_time=int(item.get("expirytime", 0) or 0),
    )


def dhcp_leases(c: Any, name: str) -> list[DhcpLease]:
    network = _require(c, name)
    try:
        return _leases(network)
    except libvirt.libvirtError as exc:
        if is_unsupported_flags(exc):
            raise Unsupported(f"network {name!r}: DHCP leases: {exc.get_error_message()}") from exc
        raise


# -- the entry cache --------------------------------------------------------------------------


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
        """The first address of the DHCP range that is not reserved, leased, excluded or the
        gateway."""
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
            and cached.uuid == _uuid_of(network)
        ):
            cached.fresh = False
            return cached
        return self.refresh(network, name, generation=generation)

    def refresh(self, network: Any, name: str, *, generation: int) -> NetworkEntries:
        """Read the network's live definition again (one XMLDesc) and cache it."""
        entries = NetworkEntries(_live(network), generation=generation)
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


# -- DHCP reservations and DNS records ---------------------------------------------------------

_ATTEMPTS = 3


def find_free_ip(
    c: Any, name: str, exclude: Collection[str], *, cache: NetworkCache, generation: int
) -> str:
    network = _require(c, name)
    entries = cache.entries(network, name, generation=generation)
    _dhcp_capable(entries)
    return entries.pick(exclude=exclude, leased=_leased(c, network))


def ensure_dhcp_host(
    c: Any,
    name: str,
    *,
    mac: str,
    host_name: str | None,
    ip: str | None,
    exclude: Collection[str],
    dns_hostnames: Sequence[str] = (),
    cache: NetworkCache,
    generation: int,
) -> DhcpHost:
    mac = normalize_mac(mac)
    if host_name is not None:
        check_hostname(host_name, field="DHCP host name")
    for hostname in dns_hostnames:
        check_hostname(hostname)
    network = _require(c, name)
    entries = cache.entries(network, name, generation=generation)
    _dhcp_capable(entries)
    for attempt in range(_ATTEMPTS):
        if mac in entries.by_mac:
            entries = cache.confirmed(network, entries)
        mine = entries.by_mac.get(mac)
        if mine is not None:
            if ip is not None and ip != mine.ip:
                raise AddressConflict(
                    f"network {name!r}: MAC {mac} is reserved for {mine.ip}, not {ip}",
                    field="mac",
                    value=mac,
                )
            if dns_hostnames and mine.name == host_name:
                _merge_dns(network, cache, entries, mine.ip, dns_hostnames)
            return mine
        if ip is None:
            chosen = entries.pick(exclude=exclude, leased=_leased(c, network))
        else:
            chosen = ip
            if ip in entries.by_ip:
                entries = cache.confirmed(network, entries)
            holder = entries.by_ip.get(ip)
            if holder is not None and holder.mac != mac:
                raise AddressConflict(
                    f"network {name!r}: {ip} is reserved for MAC {holder.mac}",
                    field="ip",
                    value=ip,
                )
            if entries.network is not None and ipaddress.IPv4Address(ip) not in entries.network:
                raise InvalidSpec(f"network {name!r}: {ip} is not in {entries.network}")
        host = DhcpHost(mac=mac, ip=chosen, name=host_name)
        try:
            _update(
                network,
                libvirt.VIR_NETWORK_UPDATE_COMMAND_ADD_LAST,
                libvirt.VIR_NETWORK_SECTION_IP_DHCP_HOST,
                build_dhcp_host_xml(host),
            )
        except libvirt.libvirtError:
            # libvirt refuses a second entry with this MAC or address: if a fresh read shows
            # one (a cache older than another writer's change), decide again on that view
            stale = not entries.fresh
            entries = cache.refresh(network, name, generation=generation)
            explained = mac in entries.by_mac or chosen in entries.by_ip
            if not (stale or explained) or attempt == _ATTEMPTS - 1:
                raise
            log.info("network %s changed behind this process's back: decided again", name)
            continue
        entries.reserved(host)
        if dns_hostnames:
            _merge_dns(network, cache, entries, chosen, dns_hostnames)
        return host
    raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises


def remove_dhcp_host(c: Any, name: str, mac: str, *, cache: NetworkCache, generation: int) -> bool:
    """DELETE by MAC straight away; libvirt says when nothing matches (then a fresh read
    tells "not there" from a real failure)."""
    mac = normalize_mac(mac)
    network = _lookup(c, name)
    if network is None:
        cache.drop(name)
        return False
    try:
        _update(
            network,
            libvirt.VIR_NETWORK_UPDATE_COMMAND_DELETE,
            libvirt.VIR_NETWORK_SECTION_IP_DHCP_HOST,
            build_dhcp_host_match_xml(mac),
        )
    except libvirt.libvirtError as exc:
        if code_of(exc) != libvirt.VIR_ERR_OPERATION_INVALID:
            cache.drop(name)
            raise
        if mac not in cache.refresh(network, name, generation=generation).by_mac:
            return False
        raise
    cached = cache.cached(name, generation=generation, uuid=_uuid_of(network))
    if cached is not None:
        cached.released(mac)
    return True


def _replace_dns(network: Any, current: DnsHost | None, wanted: DnsHost | None) -> None:
    if current is not None:
        _update(
            network,
            libvirt.VIR_NETWORK_UPDATE_COMMAND_DELETE,
            libvirt.VIR_NETWORK_SECTION_DNS_HOST,
            build_dns_host_match_xml(current.ip),
        )
    if wanted is not None:
        try:
            _update(
                network,
                libvirt.VIR_NETWORK_UPDATE_COMMAND_ADD_LAST,
                libvirt.VIR_NETWORK_SECTION_DNS_HOST,
                build_dns_host_xml(wanted),
            )
        except (libvirt.libvirtError, VirtError):
            if current is not None:  # put the old record back rather than lose it
                try:
                    _update(
                        network,
                        libvirt.VIR_NETWORK_UPDATE_COMMAND_ADD_LAST,
                        libvirt.VIR_NETWORK_SECTION_DNS_HOST,
                        build_dns_host_xml(current),
                    )
                except libvirt.libvirtError as exc:
                    log.error(
                        "restoring DNS record for %s: %s", current.ip, exc.get_error_message()
                    )
            raise


def add_dns_hostnames(
    c: Any, name: str, ip: str, hostnames: Sequence[str], *, cache: NetworkCache, generation: int
) -> DnsHost:
    for hostname in hostnames:
        check_hostname(hostname)
    network = _require(c, name)
    return _merge_dns(
        network, cache, cache.entries(network, name, generation=generation), ip, hostnames
    )


def _merge_dns(
    network: Any, cache: NetworkCache, entries: NetworkEntries, ip: str, hostnames: Sequence[str]
) -> DnsHost:
    """Merge ``hostnames`` into the record of ``ip``. A record the cache knows is read again
    before it is replaced (names someone else added are kept); a record the cache does not
    know is added directly: libvirt refuses a second record for an address, and then a fresh
    read decides again."""
    for attempt in range(_ATTEMPTS):
        if ip in entries.dns:
            entries = cache.confirmed(network, entries)
        current = entries.dns.get(ip)
        names = list(current.hostnames) if current else []
        names += [h for h in hostnames if h not in names]
        wanted = DnsHost(ip=ip, hostnames=tuple(names))
        if current is not None and current.hostnames == wanted.hostnames:
            return current
        try:
            _replace_dns(network, current, wanted)
        except libvirt.libvirtError:
            stale = not entries.fresh
            entries = cache.refresh(network, entries.name, generation=entries.generation)
            if not (stale or ip in entries.dns) or attempt == _ATTEMPTS - 1:
                raise
            continue
        entries.set_dns(ip, wanted)
        return wanted
    raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises


def remove_dns_hostnames(
    c: Any,
    name: str,
    ip: str,
    hostnames: Sequence[str] | None,
    *,
    cache: NetworkCache,
    generation: int,
) -> bool:
    """Always on a fresh read: a removal never trusts the cache's "not there"."""
    network = _lookup(c, name)
    if network is None:
        cache.drop(name)
        return False
    entries = cache.refresh(network, name, generation=generation)
    current = entries.dns.get(ip)
    if current is None:
        return False
    if hostnames is None:
        remaining: tuple[str, ...] = ()
    else:
        remaining = tuple(h for h in current.hostnames if h not in set(hostnames))
        if remaining == current.hostnames:
            return False
    wanted = DnsHost(ip=ip, hostnames=remaining) if remaining else None
    try:
        _replace_dns(network, current, wanted)
    except libvirt.libvirtError:
        cache.drop(name)
        raise
    entries.set_dns(ip, wanted)
    return True
