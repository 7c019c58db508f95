"""What wakes the LibvirtCluster controller, and which of the cluster's machines it reads.

- The cluster's machines: `internal_ips`, `is_control_plane_machine` (the label on the
  LibvirtMachine or its owner Machine) and `control_plane_addresses` (the targets of the
  `api`/`api-int` records, from the cache's cluster index).
- Secondary watches (`watches`): the Cluster (its infrastructureRef), LibvirtMachines and
  control-plane Machines of the cluster (`ControlPlaneMachineChanges`: any deletion, address,
  label or deletion-state changes of control-plane machines, and for every machine a change
  of its host, migration target or evictionStrategy while a host of its cluster is in
  maintenance), credentials Secrets
  (an index of `spec.hosts[].credentialsRef`), and the evacuation LibvirtMachineMigrations
  (label `EVACUATION_HOST_LABEL`, mapped by their owner reference to the LibvirtCluster that
  made them; created, deleted, or a new phase: `MIGRATION_CHANGES`). The machine
  controller's host index (`INDEX_HOST`) is registered here too: maintenance reads the
  machines on a host from it.
- libvirt host (dis)connections (`host_event_trigger`): requeue the LibvirtClusters using the
  host.
"""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from capl.api import constants as c
from capl.controllers.cluster_dns import addresses_in_network
from capl.controllers.common import CAPI_GROUP, Deps
from capl.controllers.machine.indexes import INDEX_HOST, index_host
from capl.ports.virt import HostEvent, VirtEvent
from capl.runtime.controller import Watch
from capl.runtime.handlers import (
    FuncPredicate,
    HasLabel,
    SkipStatusOnlyUpdates,
    map_by_name_index,
    map_owner,
    map_ref,
)
from capl.runtime.informer import Cache
from capl.runtime.objects import (
    Obj,
    ObjectKey,
    get_path,
    is_deleting,
    key_of,
    labels,
    meta,
    owner_references,
)
from capl.runtime.resources import (
    CLUSTER,
    LIBVIRT_CLUSTER,
    LIBVIRT_MACHINE,
    LIBVIRT_MACHINE_MIGRATION,
    MACHINE,
    SECRET,
)
from capl.runtime.store import INDEX_CLUSTER, cluster_index_value

__all__ = [
    "CREDENTIALS_INDEX",
    "INDEX_MAINTENANCE",
    "INDEX_OWNER_CLUSTER",
    "MIGRATION_CHANGES",
    "ControlPlaneMachineChanges",
    "add_maintenance_index",
    "add_owner_cluster_index",
    "control_plane_addresses",
    "credentials_indexer",
    "host_event_trigger",
    "in_maintenance",
    "internal_ips",
    "is_control_plane_machine",
    "libvirt_clusters_of",
    "watches",
]

CREDENTIALS_INDEX = "libvirtcluster-credentials"
"""LibvirtCluster index: "namespace/secret-name" of every host's credentials Secret."""


# --- reading the cluster's machines ----------------------------------------------------------


def internal_ips(machine: Mapping[str, Any]) -> list[str]:
    """InternalIP addresses in a LibvirtMachine's status."""
    addresses = get_path(machine, "status", "addresses") or []
    return [
        str(a.get("address"))
        for a in addresses
        if isinstance(a, Mapping)
        and a.get("type") == c.AddressType.INTERNAL_IP
        and a.get("address")
    ]


def is_control_plane_machine(cache: Cache, machine: Mapping[str, Any]) -> bool:
    """The control-plane label on the LibvirtMachine, or on its owner Machine."""
    if c.CONTROL_PLANE_LABEL in labels(machine):
        return True
    namespace = meta(machine).get("namespace") or ""
    for ref in owner_references(machine):
        if ref.get("kind") != "Machine" or not str(ref.get("apiVersion", "")).startswith(
            CAPI_GROUP + "/"
        ):
            continue
        owner_machine = cache.get(MACHINE, ObjectKey(namespace, str(ref.get("name"))))
        if owner_machine is not None and c.CONTROL_PLANE_LABEL in labels(owner_machine):
            return True
    return False


def _ip_sort_key(value: str) -> int:
    return int(ipaddress.IPv4Address(value))


def control_plane_addresses(cache: Cache, *, namespace: str, cluster: str) -> tuple[str, ...]:
    """IPv4 InternalIPs of the cluster's control-plane LibvirtMachines not being deleted."""
    found: set[str] = set()
    for machine in cache.by_index(
        LIBVIRT_MACHINE, INDEX_CLUSTER, cluster_index_value(namespace, cluster)
    ):
        if is_deleting(machine) or not is_control_plane_machine(cache, machine):
            continue
        found.update(addresses_in_network(internal_ips(machine), None))
    return tuple(sorted(found, key=_ip_sort_key))


