"""Deleting a machine: the steps (`delete_steps`), then its domain, shut down first, then its
volumes and network entries.

Ready False/`Deleting`; an ACPI shutdown is requested (once, `MachineMemory.
shutdown_requested`) and the machine requeued until the domain is off or `shutdown_timeout`
since metadata.deletionTimestamp passed (no worker waits); then undefine (NVRAM/snapshot
metadata) after checking UUID + ownership tag; then volumes by name prefix (root, extra,
Ignition/ISO, console log), DHCP reservations and the DNS name (`create.remove_resources`);
not-found is success. A missing Machine, Cluster or LibvirtCluster does not block: the host
comes from the LibvirtCluster when it exists, else from the placement annotation
(`placement.locate`). A domain with this UUID and another owner tag is never touched:
deletion waits, Ready says `ForeignDomain` in its message (remove it by hand or remove the
finalizer).
"""

from __future__ import annotations

import contextlib
import datetime

import structlog

from capl.api import constants as c
from capl.api.capi import Cluster
from capl.api.machine import LibvirtMachine
from capl.controllers.common import InvalidObject, parse, paused
from capl.controllers.machine import ipam, placement
from capl.controllers.machine.cleanup import DELETE_FOR_MOVE_ANNOTATION
from capl.controllers.machine.create import remove_resources
from capl.controllers.machine.options import LOGGER
from capl.controllers.machine.plan import (
    Failure,
    classify,
    dns_name,
    domain_state_text,
    owner_matches,
)
from capl.controllers.machine.scope import DONE, MachineScope, Problem
from capl.controllers.machine.target import Identity, Target
from capl.ports.errors import VirtError
from capl.ports.virt import DomainState
from capl.runtime.controller import Result
from capl.runtime.errors import NotFound as ApiNotFound
from capl.runtime.objects import ObjectKey
from capl.runtime.resources import CLUSTER

__all__ = ["delete_steps", "remove_machine"]

log = structlog.get_logger(LOGGER)


async def delete_steps(scope: MachineScope) -> Result:
    """The steps of a machine being deleted: finalizer (none: forget it) -> moved away
    (delete-for-move: forgotten, nothing of it is ever removed) -> pause (only the Paused
    condition; clusterctl move drops the finalizers itself) -> moved away and not paused
    (drop the finalizer only) -> Ready False/Deleting -> a live migration still aborting
    (wait) -> nothing ever created (drop the finalizer) -> locate the host (none:
    HostNotFound event, drop the finalizer) -> domain, volumes, network entries
    (`remove_machine`; the failure's reason in DomainProvisioned, Ready's message) -> the
    IPAM addresses -> drop the finalizer."""
    md, memory = scope.lm.metadata, scope.ctx.memory
    if not md.has_finalizer(c.MACHINE_FINALIZER):
        memory.forget(scope.key)
        return DONE
    moving = md.has_annotation(DELETE_FOR_MOVE_ANNOTATION)
    if moving:
        # clusterctl move deletes the source objects: the domain now belongs to the
        # target management cluster and must not be touched, also once this object is
        # gone (nothing made for it is a leftover to remove)
        memory.forget(scope.key)
    if paused(_cluster_of(scope), md):
        # clusterctl move pauses the Cluster and removes the finalizers itself
        scope.set(c.ConditionType.PAUSED, True, c.Reason.PAUSED)
        with contextlib.suppress(ApiNotFound):
            return await scope.close_paused()
        return DONE
    if moving:
        return await scope.release()  # unpaused: the finalizer only
    scope.set(c.ConditionType.READY, False, c.Reason.DELETING, "deleting the domain")
    if scope.lm.spec.migration_target:
        # the migration controller aborts the job when the machine is deleted and then
        # clears migrationTarget: only then is it known which host holds the domain
        scope.set(
            c.ConditionType.READY,
            False,
            c.Reason.WAITING_FOR_MIGRATION,
            f"waiting for the live migration to {scope.lm.spec.migration_target} to be"
            " aborted before deleting the domain",
        )
        return await scope.close_deleting(DONE)
    if scope.lm.spec.domain_uuid is None and not scope.status.get("host"):
        await ipam.release(scope)
        return await scope.release()  # nothing was ever created
    located = placement.locate(scope.ctx, scope.lm, scope.namespace)
    if located is None:
        message = (
            "cannot tell which host the domain is on (no LibvirtCluster and no placement "
            f"record); libvirt resources of {scope.namespace}/{md.name} are left in place"
        )
        log.warning(message)
        scope.event("Warning", c.Reason.HOST_NOT_FOUND, message)
        return await scope.release()
    target, cluster_name = located
    ident = Identity.of(
        namespace=scope.namespace, name=md.name or "", uid=md.uid or "", cluster=cluster_name
    )
    try:
        waiting = await remove_machine(scope, target, ident)
    except Problem as problem:
        return await _failed(scope, problem.failure)
    except VirtError as exc:
        return await _failed(scope, classify(exc))
    if waiting is not None:
        return await scope.close_deleting(waiting)
    await ipam.release(scope)  # the domain is gone: the addresses go back to the pools
    return await scope.release()


