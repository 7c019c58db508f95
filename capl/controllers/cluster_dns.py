"""DNS records of the control-plane endpoint: which names, on which addresses (pure planning).

When a LibvirtCluster leaves `spec.controlPlaneEndpoint` empty, capl sets it to
`api.<dnsDomain>:6443` and keeps A records for the control-plane machines in the libvirt
network's dnsmasq, on every host. The endpoint counts as capl-managed whenever its host is
exactly `api.<dnsDomain>` (stateless: it survives `clusterctl move`); any other endpoint (a
kube-vip VIP, a load balancer) is left alone and no records are written.

Record ownership, shared with the LibvirtMachine controller
----------------------------------------------------------
libvirt 9.0 keeps at most one DNS `<host>` record per IP, holding several hostnames, and the
port edits it by *hostname*: `add_dns_hostnames(ip, names)` merges names into the record of
`ip`, `remove_dns_hostnames(ip, names)` drops only those names (the record goes when it is
empty; deletes go by IP, which works while several records share a hostname). Both
controllers run in one process against the same `Host`, whose per-network lock serialises
these read-modify-write updates. So the two controllers share a record without fighting:

- the machine controller owns the name `<machine>.<dnsDomain>` on its machine's IP;
- this controller owns the endpoint names below, and adds/removes only those.

Neither ever rewrites or deletes the other's names. (A machine named `api` or `api-int` would
collide with the endpoint names: those machine names are reserved.)

Which names
-----------
- On a network capl created for the cluster (exclusively the cluster's), the short names
  `api` and `api-int`. libvirt writes them to dnsmasq's addn-hosts file and runs dnsmasq with
  `domain=<dnsDomain>` and `expand-hosts`, so dnsmasq answers `api`, `api.<dnsDomain>`,
  `api-int` and `api-int.<dnsDomain>` (checked on libvirt 9.0). Should the network's DNS
  domain differ from the cluster's, the fully qualified names are added as well.
- On an adopted network, which other clusters or users may share, only the fully qualified
  `api.<dnsDomain>` and `api-int.<dnsDomain>`: names scoped to the cluster's own DNS domain,
  so capl never touches an `api` record it did not write. dnsmasq answers names from its
  hosts files whatever its own domain is.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

from capl.api.defaults import DEFAULT_API_SERVER_PORT
from capl.ports.virt import DnsHost

__all__ = [
    "API_NAME",
    "API_PORT",
    "INTERNAL_API_NAME",
    "DnsChange",
    "DnsNames",
    "addresses_in_network",
    "api_names",
    "endpoint_host",
    "plan_api_records",
]

API_NAME = "api"
INTERNAL_API_NAME = "api-int"
API_PORT = DEFAULT_API_SERVER_PORT


def endpoint_host(dns_domain: str) -> str:
    """The control-plane endpoint host capl manages for a DNS domain."""
    return f"{API_NAME}.{dns_domain}"


@dataclass(frozen=True, slots=True)
class DnsNames:
    """The endpoint hostnames of one network."""

    publish: tuple[str, ...]
    """Names every control-plane address carries."""
    owned: frozenset[str]
    """Names capl may remove from any record of this network (a superset of `publish`)."""


def api_names(*, dns_domain: str, network_domain: str | None, exclusive: bool) -> DnsNames:
    """Endpoint names for a network; `exclusive`: capl created the network for this cluster."""
    fqdn = (f"{API_NAME}.{dns_domain}", f"{INTERNAL_API_NAME}.{dns_domain}")
    if not exclusive:
        return DnsNames(publish=fqdn, owned=frozenset(fqdn))
    short = (API_NAME, INTERNAL_API_NAME)
    same_domain = (network_domain or "").lower().rstrip(".") == dns_domain.lower().rstrip(".")
    return DnsNames(publish=short if same_domain else short + fqdn, owned=frozenset(short + fqdn))


@dataclass(frozen=True, slots=True)
class DnsChange:
    """Names to add to and remove from the record of one IP."""

    ip: str
    add: tuple[str, ...] = ()
    remove: tuple[str, ...] = ()


def plan_api_records(
    current: Iterable[DnsHost], wanted_ips: Iterable[str], names: DnsNames
) -> list[DnsChange]:
    """The changes that make exactly `wanted_ips` carry `names.publish`, touching no name
    outside `names.owned`; sorted by IP (empty when the network is already right)."""
    wanted = {str(ipaddress.IPv4Address(ip)) for ip in wanted_ips}
    records: dict[str, set[str]] = {}
    for record in current:
        records.setdefault(record.ip, set()).update(record.hostnames)
    changes: list[DnsChange] = []
    for ip in sorted(set(records) | wanted, key=ipaddress.IPv4Address):
        have = records.get(ip, set())
        ours = have & names.owned
        if ip in wanted:
            add = tuple(n for n in names.publish if n not in have)
            remove = tuple(sorted(ours - set(names.publish)))
        else:
            add, remove = (), tuple(sorted(ours))
        if add or remove:
            changes.append(DnsChange(ip=ip, add=add, remove=remove))
    return changes


def addresses_in_network(addresses: Iterable[str], cidr: str | None) -> list[str]:
    """The IPv4 addresses among `addresses` that lie in `cidr` (all IPv4 ones without it)."""
    network = ipaddress.IPv4Network(cidr, strict=False) if cidr else None
    result: list[str] = []
    for address in addresses:
        try:
            ip = ipaddress.IPv4Address(address)
        except ValueError:
            continue
        if (network is None or ip in network) and str(ip) not in result:
            result.append(str(ip))
    return result
