"""Network XML: the networks capl creates, DHCP/DNS host snippets for ``virNetworkUpdate``,
and a parser for any network on the host (including ones capl adopts or only inspects).

Ownership: ``<metadata><capl:network>`` with the owning cluster's namespace/name/uid. libvirt
9.0 keeps network ``<metadata>`` across define/dumpxml (checked on the real daemon and the
test driver), while ``<title>``/``<description>`` are dropped there, so the tag lives only in
metadata.

Defaults for NAT/isolated networks: the gateway is the first host address of the CIDR, the
DHCP range is the upper half of the hosts (the lower half stays free for static use and for
VIPs), and with a DNS domain ``localOnly='yes'`` makes dnsmasq answer for it without
forwarding upstream.
"""

from __future__ import annotations

import ipaddress
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass

from capl.ports.errors import InvalidSpec
from capl.ports.naming import normalize_mac
from capl.ports.virt import (
    ClusterOwner,
    DhcpHost,
    DnsHost,
    NetworkInfo,
    NetworkMode,
    NetworkSpec,
)
from capl.virt.xmlutil import capl_tag, child_text, line, parse, serialize, sub

__all__ = [
    "AddressPlan",
    "address_plan",
    "build_dhcp_host_xml",
    "build_dns_host_xml",
    "build_network_xml",
    "check_hostname",
    "parse_network_xml",
]

_OWNER_ELEMENT = "network"
_LABEL = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)$", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class AddressPlan:
    network: ipaddress.IPv4Network
    gateway: ipaddress.IPv4Address
    dhcp_start: ipaddress.IPv4Address
    dhcp_end: ipaddress.IPv4Address


