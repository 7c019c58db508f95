"""Admission checks the CRD schema cannot express, as pure functions.

Each `validate_*` takes parsed objects (and, for cross-object checks, the other objects it
needs as plain arguments) and returns a `Verdict`: field errors that deny the request and
warnings that `kubectl` prints. The aiohttp layer (capl.webhooks.server) only parses,
looks things up through Protocols and calls these.

Every error names the field it is about (`spec.network.cidr: ...`), so a user reading
`kubectl apply` output knows what to change.

Updates are *ratcheted*: an error that the old object had as well is not reported. An
object that became invalid by a rule added later, or that was created while the webhook was
not installed, can still be updated (and, importantly, the controllers' own write-backs are
never blocked), while every new problem is still caught.

What is checked:

- LibvirtCluster: an adopted network on several hosts gets a warning (capl cannot see
  whether it spans them; a created nat/isolated one on several hosts is refused by the CRD's
  own rule); the CIDR is a network address; the DHCP range lies inside it, avoids the
  network, gateway and broadcast addresses and is ordered; a control-plane VIP inside the
  CIDR is outside the DHCP range; the CIDR does not overlap, and a created network's name
  does not collide with, another LibvirtCluster's network on a shared host.
- LibvirtMachine: the root volume is at least the image's virtual size (when known); MAC
  addresses are unicast and unique; fixed IPs are unique; the hardware fields are
  consistent (`capl.api.hardware.hardware_errors`: topology gives cpus, pinning and NUMA
  cells cover the vCPUs, secure boot with UEFI, XML patches leave capl's elements alone).
- Templates: `spec.template.spec` is immutable, except in the topology controller's dry
  runs (request.dryRun and the `topology.cluster.x-k8s.io/dry-run` annotation); machine
  templates must not carry per-machine identity (mac, ip, providerID, domainUUID) or a
  migration target.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from capl.api import (
    TOPOLOGY_DRY_RUN_ANNOTATION,
    LibvirtCluster,
    LibvirtClusterSpec,
    LibvirtClusterTemplate,
    LibvirtMachine,
    LibvirtMachineSpec,
    LibvirtMachineTemplate,
    ObjectMeta,
)
from capl.api.defaults import gateway_address
from capl.api.hardware import hardware_errors

GIB = 1024**3


@dataclass(frozen=True, order=True)
class FieldError:
    """A problem with one field; `str()` gives `path: message`."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


@dataclass
class Verdict:
    errors: list[FieldError] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def allowed(self) -> bool:
        return not self.errors

    def message(self) -> str:
        return "; ".join(str(e) for e in self.errors)

    def error(self, path: str, message: str) -> None:
        self.errors.append(FieldError(path, message))

    def ratchet(self, old: Verdict | None) -> Verdict:
        """Drop the errors (and warnings) the old object had already."""
        if old is None:
            return self
        return Verdict(
            errors=[e for e in self.errors if e not in old.errors],
            warnings=[w for w in self.warnings if w not in old.warnings],
        )


def is_topology_dry_run(meta: ObjectMeta, *, dry_run: bool) -> bool:
    """The topology controller's server-side-apply dry run: the only allowed template change."""
    return dry_run and meta.has_annotation(TOPOLOGY_DRY_RUN_ANNOTATION)


# --- hosts and networks ----------------------------------------------------------------------


def host_key(uri: str) -> str:
    """Identity of the hypervisor a libvirt URI reaches: driver, host name and path.

    The transport, user and query are dropped (`qemu+ssh://root@kvm1/system` and
    `qemu+tls://kvm1/system` reach the same libvirtd); no host means this machine.
    """
    parts = urlsplit(uri)
    driver = parts.scheme.split("+", 1)[0].lower()
    host = (parts.hostname or "localhost").lower()
    if host in ("127.0.0.1", "::1"):
        host = "localhost"
    return f"{driver}://{host}{parts.path or '/'}"


def _shared_hosts(a: LibvirtClusterSpec, b: LibvirtClusterSpec) -> list[str]:
    theirs = {host_key(h.uri) for h in b.hosts}
    return [h.uri for h in a.hosts if host_key(h.uri) in theirs]


def _ref(meta: ObjectMeta) -> str:
    return f"{meta.namespace}/{meta.name}"


def _same_object(a: ObjectMeta, b: ObjectMeta) -> bool:
    if a.uid and b.uid:
        return a.uid == b.uid
    return (a.namespace, a.name) == (b.namespace, b.name)


