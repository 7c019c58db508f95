"""Before and after a live migration: the destination made ready (``prepare``), undone after a
failure (``unprepare``), the source cleared after success (``cleanup_source``), and where a
domain is (``locate``). Built on ``LibvirtHost``'s own operations where they exist.

What migration does not carry, and ``prepare`` therefore places on the destination:

- with storage copy (``NON_SHARED_INC``): the base image, imported by digest into the
  destination's pool as on the source (``ensure_base_image``: same name, same content, same
  path), and each copied volume created *empty* at the same path with the same size and
  format (the root overlay over that base image). libvirt's NBD mirror of an incremental copy
  writes only the clusters allocated in the source's top layer, so a destination volume left
  by an earlier attempt would keep stale clusters: an existing copy is deleted and created
  again (safe: the domain is not on the destination, and the pool is checked not to be shared
  first). Without the base the destination refuses the incremental copy at once; a full copy
  (``NON_SHARED_DISK``) would work without it but moves and stores the whole chain (measured:
  ``capl.virt.migration_params``).
- always (storage copy or not, unless the pool is shared): the files the domain reads but
  migration never copies: the Ignition file (fw_cfg) and the NoCloud ISO (a read-only
  cdrom), copied byte for byte from the source (their content is secret: never logged);
- the DHCP reservation (MAC -> IP) and the DNS record of each NIC on a libvirt network, as the
  source's network has them, so the guest's next renewal is acknowledged on the destination.

Whether the pool is shared is not assumed: a probe volume made in the source's pool is
looked for in the destination's pool after a rescan (``pools_shared``). A request whose
``copy_storage`` disagrees is refused, and neither ``unprepare`` nor ``cleanup_source``
deletes a volume from a shared pool (it is the one disk both hosts use).
"""

from __future__ import annotations

import contextlib
import logging
import secrets
from typing import Any

import libvirt

from capl.ports.errors import (
    DomainNotFound,
    InvalidSpec,
    NetworkNotFound,
    OperationInvalid,
    VolumeNotFound,
)
from capl.ports.virt import DomainOwner, VolumeFormat, VolumeInfo
from capl.ports.virt.migration import (
    DomainLocation,
    MigrationRequest,
    PreparedMigration,
    Whereabouts,
)
from capl.virt import domain as domains
from capl.virt import storage
from capl.virt.host import LibvirtHost
from capl.virt.migration_params import DomainLayout, domain_layout
from capl.virt.pools.directory import build_volume_xml
from capl.virt.storagexml import parse_host_caps
from capl.virt.support import retry_busy

__all__ = [
    "FILE_LIMIT",
    "check_distinct",
    "cleanup_source",
    "hosts_of",
    "locate",
    "pools_shared",
    "prepare",
    "unprepare",
]

log = logging.getLogger(__name__)

FILE_LIMIT = 64 * 1024**2
"""The largest Ignition file / NoCloud ISO ``prepare`` copies."""


def hosts_of(request: MigrationRequest) -> tuple[LibvirtHost, LibvirtHost]:
    source, destination = request.source, request.destination
    if not isinstance(source, LibvirtHost) or not isinstance(destination, LibvirtHost):
        raise InvalidSpec("migration needs two libvirt hosts of the same registry")
    return source, destination


def _host_uuid(c: Any) -> str:
    return parse_host_caps(c.getCapabilities()).uuid or ""


async def check_distinct(source: LibvirtHost, destination: LibvirtHost) -> None:
    """InvalidSpec when both are one host (same id, or one daemon behind two URIs)."""
    same = source.host_id == destination.host_id
    if not same:
        a = await source.connection.run("read host UUID", _host_uuid)
        b = await destination.connection.run("read host UUID", _host_uuid)
        same = bool(a) and a == b
    if same:
        raise InvalidSpec(
            f"migration target {destination.host_id} is the host the domain runs on "
            f"({source.host_id}): choose another host",
            reason="MigrationTargetIsSource",
        )


