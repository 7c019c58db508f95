"""Cluster API IPAM for LibvirtMachine NICs, the pure part: claims, addresses, guest config.

A NIC with `addressesFromPools` takes its IPv4 address from an `IPAddressClaim`
(ipam.cluster.x-k8s.io/v1beta2, the IPAM contract of the Cluster API book) against the pool;
the IPAM provider (e.g. the in-cluster provider) binds it to an `IPAddress` (address,
prefix, gateway). This module builds the claim, reads the address and turns it into what the
guest needs:

- a NIC on the cluster network where capl runs the DHCP (nat/isolated mode): the address
  becomes the NIC's DHCP reservation (`effective_spec` sets `ip`, as if the user had), so it
  must lie in the network's CIDR (`outside_network` says which one does not);
- any other NIC (bridge mode, a host bridge, another libvirt network): static network
  configuration in the bootstrap data, matched by the NIC's MAC: a systemd-networkd unit
  added to the Ignition config's `storage.files` (`ignition_with_network`), or a NoCloud
  `network-config` (version 2) beside cloud-config user data (`network_config_v2`).

The async side (create, read, release; conditions and events) is `ipam`.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from capl.api import constants as c
from capl.api.machine import IPPoolReference, LibvirtMachineSpec
from capl.controllers.machine.plan import BootstrapData, NicPlan, nic_mac
from capl.runtime.resources import IP_ADDRESS_CLAIM, IPAM_GROUP, Resource

__all__ = [
    "ClaimedAddress",
    "InvalidAddress",
    "PoolNic",
    "address_of",
    "claim_body",
    "claim_name",
    "effective_spec",
    "exhausted",
    "ignition_with_network",
    "network_config_v2",
    "networkd_unit",
    "nic_mac_for",
    "outside_network",
    "pool_nics",
    "pool_resource",
    "with_ipam_first",
    "with_static_addresses",
]

MAX_NAME = 253
NETWORKD_DIR = "/etc/systemd/network"

# The pool kinds whose status capl reads to tell an exhausted pool from a slow provider:
# the in-cluster provider's (status.ipAddresses.free); kind -> namespaced.
_IN_CLUSTER_POOLS: Mapping[str, tuple[str, bool]] = {
    "InClusterIPPool": ("inclusterippools", True),
    "GlobalInClusterIPPool": ("globalinclusterippools", False),
}
IN_CLUSTER_POOL_VERSION = "v1alpha2"


class InvalidAddress(ValueError):
    """A bound IPAddress capl cannot use; the message names the object and field."""


@dataclass(frozen=True, slots=True)
class PoolNic:
    """A NIC (its index in spec.networkInterfaces) that takes its address from a pool."""

    index: int
    pool: IPPoolReference

    def describe(self, namespace: str) -> str:
        """`<kind> <namespace>/<name>` (no namespace for a cluster-scoped pool kind)."""
        resource = pool_resource(self.pool)
        if resource is not None and not resource.namespaced:
            return f"{self.pool.kind} {self.pool.name}"
        return f"{self.pool.kind} {namespace}/{self.pool.name}"


@dataclass(frozen=True, slots=True)
class ClaimedAddress:
    """The address an IPAddress gives one NIC."""

    index: int
    address: str
    prefix: int
    gateway: str | None
    claim: str

    @property
    def cidr(self) -> str:
        return f"{self.address}/{self.prefix}"


def pool_nics(spec: LibvirtMachineSpec) -> list[PoolNic]:
    """The NICs with addressesFromPools, in order."""
    return [
        PoolNic(index=i, pool=nic.addresses_from_pools[0])
        for i, nic in enumerate(spec.network_interfaces or [])
        if nic.addresses_from_pools
    ]


def claim_name(machine: str, index: int) -> str:
    """`<machine>-nic<index>`, shortened with a digest when that exceeds 253 characters."""
    name = f"{machine}-nic{index}"
    if len(name) <= MAX_NAME:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:10]
    suffix = f"-{digest}-nic{index}"
    return machine[: MAX_NAME - len(suffix)].rstrip("-.") + suffix


def claim_body(
    *,
    name: str,
    namespace: str,
    cluster: str,
    owner_name: str,
    owner_uid: str,
    pool: IPPoolReference,
) -> dict[str, Any]:
    """The IPAddressClaim of one NIC: owned by the LibvirtMachine (controller reference, so
    garbage collection removes it if capl cannot and `clusterctl move` takes it), labelled
    with the cluster name, spec.clusterName and spec.poolRef."""
    return {
        "apiVersion": IP_ADDRESS_CLAIM.api_version,
        "kind": IP_ADDRESS_CLAIM.kind,
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {c.CLUSTER_NAME_LABEL: cluster},
            "ownerReferences": [
                {
                    "apiVersion": c.API_VERSION,
                    "kind": c.Kind.LIBVIRT_MACHINE,
                    "name": owner_name,
                    "uid": owner_uid,
                    "controller": True,
                }
            ],
        },
        "spec": {
            "clusterName": cluster,
            "poolRef": {"apiGroup": pool.api_group, "kind": pool.kind, "name": pool.name},
        },
    }


def owned_by(claim: Mapping[str, Any], uid: str) -> bool:
    refs = (claim.get("metadata") or {}).get("ownerReferences") or []
    return any(r.get("uid") == uid for r in refs)


def bound_address_name(claim: Mapping[str, Any]) -> str | None:
    """status.addressRef.name of a claim, None while unbound."""
    ref = (claim.get("status") or {}).get("addressRef") or {}
    name = ref.get("name")
    return str(name) if name else None


def address_of(obj: Mapping[str, Any], *, index: int, claim: str) -> ClaimedAddress:
    """The IPv4 address, prefix and gateway of an IPAddress; InvalidAddress otherwise."""
    name = (obj.get("metadata") or {}).get("name", "?")
    spec = obj.get("spec") or {}
    try:
        address = ipaddress.ip_address(str(spec.get("address", "")))
    except ValueError:
        raise InvalidAddress(
            f"IPAddress {name}: spec.address {spec.get('address')!r} is not an IP address"
        ) from None
    if not isinstance(address, ipaddress.IPv4Address):
        raise InvalidAddress(f"IPAddress {name}: spec.address {address} is not IPv4")
    prefix = spec.get("prefix")
    if not isinstance(prefix, int) or isinstance(prefix, bool) or not 1 <= prefix <= 32:
        raise InvalidAddress(f"IPAddress {name}: spec.prefix {prefix!r} is not 1-32")
    gateway = spec.get("gateway") or None
    if gateway is not None:
        try:
            gw = ipaddress.IPv4Address(str(gateway))
        except ValueError:
            raise InvalidAddress(
                f"IPAddress {name}: spec.gateway {gateway!r} is not an IPv4 address"
            ) from None
        if gw not in ipaddress.IPv4Network(f"{address}/{prefix}", strict=False):
            raise InvalidAddress(
                f"IPAddress {name}: spec.gateway {gw} is outside {address}/{prefix}"
            )
        gateway = str(gw)
    return ClaimedAddress(
        index=index, address=str(address), prefix=prefix, gateway=gateway, claim=claim
    )


# -- pools ------------------------------------------------------------------------------------


def pool_resource(pool: IPPoolReference) -> Resource | None:
    """The pool kind's resource when capl knows how to read its free count, else None."""
    if pool.api_group != IPAM_GROUP or pool.kind not in _IN_CLUSTER_POOLS:
        return None
    plural, namespaced = _IN_CLUSTER_POOLS[pool.kind]
    return Resource(IPAM_GROUP, IN_CLUSTER_POOL_VERSION, pool.kind, plural, namespaced)


