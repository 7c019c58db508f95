"""Pure decisions of the LibvirtMachine controller: no I/O, no clock, no globals.

The reconciler (`capl.controllers.libvirtmachine`) reads the world and acts; everything it
*decides* lives here so that it can be tested without an API server or a host:

- reading bootstrap data from its Secret (`read_bootstrap`), Ignition validated up front;
- placement (`choose_host`): the host with the most memory left among reachable candidates;
- the placement record (`Placement`): what deletion needs when the LibvirtCluster is gone,
  kept in an annotation because `clusterctl move` restores no status;
- MAC candidates (`nic_mac`, `mac_candidates`) and the DNS names of a machine;
- the base image source and volume name (`image_plan`);
- the libvirt domain (`build_domain_spec`);
- addresses (`merge_addresses`): lease + agent, the last known address kept while a source
  reports nothing;
- which reservations to restore in a re-created network (`restore_plan`): the MACs the
  domain's definition holds, the addresses the machine had;
- error classification (`classify`): condition reason, whether to retry soon, whether what a
  failed creation left must be rolled back;
- fault-injection points for the crash-consistency test (`fault_point`);
- orphans (`accounts_for`, `OrphanTracker`): whether a LibvirtMachine accounts for a domain
  tagged with its name, and when a domain nothing accounts for has been seen long enough to be
  removed (time is passed in: the caller owns the clock).

MACs. A NIC's MAC is `capl.ports.naming.machine_mac(cluster, namespace, name, attempt)`;
attempt 0 normally. A reservation for that MAC held by another host name (a 24-bit
collision) makes the controller try the next attempt. The DHCP reservation carries the
machine's host name, so "our" reservation is the one with one of our candidate MACs *and*
our name: the choice needs no record of its own and survives restarts and `clusterctl move`
(the domain XML holds the MAC once defined; deletion removes reservations by that rule).
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import json
import os
import posixpath
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlsplit

from capl.api import constants as c
from capl.api.machine import LibvirtMachineSpec
from capl.ports.bootstrap import validate_ignition
from capl.ports.errors import (
    AddressConflict,
    AddressExhausted,
    AlreadyExists,
    BootstrapDataError,
    BridgeNotFound,
    Busy,
    CredentialsError,
    ForeignObjectError,
    HostUnreachable,
    ImageChecksumError,
    ImageError,
    ImageFormatError,
    InvalidSpec,
    NetworkNotFound,
    NotFound,
    OperationInvalid,
    PoolNotFound,
    StorageError,
    StorageFull,
    Unsupported,
    VirtError,
)
from capl.ports.naming import MachineNames, base_image_volume_name, machine_mac
from capl.ports.virt import (
    AddressSource,
    DiskBus,
    DiskDevice,
    DiskSpec,
    DomainNic,
    DomainOwner,
    DomainSpec,
    Firmware,
    FwCfgEntry,
    ImageFromPath,
    ImageFromURL,
    ImageFromVolume,
    ImageSource,
    InterfaceAddress,
    NicSpec,
    VolumeFormat,
)

__all__ = [
    "FAULT_ENV",
    "FAULT_EXIT_CODE",
    "FAULT_STEPS",
    "IGNITION_FWCFG_KEY",
    "MAX_MAC_ATTEMPTS",
    "PLACEMENT_ANNOTATION",
    "RESERVED_HOSTNAMES",
    "BootstrapData",
    "BootstrapProblem",
    "Failure",
    "HostCandidate",
    "ImagePlan",
    "NicPlan",
    "OrphanTracker",
    "Placement",
    "Restore",
    "accounts_for",
    "build_domain_spec",
    "choose_host",
    "classify",
    "committed_memory",
    "dns_name",
    "domain_state_text",
    "fault_point",
    "image_plan",
    "internal_ips",
    "mac_candidates",
    "merge_addresses",
    "nic_mac",
    "nic_plans",
    "owner_matches",
    "pending_on_host",
    "read_bootstrap",
    "recorded_ips",
    "restore_plan",
]

GIB: Final = 1024**3
MIB: Final = 1024**2
IGNITION_FWCFG_KEY: Final = "opt/com.coreos/config"
MAX_MAC_ATTEMPTS: Final = 8

# --- fault injection -------------------------------------------------------------------------

FAULT_ENV: Final = "CAPL_FAULT"
"""`CAPL_FAULT=<step>` makes the process exit at once (os._exit, no clean-up) when the
provisioning of a machine reaches that step: the crash-consistency test kills the manager at
every step and checks that a restarted manager converges. Unset (the default): no effect."""

FAULT_EXIT_CODE: Final = 86

FAULT_STEPS: Final = (
    "identity-recorded",  # spec patch with hostName/domainUUID/providerID + finalizer written
    "base-image",  # the cluster's base image is in the pool
    "root-volume",  # the root overlay exists
    "extra-volumes",  # the extra disks exist
    "bootstrap-volume",  # Ignition file / NoCloud ISO uploaded
    "dhcp-reserved",  # DHCP host reservations (and the DNS name with the first) added
    "dns-recorded",  # after the network step (the DNS name goes with the reservation)
    "domain-defined",  # the domain is defined (persistent, autostart)
    "domain-started",  # the domain was started
    "status-written",  # the status patch of the creating reconcile was sent
)


def fault_point(step: str) -> None:
    """Exit the process here if `CAPL_FAULT` names `step` (see FAULT_ENV)."""
    if os.environ.get(FAULT_ENV) == step:
        os._exit(FAULT_EXIT_CODE)


# --- bootstrap data --------------------------------------------------------------------------


class BootstrapProblem(Exception):
    """The bootstrap Secret is unusable; `reason` is a condition reason. Never holds data."""

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason


@dataclass(frozen=True, slots=True)
class BootstrapData:
    format: c.BootstrapFormat
    data: bytes

    def __repr__(self) -> str:  # never show the content
        return f"BootstrapData(format={self.format.value!r}, bytes={len(self.data)})"


def _decode(secret: Mapping[str, Any], key: str) -> bytes | None:
    data = secret.get("data") or {}
    if key in data and data[key] is not None:
        try:
            return base64.b64decode(str(data[key]), validate=True)
        except (binascii.Error, ValueError):
            raise BootstrapProblem(
                f"key {key!r} of the bootstrap data Secret is not base64",
                reason=c.Reason.BOOTSTRAP_DATA_INVALID,
            ) from None
    string_data = secret.get("stringData") or {}
    if key in string_data and string_data[key] is not None:
        return str(string_data[key]).encode()
    return None


def read_bootstrap(secret: Mapping[str, Any]) -> BootstrapData:
    """Bootstrap data from a Cluster API bootstrap Secret: key `value`, optional `format`
    (`cloud-config`, the default, or `ignition`). Ignition is validated here, before any
    resource is created; the error names the problem, never the content."""
    name = (secret.get("metadata") or {}).get("name", "")
    value = _decode(secret, c.BOOTSTRAP_DATA_KEY)
    if value is None:
        raise BootstrapProblem(
            f"bootstrap data Secret {name} has no key {c.BOOTSTRAP_DATA_KEY!r}",
            reason=c.Reason.BOOTSTRAP_DATA_INVALID,
        )
    raw_format = _decode(secret, c.BOOTSTRAP_FORMAT_KEY)
    text = (raw_format or b"").decode("utf-8", "replace").strip() or c.BootstrapFormat.CLOUD_CONFIG
    try:
        fmt = c.BootstrapFormat(text)
    except ValueError:
        raise BootstrapProblem(
            f"bootstrap data Secret {name}: format {text[:40]!r} is not supported "
            "(cloud-config or ignition)",
            reason=c.Reason.BOOTSTRAP_DATA_INVALID,
        ) from None
    if fmt is c.BootstrapFormat.IGNITION:
        try:
            validate_ignition(value)
        except BootstrapDataError as exc:
            raise BootstrapProblem(
                f"bootstrap data Secret {name}: {exc.message}",
                reason=c.Reason.BOOTSTRAP_DATA_INVALID,
            ) from None
    return BootstrapData(format=fmt, data=value)


# --- placement -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class HostCandidate:
    name: str
    free_bytes: int
    committed_bytes: int = 0
    """Memory of machines already placed on the host whose domains do not run yet."""

    @property
    def headroom(self) -> int:
        return self.free_bytes - self.committed_bytes


def choose_host(candidates: Sequence[HostCandidate]) -> str | None:
    """The candidate with the most memory left (ties: the first in spec order)."""
    best: HostCandidate | None = None
    for candidate in candidates:
        if best is None or candidate.headroom > best.headroom:
            best = candidate
    return None if best is None else best.name


PLACEMENT_ANNOTATION: Final = "libvirtmachine.infrastructure.cluster.x-k8s.io/placement"


@dataclass(frozen=True, slots=True, kw_only=True)
class Placement:
    """Where a machine's resources live; recorded (annotation, JSON) with the identity.

    Deletion prefers the live LibvirtCluster; this record is the fall-back when that is gone
    (forced deletion) and survives `clusterctl move`. Nothing in it is secret: the
    credentials Secret is named, not copied.
    """

    host: str
    uri: str
    pool: str
    network: str | None = None
    dns_domain: str | None = None
    credentials_secret: str | None = None
    cluster: str = ""

    def encode(self) -> str:
        record = {
            "host": self.host,
            "uri": self.uri,
            "pool": self.pool,
            "network": self.network,
            "dnsDomain": self.dns_domain,
            "credentialsSecret": self.credentials_secret,
            "cluster": self.cluster,
        }
        return json.dumps(
            {k: v for k, v in record.items() if v is not None},
            sort_keys=True,
            separators=(",", ":"),
        )

    @classmethod
    def decode(cls, text: str | None) -> Placement | None:
        if not text:
            return None
        try:
            record = json.loads(text)
            return cls(
                host=str(record["host"]),
                uri=str(record["uri"]),
                pool=str(record["pool"]),
                network=record.get("network"),
                dns_domain=record.get("dnsDomain"),
                credentials_secret=record.get("credentialsSecret"),
                cluster=str(record.get("cluster", "")),
            )
        except (ValueError, KeyError, TypeError):
            return None


# --- names, MACs -----------------------------------------------------------------------------


RESERVED_HOSTNAMES: Final = frozenset({"api", "api-int"})
"""Names the LibvirtCluster controller keeps for the control-plane endpoint
(capl.controllers.cluster_dns): a machine called so gets no DNS record of its own."""


def dns_name(hostname: str, dns_domain: str | None) -> str | None:
    """`<hostname>.<dnsDomain>`; None without a DNS domain or for a reserved name."""
    if not dns_domain or hostname in RESERVED_HOSTNAMES:
        return None
    return f"{hostname}.{dns_domain}"


def nic_mac(*, cluster: str, namespace: str, name: str, index: int, attempt: int) -> str:
    """The derived MAC of NIC `index` (see the module docstring)."""
    ident = name if index == 0 else f"{name}#nic{index}"
    return machine_mac(cluster=cluster, namespace=namespace, name=ident, attempt=attempt)


@dataclass(frozen=True, slots=True, kw_only=True)
class NicPlan:
    index: int
    network: str | None
    bridge: str | None
    cluster_network: bool
    """On the cluster's network: DHCP reservation (and DNS for the first one)."""
    mac: str | None
    """Fixed by the user (spec.networkInterfaces[].mac); None: derived."""
    ip: str | None

    def dhcp_name(self, hostname: str) -> str:
        return hostname if self.index == 0 else f"{hostname}-nic{self.index}"