def _check_network_spec(spec: LibvirtClusterSpec, prefix: str, verdict: Verdict) -> None:
    net = spec.network
    if net.cidr is None:
        if net.mode != "bridge" and len(spec.hosts) > 1:
            verdict.warnings.append(
                f"{prefix}.network.name: network {net.name} is adopted on {len(spec.hosts)}"
                " hosts; it must be one L2 segment (or routed) across them, which a libvirt"
                " nat or isolated network on each host is not"
            )
        if net.mode == "bridge" and not (
            spec.control_plane_endpoint and spec.control_plane_endpoint.host
        ):
            verdict.warnings.append(
                f"{prefix}.controlPlaneEndpoint: in bridge mode capl cannot publish DNS names;"
                " set a control-plane endpoint (e.g. a kube-vip address)"
            )
        return
    network = ipaddress.IPv4Network(net.cidr, strict=False)
    if str(network) != net.cidr:
        verdict.error(
            f"{prefix}.network.cidr",
            f"{net.cidr} has host bits set; the network address is {network}",
        )
    gateway = ipaddress.IPv4Address(gateway_address(net.cidr))
    reserved = {network.network_address, gateway, network.broadcast_address}
    if net.dhcp is not None:
        start = ipaddress.IPv4Address(net.dhcp.start)
        end = ipaddress.IPv4Address(net.dhcp.end)
        for name, address in (("start", start), ("end", end)):
            path = f"{prefix}.network.dhcp.{name}"
            if address not in network:
                verdict.error(path, f"{address} is outside network.cidr {network}")
            elif address in reserved:
                verdict.error(
                    path,
                    f"{address} is the network, gateway or broadcast address of {network}",
                )
        if start > end:
            verdict.error(f"{prefix}.network.dhcp", f"start {start} is after end {end}")
    endpoint = spec.control_plane_endpoint
    if endpoint is not None and endpoint.host:
        try:
            vip = ipaddress.IPv4Address(endpoint.host)
        except ValueError:
            return
        # The gateway is the libvirt host's own address on the network: an API server on
        # the host (a hosted control plane, a load balancer) is reached there, so it is a
        # valid endpoint; only the network and broadcast addresses are not.
        if vip in (network.network_address, network.broadcast_address):
            verdict.error(
                f"{prefix}.controlPlaneEndpoint.host",
                f"{vip} is the network or broadcast address of {network}",
            )
        elif net.dhcp is not None and (
            ipaddress.IPv4Address(net.dhcp.start) <= vip <= ipaddress.IPv4Address(net.dhcp.end)
        ):
            verdict.error(
                f"{prefix}.controlPlaneEndpoint.host",
                f"{vip} is inside the DHCP range {net.dhcp.start}-{net.dhcp.end}:"
                " a virtual IP must not be handed out to machines",
            )


def _check_against_others(
    cluster: LibvirtCluster, others: Sequence[LibvirtCluster], verdict: Verdict
) -> None:
    net = cluster.spec.network
    creates = net.cidr is not None or net.mode == "bridge"
    for other in sorted(others, key=lambda o: _ref(o.metadata)):
        if _same_object(other.metadata, cluster.metadata):
            continue
        shared = _shared_hosts(cluster.spec, other.spec)
        if not shared:
            continue
        theirs = other.spec.network
        if net.cidr is not None and theirs.cidr is not None:
            mine = ipaddress.IPv4Network(net.cidr, strict=False)
            other_net = ipaddress.IPv4Network(theirs.cidr, strict=False)
            if mine.overlaps(other_net):
                verdict.error(
                    "spec.network.cidr",
                    f"{net.cidr} overlaps {theirs.cidr} of LibvirtCluster"
                    f" {_ref(other.metadata)} on host {shared[0]}",
                )
        other_creates = theirs.cidr is not None or theirs.mode == "bridge"
        if creates and other_creates and net.name is not None and net.name == theirs.name:
            verdict.error(
                "spec.network.name",
                f"network {net.name} on host {shared[0]} is created by LibvirtCluster"
                f" {_ref(other.metadata)}",
            )


def validate_libvirt_cluster(
    cluster: LibvirtCluster,
    *,
    old: LibvirtCluster | None = None,
    others: Sequence[LibvirtCluster] = (),
) -> Verdict:
    """Create (old None) or update of a LibvirtCluster; `others`: all LibvirtClusters."""

    def check(obj: LibvirtCluster) -> Verdict:
        verdict = Verdict()
        _check_network_spec(obj.spec, "spec", verdict)
        _check_against_others(obj, others, verdict)
        return verdict

    return check(cluster).ratchet(check(old) if old is not None else None)


# --- machines --------------------------------------------------------------------------------