# --- watches ---------------------------------------------------------------------------------


def credentials_indexer(obj: Obj) -> Iterable[str]:
    namespace = meta(obj).get("namespace") or ""
    names = {
        str(get_path(h, "credentialsRef", "name"))
        for h in get_path(obj, "spec", "hosts") or []
        if isinstance(h, Mapping) and get_path(h, "credentialsRef", "name")
    }
    return [f"{namespace}/{name}" for name in sorted(names)]


INDEX_OWNER_CLUSTER = "capl.owner-cluster"
"""LibvirtClusters by the Cluster that owns them ("namespace/name" of each Cluster owner
reference), so that a machine event finds its cluster's LibvirtClusters without decoding
every LibvirtCluster of the namespace."""


def owner_cluster_indexer(obj: Obj) -> Iterable[str]:
    namespace = meta(obj).get("namespace") or ""
    return sorted(
        {
            cluster_index_value(namespace, str(ref["name"]))
            for ref in owner_references(obj)
            if ref.get("kind") == "Cluster"
            and ref.get("name")
            and str(ref.get("apiVersion", "")).startswith(CAPI_GROUP + "/")
        }
    )


def add_owner_cluster_index(cache: Cache) -> None:
    """Add INDEX_OWNER_CLUSTER to the LibvirtCluster informer (once; idempotent)."""
    cache.informer(LIBVIRT_CLUSTER).add_indexer(INDEX_OWNER_CLUSTER, owner_cluster_indexer)


def libvirt_clusters_of(cache: Cache, *, namespace: str, cluster: str) -> list[ObjectKey]:
    """The LibvirtClusters of a Cluster: its infrastructureRef, and any owned by it (from
    INDEX_OWNER_CLUSTER: `add_owner_cluster_index` first)."""
    keys: set[ObjectKey] = set()
    cluster_obj = cache.get(CLUSTER, ObjectKey(namespace, cluster))
    if cluster_obj is not None:
        keys.update(map_ref("spec", "infrastructureRef", kind=c.Kind.LIBVIRT_CLUSTER)(cluster_obj))
    owned = cache.index_keys(
        LIBVIRT_CLUSTER, INDEX_OWNER_CLUSTER, cluster_index_value(namespace, cluster)
    )
    keys.update(owned)
    return sorted(keys)


def _map_member_to_clusters(cache: Cache) -> Callable[[Obj], Iterable[ObjectKey]]:
    """A (Libvirt)Machine -> the LibvirtCluster(s) of its cluster."""
    add_owner_cluster_index(cache)

    def mapper(obj: Obj) -> Iterable[ObjectKey]:
        cluster = labels(obj).get(c.CLUSTER_NAME_LABEL) or get_path(obj, "spec", "clusterName")
        if not cluster:
            return ()
        return libvirt_clusters_of(
            cache, namespace=meta(obj).get("namespace") or "", cluster=str(cluster)
        )

    return mapper


_PLACEMENT_PATHS = (
    ("spec", "hostName"),
    ("status", "host"),
    ("spec", "migrationTarget"),
    ("spec", "evictionStrategy"),
)


def _placement_changed(old: Obj, new: Obj) -> bool:
    """Where a machine is, whether it migrates, what its eviction strategy is (maintenance)."""
    return any(get_path(old, *p) != get_path(new, *p) for p in _PLACEMENT_PATHS)


def _has_maintenance(obj: Obj) -> bool:
    """A host of this LibvirtCluster in maintenance, or one whose maintenance status is still
    reported (the reconcile that removes it is woken by the spec change itself)."""
    return any(
        isinstance(h, Mapping) and h.get("maintenance")
        for part in ("spec", "status")
        for h in get_path(obj, part, "hosts") or ()
    )


INDEX_MAINTENANCE = "capl.maintenance"
"""LibvirtClusters with a host in maintenance (`_has_maintenance`), by their own key
("namespace/name"): a machine event asks `in_maintenance` without decoding a LibvirtCluster
or Cluster while no host is in maintenance (the common case)."""


def maintenance_indexer(obj: Obj) -> Iterable[str]:
    if not _has_maintenance(obj):
        return ()
    return (cluster_index_value(meta(obj).get("namespace") or "", str(meta(obj)["name"])),)


def add_maintenance_index(cache: Cache) -> None:
    """Add INDEX_MAINTENANCE to the LibvirtCluster informer (once; idempotent)."""
    cache.informer(LIBVIRT_CLUSTER).add_indexer(INDEX_MAINTENANCE, maintenance_indexer)