def nic_plans(
    spec: LibvirtMachineSpec, *, cluster_network: str, bridge_mode: bool
) -> list[NicPlan]:
    """The NICs of the machine: the spec's list, or one NIC on the cluster network."""
    interfaces = spec.network_interfaces or []
    if not interfaces:
        return [
            NicPlan(
                index=0,
                network=cluster_network,
                bridge=None,
                cluster_network=not bridge_mode,
                mac=None,
                ip=None,
            )
        ]
    plans = []
    for index, nic in enumerate(interfaces):
        on_cluster = nic.network is None and nic.bridge is None
        plans.append(
            NicPlan(
                index=index,
                network=cluster_network if on_cluster else nic.network,
                bridge=nic.bridge,
                cluster_network=on_cluster and not bridge_mode,
                mac=nic.mac.lower() if nic.mac else None,
                ip=nic.ip,
            )
        )
    return plans


def mac_candidates(plan: NicPlan, *, cluster: str, namespace: str, name: str) -> list[str]:
    if plan.mac:
        return [plan.mac]
    return [
        nic_mac(cluster=cluster, namespace=namespace, name=name, index=plan.index, attempt=a)
        for a in range(MAX_MAC_ATTEMPTS)
    ]


# --- base image ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class ImagePlan:
    volume: str
    source: ImageSource


