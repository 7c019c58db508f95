"""LibvirtCluster: the KVM hosts, network and storage of one workload cluster (the InfraCluster).

Design notes:

- `hosts` is a map-list keyed by name: the API server rejects duplicates and server-side
  apply merges per host. Each host is one Cluster API failure domain named after it.
- `network` either adopts an existing libvirt network (`name` only, never modified or
  deleted) or describes one capl creates on every host (`cidr`, `mode` nat or isolated), or
  a bridge-mode network onto an existing host bridge (`mode: bridge`, `bridge`). A created
  nat or isolated network is one island per host, so it is refused with more than one host
  (bridge mode on a shared LAN is the multi-host network). Names that
  are left empty are filled in by `capl.api.defaults` (mutating webhook, and the controller
  for API servers without the webhook) from the cluster's namespace and name.
- What identifies created infrastructure (network, pool) is set once and then immutable:
  transition rules on LibvirtCluster's `spec` field (not on the spec model, which the
  template kind embeds).
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from capl.api.base import (
    UUID,
    AbsolutePath,
    BridgeName,
    DNSLabel,
    DNSSubdomain,
    IPv4Address,
    IPv4CIDR,
    K8sModel,
    LabelValue,
    LibvirtName,
    LibvirtURI,
    cel,
    immutable_once_set,
    map_list,
    schema_extra,
)
from capl.api.constants import API_VERSION, Kind
from capl.api.meta import (
    APIEndpoint,
    Condition,
    FailureDomain,
    InitializationStatus,
    LocalObjectReference,
    ObjectMeta,
)

NetworkMode = Literal["nat", "isolated", "bridge"]


class HostMaintenance(K8sModel):
    """A host in maintenance: cordoned (nothing new is placed on it, its failure domain is no
    longer offered for control planes) and evacuated, each machine by its
    evictionStrategy. Removing the entry ends the maintenance."""

    reason: str | None = Field(default=None, max_length=256)
    """Why (shown by `capl hosts` and in Events), e.g. "kernel update"."""


class LibvirtHost(K8sModel):
    """A KVM host reachable through libvirt; one failure domain."""

    name: DNSLabel
    """Name of the host, unique in the cluster; also the failure domain's name."""
    uri: LibvirtURI
    """libvirt connection URI, e.g. qemu:///system, qemu+ssh://root@kvm1/system,
    qemu+tls://kvm1/system."""
    credentials_ref: LocalObjectReference | None = None
    """Secret in the same namespace with the connection credentials: `ssh-privatekey` (and
    optionally `known_hosts`) for qemu+ssh, `tls.crt`, `tls.key` and `ca.crt` for qemu+tls."""
    control_plane: bool = True
    """Whether control-plane machines may be placed on this host."""
    insecure_skip_host_key_verification: bool = False
    """qemu+ssh/libssh without a `known_hosts` key in the credentials Secret: connect without
    verifying the host key (man-in-the-middle risk; refused unless set)."""
    allow_insecure_tcp: bool = Field(default=False, alias="allowInsecureTCP")
    """Permit a qemu+tcp URI: unauthenticated and unencrypted, effectively root on the host for
    anyone on the network (refused unless set)."""
    migration_address: DNSSubdomain | None = None
    """Address other hosts send live-migration data to when this host is the destination
    (QEMU listens there; libvirt's qemu.conf `migration_address`). Default: the host part of
    `uri`; required for a URI without one (qemu:///system) to receive migrations."""
    maintenance: HostMaintenance | None = None
    """Set to put the host into maintenance (`capl maintenance start`); remove to end it."""


class DHCPRange(K8sModel):
    """An address range the network's DHCP server hands out."""

    start: IPv4Address
    """First address of the range."""
    end: IPv4Address
    """Last address of the range."""


_NETWORK_RULES = (
    cel(
        "has(self.cidr) || has(self.name) || self.mode == 'bridge'",
        "network: set cidr (capl creates the network), name (adopt an existing network)"
        " or mode bridge with bridge",
    ),
    cel(
        "self.mode != 'bridge' || has(self.bridge)",
        "network.bridge is required when network.mode is bridge",
        field_path=".bridge",
        reason="FieldValueRequired",
    ),
    cel(
        "self.mode != 'bridge' || !has(self.cidr)",
        "network.cidr must not be set when network.mode is bridge"
        " (addresses come from the bridged LAN)",
        field_path=".cidr",
        reason="FieldValueForbidden",
    ),
    cel(
        "!has(self.dhcp) || has(self.cidr)",
        "network.dhcp requires network.cidr",
        field_path=".dhcp",
    ),
)


