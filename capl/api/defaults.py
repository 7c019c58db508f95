"""Defaults that CRD `default:` cannot express, because they derive from other fields.

Used twice, with the same functions: by the mutating webhook (so the defaults are visible in
the stored object) and by the controllers (so API servers without the webhook, e.g. in
tests, behave the same). Both apply them only to fields that are unset, so the functions are
idempotent and a value a user (or an earlier default) wrote always wins.

Derived names combine namespace and name with a '.', which cannot occur in a namespace, so
two clusters never derive the same name; names that would exceed 63 characters are
shortened with a hash suffix.
"""

from __future__ import annotations

import hashlib
import ipaddress

from capl.api.cluster import DHCPRange, LibvirtCluster, NetworkSpec, StoragePoolSpec
from capl.api.machine import LibvirtMachine, LibvirtMachineSpec, NetworkInterface

NAME_PREFIX = "capl"
DNS_DOMAIN_SUFFIX = "capl.internal"
DEFAULT_POOL_PARENT = "/var/lib/libvirt/images"
DEFAULT_API_SERVER_PORT = 6443
MAX_DERIVED_NAME = 63


def _short_hash(text: str, length: int = 8) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def derived_name(*, namespace: str, name: str, max_length: int = MAX_DERIVED_NAME) -> str:
    """`capl-<namespace>.<name>`, or a prefix of it plus a hash when that is too long."""
    full = f"{NAME_PREFIX}-{namespace}.{name}"
    if len(full) <= max_length:
        return full
    suffix = _short_hash(f"{namespace}/{name}")
    return f"{full[: max_length - len(suffix) - 1].rstrip('.-')}-{suffix}"


def derived_dns_domain(*, namespace: str, name: str) -> str:
    """`<name>.<namespace>.capl.internal`, hashed when a label or the whole would be too long."""
    domain = f"{name}.{namespace}.{DNS_DOMAIN_SUFFIX}"
    if len(domain) <= 253 and all(0 < len(label) <= 63 for label in domain.split(".")):
        return domain
    return f"c{_short_hash(f'{namespace}/{name}', 16)}.{DNS_DOMAIN_SUFFIX}"


def gateway_address(cidr: str) -> str:
    """The host's address on a network capl creates: the first address of the CIDR."""
    network = ipaddress.IPv4Network(cidr, strict=False)
    return str(network.network_address + 1)


def default_dhcp_range(cidr: str) -> DHCPRange:
    """Everything after the gateway up to the last address before broadcast."""
    network = ipaddress.IPv4Network(cidr, strict=False)
    return DHCPRange(start=str(network.network_address + 2), end=str(network.broadcast_address - 1))


def default_network(spec: NetworkSpec, *, namespace: str | None, name: str | None) -> NetworkSpec:
    """Network defaults; only for networks capl creates (cidr set, or bridge mode)."""
    creates = spec.cidr is not None or spec.mode == "bridge"
    if not creates:
        return spec
    update: dict[str, object] = {}
    if spec.name is None and namespace and name:
        update["name"] = derived_name(namespace=namespace, name=name)
    if spec.cidr is not None:
        if spec.dns_domain is None and namespace and name:
            update["dns_domain"] = derived_dns_domain(namespace=namespace, name=name)
        if spec.dhcp is None:
            update["dhcp"] = default_dhcp_range(spec.cidr)
    return spec.model_copy(update=update) if update else spec


def default_storage_pool(
    pool: StoragePoolSpec | None, *, namespace: str | None, name: str | None
) -> StoragePoolSpec | None:
    pool = pool or StoragePoolSpec()
    pool_name = pool.name
    if pool_name is None and namespace and name:
        pool_name = derived_name(namespace=namespace, name=name)
    if pool_name is None:
        return pool if pool.path is not None else None
    path = pool.path or f"{DEFAULT_POOL_PARENT}/{pool_name}"
    return pool.model_copy(update={"name": pool_name, "path": path})


def default_libvirt_cluster(
    cluster: LibvirtCluster, *, namespace: str | None = None
) -> LibvirtCluster:
    """A copy of `cluster` with the derived defaults filled in where unset."""
    ns = cluster.metadata.namespace or namespace
    name = cluster.metadata.name
    spec = cluster.spec
    network = default_network(spec.network, namespace=ns, name=name)
    pool = default_storage_pool(spec.storage_pool, namespace=ns, name=name)
    if network is spec.network and pool == spec.storage_pool:
        return cluster
    new_spec = spec.model_copy(update={"network": network, "storage_pool": pool})
    return cluster.model_copy(update={"spec": new_spec})


def default_machine_spec(spec: LibvirtMachineSpec) -> LibvirtMachineSpec:
    """MAC addresses in lower case (libvirt and DHCP compare them as strings)."""
    nics = spec.network_interfaces
    if not nics or all(nic.mac is None or nic.mac == nic.mac.lower() for nic in nics):
        return spec
    lowered: list[NetworkInterface] = [
        nic if nic.mac is None else nic.model_copy(update={"mac": nic.mac.lower()}) for nic in nics
    ]
    return spec.model_copy(update={"network_interfaces": lowered})


def default_libvirt_machine(machine: LibvirtMachine) -> LibvirtMachine:
    spec = default_machine_spec(machine.spec)
    return machine if spec is machine.spec else machine.model_copy(update={"spec": spec})