def image_plan(spec: LibvirtMachineSpec) -> ImagePlan:
    image = spec.image
    fmt = VolumeFormat(image.format)
    digest = image.checksum.split(":", 1)[1] if image.checksum else None
    if image.url is not None:
        label = posixpath.basename(urlsplit(image.url).path) or "image"
        return ImagePlan(
            volume=base_image_volume_name(image=label, digest=digest, url=image.url),
            source=ImageFromURL(url=image.url, sha256=digest, format=fmt),
        )
    if image.path is not None:
        label = posixpath.basename(image.path) or "image"
        return ImagePlan(
            volume=base_image_volume_name(image=label, digest=digest, url=image.path),
            source=ImageFromPath(path=image.path, format=fmt),
        )
    assert image.volume is not None  # the model guarantees exactly one source
    return ImagePlan(volume=image.volume, source=ImageFromVolume(name=image.volume))


# --- the domain ------------------------------------------------------------------------------


def build_domain_spec(
    *,
    names: MachineNames,
    uuid: str,
    owner: DomainOwner,
    spec: LibvirtMachineSpec,
    domain_type: str,
    arch: str,
    root_path: str,
    extra_paths: Sequence[tuple[str, str]],
    ignition_path: str | None,
    cidata_path: str | None,
    nics: Sequence[tuple[NicPlan, str]],
    console_log: str | None,
) -> DomainSpec:
    """The libvirt domain of a machine. `extra_paths`: (disk name, volume path);
    `nics`: (plan, MAC). The NoCloud ISO sits on a virtio-scsi cdrom (guests without an AHCI
    driver see it, on any machine type)."""
    disks = [DiskSpec(path=root_path, format=VolumeFormat.QCOW2, bus=DiskBus.VIRTIO)]
    disks += [
        DiskSpec(path=path, format=VolumeFormat.QCOW2, bus=DiskBus.VIRTIO, serial=disk_name)
        for disk_name, path in extra_paths
    ]
    if cidata_path is not None:
        disks.append(
            DiskSpec(
                path=cidata_path,
                format=VolumeFormat.ISO,
                device=DiskDevice.CDROM,
                bus=DiskBus.SCSI,
                readonly=True,
            )
        )
    fw_cfg = (FwCfgEntry(name=IGNITION_FWCFG_KEY, file=ignition_path),) if ignition_path else ()
    nic_specs = tuple(
        NicSpec(mac=mac, network=None if plan.bridge else plan.network, bridge=plan.bridge)
        for plan, mac in nics
    )
    return DomainSpec(
        name=names.domain,
        uuid=uuid,
        owner=owner,
        vcpus=spec.cpus,
        memory_mib=spec.memory_mib,
        domain_type=domain_type,
        arch=arch,
        title=f"{owner.namespace}/{owner.name}",
        description=(
            f"capl LibvirtMachine {owner.namespace}/{owner.name} of cluster {owner.cluster}"
        ),
        disks=tuple(disks),
        nics=nic_specs,
        firmware=Firmware.UEFI if spec.firmware == "uefi" else Firmware.BIOS,
        fw_cfg=fw_cfg,
        console_log=console_log,
        cpu_mode="host-passthrough" if domain_type == "kvm" else None,
    )


