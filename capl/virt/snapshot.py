"""External snapshots of domains: ``capl.ports.virt.snapshots.Snapshots`` on libvirt.

``LibvirtSnapshots(host)`` uses the host's shared connection and worker pool.

Create
------
``virDomainSnapshotCreateXML`` with every writable file-backed disk ``external`` (a new
qcow2 overlay ``<domain>-<target>-snap-<name>.qcow2`` in the disk's directory; other disks
are left out), ``ATOMIC``; disk-only (``DISK_ONLY``) unless RAM is wanted, then the memory
goes to ``<domain>-snap-<name>.mem`` beside the first disk.

Revert (libvirt 9.0 cannot: "revert to external snapshot not supported yet")
---------------------------------------------------------------------------------
Taking snapshot S froze each disk's image B (S's ``<domain>`` names it) and made the domain
write to S's overlay O. The state at S is therefore "B, with an empty O on top". Revert:

1. forget S's descendants (metadata only) and remember their overlays and memory files;
2. stop the domain (destroy: what it wrote after S is discarded anyway);
3. recreate each O empty, backed by B, through the storage pool of its directory
   (``virStorageVolCreateXML`` with a ``<backingStore>``, so it works on remote hosts);
4. point the persistent definition's disks at the O files again (the current definition, or
   the one saved when S was taken: ``definition``, which undoes devices, vCPUs and memory
   changed since) and mark S current (``REDEFINE|CURRENT``), then remove the descendants'
   files (none is in a chain now);
5. with a memory snapshot: restore the saved RAM (``virDomainRestoreFlags``) with the
   disks replaced by the new O files (what libvirt ≥ 9.9 does itself); else start the domain
   when it ran before the revert (or as ``start`` says).

S survives a revert (revert to it again, or delete it). The overlay directory must be a
libvirt storage pool (capl's pools are); otherwise the revert refuses before stopping
anything.

Delete
------
``virDomainSnapshotDelete`` (libvirt 9.0 merges an external snapshot's overlay into the
image below it: a block commit on a running domain, ``qemu-img commit`` on a stopped one);
the memory file, which libvirt keeps, is removed through its pool.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import xml.etree.ElementTree as ET
from collections.abc import Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import libvirt

from capl.ports.errors import AlreadyExists, DomainNotFound, InvalidSpec, OperationInvalid
from capl.ports.virt import Host, HostId
from capl.ports.virt.snapshots import (
    SnapshotInfo,
    SnapshotKind,
    SnapshotNotFound,
    check_snapshot_name,
)
from capl.virt.host import LibvirtHost
from capl.virt.support import lookup
from capl.virt.xmlutil import parse, serialize, sub

__all__ = ["LibvirtSnapshots", "snapshot_info_of", "snapshots_of"]

_INACTIVE_SECURE = libvirt.VIR_DOMAIN_XML_INACTIVE | libvirt.VIR_DOMAIN_XML_SECURE


def snapshot_info_of(document: str, *, current: bool) -> SnapshotInfo:
    """A ``SnapshotInfo`` from ``virDomainSnapshotGetXMLDesc``."""
    root = parse(document)
    memory = root.find("memory")
    overlays = tuple(
        str(source.get("file"))
        for disk in root.findall("disks/disk")
        if disk.get("snapshot") == "external"
        for source in disk.findall("source")
        if source.get("file")
    )
    external_memory = memory is not None and memory.get("snapshot") == "external"
    return SnapshotInfo(
        name=root.findtext("name") or "",
        kind=SnapshotKind.MEMORY if external_memory else SnapshotKind.DISK,
        created=datetime.datetime.fromtimestamp(
            int(root.findtext("creationTime") or 0), tz=datetime.UTC
        ),
        state=root.findtext("state") or "",
        parent=root.findtext("parent/name"),
        current=current,
        overlays=overlays,
        description=root.findtext("description") or "",
    )


@dataclass(frozen=True, slots=True)
class _Layer:
    """One disk of an external snapshot: the overlay it made and the image below it."""

    target: str
    overlay: str
    base: str
    base_format: str


def _snapshot_disks(snapshot_xml: ET.Element) -> list[_Layer]:
    """The external disks of a snapshot with their base images (from its ``<domain>``)."""
    bases: dict[str, tuple[str, str]] = {}
    for disk in snapshot_xml.findall("domain/devices/disk"):
        target, source = disk.find("target"), disk.find("source")
        driver = disk.find("driver")
        if target is not None and source is not None and source.get("file"):
            fmt = (driver.get("type") if driver is not None else None) or "qcow2"
            bases[str(target.get("dev"))] = (str(source.get("file")), fmt)
    layers = []
    for disk in snapshot_xml.findall("disks/disk"):
        source = disk.find("source")
        if disk.get("snapshot") != "external" or source is None or not source.get("file"):
            continue
        dev = str(disk.get("name"))
        if dev not in bases:
            raise OperationInvalid(f"snapshot disk {dev} has no base image in its definition")
        base, fmt = bases[dev]
        layers.append(_Layer(dev, str(source.get("file")), base, fmt))
    return layers


def _memory_file(snapshot_xml: ET.Element) -> str | None:
    memory = snapshot_xml.find("memory")
    if memory is not None and memory.get("snapshot") == "external" and memory.get("file"):
        return str(memory.get("file"))
    return None


def _pool_of(c: Any, path: str) -> Any:
    pool = lookup(
        lambda: c.storagePoolLookupByTargetPath(os.path.dirname(path)),
        libvirt.VIR_ERR_NO_STORAGE_POOL,
    )
    if pool is None:
        raise OperationInvalid(
            f"{os.path.dirname(path)} (the directory of {os.path.basename(path)}) is not a "
            "libvirt storage pool: capl cannot recreate a snapshot overlay there"
        )
    return pool


def _remove_file(c: Any, path: str) -> None:
    """Delete a file through the storage pool of its directory (not-found is fine)."""
    pool = lookup(
        lambda: c.storagePoolLookupByTargetPath(os.path.dirname(path)),
        libvirt.VIR_ERR_NO_STORAGE_POOL,
    )
    if pool is None:
        return
    with contextlib.suppress(libvirt.libvirtError):
        pool.refresh(0)
    volume = lookup(
        lambda: pool.storageVolLookupByName(os.path.basename(path)), libvirt.VIR_ERR_NO_STORAGE_VOL
    )
    if volume is not None:
        volume.delete(0)


def _recreate_overlay(c: Any, layer: _Layer) -> None:
    """An empty qcow2 at ``layer.overlay`` backed by ``layer.base``, through the pool."""
    pool = _pool_of(c, layer.overlay)
    pool.refresh(0)
    base = c.storageVolLookupByPath(layer.base)
    capacity = int(base.info()[1])
    _remove_file(c, layer.overlay)
    volume = ET.Element("volume")
    sub(volume, "name", os.path.basename(layer.overlay))
    sub(volume, "capacity", str(capacity), unit="bytes")
    sub(sub(volume, "target"), "format", type="qcow2")
    backing = sub(volume, "backingStore")
    sub(backing, "path", layer.base)
    sub(backing, "format", type=layer.base_format)
    pool.createXML(serialize(volume), 0)


def _point_disks(domain_xml: str, layers: list[_Layer]) -> str:
    """``domain_xml`` with each layer's disk on its overlay (qcow2, chain re-detected)."""
    root = parse(domain_xml)
    by_target = {layer.target: layer for layer in layers}
    for disk in root.findall("devices/disk"):
        target = disk.find("target")
        layer = by_target.get(str(target.get("dev"))) if target is not None else None
        if layer is None:
            continue
        source = disk.find("source")
        if source is None:
            source = sub(disk, "source")
        for key in list(source.attrib):
            del source.attrib[key]
        source.set("file", layer.overlay)
        disk.set("type", "file")
        for stale in disk.findall("backingStore"):
            disk.remove(stale)
        driver = disk.find("driver")
        if driver is not None:
            driver.set("type", "qcow2")
    return serialize(root)