class NetworkSpec(K8sModel):
    """The libvirt network the machines are attached to, on every host."""

    model_config = {"json_schema_extra": schema_extra(rules=_NETWORK_RULES)}

    name: LibvirtName | None = None
    """Name of the libvirt network. Alone: adopt this existing network. With cidr: the name
    of the network capl creates (default: derived from the cluster's namespace and name)."""
    cidr: IPv4CIDR | None = None
    """IPv4 network (prefix length 8..30) of the network capl creates; the first address is
    the host's (gateway, DNS)."""
    mode: NetworkMode = "nat"
    """nat (routed to the outside through the host), isolated (no forwarding) or bridge
    (attached to an existing host bridge)."""
    bridge: BridgeName | None = None
    """Host bridge to attach to in bridge mode; otherwise the name of the bridge libvirt
    creates (default: chosen by libvirt)."""
    dns_domain: DNSSubdomain | None = None
    """DNS domain of the network; machines are `<name>.<dnsDomain>`, the control-plane
    endpoint defaults to `api.<dnsDomain>`."""
    dhcp: DHCPRange | None = None
    """DHCP range (default: the whole network after the gateway address)."""


class StoragePoolSpec(K8sModel):
    """The directory storage pool holding the cluster's volumes on every host."""

    name: LibvirtName | None = None
    """Pool name (default: derived from the cluster's namespace and name); adopted when a pool
    of that name exists."""
    path: AbsolutePath | None = None
    """Directory of the pool (default: /var/lib/libvirt/images/<pool name>)."""


_CLUSTER_SPEC_RULES = (
    cel(
        "self.hosts.all(h, self.hosts.exists_one(o, o.uri == h.uri))",
        "hosts: each uri must appear once",
        field_path=".hosts",
    ),
    cel(
        "self.hosts.exists(h, !has(h.controlPlane) || h.controlPlane)",
        "hosts: at least one host must allow control-plane machines (controlPlane: true)",
        field_path=".hosts",
    ),
    # A nat or isolated network capl creates is one libvirt network per host, each its own
    # L2 island behind its own bridge: machines on different hosts could not reach each
    # other, and api.<dnsDomain> would resolve to addresses some nodes cannot reach.
    # libvirt cannot express routes between hosts' networks, so this is refused.
    cel(
        "!has(self.network.cidr) || self.network.mode == 'bridge' || size(self.hosts) == 1",
        "network.mode nat or isolated with more than one host: capl creates the network on"
        " each host as a separate island (its own bridge and DHCP), so machines on different"
        " hosts could not reach each other or the control-plane endpoint; use mode bridge"
        " with a bridge on a LAN all hosts share, or a single host",
        field_path=".network.mode",
    ),
)


class LibvirtClusterSpec(K8sModel):
    """Desired state of a LibvirtCluster."""

    model_config = {"json_schema_extra": schema_extra(rules=_CLUSTER_SPEC_RULES)}

    control_plane_endpoint: APIEndpoint | None = None
    """Endpoint of the workload cluster's API server. Left empty, capl sets it to
    `api.<network.dnsDomain>:6443` and keeps that DNS name pointing at the control-plane
    machines; set it to a virtual IP when the cluster runs its own (e.g. kube-vip)."""
    hosts: list[LibvirtHost] = Field(
        min_length=1, max_length=32, json_schema_extra=map_list("name")
    )
    """KVM hosts of the cluster, at least one; each is a failure domain."""
    network: NetworkSpec
    """The machines' network on every host."""
    storage_pool: StoragePoolSpec | None = None
    """Storage pool of the cluster's volumes on every host."""
    region: LabelValue | None = None
    """The region of the cluster's hosts: the workload Nodes get the label
    `topology.kubernetes.io/region` with this value (as `topology.kubernetes.io/zone` with
    their host's name, the failure domain), like a cloud provider sets them. A label value:
    at most 63 characters, alphanumerics at both ends, '-', '_' or '.' inside."""


