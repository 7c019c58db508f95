"""Day-2 changes of a defined domain without replacing it: what its hardware is
(``DomainResources``) and the ``HostDay2`` part of the ``Host`` port (grow a disk, hot-plug a
disk or NIC, set the vCPUs and memory).

Every change is made to the persistent definition and, while the domain runs, to the running
guest too (libvirt's AFFECT_LIVE|AFFECT_CONFIG). What the running guest cannot take (more
vCPUs or memory than the domain was started with as its maximum) is made persistent only and
reported as ``Applied.live=False``: it takes effect at the next power cycle (a reboot from
inside the guest keeps the QEMU process, and with it the old maximum). Every call checks the
owner tag first (``ForeignDomainError``) like the other domain calls.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from capl.ports.virt.domains import DiskSpec, DomainNic, NicSpec
from capl.ports.virt.identity import DomainOwner

__all__ = ["Applied", "DomainDisk", "DomainResources", "HostDay2"]


@dataclass(frozen=True, slots=True, kw_only=True)
class DomainDisk:
    """A writable disk of the domain's persistent definition."""

    target: str
    """The guest device name libvirt gave it (``vda``, ``vdb``, ...)."""
    path: str
    """The host path of its source (a volume of the pool)."""
    serial: str | None
    """The serial capl sets on extra disks (the disk's name in the spec); None on the root."""
    capacity_bytes: int
    """The virtual size the running guest sees (the block device's), else the image's."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DomainResources:
    """What a domain has now: persistent definition, and the live values while it runs."""

    running: bool
    vcpus: int
    """vCPUs the guest has (live while running, else the persistent current count)."""
    max_vcpus: int
    """The most vCPUs the running guest can get without a power cycle (live maximum while
    it runs, else the persistent maximum)."""
    config_vcpus: int
    config_max_vcpus: int
    memory_mib: int
    """Memory the balloon gives the guest (live while running, else persistent)."""
    max_memory_mib: int
    """The domain's memory size (live while running, else persistent): the most the balloon
    can give without a power cycle."""
    config_memory_mib: int
    config_max_memory_mib: int
    disks: tuple[DomainDisk, ...]
    """Writable disks (``device='disk'``, not read-only) in definition order; the first is
    the root disk."""
    nics: tuple[DomainNic, ...]
    """NICs of the persistent definition, in guest order."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Applied:
    """The outcome of one change."""

    live: bool
    """True: the running guest has it now (or the domain is not running and the persistent
    definition has it for its next start). False: persistent only, waiting for the next
    power cycle of a running domain."""


class HostDay2(Protocol):
    """The day-2 operations of a ``Host`` (see the module docstring)."""

    async def domain_hardware(self, uuid: str) -> DomainResources:
        """One read of the domain's definitions (persistent, and live while it runs).
        DomainNotFound when the domain does not exist."""
        ...

    async def grow_disk(
        self, uuid: str, *, owner: DomainOwner, target: str, capacity_bytes: int
    ) -> Applied:
        """Grow the disk ``target`` to ``capacity_bytes``: a running domain through QEMU
        (block_resize: the image grows and the guest sees the new size at once), a stopped one
        by resizing its volume. Never shrinks (a smaller size is InvalidSpec)."""
        ...

    async def attach_disk(self, uuid: str, *, owner: DomainOwner, disk: DiskSpec) -> str:
        """Hot-plug ``disk`` (live and persistent) on the next free ``vdX``; returns the
        target. A disk whose serial is already attached is left as it is (its target)."""
        ...

    async def detach_disk(self, uuid: str, *, owner: DomainOwner, serial: str) -> bool:
        """Unplug the disk with ``serial`` (live and persistent); not there: False."""
        ...

    async def attach_nic(self, uuid: str, *, owner: DomainOwner, nic: NicSpec) -> bool:
        """Hot-plug ``nic`` (live and persistent); a NIC with its MAC already there: False."""
        ...

    async def detach_nic(self, uuid: str, *, owner: DomainOwner, mac: str) -> bool:
        """Unplug the NIC with ``mac`` (live and persistent); not there: False."""
        ...

    async def set_vcpus(
        self, uuid: str, *, owner: DomainOwner, count: int, maximum: int
    ) -> Applied:
        """``count`` vCPUs: persistent (the persistent maximum raised to ``maximum`` when it
        is lower) and, when the running guest's maximum allows, hot-plugged live."""
        ...

    async def set_memory(self, uuid: str, *, owner: DomainOwner, mib: int, maximum: int) -> Applied:
        """``mib`` of memory: persistent (the persistent size raised to ``maximum`` when it
        is lower) and, when the running domain's size allows, through the balloon live."""
        ...
