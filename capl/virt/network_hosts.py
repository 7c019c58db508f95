"""DHCP reservations and DNS host records of a network (blocking; runs in worker threads).

- DHCP host and DNS host updates use ``AFFECT_LIVE | AFFECT_CONFIG`` and are serialized per
  network by the caller (``LibvirtHost``'s per-network lock). libvirt keeps at most one DNS
  host record per IP, so hostnames are merged into that record (delete by ``<host ip=.../>``,
  then add); a record shared by several hostnames across IPs (round-robin ``api``) is fine
  because deletes go by IP.
- A free IP is the first address of the DHCP range that is neither reserved (DHCP hosts), nor
  leased, nor the gateway, nor in the caller's ``exclude`` set (the addresses recorded in the
  API objects): no in-process IPAM state.

Decisions are taken on the per-host entry cache (``capl.virt.network_cache``, whose docstring
tells why that never makes a duplicate) and checked by libvirt's own uniqueness rules.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Collection, Sequence
from typing import Any

import libvirt

from capl.ports.errors import AddressConflict, InvalidSpec, Unsupported, VirtError
from capl.ports.naming import normalize_mac
from capl.ports.virt import DhcpHost, DnsHost
from capl.virt.network import leased_addresses, lookup_network, require_network
from capl.virt.network_cache import NetworkCache, NetworkEntries, uuid_of
from capl.virt.networkxml import (
    build_dhcp_host_match_xml,
    build_dhcp_host_xml,
    build_dns_host_match_xml,
    build_dns_host_xml,
    check_hostname,
)
from capl.virt.support import code_of

__all__ = [
    "add_dns_hostnames",
    "ensure_dhcp_host",
    "find_free_ip",
    "remove_dhcp_host",
    "remove_dns_hostnames",
]

log = logging.getLogger(__name__)

_UPDATE_FLAGS = libvirt.VIR_NETWORK_UPDATE_AFFECT_LIVE | libvirt.VIR_NETWORK_UPDATE_AFFECT_CONFIG

_ATTEMPTS = 3


def _update(network: Any, command: int, section: int, xml: str) -> None:
    """LIVE|CONFIG; CONFIG alone when the network is not running (nothing live to change)."""
    try:
        network.update(command, section, -1, xml, _UPDATE_FLAGS)
    except libvirt.libvirtError as exc:
        if code_of(exc) != libvirt.VIR_ERR_OPERATION_INVALID or network.isActive():
            raise
        network.update(command, section, -1, xml, libvirt.VIR_NETWORK_UPDATE_AFFECT_CONFIG)


def _dhcp_capable(entries: NetworkEntries) -> None:
    if entries.dhcp_start is None or entries.dhcp_end is None:
        raise Unsupported(f"network {entries.name!r} has no DHCP range managed by libvirt")


def find_free_ip(
    c: Any, name: str, exclude: Collection[str], *, cache: NetworkCache, generation: int
) -> str:
    network = require_network(c, name)
    entries = cache.entries(network, name, generation=generation)
    _dhcp_capable(entries)
    return entries.pick(exclude=exclude, leased=leased_addresses(c, network))


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
    network = require_network(c, name)
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
            chosen = entries.pick(exclude=exclude, leased=leased_addresses(c, network))
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
    network = lookup_network(c, name)
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
    cached = cache.cached(name, generation=generation, uuid=uuid_of(network))
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
    network = require_network(c, name)
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
    network = lookup_network(c, name)
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