def domain_state_text(state: str) -> str:
    """ "running" -> "Running" (status.domainState)."""
    return state[:1].upper() + state[1:]


# --- addresses -------------------------------------------------------------------------------


def _ip_key(ip: str) -> tuple[int, int]:
    try:
        parsed = ipaddress.ip_address(ip)
    except ValueError:
        return (9, 0)
    return (parsed.version, int(parsed))


def merge_addresses(
    observed: Iterable[InterfaceAddress],
    *,
    previous: Sequence[Mapping[str, Any]] | None,
    hostname: str,
    fqdn: str | None,
) -> tuple[list[dict[str, str]], bool]:
    """status.addresses and whether an IP is known.

    InternalIP: every address the DHCP lease and the guest agent report (lease first, IPv4
    before IPv6, each once). When they report nothing (a lease being renewed, an agent
    restarting), the InternalIPs of `previous` are kept. Then Hostname and InternalDNS.
    """
    seen: dict[str, tuple[int, tuple[int, int]]] = {}
    for address in observed:
        if address.ip in seen:
            continue
        rank = 0 if address.source is AddressSource.LEASE else 1
        seen[address.ip] = (rank, _ip_key(address.ip))
    ips = sorted(seen, key=lambda ip: (seen[ip][1][0], seen[ip][0], seen[ip][1][1]))
    if not ips:
        ips = [
            str(a.get("address"))
            for a in previous or ()
            if a.get("type") == c.AddressType.INTERNAL_IP and a.get("address")
        ]
    result = [{"type": c.AddressType.INTERNAL_IP.value, "address": ip} for ip in ips]
    result.append({"type": c.AddressType.HOSTNAME.value, "address": hostname})
    if fqdn:
        result.append({"type": c.AddressType.INTERNAL_DNS.value, "address": fqdn})
    return result, bool(ips)