def _domain(c: Any, uuid: str, host_id: HostId) -> Any:
    domain = lookup(lambda: c.lookupByUUIDString(uuid), libvirt.VIR_ERR_NO_DOMAIN)
    if domain is None:
        raise DomainNotFound(f"domain {uuid} does not exist on {host_id}", host=host_id)
    return domain


def _snapshot(domain: Any, name: str, uuid: str, host_id: HostId) -> Any:
    snapshot = lookup(
        lambda: domain.snapshotLookupByName(name, 0), libvirt.VIR_ERR_NO_DOMAIN_SNAPSHOT
    )
    if snapshot is None:
        known = sorted(s.getName() for s in domain.listAllSnapshots(0))
        raise SnapshotNotFound(
            f"domain {uuid} ({domain.name()}) on {host_id} has no snapshot {name!r} "
            f"(it has: {', '.join(known) or 'none'})",
            host=host_id,
        )
    return snapshot


def _info(snapshot: Any) -> SnapshotInfo:
    return snapshot_info_of(snapshot.getXMLDesc(0), current=bool(snapshot.isCurrent(0)))


def _create_xml(
    domain: Any, name: str, *, memory: bool, description: str, exclude: frozenset[str]
) -> str:
    """The ``<domainsnapshot>`` request: writable file disks external (but the targets in
    ``exclude``), the rest left out."""
    live = parse(domain.XMLDesc(0))
    dom_name = domain.name()
    request = ET.Element("domainsnapshot")
    sub(request, "name", name)
    if description:
        sub(request, "description", description)
    disks = sub(request, "disks")
    first_dir = ""
    for disk in live.findall("devices/disk"):
        target, source = disk.find("target"), disk.find("source")
        dev = str(target.get("dev")) if target is not None else ""
        path = source.get("file") if source is not None else None
        if (
            disk.get("type") != "file"
            or disk.get("device", "disk") != "disk"
            or disk.find("readonly") is not None
            or not path
            or dev in exclude
        ):
            if dev:
                sub(disks, "disk", name=dev, snapshot="no")
            continue
        directory = os.path.dirname(path)
        first_dir = first_dir or directory
        element = sub(disks, "disk", name=dev, snapshot="external")
        sub(element, "driver", type="qcow2")
        sub(element, "source", file=os.path.join(directory, f"{dom_name}-{dev}-snap-{name}.qcow2"))
    if not first_dir:
        raise InvalidSpec(f"domain {dom_name} has no writable file-backed disk to snapshot")
    if memory:
        if not domain.isActive():
            raise OperationInvalid(
                f"a memory snapshot needs a running domain; {dom_name} is not running "
                "(take a disk-only snapshot)"
            )
        mem = os.path.join(first_dir, f"{dom_name}-snap-{name}.mem")
        request.insert(2 if description else 1, ET.Element("memory", snapshot="external", file=mem))
    else:
        request.insert(2 if description else 1, ET.Element("memory", snapshot="no"))
    return serialize(request)


