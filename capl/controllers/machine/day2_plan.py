"""What a day-2 change of a machine is: the spec against the domain's hardware, as pure data.

`plan_changes` compares a LibvirtMachine's spec with what its domain has (`DomainResources`,
one read) and lists the operations that make them match, in a safe order: grow disks first
(nothing is lost if a later step fails), then add disks and NICs, then remove what the spec
no longer lists, then vCPUs and memory. What cannot change in place is listed in
`DayTwoPlan.not_in_place` and left alone (a rollout replaces the machine; the in-place
extension refuses such a change, `capl.webhooks.inplace`):

- extra disks are matched by name (the disk's serial in the domain); the root disk is the
  first writable disk without a serial;
- NICs are matched by position (guest order): NICs added at the end of
  `networkInterfaces` are hot-plugged, NICs removed from its end are unplugged; a NIC whose
  attachment (network/bridge) or fixed MAC changed is not in place;
- vCPUs are set whenever the persistent or the live count differs; memory whenever the
  persistent target differs or the running domain is smaller than the spec.

Which spec changes Cluster API may leave to this instead of a rollout: `capl.api.inplace`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from capl.api.machine import LibvirtMachineSpec
from capl.controllers.machine.plan import NicPlan, nic_plans
from capl.ports.naming import MachineNames
from capl.ports.virt import DomainResources

__all__ = [
    "AddDisk",
    "AddNic",
    "DayTwoPlan",
    "GrowDisk",
    "RemoveDisk",
    "RemoveNic",
    "SetMemory",
    "SetVcpus",
    "added_disk_volume",
    "fingerprint",
    "plan_changes",
]

GIB = 1024**3


@dataclass(frozen=True, slots=True)
class GrowDisk:
    target: str
    capacity_bytes: int
    field: str
    """The spec field asking for it (`rootVolume.sizeGiB`, `extraDisks[data].sizeGiB`)."""


@dataclass(frozen=True, slots=True)
class AddDisk:
    name: str
    size_gib: int


@dataclass(frozen=True, slots=True)
class RemoveDisk:
    serial: str
    path: str


@dataclass(frozen=True, slots=True)
class AddNic:
    nic: NicPlan


@dataclass(frozen=True, slots=True)
class RemoveNic:
    mac: str
    network: str | None
    """The libvirt network it is on (its DHCP reservation goes with it), else None."""


@dataclass(frozen=True, slots=True)
class SetVcpus:
    count: int
    maximum: int


@dataclass(frozen=True, slots=True)
class SetMemory:
    mib: int
    maximum: int


Change = GrowDisk | AddDisk | RemoveDisk | AddNic | RemoveNic | SetVcpus | SetMemory


@dataclass(frozen=True, slots=True)
class DayTwoPlan:
    changes: tuple[Change, ...] = ()
    not_in_place: tuple[str, ...] = field(default=())
    """What differs but cannot change on this domain (field and why)."""


def added_disk_volume(names: MachineNames, disk_name: str) -> str:
    """The volume of an extra disk added after creation: by name, not by position (the
    positions of the disks made at creation shift when one is removed)."""
    return f"{names.prefix}-disk-{disk_name}.qcow2"


def _disk_changes(
    spec: LibvirtMachineSpec, hardware: DomainResources
) -> tuple[list[Change], list[Change]]:
    """(grow, add+remove) for the root and extra disks."""
    grow: list[Change] = []
    other: list[Change] = []
    root = next((d for d in hardware.disks if d.serial is None), None)
    if spec.root_volume is not None and root is not None:
        wanted = spec.root_volume.size_gib * GIB
        if root.capacity_bytes < wanted:
            grow.append(GrowDisk(root.target, wanted, "rootVolume.sizeGiB"))
    by_serial = {d.serial: d for d in hardware.disks if d.serial is not None}
    listed = {d.name for d in spec.extra_disks or ()}
    for disk in spec.extra_disks or ():
        have = by_serial.get(disk.name)
        if have is None:
            other.append(AddDisk(disk.name, disk.size_gib))
        elif have.capacity_bytes < disk.size_gib * GIB:
            field_name = f"extraDisks[{disk.name}].sizeGiB"
            grow.append(GrowDisk(have.target, disk.size_gib * GIB, field_name))
    for serial, have in by_serial.items():
        if serial not in listed:
            other.append(RemoveDisk(serial, have.path))
    return grow, other


def _nic_changes(
    spec: LibvirtMachineSpec, hardware: DomainResources, *, cluster_network: str, bridge_mode: bool
) -> tuple[list[Change], list[str]]:
    plans = nic_plans(spec, cluster_network=cluster_network, bridge_mode=bridge_mode)
    have = hardware.nics
    changes: list[Change] = []
    refused: list[str] = []
    for plan, nic in zip(plans, have, strict=False):
        same_place = (nic.bridge == plan.bridge) if plan.bridge else (nic.network == plan.network)
        if not same_place:
            refused.append(
                f"networkInterfaces[{plan.index}]: its network or bridge changed (a NIC is"
                " only added or removed at the end of the list in place)"
            )
        elif plan.mac and plan.mac != nic.mac:
            refused.append(f"networkInterfaces[{plan.index}].mac changed")
    interfaces = spec.network_interfaces or []
    for plan in plans[len(have) :]:
        if plan.index < len(interfaces) and interfaces[plan.index].addresses_from_pools:
            refused.append(
                f"networkInterfaces[{plan.index}].addressesFromPools: a NIC with an IPAM"
                " address is configured by the bootstrap data, only at creation"
            )
        else:
            changes.append(AddNic(plan))
    changes += [RemoveNic(nic.mac, nic.network) for nic in reversed(have[len(plans) :])]
    return changes, refused


def plan_changes(
    spec: LibvirtMachineSpec,
    hardware: DomainResources,
    *,
    cluster_network: str,
    bridge_mode: bool,
) -> DayTwoPlan:
    """The operations that make the domain match `spec` (see the module docstring)."""
    grow, disks = _disk_changes(spec, hardware)
    nics, refused = _nic_changes(
        spec, hardware, cluster_network=cluster_network, bridge_mode=bridge_mode
    )
    changes: list[Change] = [*grow, *disks, *nics]
    max_cpus = max(spec.cpus, spec.max_cpus or 0)
    if (
        spec.cpus != hardware.config_vcpus
        or max_cpus > hardware.config_max_vcpus
        or (hardware.running and spec.cpus != hardware.vcpus)
    ):
        changes.append(SetVcpus(spec.cpus, max_cpus))
    max_memory = max(spec.memory_mib, spec.max_memory_mib or 0)
    # the live current memory is the balloon's actual size, which a guest without a balloon
    # driver never moves: only the persistent target and the sizes are compared
    if (
        spec.memory_mib != hardware.config_memory_mib
        or max_memory > hardware.config_max_memory_mib
        or (hardware.running and spec.memory_mib > hardware.max_memory_mib)
    ):
        changes.append(SetMemory(spec.memory_mib, max_memory))
    # additions before removals would reuse nothing: removals of NICs/disks come after the
    # additions only so that a failed addition leaves the old devices in place
    return DayTwoPlan(changes=tuple(changes), not_in_place=tuple(refused))


def fingerprint(spec: LibvirtMachineSpec) -> tuple[Any, ...]:
    """What of `spec` a day-2 change looks at: equal fingerprints, nothing to apply."""
    return (
        spec.cpus,
        spec.max_cpus,
        spec.memory_mib,
        spec.max_memory_mib,
        spec.root_volume.size_gib if spec.root_volume else None,
        tuple((d.name, d.size_gib) for d in spec.extra_disks or ()),
        tuple(
            (n.network, n.bridge, n.mac, n.ip, repr(n.addresses_from_pools))
            for n in spec.network_interfaces or ()
        ),
    )
