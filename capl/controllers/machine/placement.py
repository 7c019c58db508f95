"""Placement: the host a machine lives on, chosen before anything is created.

spec.hostName, else Machine.spec.failureDomain, else the reachable host with the most memory
left (`plan_placement.choose_host`, after the memory committed to machines placed but not
provisioned there, read from a cache index); control-plane machines only on
`controlPlane: true` hosts; never a host in maintenance (`spec.hosts[].maintenance`, see
`plan_placement.placeable_hosts`): a machine not created yet that is pinned to one waits.
Nothing is written here: the reconciler records the choice with the identity (one spec
patch) before the domain is created.

Deletion finds the host again (`locate`): from the LibvirtCluster when it still exists, else
from the placement annotation (host URI, pool, network, credentials Secret name) written
with the identity — what a forced deletion or `clusterctl move` (no status) still has.

Failure domains are authoritative: a machine not created yet whose spec.hostName names
another host than its Machine's spec.failureDomain is not placed at all
(`plan_placement.wanted_host`): DomainProvisioned False/`FailureDomainConflict` naming both
fields, a Warning Event, nothing created; a change of either object reconciles it again.

Conditions left behind (DomainProvisioned, through `Problem`): `FailureDomainConflict`,
`HostNotFound` (a named host
that is not in the spec or is in maintenance, or no usable host: none allows control-plane
machines, or all that would are in maintenance), `Unreachable` (no host answers),
`CredentialsInvalid`, `InternalError` (an unreadable LibvirtCluster layout),
`HardwareUnavailable` (no host, or not the pinned one, can give the machine its CPU model,
pinned CPUs, NUMA cells, hugepages or devices: `placement_hardware`).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
from collections.abc import Mapping
from typing import Any

import structlog

from capl.api import constants as c
from capl.api.capi import Cluster
from capl.api.cluster import LibvirtCluster, LibvirtHost
from capl.api.defaults import default_libvirt_cluster
from capl.api.machine import LibvirtMachine
from capl.controllers.common import (
    ClusterLayout,
    CredentialsMissing,
    InvalidObject,
    connect_host,
    find_host,
    layout,
    libvirt_cluster_of,
    parse,
    parse_cached,
)
from capl.controllers.machine.indexes import (
    INDEX_PENDING_HOST,
    cluster_name_of_libvirt_cluster,
    host_index_value,
)
from capl.controllers.machine.options import LOGGER
from capl.controllers.machine.placement_hardware import check_hardware
from capl.controllers.machine.plan import Failure
from capl.controllers.machine.plan_placement import (
    PLACEMENT_ANNOTATION,
    FailureDomainConflict,
    HostCandidate,
    Placement,
    choose_host,
    committed_memory,
    no_placeable_host,
    pinned_refusal,
    placeable_hosts,
    wanted_host,
)
from capl.controllers.machine.scope import Context, MachineScope, Problem
from capl.controllers.machine.target import Target
from capl.ports.errors import CredentialsError, VirtError
from capl.runtime.objects import ObjectKey
from capl.runtime.resources import CLUSTER, LIBVIRT_CLUSTER, LIBVIRT_MACHINE, SECRET

__all__ = ["locate", "place", "secret_bytes", "target_of"]

log = structlog.get_logger(LOGGER)


async def place(scope: MachineScope) -> Target:
    """The host of the machine: pinned, failure domain, or chosen (no write here)."""
    lm, machine, lcluster = scope.lm, scope.machine, scope.lcluster
    assert machine is not None, "the gates come first"
    assert lcluster is not None, "the gates come first"
    namespace = scope.namespace
    try:
        lay = layout(lcluster)
    except InvalidObject as exc:
        raise Problem(Failure(c.Reason.INTERNAL_ERROR, str(exc), True)) from None
    created = bool(lm.spec.domain_uuid or lm.spec.provider_id)
    wanted = wanted_host(
        host_name=lm.spec.host_name,
        failure_domain=machine.spec.failure_domain,
        created=created,
        machine=f"{namespace}/{machine.metadata.name}",
    )
    if isinstance(wanted, FailureDomainConflict):
        raise Problem(Failure(c.Reason.FAILURE_DOMAIN_CONFLICT, wanted.message, False))
    if wanted:
        entry = find_host(lcluster, wanted)
        if entry is None:
            raise Problem(
                Failure(
                    c.Reason.HOST_NOT_FOUND,
                    f"host {wanted!r} is not one of LibvirtCluster "
                    f"{namespace}/{lcluster.metadata.name}'s spec.hosts",
                    False,
                )
            )
        refusal = None if created else pinned_refusal(entry)
        if refusal is not None:  # cordoned: only the machines created before stay there
            raise Problem(Failure(c.Reason.HOST_NOT_FOUND, refusal, False))
        target = target_of(scope.ctx, namespace, entry, lay, lcluster)
        if not created:
            await check_hardware(scope, [target])
        return target
    control_plane = c.CONTROL_PLANE_LABEL in (machine.metadata.labels or {}) or (
        c.CONTROL_PLANE_LABEL in (lm.metadata.labels or {})
    )
    hosts = lcluster.spec.hosts
    entries = placeable_hosts(hosts, control_plane=control_plane)
    if not entries:
        raise Problem(
            Failure(
                c.Reason.HOST_NOT_FOUND,
                no_placeable_host(hosts, control_plane=control_plane),
                False,
            )
        )
    targets = [target_of(scope.ctx, namespace, entry, lay, lcluster) for entry in entries]
    return await _choose(scope, await check_hardware(scope, targets))


async def _choose(scope: MachineScope, targets: list[Target]) -> Target:
    """The reachable target with the most memory left (host info asked concurrently; one
    host: nothing to weigh, its free memory is not read again)."""
    weigh = len(targets) > 1
    infos = await asyncio.gather(
        *(t.host.info(free_memory=weigh) for t in targets), return_exceptions=True
    )
    uid = scope.lm.metadata.uid or ""
    candidates: list[HostCandidate] = []
    problems: list[str] = []
    for target, info in zip(targets, infos, strict=True):
        if isinstance(info, BaseException):
            if not isinstance(info, VirtError):
                raise info
            problems.append(f"{target.name}: {info}")
            continue
        target.info = info
        committed = 0
        if weigh:
            committed = committed_memory(
                scope.ctx.cache.by_index(
                    LIBVIRT_MACHINE,
                    INDEX_PENDING_HOST,
                    host_index_value(scope.namespace, scope.cluster_name, target.name),
                ),
                host=target.name,
                skip_uid=uid,
            )
        candidates.append(
            HostCandidate(
                name=target.name, free_bytes=info.memory_free_bytes, committed_bytes=committed
            )
        )
    chosen = choose_host(candidates)
    if chosen is None:
        raise Problem(
            Failure(c.Reason.UNREACHABLE, "no host is reachable: " + "; ".join(problems), True)
        )
    return next(t for t in targets if t.name == chosen)


def target_of(
    ctx: Context, namespace: str, entry: LibvirtHost, lay: ClusterLayout, lcluster: LibvirtCluster
) -> Target:
    """The Target of host `entry` of the LibvirtCluster (connected; credentials read)."""
    try:
        host = connect_host(ctx.deps, namespace=namespace, host=entry)
    except (CredentialsMissing, CredentialsError) as exc:
        raise Problem(Failure(c.Reason.CREDENTIALS_INVALID, str(exc), False)) from None
    ref = entry.credentials_ref
    reported = next(
        (h for h in lcluster.status.hosts or () if h.name == entry.name and h.network_uuid),
        None,
    )
    return Target(
        name=entry.name,
        uri=str(entry.uri),
        host=host,
        pool=lay.pool,
        network=lay.network,
        dns_domain=lay.dns_domain,
        bridge_mode=lcluster.spec.network.mode == "bridge",
        credentials_secret=ref.name if ref is not None and ref.name else None,
        cidr=lay.cidr,
        network_uuid=(
            str(reported.network_uuid).lower()
            if reported is not None and reported.network and reported.network == lay.network
            else None
        ),
    )


def locate(ctx: Context, lm: LibvirtMachine, namespace: str) -> tuple[Target, str] | None:
    """Host and cluster resource names of a machine being deleted: from the LibvirtCluster
    when it still exists, else from the placement annotation."""
    record = Placement.decode(lm.metadata.annotation(PLACEMENT_ANNOTATION))
    cluster_name = lm.metadata.label(c.CLUSTER_NAME_LABEL) or (record.cluster if record else "")
    host_name = lm.spec.host_name or (record.host if record else None)
    lcluster = _libvirt_cluster_for(ctx, namespace, cluster_name)
    if lcluster is not None and host_name:
        entry = find_host(lcluster, host_name)
        if entry is not None:
            try:
                lay = layout(lcluster)
                return target_of(ctx, namespace, entry, lay, lcluster), cluster_name
            except (InvalidObject, Problem) as exc:
                log.info("LibvirtCluster unusable for deletion, using the record", error=str(exc))
    if record is None:
        return None
    credentials: dict[str, bytes] | None = None
    if record.credentials_secret:
        secret = ctx.cache.get(SECRET, ObjectKey(namespace, record.credentials_secret))
        if secret is not None:
            credentials = {}
            for item in secret.get("data") or {}:
                value = secret_bytes(secret, item)
                if value is not None:
                    credentials[item] = value
    try:
        host = ctx.deps.hosts.get(uri=record.uri, credentials=credentials)
    except VirtError as exc:
        log.warning("cannot use the recorded host", error=str(exc))
        return None
    target = Target(
        name=record.host,
        uri=record.uri,
        host=host,
        pool=record.pool,
        network=record.network,
        dns_domain=record.dns_domain,
        bridge_mode=False,
        credentials_secret=record.credentials_secret,
    )
    return target, cluster_name or record.cluster


def _libvirt_cluster_for(ctx: Context, namespace: str, cluster_name: str) -> LibvirtCluster | None:
    if not cluster_name:
        return None
    cluster_raw = ctx.cache.get(CLUSTER, ObjectKey(namespace, cluster_name))
    if cluster_raw is not None:
        with contextlib.suppress(InvalidObject):
            return libvirt_cluster_of(ctx.cache, parse_cached(Cluster, cluster_raw))
    for obj in ctx.cache.list(LIBVIRT_CLUSTER, namespace=namespace):
        if cluster_name_of_libvirt_cluster(obj) == cluster_name:
            with contextlib.suppress(InvalidObject):
                return default_libvirt_cluster(parse(LibvirtCluster, obj))
    return None


def secret_bytes(secret: Mapping[str, Any], key: str) -> bytes | None:
    """One key of a Secret's data, decoded (None when missing or not base64)."""
    value = (secret.get("data") or {}).get(key)
    if value is None:
        return None
    try:
        return base64.b64decode(str(value))
    except (binascii.Error, ValueError):
        return None