class LibvirtSnapshots:
    """``capl.ports.virt.snapshots.Snapshots`` on one ``LibvirtHost``."""

    def __init__(self, host: LibvirtHost) -> None:
        self._host = host

    @property
    def host_id(self) -> HostId:
        return self._host.host_id

    async def _run(self, action: str, fn: Any) -> Any:
        connection = self._host.connection
        with connection.long_calls():  # saving RAM or committing a disk takes a while
            return await connection.run(action, fn)

    async def create_snapshot(
        self,
        uuid: str,
        name: str,
        *,
        memory: bool = False,
        description: str = "",
        exclude: Collection[str] = (),
    ) -> SnapshotInfo:
        check_snapshot_name(name)
        left_out = frozenset(exclude)
        host_id = self.host_id

        def op(c: Any) -> SnapshotInfo:
            domain = _domain(c, uuid, host_id)
            existing = lookup(
                lambda: domain.snapshotLookupByName(name, 0), libvirt.VIR_ERR_NO_DOMAIN_SNAPSHOT
            )
            if existing is not None:
                raise AlreadyExists(
                    f"domain {uuid} ({domain.name()}) already has a snapshot {name!r}",
                    host=host_id,
                )
            request = _create_xml(
                domain, name, memory=memory, description=description, exclude=left_out
            )
            flags = libvirt.VIR_DOMAIN_SNAPSHOT_CREATE_ATOMIC
            if not memory:
                flags |= libvirt.VIR_DOMAIN_SNAPSHOT_CREATE_DISK_ONLY
            return _info(domain.snapshotCreateXML(request, flags))

        result: SnapshotInfo = await self._run(f"snapshot domain {uuid} as {name}", op)
        return result

    async def list_snapshots(self, uuid: str) -> list[SnapshotInfo]:
        host_id = self.host_id

        def op(c: Any) -> list[SnapshotInfo]:
            infos = [_info(s) for s in _domain(c, uuid, host_id).listAllSnapshots(0)]
            parents = {info.name: info.parent for info in infos}

            def depth(name: str | None) -> int:
                return 0 if name is None else 1 + depth(parents.get(name))

            return sorted(infos, key=lambda i: (depth(i.parent), i.created, i.name))

        result: list[SnapshotInfo] = await self._host.connection.run(
            f"list the snapshots of domain {uuid}", op
        )
        return result

    async def persistent_definition(self, uuid: str) -> str:
        host_id = self.host_id

        def op(c: Any) -> str:
            domain = _domain(c, uuid, host_id)
            return str(domain.XMLDesc(_INACTIVE_SECURE))

        result: str = await self._host.connection.run(
            f"read the persistent definition of domain {uuid}", op
        )
        return result

    async def revert_snapshot(
        self, uuid: str, name: str, *, start: bool | None = None, definition: str | None = None
    ) -> SnapshotInfo:
        host_id = self.host_id

        def op(c: Any) -> SnapshotInfo:
            domain = _domain(c, uuid, host_id)
            snapshot = _snapshot(domain, name, uuid, host_id)
            document = snapshot.getXMLDesc(0)
            root = parse(document)
            layers = _snapshot_disks(root)
            if not layers:  # an internal snapshot (not capl's): libvirt reverts those
                domain.revertToSnapshot(snapshot, 0)
                return _info(snapshot)
            for layer in layers:  # refuse before stopping anything
                _pool_of(c, layer.overlay)
            _revert_external(c, domain, snapshot, document, layers, start, definition)
            return _info(domain.snapshotLookupByName(name, 0))

        result: SnapshotInfo = await self._run(f"revert domain {uuid} to snapshot {name}", op)
        return result

    async def delete_snapshot(self, uuid: str, name: str) -> bool:
        host_id = self.host_id

        def op(c: Any) -> bool:
            domain = _domain(c, uuid, host_id)
            snapshot = lookup(
                lambda: domain.snapshotLookupByName(name, 0), libvirt.VIR_ERR_NO_DOMAIN_SNAPSHOT
            )
            if snapshot is None:
                return False
            memory = _memory_file(parse(snapshot.getXMLDesc(0)))
            snapshot.delete(0)
            if memory:
                _remove_file(c, memory)
            return True

        result: bool = await self._run(f"delete snapshot {name} of domain {uuid}", op)
        return result