def _check_machine_spec(
    spec: LibvirtMachineSpec,
    prefix: str,
    verdict: Verdict,
    *,
    image_size: int | None,
    template: bool,
) -> None:
    root = spec.root_volume
    if image_size is not None and root is not None and root.size_gib * GIB < image_size:
        needed = -(-image_size // GIB)
        verdict.error(
            f"{prefix}.rootVolume.sizeGiB",
            f"{root.size_gib} GiB is smaller than the image's virtual size"
            f" ({image_size} bytes); use at least {needed}",
        )
    url = spec.image.url
    if url is not None and spec.image.checksum is None and urlsplit(url).scheme == "http":
        verdict.warnings.append(
            f"{prefix}.image.checksum: the image is downloaded over plain http and not"
            " verified; set a sha256 checksum"
        )
    for path, message in hardware_errors(
        cpus=spec.cpus,
        memory_mib=spec.memory_mib,
        firmware=spec.firmware,
        cpu=spec.cpu,
        hugepages=spec.hugepages,
        host_devices=spec.host_devices,
        mediated_devices=spec.mediated_devices,
        secure_boot=spec.secure_boot,
        xml_patches=spec.xml_patches,
    ):
        verdict.error(f"{prefix}.{path}", message)
    seen_macs: dict[str, int] = {}
    seen_ips: dict[str, int] = {}
    for i, nic in enumerate(spec.network_interfaces or []):
        path = f"{prefix}.networkInterfaces[{i}]"
        if template:
            if nic.mac is not None:
                verdict.error(
                    f"{path}.mac",
                    "must not be set in a template: every machine created from it would"
                    " share the address",
                )
            if nic.ip is not None:
                verdict.error(
                    f"{path}.ip",
                    "must not be set in a template: every machine created from it would"
                    " share the address (addressesFromPools gives each machine its own"
                    " address from a Cluster API IPAM pool)",
                )
        if nic.mac is not None:
            mac = nic.mac.lower()
            if int(mac[:2], 16) & 1:
                verdict.error(f"{path}.mac", f"{nic.mac} is a multicast address")
            if mac in seen_macs:
                verdict.error(
                    f"{path}.mac", f"duplicates {prefix}.networkInterfaces[{seen_macs[mac]}].mac"
                )
            seen_macs.setdefault(mac, i)
        if nic.ip is not None:
            if nic.ip in seen_ips:
                verdict.error(
                    f"{path}.ip", f"duplicates {prefix}.networkInterfaces[{seen_ips[nic.ip]}].ip"
                )
            seen_ips.setdefault(nic.ip, i)
    if template:
        for name, value in (("providerID", spec.provider_id), ("domainUUID", spec.domain_uuid)):
            if value is not None:
                verdict.error(
                    f"{prefix}.{name}",
                    "must not be set in a template: it identifies one machine's domain",
                )
        if spec.migration_target is not None:
            verdict.error(
                f"{prefix}.migrationTarget",
                "must not be set in a template: capl sets it on one machine while it migrates",
            )
        pinned = [
            *(
                f"hostDevices[{i}].pciAddress"
                for i, d in enumerate(spec.host_devices or ())
                if d.pci_address
            ),
            *(
                f"mediatedDevices[{i}].uuid"
                for i, d in enumerate(spec.mediated_devices or ())
                if d.uuid
            ),
        ]
        for path in pinned:
            verdict.warnings.append(
                f"{prefix}.{path}: names one device; only one machine of the template can"
                " have it (select by vendor/product or mdev type instead)"
            )


def validate_libvirt_machine(
    machine: LibvirtMachine,
    *,
    old: LibvirtMachine | None = None,
    image_size: int | None = None,
) -> Verdict:
    """Create or update of a LibvirtMachine; `image_size`: the image's virtual size in bytes
    when known (None: unknown, not checked)."""

    def check(obj: LibvirtMachine) -> Verdict:
        verdict = Verdict()
        _check_machine_spec(obj.spec, "spec", verdict, image_size=image_size, template=False)
        return verdict

    return check(machine).ratchet(check(old) if old is not None else None)


def validate_libvirt_machine_template(
    template: LibvirtMachineTemplate,
    *,
    old: LibvirtMachineTemplate | None = None,
    dry_run: bool = False,
    image_size: int | None = None,
) -> Verdict:
    def check(obj: LibvirtMachineTemplate) -> Verdict:
        verdict = Verdict()
        _check_machine_spec(
            obj.spec.template.spec,
            "spec.template.spec",
            verdict,
            image_size=image_size,
            template=True,
        )
        return verdict

    verdict = check(template).ratchet(check(old) if old is not None else None)
    if (
        old is not None
        and template.spec.template.spec != old.spec.template.spec
        and not is_topology_dry_run(template.metadata, dry_run=dry_run)
    ):
        verdict.error(
            "spec.template.spec",
            "LibvirtMachineTemplate spec is immutable: create a new template and point the"
            " MachineDeployment or control plane at it",
        )
    return verdict


def validate_libvirt_cluster_template(
    template: LibvirtClusterTemplate,
    *,
    old: LibvirtClusterTemplate | None = None,
    dry_run: bool = False,
) -> Verdict:
    def check(obj: LibvirtClusterTemplate) -> Verdict:
        verdict = Verdict()
        _check_network_spec(obj.spec.template.spec, "spec.template.spec", verdict)
        return verdict

    verdict = check(template).ratchet(check(old) if old is not None else None)
    if (
        old is not None
        and template.spec.template.spec != old.spec.template.spec
        and not is_topology_dry_run(template.metadata, dry_run=dry_run)
    ):
        verdict.error(
            "spec.template.spec",
            "LibvirtClusterTemplate spec is immutable: create a new template and point the"
            " ClusterClass at it",
        )
    return verdict
