"""What wakes a LibvirtMachine besides its own object: the secondary watches and libvirt.

- its Machine (spec, status.nodeRef, labels/annotations/ownerReferences/deletion), mapped by
  the Machine's infrastructureRef;
- its Cluster (spec, status.initialization, metadata), mapped to the cluster's members;
- its LibvirtCluster (spec, status.initialization, status.hosts: a re-created network's new
  UUID, see `network`), mapped through the cluster index;
- Secrets: the bootstrap data Secret (through the Machines naming it) and the cluster's
  `<cluster>-kubeconfig` (the workload Node's providerID, `guest`);
- libvirt: domain lifecycle events by domain UUID (`INDEX_DOMAIN_UUID`) and host connection
  events by host (`INDEX_HOST`, `keys_on_host`).

The reconciler "touches" every key these yield (`Memory.touch`): a machine settled at Ready
is looked at again only when something touched it or its resourceVersion changed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from capl.api import constants as c
from capl.controllers.machine.guest import KUBECONFIG_SUFFIX
from capl.controllers.machine.indexes import (
    INDEX_BOOTSTRAP_SECRET,
    INDEX_HOST,
    cluster_name_of_libvirt_cluster,
    host_index_value,
)
from capl.ports.errors import VirtError
from capl.ports.virt import HostId, Hosts
from capl.runtime.controller import Watch
from capl.runtime.handlers import (
    FuncPredicate,
    Mapper,
    map_by_name_index,
    map_cluster_members,
    map_ref,
    map_via,
)
from capl.runtime.informer import Cache
from capl.runtime.objects import Obj, ObjectKey, get_path, meta
from capl.runtime.resources import CLUSTER, LIBVIRT_CLUSTER, LIBVIRT_MACHINE, MACHINE, SECRET
from capl.runtime.store import INDEX_CLUSTER, cluster_index_value

__all__ = [
    "CLUSTER_CHANGES",
    "LIBVIRT_CLUSTER_CHANGES",
    "MACHINE_CHANGES",
    "keys_on_host",
    "watches",
]


def _changed(old: Obj, new: Obj, *paths: tuple[str, ...]) -> bool:
    return any(get_path(old, *p) != get_path(new, *p) for p in paths)


_META_PATHS = (
    ("metadata", "labels"),
    ("metadata", "annotations"),
    ("metadata", "ownerReferences"),
    ("metadata", "deletionTimestamp"),
)
MACHINE_CHANGES = FuncPredicate(
    on_update=lambda old, new: (
        old is new or _changed(old, new, ("spec",), ("status", "nodeRef"), *_META_PATHS)
    )
)
CLUSTER_CHANGES = FuncPredicate(
    on_update=lambda old, new: (
        old is new or _changed(old, new, ("spec",), ("status", "initialization"), *_META_PATHS)
    )
)
LIBVIRT_CLUSTER_CHANGES = FuncPredicate(
    on_update=lambda old, new: (
        old is new
        or _changed(
            old, new, ("spec",), ("status", "initialization"), ("status", "hosts"), *_META_PATHS
        )
    )
)


def watches(cache: Cache, touching: Callable[[Mapper], Mapper]) -> list[Watch]:
    """The secondary watches; `touching` wraps each mapper (the reconciler's touch)."""
    to_machine = map_ref("spec", "infrastructureRef", kind=c.Kind.LIBVIRT_MACHINE)
    secrets = map_via(
        cache, MACHINE, map_by_name_index(cache, MACHINE, INDEX_BOOTSTRAP_SECRET), to_machine
    )
    return [
        Watch(MACHINE, touching(to_machine), (MACHINE_CHANGES,)),
        Watch(CLUSTER, touching(map_cluster_members(cache, LIBVIRT_MACHINE)), (CLUSTER_CHANGES,)),
        Watch(LIBVIRT_CLUSTER, touching(_map_libvirt_cluster(cache)), (LIBVIRT_CLUSTER_CHANGES,)),
        Watch(SECRET, touching(_union(secrets, _map_kubeconfig_secret(cache)))),
    ]


def _map_libvirt_cluster(cache: Cache) -> Mapper:
    def mapper(obj: Obj) -> Iterable[ObjectKey]:
        cluster = cluster_name_of_libvirt_cluster(obj)
        if not cluster:
            return ()
        value = cluster_index_value(meta(obj).get("namespace") or "", cluster)
        return cache.store(LIBVIRT_MACHINE).index_keys(INDEX_CLUSTER, value)

    return mapper


def _map_kubeconfig_secret(cache: Cache) -> Mapper:
    def mapper(obj: Obj) -> Iterable[ObjectKey]:
        name = str(meta(obj).get("name") or "")
        if not name.endswith(KUBECONFIG_SUFFIX):
            return ()
        cluster = name[: -len(KUBECONFIG_SUFFIX)]
        value = cluster_index_value(meta(obj).get("namespace") or "", cluster)
        return cache.store(LIBVIRT_MACHINE).index_keys(INDEX_CLUSTER, value)

    return mapper


def _union(*mappers: Mapper) -> Mapper:
    def mapper(obj: Obj) -> Iterable[ObjectKey]:
        keys: list[ObjectKey] = []
        for m in mappers:
            keys.extend(m(obj))
        return keys

    return mapper


def keys_on_host(cache: Cache, hosts: Hosts, host_id: HostId) -> list[ObjectKey]:
    """The machines placed on the host a host event is about (every cluster using it)."""
    keys: list[ObjectKey] = []
    store = cache.store(LIBVIRT_MACHINE)
    for obj in cache.list(LIBVIRT_CLUSTER):
        cluster = cluster_name_of_libvirt_cluster(obj)
        if not cluster:
            continue
        namespace = meta(obj).get("namespace") or ""
        for entry in get_path(obj, "spec", "hosts") or ():
            try:
                same = hosts.host_id(str(entry.get("uri", ""))) == host_id
            except VirtError:
                continue
            if same:
                value = host_index_value(namespace, cluster, str(entry.get("name")))
                keys.extend(store.index_keys(INDEX_HOST, value))
    return keys
