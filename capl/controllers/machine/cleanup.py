"""What vanished LibvirtMachines left behind: their removal, and the orphan sweep.

Objects that vanish. kube-apiserver can remove a LibvirtMachine whose DELETE raced the patch
that added our finalizer (kubernetes/kubernetes#77988): the patch answers 200, the controller
creates the domain, and the object is gone. So the controller remembers, per key, the
incarnation (UID) it created or found a domain for (`MachineMemory.made`); when a write
answers 404, or a reconcile finds the object missing from the cache or carrying another UID,
a live GET confirms it and what was made for that UID is removed (`remove_vanished`; never
while the machine's Cluster is paused: `clusterctl move` removes the finalizers of the
objects it moved away, possibly before a reconcile saw their delete-for-move annotation): the
domain only if its owner tag still names that UID, then the volumes, DHCP reservations and
DNS name (which are named after namespace/name, not the UID) only while no domain holds the
machine's name on that host. All of it runs inside a reconcile of the key, so it never
overlaps a reconcile of a re-created object of the same name. A Normal event
(`VanishedMachineRolledBack`) on the LibvirtCluster names what was removed.

Orphan sweep. The backstop for what the process did not see (it restarted, a write failed
for another reason): every `orphan_sweep_interval` (and once the caches synced) each host of
each LibvirtCluster the manager watches (namespace, watch filter; not while the Cluster is
paused, e.g. during `clusterctl move`) is listed for domains tagged for that cluster and
namespace that no cached LibvirtMachine accounts for (same UID, or the same name with the
domain's UUID recorded: a moved object adopts it; `plan_orphans.accounts_for`). A domain
reported by two consecutive sweeps and first seen at least `orphan_grace` ago is confirmed
with a live GET (the cache may lag) and then removed by the same path as above, queued as a
reconcile of its key (`MachineMemory.orphans`); a Warning event (`OrphanDomainRemoved`) on
the LibvirtCluster names it. A sweep lists each host once, whatever the number of its
clusters, and does not read the tag of a domain whose UUID a cached LibvirtMachine records
(`INDEX_DOMAIN_UUID`: that object accounts for it): at 10,000 settled machines in 100
clusters on one host a sweep was 100 listings of 10,000 tag reads each (issue 16).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import Final

import structlog

from capl.api import constants as c
from capl.api.capi import Cluster
from capl.api.cluster import LibvirtCluster
from capl.api.defaults import default_libvirt_cluster
from capl.controllers.common import InvalidObject, layout, parse, paused
from capl.controllers.machine.create import remove_resources
from capl.controllers.machine.indexes import (
    INDEX_DOMAIN_UUID,
    cluster_name_of_libvirt_cluster,
    host_index_value,
    libvirt_cluster_raw,
)
from capl.controllers.machine.options import LOGGER
from capl.controllers.machine.placement import target_of
from capl.controllers.machine.plan import dns_name
from capl.controllers.machine.plan_orphans import accounts_for
from capl.controllers.machine.scope import Context, Problem
from capl.controllers.machine.target import Identity, Leftover, Target
from capl.ports.errors import VirtError
from capl.ports.virt import DomainInfo, DomainOwner
from capl.runtime.controller import Controller, Result
from capl.runtime.errors import ApiError
from capl.runtime.errors import NotFound as ApiNotFound
from capl.runtime.objects import Obj, ObjectKey, meta
from capl.runtime.resources import CLUSTER, LIBVIRT_CLUSTER, LIBVIRT_MACHINE

__all__ = [
    "DELETE_FOR_MOVE_ANNOTATION",
    "ORPHAN_REMOVED_REASON",
    "ROLLED_BACK_REASON",
    "remove_vanished",
    "run_sweeps",
    "sweep",
]

log = structlog.get_logger(LOGGER)

ROLLED_BACK_REASON: Final = "VanishedMachineRolledBack"
ORPHAN_REMOVED_REASON: Final = "OrphanDomainRemoved"
#: Set by `clusterctl move` on the source objects it is about to delete.
DELETE_FOR_MOVE_ANNOTATION: Final = "clusterctl.cluster.x-k8s.io/delete-for-move"


# -- objects that vanished ----------------------------------------------------------------------


async def remove_vanished(ctx: Context, key: ObjectKey, cached: Obj | None) -> Result | None:
    """Remove what was made for incarnations of `key` other than `cached` (None: the object
    is not in the cache) once a live GET confirms they are gone. None when done; a short
    requeue while the object exists in the API but not yet in the cache."""
    record = ctx.memory.of(key)
    uid = meta(cached).get("uid") if cached is not None else None
    made, swept = record.made, record.orphans
    candidates = [x for x in (made, *swept.values()) if x is not None and x.uid != uid]
    for domain_uuid in [u for u, x in swept.items() if x.uid == uid]:
        del swept[domain_uuid]  # the cached object accounts for it after all
    if made is not None and made.uid != uid and _cluster_paused(ctx, made):
        # vanished while its Cluster is paused: clusterctl move took it (and removed the
        # finalizer before a reconcile saw its delete-for-move annotation), or it was
        # deleted by hand during a pause; either way nothing of it is touched
        log.info("a LibvirtMachine vanished while its Cluster is paused: its domain is kept")
        record.made = None
        candidates.remove(made)
    if not candidates:
        return None
    live = await _live(ctx, key)
    for leftover in candidates:
        if accounts_for(live, owner_uid=leftover.uid, domain_uuid=leftover.domain_uuid):
            if leftover is made and live is not None and meta(live).get("uid") == leftover.uid:
                # it exists; the cache has not caught up (or lost it for a relist)
                return Result(requeue_after=ctx.options.address_poll)
            swept.pop(leftover.domain_uuid, None)
            ctx.memory.orphans.forget(leftover.domain_uuid)
            continue
        await _remove_leftover(ctx, leftover)
        if leftover is made:
            record.made = None
        swept.pop(leftover.domain_uuid, None)
    return None


def _cluster_paused(ctx: Context, leftover: Leftover) -> bool:
    ident = leftover.ident
    raw = ctx.cache.get(CLUSTER, ObjectKey(ident.namespace, ident.cluster))
    if raw is None:
        return False
    with contextlib.suppress(InvalidObject):
        return bool(parse(Cluster, raw).spec.paused)
    return False


async def _live(ctx: Context, key: ObjectKey) -> Obj | None:
    try:
        return await ctx.client.get(key)
    except ApiNotFound:
        return None


async def _remove_leftover(ctx: Context, leftover: Leftover) -> None:
    """The domain if it still carries the vanished incarnation's tag (UID included), then
    the machine's volumes, DHCP reservations and DNS name unless a domain holds its name on
    the host (the caller runs inside a reconcile of the key: no reconcile of a same-name
    object runs meanwhile)."""
    ident, target = leftover.ident, leftover.target
    host, owner_tag = target.host, ident.owner()
    removed: list[str] = []
    info = await host.get_domain(leftover.domain_uuid)
    if info is not None:
        if info.owner != owner_tag:
            log.info(
                "domain of a vanished LibvirtMachine carries another owner tag now; left alone",
                domain=info.name,
                uuid=leftover.domain_uuid,
                uid=leftover.uid,
            )
            ctx.memory.orphans.forget(leftover.domain_uuid)
            return
        await host.undefine_domain(leftover.domain_uuid, owner=owner_tag)
        removed.append(f"domain {info.name} ({leftover.domain_uuid})")
    ctx.memory.orphans.forget(leftover.domain_uuid)
    holder = await host.find_domain(ident.names.domain)
    if holder is None:
        await remove_resources(
            host,
            pool=target.pool,
            network=target.network,
            spec=leftover.spec,
            ident=ident,
            fqdn=dns_name(ident.hostname, target.dns_domain),
        )
        removed.append("its volumes, DHCP reservations and DNS name")
    else:
        log.info(
            "a domain holds the machine's name: its volumes and addresses are left",
            domain=holder.name,
            uuid=holder.uuid,
        )
    _report_removed(ctx, leftover, removed)


def _report_removed(ctx: Context, leftover: Leftover, removed: list[str]) -> None:
    ident, target = leftover.ident, leftover.target
    what = " and ".join(removed) or "nothing (already gone)"
    message = (
        f"LibvirtMachine {ident.namespace}/{ident.name} (uid {ident.uid}) no longer "
        f"exists; removed {what} from host {target.name}"
    )
    ctx.memory.note_removed(message)
    log.info(
        "removed what a vanished LibvirtMachine left",
        machine=f"{ident.namespace}/{ident.name}",
        uid=ident.uid,
        host=target.name,
        removed=what,
        swept=leftover.swept,
    )
    lcluster = libvirt_cluster_raw(ctx.cache, ident.namespace, ident.cluster)
    if lcluster is not None and removed:
        if leftover.swept:
            ctx.deps.recorder.event(lcluster, "Warning", ORPHAN_REMOVED_REASON, message)
        else:
            ctx.deps.recorder.event(lcluster, "Normal", ROLLED_BACK_REASON, message)


# -- the orphan sweep ---------------------------------------------------------------------------


async def run_sweeps(ctx: Context, controller: Controller | None, stop: asyncio.Event) -> None:
    """A manager runnable (while leading): an orphan sweep once the caches synced, then
    every `orphan_sweep_interval` seconds of the injected clock."""
    interval = ctx.options.orphan_sweep_interval
    if interval <= 0:
        await stop.wait()
        return
    if controller is not None:
        await _until(controller.wait_synced(), stop)
    while not stop.is_set():
        try:
            await sweep(ctx, controller)
        except (ApiError, VirtError) as exc:
            log.warning("orphan sweep incomplete", error=str(exc))
        await _until(ctx.deps.clock.sleep(interval), stop)


async def sweep(ctx: Context, controller: Controller | None) -> list[ObjectKey]:
    """One orphan sweep (see the module docstring); returns the keys queued to remove a
    confirmed orphan."""
    key_filter = controller.options.key_filter if controller else None
    queued: list[ObjectKey] = []
    scopes: list[str] = []
    known = ctx.cache.index_values(LIBVIRT_MACHINE, INDEX_DOMAIN_UUID)
    listings: dict[object, list[DomainInfo]] = {}  # one listing per host per sweep
    for raw in ctx.cache.list(LIBVIRT_CLUSTER):
        if key_filter is not None and not key_filter(raw):
            continue
        if DELETE_FOR_MOVE_ANNOTATION in (meta(raw).get("annotations") or {}):
            continue
        namespace = meta(raw).get("namespace") or ""
        cluster_name = cluster_name_of_libvirt_cluster(raw)
        if not cluster_name:
            continue
        try:
            lcluster = default_libvirt_cluster(parse(LibvirtCluster, raw))
            lay = layout(lcluster)
            cluster_raw = ctx.cache.get(CLUSTER, ObjectKey(namespace, cluster_name))
            cluster = parse(Cluster, cluster_raw) if cluster_raw is not None else None
        except InvalidObject:
            continue
        if paused(cluster, lcluster.metadata):
            continue  # e.g. clusterctl move in progress: the domains change hands
        for entry in lcluster.spec.hosts:
            scope = host_index_value(namespace, cluster_name, entry.name)
            scopes.append(scope)
            try:
                target = target_of(ctx, namespace, entry, lay, lcluster)
                domains = listings.get(target.host.host_id)
                if domains is None:
                    domains = await target.host.list_domains(skip_uuids=known)
                    listings[target.host.host_id] = domains
            except (Problem, VirtError) as exc:
                ctx.memory.orphans.reset(scope)
                log.debug("orphan sweep skips a host", host=entry.name, error=str(exc))
                continue
            queued += await _sweep_host(
                ctx, controller, scope, target, domains, namespace, cluster_name
            )
    ctx.memory.orphans.retain(scopes)
    return queued


async def _sweep_host(
    ctx: Context,
    controller: Controller | None,
    scope: str,
    target: Target,
    domains: list[DomainInfo],
    namespace: str,
    cluster_name: str,
) -> list[ObjectKey]:
    """One host's domains of the cluster: the keys of the orphans confirmed now (queued)."""
    found: dict[str, tuple[ObjectKey, DomainInfo, DomainOwner]] = {}
    for info in domains:
        tag = info.owner
        if (
            tag is None
            or tag.kind != c.Kind.LIBVIRT_MACHINE
            or tag.namespace != namespace
            or tag.cluster != cluster_name
        ):
            continue
        key = ObjectKey(namespace, tag.name)
        cached = ctx.cache.get(LIBVIRT_MACHINE, key)
        if accounts_for(cached, owner_uid=tag.uid, domain_uuid=info.uuid):
            continue
        found[info.uuid.lower()] = (key, info, tag)
    confirmed = ctx.memory.orphans.observe(scope, found, now=ctx.deps.clock.now())
    queued: list[ObjectKey] = []
    for domain_uuid in sorted(confirmed):
        key, info, tag = found[domain_uuid]
        live = await _live(ctx, key)
        if accounts_for(live, owner_uid=tag.uid, domain_uuid=domain_uuid):
            ctx.memory.orphans.forget(domain_uuid)
            continue
        ident = Identity.of(namespace=namespace, name=tag.name, uid=tag.uid, cluster=cluster_name)
        ctx.memory.of(key).orphans[domain_uuid] = Leftover(
            ident=ident, domain_uuid=domain_uuid, target=target, spec_json=None, swept=True
        )
        log.info(
            "orphaned domain confirmed, queued for removal",
            domain=info.name,
            uuid=domain_uuid,
            machine=f"{namespace}/{tag.name}",
            uid=tag.uid,
            host=target.name,
        )
        queued.append(key)
        if controller is not None:
            controller.enqueue(key)
    return queued


async def _until(work: Awaitable[None], stop: asyncio.Event) -> None:
    """Await `work` unless `stop` is set first (then `work` is cancelled)."""
    task = asyncio.ensure_future(work)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for pending in (task, stopped):
            if not pending.done():
                pending.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await pending