def _probe_make(c: Any, pool_name: str, name: str) -> None:
    pool = storage.lookup_pool(c, pool_name)
    xml = build_volume_xml(name=name, capacity_bytes=0, format=VolumeFormat.RAW)
    retry_busy(lambda: pool.createXML(xml, 0))


def _probe_seen(c: Any, pool_name: str, name: str) -> bool:
    pool = storage.lookup_pool(c, pool_name)
    retry_busy(lambda: pool.refresh(0))
    return storage.lookup_volume(pool, name) is not None


async def pools_shared(source: LibvirtHost, destination: LibvirtHost, pool: str) -> bool:
    """True when ``pool`` on both hosts is one directory (a probe volume made on the source
    shows up on the destination after a rescan)."""
    name = f"capl-share-probe-{secrets.token_hex(6)}"
    await source.connection.run(
        f"make probe volume in pool {pool}", lambda c: _probe_make(c, pool, name)
    )
    try:
        return await destination.connection.run(
            f"look for probe volume in pool {pool}", lambda c: _probe_seen(c, pool, name)
        )
    finally:
        await source.delete_volume(pool=pool, name=name)
        with contextlib.suppress(Exception):  # let the destination forget it too
            await destination.list_volumes(pool=pool, prefix=name, refresh=True)


def _live_layout(c: Any, uuid: str, owner: DomainOwner) -> DomainLayout | None:
    domain = domains.checked(c, uuid, owner)
    return None if domain is None else domain_layout(str(domain.XMLDesc(0)))


async def layout_on(host: LibvirtHost, uuid: str, owner: DomainOwner) -> DomainLayout | None:
    return await host.connection.run(
        f"read definition of domain {uuid}", lambda c: _live_layout(c, uuid, owner)
    )


async def locate(source: LibvirtHost, destination: LibvirtHost, uuid: str) -> DomainLocation:
    return DomainLocation(
        source_host=source.host_id,
        destination_host=destination.host_id,
        source=await source.get_domain(uuid),
        destination=await destination.get_domain(uuid),
    )


async def _volumes(host: LibvirtHost, pool: str, names: tuple[str, ...]) -> list[VolumeInfo]:
    found = []
    for name in names:
        info = await host.get_volume(pool=pool, name=name)
        if info is None:
            raise VolumeNotFound(f"volume {name} of the domain is not in pool {pool}")
        found.append(info)
    return found


async def _check_pools(source: LibvirtHost, destination: LibvirtHost, pool: str) -> None:
    a, b = await source.get_pool(pool), await destination.get_pool(pool)
    if a is None or b is None:
        where = source.host_id if a is None else destination.host_id
        raise InvalidSpec(f"storage pool {pool} does not exist on {where}")
    if a.path != b.path:
        raise InvalidSpec(
            f"storage pool {pool} is at {a.path} on {source.host_id} but at {b.path} on "
            f"{destination.host_id}: volumes must keep their paths"
        )