def address_plan(spec: NetworkSpec) -> AddressPlan:
    if not spec.cidr:
        raise InvalidSpec(f"network {spec.name!r}: mode {spec.mode} needs a CIDR")
    try:
        net = ipaddress.IPv4Network(spec.cidr, strict=False)
    except ValueError as exc:
        raise InvalidSpec(f"network {spec.name!r}: CIDR {spec.cidr!r} is invalid: {exc}") from None
    if net.prefixlen > 29:
        raise InvalidSpec(f"network {spec.name!r}: CIDR {net} is too small (at most /29)")
    first, last = _host_bounds(net)
    gateway = first
    default_start = ipaddress.IPv4Address(int(first) + (int(last) - int(first)) // 2 + 1)
    try:
        start = ipaddress.IPv4Address(spec.dhcp_start) if spec.dhcp_start else default_start
        end = ipaddress.IPv4Address(spec.dhcp_end) if spec.dhcp_end else last
    except ValueError as exc:
        raise InvalidSpec(f"network {spec.name!r}: DHCP range is invalid: {exc}") from None
    for label, address in (("start", start), ("end", end)):
        if (
            address not in net
            or address == gateway
            or address in (net.network_address, net.broadcast_address)
        ):
            raise InvalidSpec(
                f"network {spec.name!r}: DHCP {label} {address} is not a usable address of {net} "
                f"(gateway {gateway})"
            )
    if int(start) > int(end):
        raise InvalidSpec(f"network {spec.name!r}: DHCP start {start} is after end {end}")
    return AddressPlan(network=net, gateway=gateway, dhcp_start=start, dhcp_end=end)


def _host_bounds(
    net: ipaddress.IPv4Network,
) -> tuple[ipaddress.IPv4Address, ipaddress.IPv4Address]:
    return (
        ipaddress.IPv4Address(int(net.network_address) + 1),
        ipaddress.IPv4Address(int(net.broadcast_address) - 1),
    )


def check_hostname(name: str, *, field: str = "hostname") -> str:
    """A DNS name (labels of letters, digits, hyphens); trailing dot not allowed."""
    line(name, field=field)
    if len(name) > 253 or not all(_LABEL.match(label) for label in name.split(".")):
        raise InvalidSpec(f"{field} {name!r} is not a valid DNS name")
    return name


def _owner_element(owner: ClusterOwner) -> ET.Element:
    element = ET.Element(capl_tag(_OWNER_ELEMENT))
    sub(element, capl_tag("namespace"), line(owner.namespace, field="owner namespace"))
    sub(element, capl_tag("name"), line(owner.name, field="owner name"))
    if owner.uid:
        sub(element, capl_tag("uid"), line(owner.uid, field="owner uid"))
    return element


def build_network_xml(spec: NetworkSpec) -> str:
    root = ET.Element("network")
    sub(root, "name", line(spec.name, field="network name"))
    metadata = sub(root, "metadata")
    metadata.append(_owner_element(spec.owner))
    if spec.mode is NetworkMode.BRIDGE:
        if not spec.bridge:
            raise InvalidSpec(f"network {spec.name!r}: bridge mode needs the host bridge's name")
        sub(root, "forward", mode="bridge")
        sub(root, "bridge", name=line(spec.bridge, field="bridge name"))
        if spec.mtu:
            sub(root, "mtu", size=str(spec.mtu))
        return serialize(root)
    plan = address_plan(spec)
    if spec.mode is NetworkMode.NAT:
        sub(root, "forward", mode="nat")
    if spec.bridge:
        if len(spec.bridge) > 15:
            raise InvalidSpec(f"bridge name {spec.bridge!r} is longer than 15 characters")
        sub(root, "bridge", name=line(spec.bridge, field="bridge name"), stp="on", delay="0")
    if spec.mtu:
        sub(root, "mtu", size=str(spec.mtu))
    if spec.dns_domain:
        sub(
            root,
            "domain",
            name=check_hostname(spec.dns_domain, field="DNS domain"),
            localOnly="yes",
        )
    ip = sub(root, "ip", address=str(plan.gateway), prefix=str(plan.network.prefixlen))
    dhcp = sub(ip, "dhcp")
    sub(dhcp, "range", start=str(plan.dhcp_start), end=str(plan.dhcp_end))
    return serialize(root)


def build_dhcp_host_xml(host: DhcpHost) -> str:
    element = ET.Element("host", mac=normalize_mac(host.mac))
    if host.name:
        element.set("name", check_hostname(host.name, field="DHCP host name"))
    element.set("ip", str(_ipv4(host.ip)))
    return ET.tostring(element, encoding="unicode")


def build_dhcp_host_match_xml(mac: str) -> str:
    """The minimal ``<host mac=.../>`` that DELETE matches on."""
    return ET.tostring(ET.Element("host", mac=normalize_mac(mac)), encoding="unicode")


def build_dns_host_xml(host: DnsHost) -> str:
    if not host.hostnames:
        raise InvalidSpec(f"DNS host record for {host.ip} needs at least one hostname")
    element = ET.Element("host", ip=str(_ipv4(host.ip)))
    for name in host.hostnames:
        sub(element, "hostname", check_hostname(name))
    return ET.tostring(element, encoding="unicode")


def build_dns_host_match_xml(ip: str) -> str:
    """``<host ip=.../>``: DELETE by IP, which works when hostnames are shared by records."""
    return ET.tostring(ET.Element("host", ip=str(_ipv4(ip))), encoding="unicode")


def _ipv4(value: str) -> ipaddress.IPv4Address:
    try:
        return ipaddress.IPv4Address(value)
    except ValueError:
        raise InvalidSpec(f"{value!r} is not an IPv4 address") from None


def _owner_from(root: ET.Element) -> ClusterOwner | None:
    element = root.find(f"metadata/{capl_tag(_OWNER_ELEMENT)}")
    if element is None:
        return None
    namespace = child_text(element, capl_tag("namespace"))
    name = child_text(element, capl_tag("name"))
    if not namespace or not name:
        return None
    return ClusterOwner(
        namespace=namespace, name=name, uid=child_text(element, capl_tag("uid")) or ""
    )


def parse_network_xml(
    document: str, *, active: bool, persistent: bool, autostart: bool
) -> NetworkInfo:
    root = parse(document)
    forward = root.find("forward")
    forward_mode = forward.get("mode", "nat") if forward is not None else "none"
    mode = {
        "nat": NetworkMode.NAT,
        "none": NetworkMode.ISOLATED,
        "bridge": NetworkMode.BRIDGE,
    }.get(forward_mode)
    bridge = root.find("bridge")
    cidr = gateway = dhcp_start = dhcp_end = None
    dhcp_hosts: list[DhcpHost] = []
    for ip in root.findall("ip"):
        if ip.get("family", "ipv4") != "ipv4" or not ip.get("address"):
            continue
        address = ip.get("address", "")
        prefix = ip.get("prefix") or ip.get("netmask") or "24"
        try:
            interface = ipaddress.IPv4Interface(f"{address}/{prefix}")
        except ValueError:
            continue
        if cidr is None:
            cidr, gateway = str(interface.network), address
            range_element = ip.find("dhcp/range")
            if range_element is not None:
                dhcp_start, dhcp_end = range_element.get("start"), range_element.get("end")
        for host in ip.findall("dhcp/host"):
            if host.get("mac") and host.get("ip"):
                dhcp_hosts.append(
                    DhcpHost(
                        mac=host.get("mac", "").lower(),
                        ip=host.get("ip", ""),
                        name=host.get("name"),
                    )
                )
    dns_hosts = tuple(
        DnsHost(
            ip=host.get("ip", ""),
            hostnames=tuple((h.text or "").strip() for h in host.findall("hostname")),
        )
        for host in root.findall("dns/host")
    )
    domain = root.find("domain")
    return NetworkInfo(
        name=child_text(root, "name") or "",
        uuid=child_text(root, "uuid") or "",
        mode=mode,
        forward_mode=forward_mode,
        bridge=bridge.get("name") if bridge is not None else None,
        active=active,
        persistent=persistent,
        autostart=autostart,
        cidr=cidr,
        gateway=gateway,
        dhcp_start=dhcp_start,
        dhcp_end=dhcp_end,
        dns_domain=domain.get("name") if domain is not None else None,
        dhcp_hosts=tuple(dhcp_hosts),
        dns_hosts=dns_hosts,
        owner=_owner_from(root),
    )
