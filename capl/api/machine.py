"""LibvirtMachine: one libvirt domain that becomes one Kubernetes node (the InfraMachine).

Design notes:

- Everything needed to find the domain again lives in `spec` (`hostName`, `domainUUID`,
  `providerID`), because `clusterctl move` restores no status. The controller writes these
  once; transition rules make them immutable once set (see `MACHINE_SPEC_TRANSITION_RULES`).
  The rules sit on LibvirtMachine's `spec` field, not on `LibvirtMachineSpec`, because
  templates embed the same spec and must stay mutable for the topology controller's dry runs.
- `image` is immutable: a different base image means a different machine (a rollout).
- `networkInterfaces` empty means one NIC on the cluster's network.
- `networkInterfaces[].addressesFromPools` (Cluster API IPAM, as CAPV/CAPMOX/Metal3 name it):
  the controller claims an address per pool (an IPAddressClaim, `capl.controllers.machine.ipam`)
  and gives the bound IPAddress to the guest: a DHCP reservation where capl runs the DHCP
  (the cluster network in nat/isolated mode), else static network configuration in the
  Ignition config or the NoCloud `network-config`. Exclusive with `ip`.
- Day-2 changes (`capl.controllers.machine.day2`): `cpus`, `memoryMiB` (up to `maxCPUs` /
  `maxMemoryMiB`), `rootVolume.sizeGiB` and `extraDisks[].sizeGiB` (grow only: a shrink is
  refused by the API server, naming the field), extra disks and NICs added or removed at the
  end of the list are applied to the running domain (live and persistent); what the guest
  cannot take live waits for the next power cycle (the HardwareUpdated condition says so).
- Live migration moves a domain to another host, so `hostName` is immutable *except* along
  a migration: the migration controller first records the destination in
  `spec.migrationTarget` (before any libvirt call; while it is set the machine controller
  never creates or starts the domain), and after libvirt moved the domain it sets `hostName`
  to that value and clears `migrationTarget` in one write. The transition rule allows
  exactly that, so the API server itself (not only the webhook) refuses any other change.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal, Self

from pydantic import Field, model_validator

from capl.api.base import (
    DNS_LABEL_PATTERN,
    HTTPURL,
    UUID,
    AbsolutePath,
    BridgeName,
    DNSLabel,
    DNSSubdomain,
    IPv4Address,
    K8sModel,
    LibvirtName,
    MACAddress,
    ProviderID,
    SHA256Checksum,
    SizeGiB,
    cel,
    immutable_once_set,
    map_list,
    schema_extra,
)
from capl.api.constants import API_VERSION, Kind
from capl.api.hardware import (
    CPU,
    TOPOLOGY_RULE,
    TPM,
    HostDevice,
    Hugepages,
    MediatedDevice,
    XMLPatch,
)
from capl.api.meta import Condition, InitializationStatus, MachineAddress, ObjectMeta

ImageFormat = Literal["qcow2", "raw"]
DiskName = Annotated[str, Field(min_length=1, max_length=32, pattern=DNS_LABEL_PATTERN)]
Firmware = Literal["bios", "uefi"]
DomainType = Literal["auto", "kvm", "qemu"]
EvictionStrategy = Literal["LiveMigrate", "LiveMigrateIfPossible", "Recreate", "None"]
DEFAULT_EVICTION_STRATEGY: EvictionStrategy = "LiveMigrateIfPossible"

_IMAGE_ONE_SOURCE = cel(
    "(has(self.url) ? 1 : 0) + (has(self.path) ? 1 : 0) + (has(self.volume) ? 1 : 0) == 1",
    "image: exactly one of url, path or volume must be set",
)


class ImageSource(K8sModel):
    """The base image the root disk is a copy-on-write overlay of. Exactly one source."""

    model_config = {"json_schema_extra": schema_extra(rules=[_IMAGE_ONE_SOURCE])}

    url: HTTPURL | None = None
    """http(s) URL of the image; imported once into the cluster's storage pool per host."""
    path: AbsolutePath | None = None
    """Absolute path of an image file on the host."""
    volume: LibvirtName | None = None
    """Name of an existing volume in the cluster's storage pool on the host."""
    checksum: SHA256Checksum | None = None
    """Expected digest of the image file, `sha256:<64 hex digits>`; verified on import."""
    format: ImageFormat = "qcow2"
    """Disk format of the image: qcow2 or raw."""

    @model_validator(mode="after")
    def _exactly_one_source(self) -> Self:
        sources = [s for s in (self.url, self.path, self.volume) if s is not None]
        if len(sources) != 1:
            raise ValueError("image: exactly one of url, path or volume must be set")
        return self


