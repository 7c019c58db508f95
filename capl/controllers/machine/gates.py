"""The gates of a provisioning reconcile and its identity step (steps 1 to 4b and 7 of
`reconciler.LibvirtMachineReconciler._provision`).

Each gate reads what the reconcile needs from the cache into the scope and answers whether
the reconcile may go on; a gate that stops it leaves its condition in the scope (the one
status write is the caller's, `scope.MachineScope.close`). The identity step writes
spec.hostName, spec.domainUUID, spec.providerID and the placement annotation with the
finalizer, in one spec patch, before anything is created.
"""

from __future__ import annotations

import uuid as uuidlib

import structlog

from capl.api import constants as c
from capl.api.capi import Cluster, Machine
from capl.api.machine import LibvirtMachine
from capl.controllers.common import (
    add_finalizer,
    libvirt_cluster_of,
    owner,
    parse_cached,
    paused,
)
from capl.controllers.machine.options import LOGGER
from capl.controllers.machine.plan import fault_point
from capl.controllers.machine.plan_placement import PLACEMENT_ANNOTATION
from capl.controllers.machine.scope import MachineScope, Placed
from capl.controllers.machine.target import Identity, Target
from capl.runtime.conditions import get_condition
from capl.runtime.objects import ObjectKey
from capl.runtime.resources import CLUSTER, MACHINE

__all__ = [
    "cluster_known",
    "identity",
    "infrastructure_ready",
    "not_migrating",
    "owner_machine",
    "provisioned",
    "unpaused",
]

log = structlog.get_logger(LOGGER)


def owner_machine(scope: MachineScope) -> bool:
    """Gate 1: the owner Machine (and the Cluster it names), from the cache."""
    cache = scope.ctx.cache
    ref = owner(scope.lm.metadata, kind="Machine")
    if ref is None:
        log.debug("waiting for the owner Machine")
        return False
    machine_raw = cache.get(MACHINE, ObjectKey(scope.namespace, ref.name))
    if machine_raw is None:
        log.debug("owner Machine not in the cache yet", machine=ref.name)
        return False
    scope.machine = parse_cached(Machine, machine_raw)
    name = scope.lm.metadata.label(c.CLUSTER_NAME_LABEL) or scope.machine.spec.cluster_name
    scope.cluster_name = name
    cluster_raw = cache.get(CLUSTER, ObjectKey(scope.namespace, name)) if name else None
    scope.cluster = None if cluster_raw is None else parse_cached(Cluster, cluster_raw)
    return True


def unpaused(scope: MachineScope) -> bool:
    """Gate 3: pause (the Cluster's spec.paused or the paused annotation), before any
    other write (finalizer, identity, defaults): paused, only the Paused condition."""
    if paused(scope.cluster, scope.lm.metadata):
        scope.set(c.ConditionType.PAUSED, True, c.Reason.PAUSED)
        return False
    scope.set(c.ConditionType.PAUSED, False, c.Reason.NOT_PAUSED)
    return True


def cluster_known(scope: MachineScope) -> bool:
    """Gate 2 (after pause): the finalizer, and the Cluster (read by gate 1)."""
    lm = scope.lm
    add_finalizer(scope.desired, c.MACHINE_FINALIZER)
    name = scope.cluster_name
    if scope.cluster is None:
        done = provisioned(lm)
        scope.set(
            c.ConditionType.DOMAIN_PROVISIONED,
            done,
            c.Reason.RUNNING if done else c.Reason.WAITING_FOR_CLUSTER,
            "" if done else f"Cluster {scope.namespace}/{name} not found",
        )
        return False
    return True


def infrastructure_ready(scope: MachineScope) -> bool:
    """Gate 4: the Cluster's infrastructure provisioned (only before the identity is
    recorded: it never blocks a machine that has its domain) and its LibvirtCluster cached."""
    assert scope.cluster is not None
    scope.lcluster = libvirt_cluster_of(scope.ctx.cache, scope.cluster)
    if not scope.lm.spec.domain_uuid and not scope.cluster.infrastructure_provisioned:
        message = "the Cluster's infrastructure is not provisioned yet"
    elif scope.lcluster is None:
        message = (
            f"the LibvirtCluster of Cluster {scope.namespace}/{scope.cluster_name} "
            "is not in the cache"
        )
    else:
        return True
    scope.set(
        c.ConditionType.DOMAIN_PROVISIONED,
        False,
        c.Reason.WAITING_FOR_CLUSTER_INFRASTRUCTURE,
        message,
    )
    return False


def not_migrating(scope: MachineScope) -> bool:
    """Gate 4b: while spec.migrationTarget is set the migration controller owns the domain's
    whereabouts: nothing here may create, start or look for it (it may be on either host for
    a moment). The Migrating condition says so; when the target is cleared it turns False."""
    target = scope.lm.spec.migration_target
    if target:
        scope.set(
            c.ConditionType.MIGRATING,
            True,
            c.Reason.MIGRATION_RUNNING,
            f"live migration from {scope.lm.spec.host_name} to {target}",
        )
        return False
    if get_condition(scope.current, c.ConditionType.MIGRATING) is not None:
        scope.set(c.ConditionType.MIGRATING, False, c.Reason.NOT_MIGRATING)
    return True


async def identity(scope: MachineScope, target: Target) -> None:
    """Step 7: hostName, domainUUID, providerID and the placement record, written before
    anything is created (one spec patch with the finalizer)."""
    lm, machine = scope.lm, scope.machine
    assert machine is not None
    domain_uuid = lm.spec.domain_uuid or _uuid_from_provider_id(lm.spec.provider_id)
    fresh = domain_uuid is None
    if domain_uuid is None:
        domain_uuid = str(uuidlib.uuid4())
    spec = scope.desired.setdefault("spec", {})
    spec.setdefault("hostName", target.name)
    spec["domainUUID"] = domain_uuid
    spec["providerID"] = c.PROVIDER_ID_PREFIX + domain_uuid
    annotations = scope.desired.setdefault("metadata", {}).setdefault("annotations", {})
    annotations[PLACEMENT_ANNOTATION] = target.placement(scope.cluster_name).encode()
    ident = Identity.of(
        namespace=scope.namespace,
        name=lm.metadata.name or "",
        uid=lm.metadata.uid or "",
        cluster=scope.cluster_name,
    )
    scope.placed = Placed(
        machine=machine,
        target=target,
        ident=ident,
        domain_uuid=domain_uuid,
        provisioned=provisioned(lm),
        fresh=fresh,
    )
    if fresh or scope.main_changed():
        await scope.write_main()
        fault_point("identity-recorded")


def provisioned(lm: LibvirtMachine) -> bool:
    """status.initialization.provisioned: the domain existed once."""
    return bool(lm.status.initialization and lm.status.initialization.provisioned)


def _uuid_from_provider_id(provider_id: str | None) -> str | None:
    if provider_id and provider_id.startswith(c.PROVIDER_ID_PREFIX):
        return provider_id[len(c.PROVIDER_ID_PREFIX) :].lower() or None
    return None