def exhausted(pool: Mapping[str, Any]) -> tuple[int, int] | None:
    """(used, total) when an in-cluster pool's status says no address is free, else None."""
    counts = (pool.get("status") or {}).get("ipAddresses") or {}
    free, used, total = counts.get("free"), counts.get("used"), counts.get("total")
    if isinstance(free, int) and free <= 0:
        return (int(used or 0), int(total or 0))
    return None


# -- what the guest gets ----------------------------------------------------------------------


def effective_spec(
    spec: LibvirtMachineSpec, addresses: Mapping[int, ClaimedAddress], *, dhcp: Sequence[int]
) -> LibvirtMachineSpec:
    """The spec with each DHCP-served pool NIC's `ip` set to its IPAM address (in memory
    only: the reservation code then treats it as a user's fixed address)."""
    if not dhcp:
        return spec
    nics = list(spec.network_interfaces or [])
    for index in dhcp:
        nics[index] = nics[index].model_copy(update={"ip": addresses[index].address})
    return spec.model_copy(update={"network_interfaces": nics})


def outside_network(address: ClaimedAddress, cidr: str | None) -> bool:
    """True when `address` is not a host address of the network `cidr` (None: unknown)."""
    if not cidr:
        return False
    network = ipaddress.IPv4Network(cidr, strict=False)
    ip = ipaddress.IPv4Address(address.address)
    return ip not in network or ip in (network.network_address, network.broadcast_address)