class RootVolume(K8sModel):
    """The root disk of the machine."""

    size_gib: SizeGiB = Field(alias="sizeGiB")
    """Size of the root disk in GiB; at least the virtual size of the image."""


class Disk(K8sModel):
    """An additional empty disk."""

    name: DiskName
    """Name of the disk, unique within the machine; part of the volume name."""
    size_gib: SizeGiB = Field(alias="sizeGiB")
    """Size in GiB."""


_NIC_ONE_ATTACHMENT = cel(
    "!(has(self.network) && has(self.bridge))",
    "networkInterfaces: network and bridge are mutually exclusive",
)
_NIC_IP_ON_CLUSTER_NETWORK = cel(
    "!has(self.ip) || (!has(self.network) && !has(self.bridge))",
    "networkInterfaces: ip can only be reserved on the cluster network"
    " (leave network and bridge unset)",
    field_path=".ip",
)


_NIC_IP_OR_POOLS = cel(
    "!has(self.ip) || !has(self.addressesFromPools)",
    "networkInterfaces: ip and addressesFromPools are mutually exclusive",
    field_path=".addressesFromPools",
)


class IPPoolReference(K8sModel):
    """A Cluster API IPAM pool (TypedLocalObjectReference with a required apiGroup), e.g.
    apiGroup ipam.cluster.x-k8s.io, kind InClusterIPPool or GlobalInClusterIPPool."""

    api_group: DNSSubdomain = Field(alias="apiGroup")
    """API group of the pool kind."""
    kind: Annotated[str, Field(min_length=1, max_length=63, pattern=r"^[A-Z][A-Za-z0-9]*$")]
    """Kind of the pool."""
    name: DNSSubdomain
    """Name of the pool (in the machine's namespace for namespaced pool kinds)."""


class NetworkInterface(K8sModel):
    """A NIC. With neither network nor bridge set it is attached to the cluster network."""

    model_config = {
        "json_schema_extra": schema_extra(
            rules=[_NIC_ONE_ATTACHMENT, _NIC_IP_ON_CLUSTER_NETWORK, _NIC_IP_OR_POOLS]
        )
    }

    network: LibvirtName | None = None
    """Name of a libvirt network on the host (default: the cluster network)."""
    bridge: BridgeName | None = None
    """Name of a host bridge to attach to directly."""
    mac: MACAddress | None = None
    """MAC address (default: derived from the machine's identity, stable across restarts)."""
    ip: IPv4Address | None = None
    """Fixed IPv4 address, reserved by DHCP on the cluster network."""
    addresses_from_pools: list[IPPoolReference] | None = Field(
        default=None, min_length=1, max_length=1, alias="addressesFromPools"
    )
    """Take the NIC's IPv4 address from this Cluster API IPAM pool (an IPAddressClaim per
    pool, released when the machine is deleted). One pool: capl's networks are IPv4 and a
    NIC gets one address."""