@dataclass(frozen=True, slots=True, kw_only=True)
class Restore:
    """One DHCP reservation to restore: the NIC, the MAC its domain uses, the address."""

    plan: NicPlan
    mac: str
    ip: str | None
    """None: no address known for this NIC (a free one is picked)."""


def restore_plan(
    plans: Sequence[NicPlan],
    nics: Sequence[DomainNic],
    *,
    network: str,
    observed: Iterable[InterfaceAddress],
    recorded: Sequence[str],
    cidr: str | None,
) -> list[Restore]:
    """The reservations of a running machine in its cluster network, to be made again after
    the network was re-created (its DHCP hosts and DNS records went with it).

    NICs pair with the domain's interfaces by position (the domain was defined from the
    same plans, in that order); the MAC is the domain's, which may be a collision fallback
    rather than the first candidate. The address, per NIC: the spec's `ip`, else what the
    lease or guest agent reports for that MAC, else the machine's recorded InternalIPs in
    the network's CIDR that no other NIC took, in order (the guest keeps its address until
    its lease runs out, so the reservation must give it the same one)."""
    net = ipaddress.IPv4Network(cidr, strict=False) if cidr else None

    def inside(ip: str) -> bool:
        try:
            address = ipaddress.ip_address(ip)
        except ValueError:
            return False
        return address.version == 4 and (net is None or address in net)

    by_mac: dict[str, str] = {}
    for address in observed:  # lease first (merge order), then agent
        if inside(address.ip):
            by_mac.setdefault(address.mac.lower(), address.ip)
    result: list[Restore] = []
    for plan, nic in zip(plans, nics, strict=False):
        if not plan.cluster_network or nic.network != network:
            continue
        result.append(Restore(plan=plan, mac=nic.mac, ip=plan.ip or by_mac.get(nic.mac)))
    taken = {r.ip for r in result if r.ip}
    spare = [ip for ip in recorded if inside(ip) and ip not in taken]
    filled: list[Restore] = []
    for item in result:
        if item.ip is None and spare:
            item = Restore(plan=item.plan, mac=item.mac, ip=spare.pop(0))
        filled.append(item)
    return filled