def _cluster_of(scope: MachineScope) -> Cluster | None:
    md = scope.lm.metadata
    raw = scope.ctx.cache.get(
        CLUSTER, ObjectKey(scope.namespace, md.label(c.CLUSTER_NAME_LABEL) or "")
    )
    if raw is None:
        return None
    with contextlib.suppress(InvalidObject):
        return parse(Cluster, raw)
    return None


async def _failed(scope: MachineScope, failure: Failure) -> Result:
    result = scope.fail(failure)
    scope.set(c.ConditionType.READY, False, c.Reason.DELETING, failure.message)
    return await scope.close_deleting(result)


async def remove_machine(scope: MachineScope, target: Target, ident: Identity) -> Result | None:
    """The domain (after its shutdown), then the volumes and network entries; a requeue
    while the guest shuts down. Raises Problem or VirtError."""
    if scope.lm.spec.domain_uuid:
        waiting = await _remove_domain(scope, target, ident)
        if waiting is not None:
            return waiting
    await remove_resources(
        target.host,
        pool=target.pool,
        network=target.network,
        spec=scope.lm.spec,
        ident=ident,
        fqdn=_fqdn(ident, target),
    )
    return None


async def _remove_domain(scope: MachineScope, target: Target, ident: Identity) -> Result | None:
    """Shut down (gracefully while time allows), then undefine; a requeue while waiting."""
    lm, host, record, options = scope.lm, target.host, scope.record, scope.ctx.options
    domain_uuid = str(lm.spec.domain_uuid)
    expected = ident.owner()
    info = await host.get_domain(domain_uuid)
    if info is None:
        return None
    ours, retag = owner_matches(info.owner, expected)
    if not ours:
        raise Problem(
            Failure(
                c.Reason.FOREIGN_DOMAIN,
                f"domain {info.name!r} ({domain_uuid}) does not carry this machine's owner "
                "tag: it is left untouched and deletion waits; remove it by hand or "
                "remove the finalizer",
                False,
            )
        )
    if retag:
        info = await host.retag_domain(domain_uuid, owner=expected)
    if info.state in (DomainState.RUNNING, DomainState.SHUTDOWN, DomainState.BLOCKED):
        elapsed = scope.ctx.deps.clock.wall() - _deletion_started(lm)
        remaining = options.shutdown_timeout - elapsed
        if remaining > 0:
            if not record.shutdown_requested:
                await host.request_shutdown(domain_uuid, owner=expected)
                record.shutdown_requested = True
            scope.status["domainState"] = domain_state_text(info.state.value)
            scope.set(
                c.ConditionType.READY,
                False,
                c.Reason.DELETING,
                "waiting for the guest to shut down (ACPI power button)",
            )
            return Result(requeue_after=min(options.shutdown_poll, remaining))
    await host.undefine_domain(domain_uuid, owner=expected)
    record.shutdown_requested = False
    return None


def _fqdn(ident: Identity, target: Target) -> str | None:
    return dns_name(ident.hostname, target.dns_domain)


def _parse_time(value: str) -> float:
    try:
        return datetime.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def _deletion_started(lm: LibvirtMachine) -> float:
    stamp = lm.metadata.deletion_timestamp
    if stamp is None:
        return 0.0
    if isinstance(stamp, datetime.datetime):
        if stamp.tzinfo is None:
            stamp = stamp.replace(tzinfo=datetime.UTC)
        return stamp.timestamp()
    return _parse_time(str(stamp))
