"""Predicates (which events matter) and mappers (event object -> primary keys) for controllers.

A controller watches its primary kind with `PRIMARY_DEFAULT_PREDICATES` (status-only updates
skipped) and secondary kinds through a `Mapper`: Machine -> its LibvirtMachine
(`map_ref("spec", "infrastructureRef", kind="LibvirtMachine")`), Cluster -> its LibvirtCluster
(same) and its LibvirtMachines (`map_cluster_members(cache, LIBVIRT_MACHINE)`), an object ->
its owner (`map_owner("Machine")`), anything via an index (`map_index`), and two hops through
another cached kind (`map_via`): e.g. a bootstrap Secret -> the Machines naming it (an index made
with `field_indexer("spec", "bootstrap", "dataSecretName")`) -> their LibvirtMachines.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from capl.runtime.objects import Obj, ObjectKey, get_path, key_of, labels, meta, owner_references
from capl.runtime.store import INDEX_CLUSTER, Indexer, cluster_index_value

if TYPE_CHECKING:
    from capl.runtime.informer import Cache
    from capl.runtime.resources import Resource

Mapper = Callable[[Obj], Iterable[ObjectKey]]


class Predicate(Protocol):
    """Decides whether an event is worth a reconcile. Resyncs are update(obj, obj)."""

    def create(self, obj: Obj) -> bool: ...

    def update(self, old: Obj, new: Obj) -> bool: ...

    def delete(self, obj: Obj) -> bool: ...


_IGNORED_META = frozenset({"resourceVersion", "managedFields", "generation"})


def _without_status(obj: Obj) -> dict[str, Any]:
    body = {k: v for k, v in obj.items() if k != "status" and k != "metadata"}
    body["metadata"] = {k: v for k, v in meta(obj).items() if k not in _IGNORED_META}
    return body


class SkipStatusOnlyUpdates:
    """Pass creates, deletes, resyncs and updates that change more than status.

    With metadata.generation on both sides: pass when generation, labels, annotations,
    finalizers, ownerReferences or deletionTimestamp changed. Without generation (kinds that do
    not bump it): pass when anything but status/resourceVersion/managedFields changed.
    """

    WATCHED_META = ("labels", "annotations", "finalizers", "ownerReferences", "deletionTimestamp")

    def create(self, obj: Obj) -> bool:
        return True

    def delete(self, obj: Obj) -> bool:
        return True

    def update(self, old: Obj, new: Obj) -> bool:
        if old is new:
            return True
        old_meta, new_meta = meta(old), meta(new)
        if old_meta.get("resourceVersion") == new_meta.get("resourceVersion"):
            return True  # resync / re-list delivering the same object
        old_gen, new_gen = old_meta.get("generation"), new_meta.get("generation")
        if old_gen is None or new_gen is None:
            return _without_status(old) != _without_status(new)
        if old_gen != new_gen:
            return True
        return any(old_meta.get(f) != new_meta.get(f) for f in self.WATCHED_META)


@dataclass(frozen=True, slots=True)
class HasLabel:
    """Only objects carrying label `key` (with `value`, when given)."""

    key: str
    value: str | None = None

    def matches(self, obj: Obj) -> bool:
        have = labels(obj)
        if self.value is None:
            return self.key in have
        return have.get(self.key) == self.value

    def create(self, obj: Obj) -> bool:
        return self.matches(obj)

    def update(self, old: Obj, new: Obj) -> bool:
        return self.matches(new) or self.matches(old)

    def delete(self, obj: Obj) -> bool:
        return self.matches(obj)


@dataclass(frozen=True, slots=True)
class FuncPredicate:
    """A predicate from functions; a missing function passes."""

    on_create: Callable[[Obj], bool] | None = None
    on_update: Callable[[Obj, Obj], bool] | None = None
    on_delete: Callable[[Obj], bool] | None = None

    def create(self, obj: Obj) -> bool:
        return self.on_create is None or self.on_create(obj)

    def update(self, old: Obj, new: Obj) -> bool:
        return self.on_update is None or self.on_update(old, new)

    def delete(self, obj: Obj) -> bool:
        return self.on_delete is None or self.on_delete(obj)


PRIMARY_DEFAULT_PREDICATES: tuple[Predicate, ...] = (SkipStatusOnlyUpdates(),)


# -- mappers ---------------------------------------------------------------------------------


def map_self(obj: Obj) -> Iterable[ObjectKey]:
    return (key_of(obj),)


def map_ref(*path: str, kind: str | None = None, api_group: str | None = None) -> Mapper:
    """Follow an object reference at `path` (name, optional namespace/kind/apiGroup/apiVersion)
    to a key in the same namespace unless the reference names one."""

    def mapper(obj: Obj) -> Iterable[ObjectKey]:
        ref = get_path(obj, *path)
        if not isinstance(ref, dict) or not ref.get("name"):
            return ()
        if kind is not None and ref.get("kind") not in (None, kind):
            return ()
        if api_group is not None:
            group = ref.get("apiGroup")
            if group is None and "apiVersion" in ref:
                group = str(ref["apiVersion"]).rpartition("/")[0]
            if group not in (None, api_group):
                return ()
        namespace = ref.get("namespace") or meta(obj).get("namespace") or ""
        return (ObjectKey(namespace, ref["name"]),)

    return mapper


def map_owner(kind: str, *, api_group: str | None = None, controller_only: bool = False) -> Mapper:
    """The owners of the given kind (same namespace)."""

    def mapper(obj: Obj) -> Iterable[ObjectKey]:
        namespace = meta(obj).get("namespace") or ""
        keys = []
        for ref in owner_references(obj):
            if ref.get("kind") != kind:
                continue
            if api_group is not None and str(ref.get("apiVersion", "")).rpartition("/")[0] != (
                api_group
            ):
                continue
            if controller_only and not ref.get("controller"):
                continue
            keys.append(ObjectKey(namespace, ref["name"]))
        return keys

    return mapper


def map_index(
    cache: Cache, resource: Resource, index: str, values: Callable[[Obj], Iterable[str]]
) -> Mapper:
    """Keys of the cached `resource` objects whose `index` holds any of `values(obj)`."""

    def mapper(obj: Obj) -> Iterable[ObjectKey]:
        store = cache.store(resource)
        keys: list[ObjectKey] = []
        for value in values(obj):
            keys.extend(store.index_keys(index, value))
        return keys

    return mapper


def map_cluster_members(cache: Cache, resource: Resource) -> Mapper:
    """For a Cluster: the cached `resource` objects labelled with its cluster name."""

    def values(obj: Obj) -> Iterable[str]:
        m = meta(obj)
        return (cluster_index_value(m.get("namespace") or "", m["name"]),)

    return map_index(cache, resource, INDEX_CLUSTER, values)


def field_indexer(*path: str) -> Indexer:
    """An Indexer of a string field, namespaced: value "namespace/field-value"."""

    def indexer(obj: Obj) -> Iterable[str]:
        value = get_path(obj, *path)
        if not isinstance(value, str) or not value:
            return ()
        return (f"{meta(obj).get('namespace') or ''}/{value}",)

    return indexer


def map_by_name_index(cache: Cache, resource: Resource, index: str) -> Mapper:
    """Keys of cached `resource` objects whose namespaced `index` (see field_indexer) holds the
    event object's "namespace/name" (e.g. Secret -> Machines whose dataSecretName is it)."""

    def values(obj: Obj) -> Iterable[str]:
        m = meta(obj)
        return (f"{m.get('namespace') or ''}/{m['name']}",)

    return map_index(cache, resource, index, values)


def map_via(cache: Cache, resource: Resource, first: Mapper, second: Mapper) -> Mapper:
    """Two hops: `first` maps the event object to keys of cached `resource` objects, `second`
    maps each of those to primary keys."""

    def mapper(obj: Obj) -> Iterable[ObjectKey]:
        keys: list[ObjectKey] = []
        store = cache.store(resource)
        for key in first(obj):
            middle = store.get(key)
            if middle is not None:
                keys.extend(second(middle))
        return keys

    return mapper
