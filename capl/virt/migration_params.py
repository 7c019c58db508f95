"""What ``virDomainMigrate3`` is called with, and what a domain definition says about how it
can move (pure: builds flags and parameters, reads XML; no call to a host).

Flags: ``LIVE | PERSIST_DEST | UNDEFINE_SOURCE | ABORT_ON_ERROR``, plus ``NON_SHARED_INC``
when storage is copied (never ``TUNNELLED`` then: libvirt refuses NBD storage copy through a
tunnel), ``AUTO_CONVERGE``, ``POSTCOPY`` and ``UNSAFE`` only when the options allow them.

Why ``NON_SHARED_INC``, as measured against libvirtd 9.0 / QEMU (TCG) on the multi-host bed
with a 256 MiB test guest whose root disk is a qcow2 overlay (21 MiB virtual) on the 16 MiB
base image (/tmp experiments of issue 14; the suite's case: tests/multihost/
test_virt_migration.py):

- ``NON_SHARED_INC`` onto an empty overlay over the same base (what ``prepare`` makes):
  only the top layer is mirrored; the destination overlay keeps its backing file and stays
  small (200 KiB allocated, as on the source).
- ``NON_SHARED_INC`` without the base image on the destination: refused by the destination
  at once (0.1 s, "Cannot access backing file ..."), the domain untouched on the source.
- ``NON_SHARED_DISK`` onto the same prepared overlay: works, but the whole chain is copied
  into the overlay (16 MiB allocated on top of a base that holds the same data).
- ``NON_SHARED_DISK`` with nothing on the destination: works too (libvirt pre-creates the
  file in the active pool), as a standalone qcow2 without a backing file: a full copy does not
  need the base, but every later move copies the whole disk and the base is not shared.

So: the base image by digest plus an empty overlay on the destination, and
``NON_SHARED_INC``. With this guest memory dominated the ~100 MB on the wire in every case;
libvirt's job took 1.2-2.7 s and the guest's downtime was 65-380 ms.

Parameters: ``migrate_uri`` (``tcp://<destination migration address>``: the data stream goes
to the address the caller names, not to what the destination's hostname resolves to),
``migrate_disks`` (only the writable disks capl copies; never the read-only cdrom),
``bandwidth`` (MiB/s). No ``destination_xml``: the volumes sit at the same paths on both hosts.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

import libvirt

from capl.ports.errors import InvalidSpec, Unsupported
from capl.ports.virt.migration import MigrationOptions
from capl.virt.xmlutil import parse

__all__ = [
    "DomainDisk",
    "DomainLayout",
    "domain_layout",
    "migrate_uri",
    "migration_flags",
    "migration_params",
]

BASE_FLAGS = (
    libvirt.VIR_MIGRATE_LIVE
    | libvirt.VIR_MIGRATE_PERSIST_DEST
    | libvirt.VIR_MIGRATE_UNDEFINE_SOURCE
    | libvirt.VIR_MIGRATE_ABORT_ON_ERROR
)

# devices QEMU cannot migrate, or that tie a domain to its host
_UNMOVABLE = ("hostdev", "smartcard", "filesystem", "vsock")


def migration_flags(options: MigrationOptions) -> int:
    flags = int(BASE_FLAGS)
    if options.copy_storage:
        flags |= libvirt.VIR_MIGRATE_NON_SHARED_INC
    if options.allow_auto_converge:
        flags |= libvirt.VIR_MIGRATE_AUTO_CONVERGE
    if options.allow_post_copy:
        flags |= libvirt.VIR_MIGRATE_POSTCOPY
    if options.allow_unsafe:
        flags |= libvirt.VIR_MIGRATE_UNSAFE
    return flags


def migrate_uri(address: str) -> str:
    """``tcp://<address>``; an IPv6 address goes in brackets. Only a hostname or address."""
    value = address.strip()
    try:
        ip = ipaddress.ip_address(value)
    except ValueError:
        if not value or any(ch in value for ch in "/:@[]? \t\n"):
            raise InvalidSpec(f"migration address {address!r} is not a host name or IP") from None
        return f"tcp://{value}"
    return f"tcp://[{ip}]" if ip.version == 6 else f"tcp://{ip}"