class LibvirtMachineSpec(K8sModel):
    """Desired state of a LibvirtMachine."""

    model_config = {
        "json_schema_extra": schema_extra(
            rules=[
                cel(
                    "!has(self.providerID) || !has(self.domainUUID)"
                    " || self.providerID == 'libvirt:///' + self.domainUUID",
                    "providerID must be libvirt:/// followed by domainUUID",
                    field_path=".providerID",
                ),
                TOPOLOGY_RULE,
                cel(
                    "!has(self.maxCPUs) || !has(self.cpus) || self.cpus <= self.maxCPUs",
                    "cpus must not exceed maxCPUs",
                    field_path=".cpus",
                ),
                cel(
                    "!has(self.maxMemoryMiB) || !has(self.memoryMiB)"
                    " || self.memoryMiB <= self.maxMemoryMiB",
                    "memoryMiB must not exceed maxMemoryMiB",
                    field_path=".memoryMiB",
                ),
            ]
        )
    }

    provider_id: ProviderID | None = Field(default=None, alias="providerID")
    """`libvirt:///<domain UUID>`; set by the controller, equal to the Node's spec.providerID."""
    domain_uuid: UUID | None = Field(default=None, alias="domainUUID")
    """UUID of the libvirt domain; set by the controller when the domain is defined."""
    host_name: DNSLabel | None = None
    """Name of the host (spec.hosts[].name of the LibvirtCluster) the domain runs on. Pins the
    machine when set by the user; otherwise the controller records its placement here."""
    cpus: int = Field(default=2, ge=1, le=512)
    """Number of virtual CPUs."""
    memory_mib: int = Field(default=4096, ge=64, le=4194304, alias="memoryMiB")
    """Memory in MiB (at least 64)."""
    max_cpus: int | None = Field(default=None, ge=1, le=512, alias="maxCPUs")
    """Most vCPUs `cpus` may be raised to on the running machine: the domain is defined with
    this many vCPUs of which `cpus` are online, and a raise is hot-plugged. Default: `cpus`
    (a raise then takes effect at the next power cycle)."""
    max_memory_mib: int | None = Field(default=None, ge=64, le=4194304, alias="maxMemoryMiB")
    """Most memory `memoryMiB` may be raised to on the running machine (the balloon gives
    the guest `memoryMiB` of it; a raise deflates the balloon). Default: `memoryMiB` (a
    raise then takes effect at the next power cycle)."""
    image: ImageSource
    """Base image of the root disk."""
    root_volume: RootVolume | None = None
    """Root disk size (default: the virtual size of the image)."""
    extra_disks: list[Disk] | None = Field(
        default=None, max_length=16, json_schema_extra=map_list("name")
    )
    """Additional empty disks, keyed by name."""
    network_interfaces: list[NetworkInterface] | None = Field(default=None, max_length=8)
    """NICs in guest order (default: one NIC on the cluster network)."""
    firmware: Firmware = "bios"
    """Boot firmware: bios (SeaBIOS) or uefi (OVMF)."""
    domain_type: DomainType = "auto"
    """libvirt domain type: kvm, qemu (TCG emulation) or auto (kvm when the host offers it)."""
    vnc: bool = False
    """A graphical console: a VNC display on a unix socket of the host only (never a TCP
    port), reached with `capl vnc MACHINE`. Applies when the domain is defined."""
    eviction_strategy: EvictionStrategy | None = None
    """What happens to the machine when its host goes into maintenance (as KubeVirt's
    evictionStrategy): LiveMigrate (live-migrate to another host of the cluster; the
    maintenance waits while that is impossible), LiveMigrateIfPossible (migrate, else
    Recreate), Recreate (delete the Machine so that its owner creates a replacement on
    another host), None (stay: the maintenance waits and says so). Default:
    LiveMigrateIfPossible."""
    migration_target: DNSLabel | None = None
    """Set by capl while a live migration moves the domain: the destination host. Not for
    users (refused in templates)."""
    # hardware (capl.api.hardware)
    cpu: CPU | None = None
    """Guest CPU model/mode, topology, pinning (dedicatedCPUs) and NUMA cells."""
    hugepages: Hugepages | None = None
    """Back the guest memory with hugepages of this size."""
    host_devices: list[HostDevice] | None = Field(
        default=None, max_length=8, json_schema_extra=map_list("name")
    )
    """PCI devices of the host passed through, by address or vendor/product."""
    mediated_devices: list[MediatedDevice] | None = Field(
        default=None, max_length=8, json_schema_extra=map_list("name")
    )
    """Mediated devices (vGPU) of the host, by UUID or mdev type."""
    tpm: TPM | None = None
    """An emulated TPM 2.0 (swtpm on the host)."""
    secure_boot: bool | None = None
    """UEFI secure boot (OVMF with the secure-boot variables); needs firmware uefi."""
    xml_patches: list[XMLPatch] | None = Field(default=None, max_length=32, alias="xmlPatches")
    """Restricted changes of the generated domain XML (see capl.api.hardware.XMLPatch)."""

    @model_validator(mode="after")
    def _within_maxima(self) -> Self:
        if self.max_cpus is not None and self.cpus > self.max_cpus:
            raise ValueError("cpus must not exceed maxCPUs")
        if self.max_memory_mib is not None and self.memory_mib > self.max_memory_mib:
            raise ValueError("memoryMiB must not exceed maxMemoryMiB")
        return self