async def prepare(request: MigrationRequest) -> PreparedMigration:
    """See the module docstring; raises before changing anything when the request is bad."""
    source, destination = hosts_of(request)
    spec, uuid = request.storage, request.uuid
    await check_distinct(source, destination)
    location = await locate(source, destination, uuid)
    if location.where is not Whereabouts.SOURCE:
        raise OperationInvalid(
            f"domain {uuid} cannot be migrated now: {location.describe()}",
            reason="NotRunningOnSource",
        )
    if location.destination is not None:
        raise OperationInvalid(
            f"domain {uuid} is defined on {destination.host_id} already: {location.describe()}"
        )
    layout = await layout_on(source, uuid, request.owner)
    if layout is None:
        raise DomainNotFound(f"domain {uuid} vanished from {source.host_id}")
    await _check_pools(source, destination, spec.pool)
    volumes = await _volumes(source, spec.pool, spec.volumes)
    files = await _volumes(source, spec.pool, spec.files)
    layout.check_movable(files={f.path for f in files}, volumes={v.path for v in volumes})
    shared = await pools_shared(source, destination, spec.pool)
    if shared == request.options.copy_storage:
        raise InvalidSpec(
            f"storage pool {spec.pool} is {'' if shared else 'not '}shared between "
            f"{source.host_id} and {destination.host_id}: migrate "
            f"{'without' if shared else 'with'} storage copy",
            reason="StorageSharingMismatch",
        )
    dhcp = await _copy_network_entries(source, destination, layout)
    if shared:
        return PreparedMigration(
            copy_storage=False, disks=(), copy_bytes=layout.memory_bytes, dhcp_hosts=dhcp
        )
    created = await _recreate_volumes(request, destination, volumes)
    for info in files:
        await _copy_file(source, destination, info)
    copied = layout.copied_disks()
    return PreparedMigration(
        copy_storage=True,
        disks=copied,
        copy_bytes=layout.memory_bytes + sum(v.allocation_bytes for v in volumes),
        volumes_created=created,
        files_copied=tuple(f.name for f in files),
        dhcp_hosts=dhcp,
    )


async def _recreate_volumes(
    request: MigrationRequest, destination: LibvirtHost, volumes: list[VolumeInfo]
) -> tuple[str, ...]:
    """The copied volumes, empty, at the source's paths and sizes (the base image first)."""
    spec = request.storage
    base = None
    if any(v.backing_path for v in volumes):
        if spec.base_image is None or spec.image_source is None:
            raise InvalidSpec("an overlay is copied: the base image and its source are needed")
        base = await destination.ensure_base_image(
            pool=spec.pool, name=spec.base_image, source=spec.image_source
        )
    created = []
    for info in volumes:
        await destination.delete_volume(pool=spec.pool, name=info.name)  # stale clusters
        if info.backing_path:
            assert base is not None
            if base.volume.path != info.backing_path:
                raise InvalidSpec(
                    f"volume {info.name} is backed by {info.backing_path} on the source, but "
                    f"the base image {spec.base_image} is at {base.volume.path} on "
                    f"{destination.host_id}"
                )
            made = await destination.create_overlay(
                pool=spec.pool, name=info.name, backing=base, capacity_bytes=info.capacity_bytes
            )
        else:
            made = await destination.create_volume(
                pool=spec.pool,
                name=info.name,
                capacity_bytes=info.capacity_bytes,
                format=VolumeFormat(info.format) if info.format == "raw" else VolumeFormat.QCOW2,
            )
        if made.path != info.path or made.capacity_bytes != info.capacity_bytes:
            raise InvalidSpec(
                f"volume {info.name} came out as {made.path} ({made.capacity_bytes} bytes) on "
                f"{destination.host_id}, not {info.path} ({info.capacity_bytes} bytes)"
            )
        created.append(info.name)
    return tuple(created)


async def _copy_file(source: LibvirtHost, destination: LibvirtHost, info: VolumeInfo) -> None:
    tail = await source.read_volume_tail(pool=info.pool, name=info.name, limit=FILE_LIMIT + 1)
    if tail is None:
        raise VolumeNotFound(f"file {info.name} cannot be read from {source.host_id}")
    if tail.offset or len(tail.data) > FILE_LIMIT:
        raise InvalidSpec(f"file {info.name} is larger than {FILE_LIMIT} bytes")
    made = await destination.upload_volume(pool=info.pool, name=info.name, data=tail.data)
    if made.path != info.path:
        raise InvalidSpec(f"file {info.name} landed at {made.path}, not {info.path}")