# Transition rules of a LibvirtCluster's spec (not of templates: see the module docstring).
CLUSTER_SPEC_TRANSITION_RULES = (
    immutable_once_set("controlPlaneEndpoint.host"),
    immutable_once_set("controlPlaneEndpoint.port", string=False),
    immutable_once_set("network.name"),
    immutable_once_set("network.cidr"),
    immutable_once_set("network.bridge"),
    immutable_once_set("network.dnsDomain"),
    cel(
        "self.network.mode == oldSelf.network.mode",
        "network.mode is immutable",
        field_path=".network.mode",
        reason="FieldValueForbidden",
    ),
    immutable_once_set("storagePool.name"),
    immutable_once_set("storagePool.path"),
)


MaintenancePhase = Literal["Evacuating", "Blocked", "Evacuated"]


class HostMaintenanceStatus(K8sModel):
    """How a host's maintenance goes."""

    phase: MaintenancePhase
    """Evacuating (machines are being moved or replaced), Blocked (a machine cannot leave:
    evictionStrategy None, or LiveMigrate without a possible migration; the message says
    which), Evacuated (no machine of the cluster is left on the host)."""
    machines: int = Field(default=0, ge=0)
    """Machines of the cluster still on the host."""
    message: str | None = Field(default=None, max_length=1024)
    """What is being waited on."""


class HostStatus(K8sModel):
    """What capl observed and set up on one host."""

    name: DNSLabel
    """Name of the host (spec.hosts[].name)."""
    reachable: bool | None = None
    """Whether the last connection attempt succeeded."""
    libvirt_version: str | None = Field(default=None, max_length=64)
    """Version of the host's libvirt daemon."""
    network: str | None = Field(default=None, max_length=200)
    """Name of the cluster's libvirt network on this host."""
    network_created: bool | None = None
    """True when capl created that network (and will remove it), false when adopted."""
    network_uuid: UUID | None = Field(default=None, alias="networkUUID")
    """UUID of that network as last seen on this host. It changes when the network is
    re-created (by capl after it vanished, or out of band), which tells the machines on the
    host to restore their DHCP reservations and DNS records in it."""
    bridge: str | None = Field(default=None, max_length=15)
    """Bridge device of the network on this host."""
    storage_pool: str | None = Field(default=None, max_length=200)
    """Name of the cluster's storage pool on this host."""
    storage_pool_created: bool | None = None
    """True when capl created that pool (and will remove it), false when adopted."""
    message: str | None = Field(default=None, max_length=1024)
    """Why the host is not ready, when it is not."""
    maintenance: HostMaintenanceStatus | None = None
    """Progress of the host's maintenance, while spec.hosts[].maintenance is set."""


class LibvirtClusterStatus(K8sModel):
    """Observed state of a LibvirtCluster."""

    initialization: InitializationStatus | None = None
    """Initial provisioning: `provisioned` turns true once network and pool exist on every
    control-plane host and the endpoint is known; never set back to false."""
    failure_domains: list[FailureDomain] | None = Field(
        default=None, max_length=32, json_schema_extra=map_list("name")
    )
    """One failure domain per host."""
    hosts: list[HostStatus] | None = Field(
        default=None, max_length=32, json_schema_extra=map_list("name")
    )
    """Per-host state."""
    observed_generation: int | None = Field(default=None, ge=0)
    """The metadata.generation last reconciled."""
    conditions: list[Condition] | None = Field(
        default=None, max_length=32, json_schema_extra=map_list("type")
    )
    """Ready, Paused, HostsReachable, NetworkReady, StorageReady, ControlPlaneEndpointReady."""


class LibvirtCluster(K8sModel):
    """The libvirt infrastructure of one workload cluster."""

    KIND: ClassVar[str] = Kind.LIBVIRT_CLUSTER

    api_version: Literal["infrastructure.cluster.x-k8s.io/v1alpha1"] = API_VERSION
    kind: Literal["LibvirtCluster"] = "LibvirtCluster"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: LibvirtClusterSpec = Field(
        json_schema_extra=schema_extra(rules=CLUSTER_SPEC_TRANSITION_RULES)
    )
    status: LibvirtClusterStatus = Field(default_factory=LibvirtClusterStatus)


class LibvirtClusterList(K8sModel):
    api_version: str = API_VERSION
    kind: Literal["LibvirtClusterList"] = "LibvirtClusterList"
    items: list[LibvirtCluster] = Field(default_factory=list)
