"""Networks, DHCP reservations and DNS host records (blocking; runs in worker threads).

- Networks are defined persistently, started and autostarted: ``AFFECT_CONFIG`` updates fail
  on transient networks, and live-only entries vanish on a host reboot (libvirt-notes.md).
- Before creating a NAT/isolated network its CIDR is compared with every other network on
  the host (active or not); a bridge-mode network needs its bridge to exist (libvirt itself
  starts a bridge-mode network on a missing bridge without complaint). A network whose start
  fails is undefined again: nothing half-created stays.
- DHCP host and DNS host updates use ``AFFECT_LIVE | AFFECT_CONFIG`` and are serialized per
  network (read-modify-write). libvirt keeps at most one DNS host record per IP, so hostnames
  are merged into that record (delete by ``<host ip=.../>``, then add); a record shared by
  several hostnames across IPs (round-robin ``api``) is fine because deletes go by IP.
- A free IP is the first address of the DHCP range that is neither reserved (DHCP hosts), nor
  leased, nor the gateway, nor in the caller's ``exclude`` set (the addresses recorded in the
  API objects): no in-process IPAM state.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
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


def _dhcp_capable(info: NetworkInfo) -> None:
    if not info.dhcp_start or not info.dhcp_end:
        raise Unsupported(f"network {info.name!r} has no DHCP range managed by libvirt")


def _leases(network: Any) -> list[DhcpLease]:
    return [
        _lease(item)
        for item in network.DHCPLeases() or []
        if item.get("type", 0) == libvirt.VIR_IP_ADDR_TYPE_IPV4
    ]


def _leased(c: Any, network: Any) -> list[DhcpLease]:
    """Current leases, or none where the driver has no DHCP server (test driver)."""
    if is_test_driver(c):
        return []
    try:
        return _leases(network)
    except libvirt.libvirtError as exc:
        if is_unsupported_flags(exc):
            return []
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


def _pick_free(info: NetworkInfo, taken: set[str]) -> str:
    assert info.dhcp_start
    assert info.dhcp_end
    start, end = ipaddress.IPv4Address(info.dhcp_start), ipaddress.IPv4Address(info.dhcp_end)
    for value in range(int(start), int(end) + 1):
        candidate = str(ipaddress.IPv4Address(value))
        if candidate not in taken:
            return candidate
    raise AddressExhausted(
        f"network {info.name!r}: no free address in {start}-{end} "
        f"({len(taken)} reserved, leased or recorded)"
    )


def _taken(c: Any, network: Any, info: NetworkInfo, exclude: Collection[str]) -> set[str]:
    taken = {h.ip for h in info.dhcp_hosts} | {lease.ip for lease in _leased(c, network)}
    taken |= {str(ip) for ip in exclude}
    if info.gateway:
        taken.add(info.gateway)
    return taken


def find_free_ip(c: Any, name: str, exclude: Collection[str]) -> str:
    network = _require(c, name)
    info = _live(network)
    _dhcp_capable(info)
    return _pick_free(info, _taken(c, network, info, exclude))


def ensure_dhcp_host(
    c: Any,
    name: str,
    *,
    mac: str,
    host_name: str | None,
    ip: str | None,
    exclude: Collection[str],
    dns_hostnames: Sequence[str] = (),
) -> DhcpHost:
    mac = normalize_mac(mac)
    if host_name is not None:
        check_hostname(host_name, field="DHCP host name")
    for hostname in dns_hostnames:
        check_hostname(hostname)
    network = _require(c, name)
    info = _live(network)
    _dhcp_capable(info)
    mine = next((h for h in info.dhcp_hosts if h.mac == mac), None)
    if mine is not None:
        if ip is not None and ip != mine.ip:
            raise AddressConflict(
                f"network {name!r}: MAC {mac} is reserved for {mine.ip}, not {ip}",
                field="mac",
                value=mac,
            )
        if dns_hostnames and mine.name == host_name:
            _merge_dns(network, info, mine.ip, dns_hostnames)
        return mine
    if ip is None:
        ip = _pick_free(info, _taken(c, network, info, exclude))
    else:
        holder = next((h for h in info.dhcp_hosts if h.ip == ip), None)
        if holder is not None:
            raise AddressConflict(
                f"network {name!r}: {ip} is reserved for MAC {holder.mac}",
                field="ip",
                value=ip,
            )
        plan_net = ipaddress.IPv4Network(info.cidr) if info.cidr else None
        if plan_net is not None and ipaddress.IPv4Address(ip) not in plan_net:
            raise InvalidSpec(f"network {name!r}: {ip} is not in {plan_net}")
    host = DhcpHost(mac=mac, ip=ip, name=host_name)
    _update(
        network,
        libvirt.VIR_NETWORK_UPDATE_COMMAND_ADD_LAST,
        libvirt.VIR_NETWORK_SECTION_IP_DHCP_HOST,
        build_dhcp_host_xml(host),
    )
    if dns_hostnames:
        # the DHCP update left the DNS section of `info` as it is on the network
        _merge_dns(network, info, ip, dns_hostnames)
    return host


def remove_dhcp_host(c: Any, name: str, mac: str) -> bool:
    mac = normalize_mac(mac)
    network = _lookup(c, name)
    if network is None:
        return False
    info = _live(network)
    if not any(h.mac == mac for h in info.dhcp_hosts):
        return False
    _update(
        network,
        libvirt.VIR_NETWORK_UPDATE_COMMAND_DELETE,
        libvirt.VIR_NETWORK_SECTION_IP_DHCP_HOST,
        build_dhcp_host_match_xml(mac),
    )
    return True


def _dns_record(info: NetworkInfo, ip: str) -> DnsHost | None:
    return next((h for h in info.dns_hosts if h.ip == ip), None)


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


def add_dns_hostnames(c: Any, name: str, ip: str, hostnames: Sequence[str]) -> DnsHost:
    for hostname in hostnames:
        check_hostname(hostname)
    network = _require(c, name)
    return _merge_dns(network, _live(network), ip, hostnames)


def _merge_dns(network: Any, info: NetworkInfo, ip: str, hostnames: Sequence[str]) -> DnsHost:
    current = _dns_record(info, ip)
    names = list(current.hostnames) if current else []
    names += [h for h in hostnames if h not in names]
    wanted = DnsHost(ip=ip, hostnames=tuple(names))
    if current is not None and current.hostnames == wanted.hostnames:
        return current
    _replace_dns(network, current, wanted)
    return wanted


def remove_dns_hostnames(c: Any, name: str, ip: str, hostnames: Sequence[str] | None) -> bool:
    network = _lookup(c, name)
    if network is None:
        return False
    info = _live(network)
    current = _dns_record(info, ip)
    if current is None:
        return False
    if hostnames is None:
        remaining: tuple[str, ...] = ()
    else:
        remaining = tuple(h for h in current.hostnames if h not in set(hostnames))
        if remaining == current.hostnames:
            return False
    _replace_dns(network, current, DnsHost(ip=ip, hostnames=remaining) if remaining else None)
    return True