def _revert_external(
    c: Any,
    domain: Any,
    snapshot: Any,
    document: str,
    layers: list[_Layer],
    start: bool | None,
    definition: str | None,
) -> None:
    """Steps 1-5 of the module docstring (in the worker thread); ``definition``: the
    persistent definition to put back (else the current one keeps its devices)."""
    root = parse(document)
    stale: list[str] = []
    for child in snapshot.listAllChildren(libvirt.VIR_DOMAIN_SNAPSHOT_LIST_DESCENDANTS):
        child_root = parse(child.getXMLDesc(0))
        stale += [layer.overlay for layer in _snapshot_disks(child_root)]
        memory = _memory_file(child_root)
        if memory:
            stale.append(memory)
        child.delete(libvirt.VIR_DOMAIN_SNAPSHOT_DELETE_METADATA_ONLY)
    running = bool(domain.isActive())
    if running:
        domain.destroy()
    for layer in layers:
        _recreate_overlay(c, layer)
    c.defineXML(_point_disks(definition or domain.XMLDesc(_INACTIVE_SECURE), layers))
    flags = libvirt.VIR_DOMAIN_SNAPSHOT_CREATE_REDEFINE | libvirt.VIR_DOMAIN_SNAPSHOT_CREATE_CURRENT
    domain.snapshotCreateXML(document, flags)
    keep = {layer.overlay for layer in layers}
    for path in stale:
        if path not in keep:
            _remove_file(c, path)
    memory = _memory_file(root)
    if memory and start is not False:
        saved = c.saveImageGetXMLDesc(memory, libvirt.VIR_DOMAIN_SAVE_IMAGE_XML_SECURE)
        paused = root.findtext("state") == "paused"
        c.restoreFlags(
            memory,
            _point_disks(saved, layers),
            libvirt.VIR_DOMAIN_SAVE_PAUSED if paused else libvirt.VIR_DOMAIN_SAVE_RUNNING,
        )
    elif start or (start is None and running):
        domain.create()


def snapshots_of(host: Host) -> LibvirtSnapshots:
    """The ``SnapshotsOf`` the manager injects into a controller: snapshots of a ``Host``
    from ``LibvirtHosts`` (TypeError for any other implementation)."""
    if not isinstance(host, LibvirtHost):
        raise TypeError(f"snapshots need a LibvirtHost, got {type(host).__name__}")
    return LibvirtSnapshots(host)


if TYPE_CHECKING:
    from capl.ports.virt.snapshots import Snapshots, SnapshotsOf

    _factory: SnapshotsOf = snapshots_of

    def _implements_the_port(snapshots: LibvirtSnapshots) -> Snapshots:
        """mypy checks here that the adapter satisfies the port's Protocol."""
        return snapshots
