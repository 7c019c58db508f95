"""Networks: define, adopt, delete, and their DHCP leases (blocking; runs in worker threads).

- Networks are defined persistently, started and autostarted: ``AFFECT_CONFIG`` updates fail
  on transient networks, and live-only entries vanish on a host reboot (libvirt-notes.md).
- Before creating a NAT/isolated network its CIDR is compared with every other network on
  the host (active or not: ``defined_cidrs``, which ``network_cidrs`` answers from too); a
  bridge-mode network needs its bridge to exist (libvirt itself starts a bridge-mode network
  on a missing bridge without complaint). A network whose start fails is undefined again:
  nothing half-created stays.

DHCP reservations and DNS host records are ``capl.virt.network_hosts``, the per-host cache of
them ``capl.virt.network_cache`` (re-exported here).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
from typing import Any

import libvirt

from capl.ports.errors import (
    BridgeNotFound,
    ForeignObjectError,
    InvalidSpec,
    NetworkNotFound,
    NetworkOverlap,
    Unsupported,
)
from capl.ports.virt import ClusterOwner, DhcpLease, NetworkInfo, NetworkMode, NetworkSpec
from capl.virt.counting import remembered
from capl.virt.errors import is_unsupported_flags
from capl.virt.network_cache import NetworkCache, NetworkEntries
from capl.virt.networkxml import address_plan, build_network_xml, parse_network_xml
from capl.virt.storage import is_test_driver
from capl.virt.support import code_of, lookup

__all__ = [
    "NetworkCache",
    "NetworkEntries",
    "defined_cidrs",
    "delete_network",
    "dhcp_leases",
    "ensure_network",
    "get_network",
    "leased_addresses",
    "leases",
    "lookup_network",
    "network_cidrs",
    "network_info",
    "network_xml",
    "require_network",
]

log = logging.getLogger(__name__)

_NO_NET = libvirt.VIR_ERR_NO_NETWORK


def lookup_network(c: Any, name: str) -> Any | None:
    return lookup(lambda: c.networkLookupByName(name), _NO_NET)


def require_network(c: Any, name: str) -> Any:
    """The network for an operation on its entries or leases: remembered on the connection
    handle (``counting.remembered``; a stale one fails its first call and is looked up
    again)."""
    network = remembered(c, "network", name, lambda: lookup_network(c, name))
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
    network = lookup_network(c, name)
    return network_info(network) if network is not None else None


def defined_cidrs(c: Any) -> list[tuple[str, str]]:
    """``(name, IPv4 CIDR)`` of every network defined on the host, active or not, whoever owns
    it, from its persistent definition; networks without IPv4 are left out, and so is one
    that goes away while it is read."""
    found = []
    for other in c.listAllNetworks(0):
        try:
            name = str(other.name())
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
        if parsed.cidr:
            found.append((name, parsed.cidr))
    return found


def network_cidrs(c: Any) -> list[str]:
    """The IPv4 CIDR of every network on the host (see ``defined_cidrs``)."""
    return [cidr for _, cidr in defined_cidrs(c)]


def _check_overlap(c: Any, spec: NetworkSpec) -> None:
    wanted = address_plan(spec).network
    for other_name, other_cidr in defined_cidrs(c):
        if other_name != spec.name and wanted.overlaps(ipaddress.IPv4Network(other_cidr)):
            raise NetworkOverlap(
                f"network {spec.name!r}: CIDR {wanted} overlaps network {other_name!r} "
                f"({other_cidr}) on this host",
                other_network=other_name,
                other_cidr=other_cidr,
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
    network = lookup_network(c, spec.name)
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
    network = lookup_network(c, name)
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


def leases(network: Any) -> list[DhcpLease]:
    return [
        _lease(item)
        for item in network.DHCPLeases() or []
        if item.get("type", 0) == libvirt.VIR_IP_ADDR_TYPE_IPV4
    ]


def leased_addresses(c: Any, network: Any) -> set[str]:
    """Currently leased addresses, or none where the driver has no DHCP server (test driver)."""
    if is_test_driver(c):
        return set()
    try:
        return {lease.ip for lease in leases(network)}
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
    network = require_network(c, name)
    try:
        return leases(network)
    except libvirt.libvirtError as exc:
        if is_unsupported_flags(exc):
            raise Unsupported(f"network {name!r}: DHCP leases: {exc.get_error_message()}") from exc
        raise