def in_maintenance(cache: Cache, machine: Obj) -> bool:
    """Whether a LibvirtCluster of the machine's cluster has a host in maintenance (from the
    cache; `add_maintenance_index` first): only then does a machine's placement matter to the
    cluster's reconcile. Without it, every new machine (hostName, then status.host) would wake
    the whole cluster reconcile (network, pool, endpoint: it reads the network's whole
    definition) twice for nothing."""
    busy = cache.index_values(LIBVIRT_CLUSTER, INDEX_MAINTENANCE)
    if not busy:
        return False
    cluster = labels(machine).get(c.CLUSTER_NAME_LABEL) or get_path(machine, "spec", "clusterName")
    if not cluster:
        return False
    namespace = meta(machine).get("namespace") or ""
    return any(
        cluster_index_value(key.namespace, key.name) in busy
        for key in libvirt_clusters_of(cache, namespace=namespace, cluster=str(cluster))
    )


class ControlPlaneMachineChanges:
    """LibvirtMachine events that matter to the cluster: any deletion (deletion waits for the
    machines), creates/updates of control-plane machines that change their addresses,
    labels or deletion state (the endpoint records), and updates of any machine that change
    its host, migration target or eviction strategy while a host of its cluster is in
    maintenance (`in_maintenance`)."""

    def __init__(self, cache: Cache) -> None:
        self.cache = cache
        add_owner_cluster_index(cache)
        add_maintenance_index(cache)

    def create(self, obj: Obj) -> bool:
        return is_control_plane_machine(self.cache, obj)

    def delete(self, obj: Obj) -> bool:
        return True

    def update(self, old: Obj, new: Obj) -> bool:
        if old is not new and _placement_changed(old, new) and in_maintenance(self.cache, new):
            return True
        if not (
            is_control_plane_machine(self.cache, old) or is_control_plane_machine(self.cache, new)
        ):
            return False
        if old is new:
            return True
        return (
            internal_ips(old) != internal_ips(new)
            or is_deleting(old) != is_deleting(new)
            or labels(old).get(c.CONTROL_PLANE_LABEL) != labels(new).get(c.CONTROL_PLANE_LABEL)
        )


def _migration_changed(old: Obj, new: Obj) -> bool:
    return (
        old is new
        or get_path(old, "status", "phase") != get_path(new, "status", "phase")
        or is_deleting(old) != is_deleting(new)
    )


MIGRATION_CHANGES = FuncPredicate(on_update=_migration_changed)
"""Evacuation migrations: created, deleted, a new phase or the deletion started."""


def watches(cache: Cache) -> list[Watch]:
    """The secondary watches of the controller (adds the credentials and owner-cluster
    indexes of LibvirtClusters and the machine host index to the cache)."""
    cache.informer(LIBVIRT_CLUSTER).add_indexer(CREDENTIALS_INDEX, credentials_indexer)
    add_owner_cluster_index(cache)
    cache.informer(LIBVIRT_MACHINE).add_indexer(INDEX_HOST, index_host)
    members = _map_member_to_clusters(cache)
    return [
        Watch(CLUSTER, map_ref("spec", "infrastructureRef", kind=c.Kind.LIBVIRT_CLUSTER)),
        Watch(LIBVIRT_MACHINE, members, predicates=(ControlPlaneMachineChanges(cache),)),
        Watch(
            MACHINE,
            members,
            predicates=(HasLabel(c.CONTROL_PLANE_LABEL), SkipStatusOnlyUpdates()),
        ),
        Watch(SECRET, map_by_name_index(cache, LIBVIRT_CLUSTER, CREDENTIALS_INDEX)),
        Watch(
            LIBVIRT_MACHINE_MIGRATION,
            map_owner(c.Kind.LIBVIRT_CLUSTER, api_group=c.GROUP),
            predicates=(HasLabel(c.EVACUATION_HOST_LABEL), MIGRATION_CHANGES),
        ),
    ]


def _is_host_event(event: VirtEvent) -> bool:
    """Only host (dis)connections concern the LibvirtClusters (two domain events per new
    machine are not handed to the loop for nothing)."""
    return isinstance(event, HostEvent)


def host_event_trigger(
    deps: Deps, enqueue: Callable[[ObjectKey], None]
) -> Callable[[asyncio.Event], Any]:
    """A runnable: libvirt host (dis)connections requeue the LibvirtClusters using the host."""

    def listener(event: VirtEvent) -> None:
        if not isinstance(event, HostEvent):
            return
        for obj in deps.cache.list(LIBVIRT_CLUSTER):
            for host in get_path(obj, "spec", "hosts") or []:
                uri = host.get("uri") if isinstance(host, Mapping) else None
                if uri and deps.hosts.host_id(str(uri)) == event.host_id:
                    enqueue(key_of(obj))
                    break

    async def run(stop: asyncio.Event) -> None:
        subscription = deps.hosts.subscribe(listener, wants=_is_host_event)
        try:
            await stop.wait()
        finally:
            subscription.close()

    return run