# Transition rules of a LibvirtMachine's spec (not of templates: see the module docstring).
MACHINE_SPEC_TRANSITION_RULES = (
    cel(
        "self.image == oldSelf.image",
        "image is immutable",
        field_path=".image",
        reason="FieldValueForbidden",
    ),
    cel(
        "!has(oldSelf.hostName) || oldSelf.hostName == ''"
        " || (has(self.hostName) && (self.hostName == oldSelf.hostName"
        " || (has(oldSelf.migrationTarget) && self.hostName == oldSelf.migrationTarget"
        " && !has(self.migrationTarget))))",
        "hostName is immutable once set; it changes only when a live migration completes"
        " (to the host in migrationTarget, which is cleared in the same write)",
        field_path=".hostName",
        reason="FieldValueForbidden",
    ),
    cel(
        "!has(self.migrationTarget) || !has(self.hostName)"
        " || self.migrationTarget != self.hostName",
        "migrationTarget must name another host than hostName",
        field_path=".migrationTarget",
    ),
    cel(
        "!has(self.migrationTarget) || !has(oldSelf.migrationTarget)"
        " || self.migrationTarget == oldSelf.migrationTarget",
        "migrationTarget cannot change while a migration runs (clear it first)",
        field_path=".migrationTarget",
        reason="FieldValueForbidden",
    ),
    immutable_once_set("providerID"),
    immutable_once_set("domainUUID"),
    cel(
        "!has(oldSelf.rootVolume) || (has(self.rootVolume)"
        " && self.rootVolume.sizeGiB >= oldSelf.rootVolume.sizeGiB)",
        "rootVolume.sizeGiB cannot shrink (a disk only grows in place) and cannot be removed",
        field_path=".rootVolume.sizeGiB",
        reason="FieldValueForbidden",
    ),
    cel(
        "!has(oldSelf.extraDisks) || !has(self.extraDisks) || self.extraDisks.all(d,"
        " oldSelf.extraDisks.all(o, o.name != d.name || d.sizeGiB >= o.sizeGiB))",
        "extraDisks[].sizeGiB cannot shrink (a disk only grows in place; remove the disk"
        " and add one under another name instead)",
        field_path=".extraDisks",
        reason="FieldValueForbidden",
    ),
)


class LibvirtMachineStatus(K8sModel):
    """Observed state of a LibvirtMachine."""

    initialization: InitializationStatus | None = None
    """Initial provisioning: `provisioned` turns true once the domain runs and has an address."""
    addresses: list[MachineAddress] | None = Field(default=None, max_length=32)
    """Addresses of the machine (Hostname, InternalIP, InternalDNS)."""
    failure_domain: str | None = Field(default=None, min_length=1, max_length=256)
    """Failure domain (host name) the machine was placed in."""
    host: str | None = Field(default=None, max_length=63)
    """Host the domain runs on."""
    domain_state: str | None = Field(default=None, max_length=32)
    """libvirt state of the domain (Running, Shutoff, Paused, ...)."""
    network_uuid: UUID | None = Field(default=None, alias="networkUUID")
    """UUID of the cluster network (LibvirtCluster status.hosts[].networkUUID of the
    machine's host) the machine's DHCP reservations and DNS record were last made or
    restored in; when the LibvirtCluster reports another UUID they are restored again."""
    observed_generation: int | None = Field(default=None, ge=0)
    """The metadata.generation last reconciled."""
    conditions: list[Condition] | None = Field(
        default=None, max_length=32, json_schema_extra=map_list("type")
    )
    """Ready, Paused, DomainProvisioned, BootstrapDataDelivered, AddressAssigned,
    BootstrapSucceeded, Migrating."""


class LibvirtMachine(K8sModel):
    """A libvirt domain that is one node of a workload cluster."""

    KIND: ClassVar[str] = Kind.LIBVIRT_MACHINE

    api_version: Literal["infrastructure.cluster.x-k8s.io/v1alpha1"] = API_VERSION
    kind: Literal["LibvirtMachine"] = "LibvirtMachine"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: LibvirtMachineSpec = Field(
        json_schema_extra=schema_extra(rules=MACHINE_SPEC_TRANSITION_RULES)
    )
    status: LibvirtMachineStatus = Field(default_factory=LibvirtMachineStatus)


class LibvirtMachineList(K8sModel):
    api_version: str = API_VERSION
    kind: Literal["LibvirtMachineList"] = "LibvirtMachineList"
    items: list[LibvirtMachine] = Field(default_factory=list)