def networkd_unit(mac: str, address: ClaimedAddress) -> str:
    """A systemd-networkd unit that gives the NIC with `mac` its static address."""
    lines = [
        "[Match]",
        f"MACAddress={mac}",
        "",
        "[Network]",
        f"Address={address.cidr}",
        "DHCP=no",
    ]
    if address.gateway:
        lines.append(f"Gateway={address.gateway}")
    return "\n".join(lines) + "\n"


def networkd_path(index: int) -> str:
    return f"{NETWORKD_DIR}/10-capl-nic{index}.network"


def ignition_with_network(data: bytes, nics: Sequence[tuple[str, ClaimedAddress]]) -> bytes:
    """The Ignition config with a networkd unit per (MAC, address) in storage.files
    (replacing an entry of the same path); spec 2.x entries get filesystem "root"."""
    config = json.loads(data)
    version = str((config.get("ignition") or {}).get("version", ""))
    storage = config.setdefault("storage", {})
    files: list[dict[str, Any]] = storage.setdefault("files", [])
    for mac, address in nics:
        path = networkd_path(address.index)
        source = "data:," + urllib.parse.quote(networkd_unit(mac, address), safe="")
        entry: dict[str, Any] = {"path": path, "mode": 0o644, "contents": {"source": source}}
        if version.startswith("2."):
            entry["filesystem"] = "root"
        else:
            entry["overwrite"] = True
        files[:] = [f for f in files if f.get("path") != path]
        files.append(entry)
    return json.dumps(config, separators=(",", ":")).encode()


def network_config_v2(nics: Sequence[tuple[str, ClaimedAddress]]) -> bytes:
    """A cloud-init network-config (version 2) with the static addresses, matched by MAC."""
    ethernets: dict[str, Any] = {}
    for mac, address in nics:
        entry: dict[str, Any] = {
            "match": {"macaddress": mac},
            "dhcp4": False,
            "addresses": [address.cidr],
        }
        if address.gateway:
            entry["routes"] = [{"to": "0.0.0.0/0", "via": address.gateway}]
        ethernets[f"nic{address.index}"] = entry
    doc = {"version": 2, "ethernets": ethernets}
    return yaml.safe_dump(doc, default_flow_style=False, sort_keys=True).encode()


def nic_mac_for(plan: NicPlan, *, cluster: str, namespace: str, name: str) -> str:
    """The MAC of a NIC without a DHCP reservation (the user's, or the first derived one:
    what `network.reserve_addresses` gives such a NIC)."""
    return plan.mac or nic_mac(
        cluster=cluster, namespace=namespace, name=name, index=plan.index, attempt=0
    )


def with_static_addresses(
    bootstrap: BootstrapData, nics: Sequence[tuple[str, ClaimedAddress]]
) -> BootstrapData:
    """The bootstrap data with the static addresses of `nics` (MAC, address): a networkd
    unit each in an Ignition config, a NoCloud network-config beside cloud-config."""
    if not nics:
        return bootstrap
    if bootstrap.format is c.BootstrapFormat.IGNITION:
        return BootstrapData(
            format=bootstrap.format, data=ignition_with_network(bootstrap.data, nics)
        )
    return BootstrapData(
        format=bootstrap.format, data=bootstrap.data, network_config=network_config_v2(nics)
    )


def with_ipam_first(
    addresses: Sequence[Mapping[str, str]], ipam: Sequence[str]
) -> list[dict[str, str]]:
    """status.addresses with the IPAM addresses as the first InternalIPs (in NIC order): they
    are the NICs' addresses whatever else the lease or the agent reports beside them."""
    if not ipam:
        return [dict(a) for a in addresses]
    internal = c.AddressType.INTERNAL_IP.value
    rest = [
        dict(a) for a in addresses if not (a.get("type") == internal and a.get("address") in ipam)
    ]
    return [{"type": internal, "address": ip} for ip in ipam] + rest