def internal_ips(obj: Mapping[str, Any]) -> tuple[str, ...]:
    """The InternalIP addresses a LibvirtMachine reports in status.addresses."""
    return tuple(
        str(address["address"])
        for address in (obj.get("status") or {}).get("addresses") or ()
        if address.get("type") == c.AddressType.INTERNAL_IP and address.get("address")
    )


def recorded_ips(machines: Iterable[Mapping[str, Any]], *, skip_uid: str) -> set[str]:
    """InternalIPs that other LibvirtMachines report (excluded when picking an address).
    The controller gets the same set from an index of its cache instead of scanning."""
    taken: set[str] = set()
    for obj in machines:
        if (obj.get("metadata") or {}).get("uid") == skip_uid:
            continue
        taken.update(internal_ips(obj))
    return taken


def pending_on_host(obj: Mapping[str, Any]) -> bool:
    """Placed on a host (spec.hostName) and not provisioned yet: its memory is committed
    there although its domain may not run (see committed_memory)."""
    spec = obj.get("spec") or {}
    if not spec.get("hostName"):
        return False
    return not ((obj.get("status") or {}).get("initialization") or {}).get("provisioned")


# --- errors ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Failure:
    reason: str
    message: str
    transient: bool
    """Retry soon with backoff (host down, busy); otherwise retry after a long pause."""
    condition: str = c.ConditionType.DOMAIN_PROVISIONED


_REASONS: tuple[tuple[type[Exception], str, bool], ...] = (
    (HostUnreachable, c.Reason.UNREACHABLE, True),
    (CredentialsError, c.Reason.CREDENTIALS_INVALID, False),
    (Busy, c.Reason.DOMAIN_ERROR, True),
    (ImageChecksumError, c.Reason.CHECKSUM_MISMATCH, False),
    (ImageFormatError, c.Reason.IMAGE_UNAVAILABLE, False),
    (ImageError, c.Reason.IMAGE_UNAVAILABLE, True),
    (StorageFull, c.Reason.STORAGE_UNAVAILABLE, True),
    (PoolNotFound, c.Reason.STORAGE_UNAVAILABLE, True),
    (StorageError, c.Reason.STORAGE_UNAVAILABLE, True),
    (ForeignObjectError, c.Reason.NAME_COLLISION, False),
    (AlreadyExists, c.Reason.NAME_COLLISION, False),
    (NetworkNotFound, c.Reason.NETWORK_NOT_FOUND, True),
    (AddressConflict, c.Reason.NETWORK_CONFLICT, False),
    (AddressExhausted, c.Reason.NETWORK_CONFLICT, True),
    (BridgeNotFound, c.Reason.BRIDGE_NOT_FOUND, True),
    (BootstrapDataError, c.Reason.BOOTSTRAP_DATA_INVALID, False),
    (InvalidSpec, c.Reason.DOMAIN_ERROR, False),
    (Unsupported, c.Reason.DOMAIN_ERROR, False),
    (OperationInvalid, c.Reason.DOMAIN_ERROR, True),
    (NotFound, c.Reason.DOMAIN_ERROR, True),
)