def migration_params(
    options: MigrationOptions, *, address: str, disks: tuple[str, ...]
) -> dict[str, object]:
    params: dict[str, object] = {libvirt.VIR_MIGRATE_PARAM_URI: migrate_uri(address)}
    if options.copy_storage:
        if not disks:
            raise InvalidSpec("storage copy asked for, but the domain has no disk to copy")
        params[libvirt.VIR_MIGRATE_PARAM_MIGRATE_DISKS] = list(disks)
    if options.bandwidth_mib_per_s is not None:
        params[libvirt.VIR_MIGRATE_PARAM_BANDWIDTH] = int(options.bandwidth_mib_per_s)
    return params


@dataclass(frozen=True, slots=True, kw_only=True)
class DomainDisk:
    target: str
    path: str
    device: str
    readonly: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class DomainLayout:
    """What a (live) domain definition says matters for moving it."""

    memory_bytes: int
    disks: tuple[DomainDisk, ...]
    fw_cfg_files: tuple[str, ...]
    nic_macs: tuple[tuple[str, str | None], ...]
    """(MAC, libvirt network or None for a bridge) per NIC."""
    unmovable: tuple[str, ...]
    """Device kinds QEMU cannot migrate (``hostdev``...), empty when it can move."""

    def check_movable(self, *, files: set[str], volumes: set[str]) -> None:
        """InvalidSpec/Unsupported unless every file the domain reads is capl's to place:
        writable disks in ``volumes``, read-only disks and fw_cfg files in ``files``."""
        if self.unmovable:
            raise Unsupported(
                f"the domain has devices that cannot migrate: {', '.join(self.unmovable)}",
                reason="NotMigratable",
            )
        for disk in self.disks:
            wanted = files if disk.readonly else volumes
            if disk.path not in wanted:
                kind = "read-only" if disk.readonly else "writable"
                raise InvalidSpec(
                    f"{kind} disk {disk.target} ({disk.path}) is not one of the machine's "
                    "volumes: capl cannot place it on the destination",
                    reason="NotMigratable",
                )
        for path in self.fw_cfg_files:
            if path not in files:
                raise InvalidSpec(
                    f"fw_cfg file {path} is not one of the machine's files", reason="NotMigratable"
                )

    def copied_disks(self) -> tuple[str, ...]:
        return tuple(d.target for d in self.disks if not d.readonly and d.device == "disk")


_UNITS = {"b": 1, "bytes": 1, "k": 1024, "kib": 1024, "m": 1024**2, "mib": 1024**2}
_UNITS |= {"g": 1024**3, "gib": 1024**3, "kb": 1000, "mb": 1000**2, "gb": 1000**3}


def domain_layout(document: str) -> DomainLayout:
    root = parse(document)
    memory = root.find("memory")
    unit = (memory.get("unit") if memory is not None else None) or "KiB"
    size = int((memory.text or "0").strip()) if memory is not None else 0
    disks = []
    for element in root.findall("./devices/disk"):
        source = element.find("source")
        target = element.find("target")
        path = (source.get("file") or source.get("dev") or "") if source is not None else ""
        if not path:  # an empty cdrom tray
            continue
        disks.append(
            DomainDisk(
                target=(target.get("dev") or "") if target is not None else "",
                path=path,
                device=element.get("device") or "disk",
                readonly=element.find("readonly") is not None or element.get("device") == "cdrom",
            )
        )
    fw_cfg = tuple(
        entry.get("file") or ""
        for entry in root.findall("./sysinfo[@type='fwcfg']/entry")
        if entry.get("file")
    )
    nics = []
    for element in root.findall("./devices/interface"):
        mac = element.find("mac")
        source = element.find("source")
        network = source.get("network") if source is not None else None
        if mac is not None and mac.get("address"):
            nics.append((str(mac.get("address")).lower(), network))
    unmovable = tuple(kind for kind in _UNMOVABLE if root.find(f"./devices/{kind}") is not None)
    return DomainLayout(
        memory_bytes=size * _UNITS.get(unit.lower(), 1024),
        disks=tuple(disks),
        fw_cfg_files=fw_cfg,
        nic_macs=tuple(nics),
        unmovable=unmovable,
    )