async def _copy_network_entries(
    source: LibvirtHost, destination: LibvirtHost, layout: DomainLayout
) -> tuple[tuple[str, str, str], ...]:
    """The DHCP reservation and DNS record of each NIC on a libvirt network."""
    made = []
    for mac, network in layout.nic_macs:
        if network is None:
            continue
        there = await destination.get_network(network)
        if there is None:
            raise NetworkNotFound(f"network {network} does not exist on {destination.host_id}")
        here = await source.get_network(network)
        host = next((h for h in (here.dhcp_hosts if here else ()) if h.mac == mac), None)
        if host is None:
            continue
        await destination.ensure_dhcp_host(network=network, mac=mac, name=host.name, ip=host.ip)
        record = next((d for d in (here.dns_hosts if here else ()) if d.ip == host.ip), None)
        if record is not None:
            await destination.add_dns_hostnames(
                network=network, ip=host.ip, hostnames=record.hostnames
            )
        made.append((network, mac, host.ip))
    return tuple(made)


async def _remove_network_entries(host: LibvirtHost, layout: DomainLayout) -> list[str]:
    removed = []
    for mac, network in layout.nic_macs:
        if network is None:
            continue
        info = await host.get_network(network)
        entry = next((h for h in (info.dhcp_hosts if info else ()) if h.mac == mac), None)
        if entry is None:
            continue
        if await host.remove_dns_hostnames(network=network, ip=entry.ip):
            removed.append(f"DNS record {entry.ip} in {network}")
        if await host.remove_dhcp_host(network=network, mac=mac):
            removed.append(f"DHCP host {mac} in {network}")
    return removed


async def _remove_storage(
    host: LibvirtHost, other: LibvirtHost, request: MigrationRequest
) -> list[str]:
    spec = request.storage
    if await pools_shared(host, other, spec.pool):
        return []  # the one copy both hosts use
    removed = []
    for name in (*spec.volumes, *spec.files, *spec.leftovers):
        if await host.delete_volume(pool=spec.pool, name=name):
            removed.append(f"volume {name}")
    return removed


async def unprepare(request: MigrationRequest) -> list[str]:
    """Remove what ``prepare`` made on the destination; only while the domain is active on
    the source and not on the destination (it is the one copy otherwise)."""
    source, destination = hosts_of(request)
    location = await locate(source, destination, request.uuid)
    if location.where is not Whereabouts.SOURCE or location.destination is not None:
        raise OperationInvalid(
            f"not undoing the preparation on {destination.host_id}: {location.describe()}"
        )
    layout = await layout_on(source, request.uuid, request.owner)
    if layout is None:
        raise DomainNotFound(f"domain {request.uuid} vanished from {source.host_id}")
    removed = await _remove_network_entries(destination, layout)
    removed += await _remove_storage(destination, source, request)
    log.info("migration of %s undone on %s: %s", request.uuid, destination.host_id, removed)
    return removed


def _undefine_inactive(c: Any, uuid: str, owner: DomainOwner) -> bool:
    domain = domains.checked(c, uuid, owner)
    if domain is None or domain.isActive():
        return False
    with contextlib.suppress(libvirt.libvirtError):
        return domains.undefine(c, uuid, owner)
    return False


async def cleanup_source(request: MigrationRequest) -> list[str]:
    """After success: the source's copy of the domain's storage and network entries."""
    source, destination = hosts_of(request)
    location = await locate(source, destination, request.uuid)
    if location.where is not Whereabouts.DESTINATION:
        raise OperationInvalid(
            f"not cleaning {source.host_id} up: the domain is not (only) on "
            f"{destination.host_id}: {location.describe()}"
        )
    layout = await layout_on(destination, request.uuid, request.owner)
    if layout is None:
        raise DomainNotFound(f"domain {request.uuid} vanished from {destination.host_id}")
    removed = []
    if location.source is not None and await source.connection.run(
        f"undefine leftover domain {request.uuid}",
        lambda c: _undefine_inactive(c, request.uuid, request.owner),
    ):
        removed.append(f"inactive domain {request.uuid}")
    removed += await _remove_network_entries(source, layout)
    removed += await _remove_storage(source, destination, request)
    log.info("source %s of migrated %s cleaned: %s", source.host_id, request.uuid, removed)
    return removed