def classify(error: VirtError) -> Failure:
    """Condition reason and retry policy of a libvirt error; the message is the error's own
    (it names the libvirt error and never secret material: see capl.ports.errors)."""
    for kind, reason, transient in _REASONS:
        if isinstance(error, kind):
            condition = (
                c.ConditionType.BOOTSTRAP_DATA_DELIVERED
                if isinstance(error, BootstrapDataError)
                else c.ConditionType.DOMAIN_PROVISIONED
            )
            return Failure(str(reason), str(error), transient, condition)
    return Failure(c.Reason.DOMAIN_ERROR, str(error), True)


def owner_matches(found: DomainOwner | None, expected: DomainOwner) -> tuple[bool, bool]:
    """(ours, needs retag): ours ignoring the UID; retag when only the UID differs (move)."""
    if found is None or not found.matches(expected, ignore_uid=True):
        return False, False
    return True, found.uid != expected.uid


def committed_memory(machines: Iterable[Mapping[str, Any]], *, host: str, skip_uid: str) -> int:
    """Memory (bytes) of machines placed on `host` that do not run yet (not provisioned):
    keeps a burst of placements from all landing on the host that looked emptiest."""
    total = 0
    for obj in machines:
        meta = obj.get("metadata") or {}
        spec = obj.get("spec") or {}
        if meta.get("uid") == skip_uid or spec.get("hostName") != host:
            continue
        if not pending_on_host(obj):
            continue
        total += int(spec.get("memoryMiB") or 4096) * MIB
    return total


# --- orphans ---------------------------------------------------------------------------------


def accounts_for(obj: Mapping[str, Any] | None, *, owner_uid: str, domain_uuid: str) -> bool:
    """Whether LibvirtMachine `obj` (None: there is none) accounts for a domain whose owner
    tag names it with `owner_uid`: the same object (UID), or an object of the same name that
    records the domain's UUID (after `clusterctl move`: its next reconcile retags the domain).
    A same-name object with another UID and another domain is a new incarnation: the domain
    belonged to a deleted one."""
    if obj is None:
        return False
    md = obj.get("metadata") or {}
    if owner_uid and md.get("uid") == owner_uid:
        return True
    recorded = str((obj.get("spec") or {}).get("domainUUID") or "").lower()
    return bool(recorded) and recorded == domain_uuid.lower()


class OrphanTracker:
    """When a domain no LibvirtMachine accounts for may be removed by the orphan sweep.

    The informer cache may lag behind the API server (an object just created, a relist in
    progress), so a domain becomes a removal candidate only once it was reported orphaned by
    two consecutive sweeps of its scope (one host of one cluster) *and* at least `grace`
    seconds after it was first reported. A domain missing from a sweep's report, or a scope
    swept with an error, starts over. Pure bookkeeping: the caller passes the time.
    """

    def __init__(self, *, grace: float) -> None:
        self.grace = grace
        self._first_seen: dict[str, dict[str, float]] = {}

    def observe(self, scope: str, orphans: Iterable[str], *, now: float) -> set[str]:
        """Record one complete sweep of `scope` that found `orphans` (domain UUIDs); returns
        the ones confirmed for removal."""
        before = self._first_seen.get(scope, {})
        current = {u.lower() for u in orphans}
        confirmed = {u for u in current if u in before and now - before[u] >= self.grace}
        self._first_seen[scope] = {u: before.get(u, now) for u in current}
        return confirmed

    def reset(self, scope: str) -> None:
        """Forget what was seen in `scope` (it could not be swept completely)."""
        self._first_seen.pop(scope, None)

    def forget(self, domain_uuid: str) -> None:
        """The domain is gone or accounted for again."""
        for seen in self._first_seen.values():
            seen.pop(domain_uuid.lower(), None)

    def pending(self) -> int:
        """Domains seen orphaned once, not confirmed yet."""
        return sum(len(seen) for seen in self._first_seen.values())

    def retain(self, scopes: Iterable[str]) -> None:
        """Drop the state of scopes that no longer exist (a deleted cluster or host)."""
        keep = set(scopes)
        for scope in list(self._first_seen):
            if scope not in keep:
                del self._first_seen[scope]
