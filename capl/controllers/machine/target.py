"""What a machine is and where it lives: value types the services pass around.

- `Identity`: namespace/name/UID and cluster of a LibvirtMachine, with the libvirt names
  derived from them (`capl.ports.naming`) and the owner tag its domain carries.
- `Target`: the host a machine lives on (a connected `Host` port) and the names of its
  cluster's resources there (pool, network, DNS domain), as the LibvirtCluster or, when
  that is gone, the placement record says.
- `Leftover`: what was made on one host for one incarnation (UID) of a LibvirtMachine,
  removed once that incarnation is confirmed gone (`capl.controllers.machine.cleanup`).
"""

from __future__ import annotations

from dataclasses import dataclass

from capl.api.machine import LibvirtMachineSpec
from capl.controllers.machine.plan_placement import Placement
from capl.ports.naming import MachineNames, machine_hostname, machine_names
from capl.ports.virt import DomainOwner, Host, HostInfo

__all__ = ["Identity", "Leftover", "Target"]


@dataclass(slots=True)
class Target:
    """The host a machine lives on and the names of its cluster resources there."""

    name: str
    uri: str
    host: Host
    pool: str
    network: str | None
    dns_domain: str | None
    bridge_mode: bool
    credentials_secret: str | None
    info: HostInfo | None = None
    cidr: str | None = None
    network_uuid: str | None = None
    """The network's UUID on this host as the LibvirtCluster last reported it
    (status.hosts[].networkUUID); None when not reported (yet)."""

    def placement(self, cluster: str) -> Placement:
        return Placement(
            host=self.name,
            uri=self.uri,
            pool=self.pool,
            network=self.network,
            dns_domain=self.dns_domain,
            credentials_secret=self.credentials_secret,
            cluster=cluster,
        )


@dataclass(frozen=True, slots=True)
class Identity:
    namespace: str
    name: str
    uid: str
    cluster: str
    names: MachineNames
    hostname: str

    @classmethod
    def of(cls, *, namespace: str, name: str, uid: str, cluster: str) -> Identity:
        """The identity of machine namespace/name (its libvirt names derived from those)."""
        return cls(
            namespace=namespace,
            name=name,
            uid=uid,
            cluster=cluster,
            names=machine_names(namespace=namespace, name=name),
            hostname=machine_hostname(name),
        )

    def owner(self) -> DomainOwner:
        return DomainOwner(
            cluster=self.cluster, namespace=self.namespace, name=self.name, uid=self.uid
        )


@dataclass(slots=True, kw_only=True)
class Leftover:
    """What was made on one host for one incarnation (UID) of a LibvirtMachine: removed once
    that incarnation is confirmed gone (see capl.controllers.machine.cleanup)."""

    ident: Identity
    domain_uuid: str
    target: Target
    spec_json: bytes | None
    """The spec it was created from (NICs, MACs), as the JSON it was read from (`of_spec`):
    a parsed spec is ~2 KB per machine held for the machine's life, its JSON a few hundred
    bytes, and it is read only to remove what was made. None when only the domain is known
    (sweep): the default single NIC on the cluster network is assumed."""
    swept: bool = False

    @staticmethod
    def of_spec(spec: LibvirtMachineSpec) -> bytes:
        """`spec_json` of a spec: the fields it was given, as the API names them."""
        return spec.model_dump_json(by_alias=True, exclude_unset=True).encode()

    @property
    def spec(self) -> LibvirtMachineSpec | None:
        """The spec (parsed afresh on each read), or None (see `spec_json`)."""
        if self.spec_json is None:
            return None
        return LibvirtMachineSpec.model_validate_json(self.spec_json)

    @property
    def uid(self) -> str:
        return self.ident.uid
