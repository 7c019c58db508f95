"""Pure decisions of the LibvirtMachine controller: no I/O, no clock, no globals.

The services of `capl.controllers.machine` read the world and act; everything they *decide*
lives in the `plan*` modules so that it can be tested without an API server or a host. This
one holds what one machine's creation decides:

- reading bootstrap data from its Secret (`read_bootstrap`), Ignition validated up front;
- MAC candidates (`nic_mac`, `mac_candidates`), the NICs (`nic_plans`) and the DNS name of
  a machine;
- the base image source and volume name (`image_plan`);
- the libvirt domain (`build_domain_spec`), whether a found domain is ours (`owner_matches`);
- error classification (`classify`): condition reason, whether to retry soon, whether what a
  failed creation left must be rolled back;
- fault-injection points for the crash-consistency test (`fault_point`).

The others: `plan_placement` (choosing a host, the placement record), `plan_addresses`
(status.addresses, what to restore in a re-created network), `plan_orphans` (whether a
machine accounts for a domain, when an orphan may go).

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
import os
import posixpath
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlsplit

from capl.api import constants as c
from capl.api.machine import LibvirtMachineSpec
from capl.controllers.machine.plan_hardware import domain_hardware
from capl.ports.bootstrap import validate_ignition
from capl.ports.errors import (
    AddressConflict,
    AddressExhausted,
    AlreadyExists,
    BootstrapDataError,
    BridgeNotFound,
    Busy,
    CredentialsError,
    DeviceUnavailable,
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
    DiskBus,
    DiskDevice,
    DiskSpec,
    DomainOwner,
    DomainSpec,
    Firmware,
    FwCfgEntry,
    ImageFromPath,
    ImageFromURL,
    ImageFromVolume,
    ImageSource,
    NicSpec,
    VolumeFormat,
)

__all__ = [
    "FAULT_ENV",
    "FAULT_EXIT_CODE",
    "FAULT_STEPS",
    "IGNITION_FWCFG_KEY",
    "MAX_MAC_ATTEMPTS",
    "RESERVED_HOSTNAMES",
    "BootstrapData",
    "BootstrapProblem",
    "Failure",
    "ImagePlan",
    "NicPlan",
    "build_domain_spec",
    "classify",
    "dns_name",
    "domain_state_text",
    "fault_point",
    "image_plan",
    "mac_candidates",
    "nic_mac",
    "nic_plans",
    "owner_matches",
    "read_bootstrap",
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


_FAULT: Final = os.environ.get(FAULT_ENV) or None
"""The step `CAPL_FAULT` names, read once (the tests set it for the whole process)."""


def fault_point(step: str) -> None:
    """Exit the process here if `CAPL_FAULT` names `step` (see FAULT_ENV)."""
    if step == _FAULT:
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
    network_config: bytes | None = None
    """NoCloud `network-config` (cloud-config only): static addresses from IPAM."""

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


def mac_candidates(plan: NicPlan, *, cluster: str, namespace: str, name: str) -> Iterator[str]:
    """The MACs a NIC may get, in order, each derived when asked (the first one is taken
    almost always: a hash per candidate is not paid up front)."""
    if plan.mac:
        yield plan.mac
        return
    for attempt in range(MAX_MAC_ATTEMPTS):
        yield nic_mac(
            cluster=cluster, namespace=namespace, name=name, index=plan.index, attempt=attempt
        )


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
        max_vcpus=spec.max_cpus,
        max_memory_mib=spec.max_memory_mib,
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
        hardware=domain_hardware(spec),
        machine="q35" if spec.secure_boot else None,  # secure boot needs SMM: q35
        vnc=spec.vnc,
    )


def domain_state_text(state: str) -> str:
    """ "running" -> "Running" (status.domainState)."""
    return state[:1].upper() + state[1:]


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
    (DeviceUnavailable, c.Reason.HARDWARE_UNAVAILABLE, True),
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
