"""The informer's in-memory cache of one kind, with secondary indexes.

An index maps an index value to the keys of the objects that produce it; an `Indexer` is a plain
function `obj -> iterable of values`. Two indexes are built in: by owner UID (`INDEX_OWNER_UID`)
and by cluster (`INDEX_CLUSTER`, value "namespace/cluster-name" from the
`cluster.x-k8s.io/cluster-name` label).

Objects are kept encoded (compact JSON bytes, orjson) and decoded on every read: a cached
LibvirtMachine takes about 2 KB so instead of about 8 KB as nested dicts and strings, and
every read is the caller's own copy. (Measured for issue 16: this cut pymalloc's allocated
memory at 1,000 machines from 72 to 59 MB, not RSS, which the import of kubernetes_asyncio
and per-machine controller memory dominate; see docs/benchmarks.md.) The indexes are
computed once, from the object as it arrives. An index
value held by one key (a domain UUID, an owner UID) keeps that key alone, not a set.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from types import MappingProxyType

import orjson

from capl.runtime.objects import (
    CLUSTER_NAME_LABEL,
    Obj,
    ObjectKey,
    key_of,
    labels,
    owner_references,
)

Indexer = Callable[[Obj], Iterable[str]]
ObjList = list[Obj]
KeyList = list[ObjectKey]

INDEX_OWNER_UID = "owner-uid"
INDEX_CLUSTER = "cluster"


def index_owner_uid(obj: Obj) -> Iterable[str]:
    return [str(ref["uid"]) for ref in owner_references(obj) if ref.get("uid")]


def index_cluster(obj: Obj) -> Iterable[str]:
    name = labels(obj).get(CLUSTER_NAME_LABEL)
    if not name:
        return ()
    return (cluster_index_value(obj["metadata"].get("namespace") or "", name),)


def cluster_index_value(namespace: str, cluster_name: str) -> str:
    """The INDEX_CLUSTER value for a cluster."""
    return f"{namespace}/{cluster_name}"


DEFAULT_INDEXERS: Mapping[str, Indexer] = {
    INDEX_OWNER_UID: index_owner_uid,
    INDEX_CLUSTER: index_cluster,
}


def selector_matches(selector: Mapping[str, str] | None, obj: Obj) -> bool:
    """Equality-based label selector match."""
    if not selector:
        return True
    have = labels(obj)
    return all(have.get(k) == v for k, v in selector.items())


class Store:
    """Objects by key, plus indexes (see the module docstring)."""

    def __init__(self, indexers: Mapping[str, Indexer] | None = None) -> None:
        self._items: dict[ObjectKey, bytes] = {}
        self._indexers: dict[str, Indexer] = dict(
            DEFAULT_INDEXERS if indexers is None else indexers
        )
        self._indices: dict[str, dict[str, ObjectKey | set[ObjectKey]]] = {
            n: {} for n in self._indexers
        }
        self._values: dict[str, dict[ObjectKey, str | tuple[str, ...]]] = {
            n: {} for n in self._indexers
        }

    # -- reading -----------------------------------------------------------------------------

    def get(self, key: ObjectKey) -> Obj | None:
        data = self._items.get(key)
        return None if data is None else _decode(data)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[Obj]:
        return (_decode(data) for data in list(self._items.values()))

    def list_keys(self) -> KeyList:
        return list(self._items)

    def list(
        self, *, namespace: str | None = None, selector: Mapping[str, str] | None = None
    ) -> ObjList:
        """Objects in a namespace (all when None) whose labels match `selector`."""
        found: ObjList = []
        for key, data in self._items.items():
            if namespace is None or key.namespace == namespace:
                obj = _decode(data)
                if selector_matches(selector, obj):
                    found.append(obj)
        return found

    def index_keys(self, index: str, value: str) -> KeyList:
        try:
            bucket = self._indices[index].get(value)
        except KeyError:
            raise KeyError(f"no index {index!r}") from None
        if bucket is None:
            return []
        return [bucket] if isinstance(bucket, ObjectKey) else list(bucket)

    def by_index(self, index: str, value: str) -> ObjList:
        return [_decode(self._items[k]) for k in self.index_keys(index, value)]

    def index_values(self, index: str) -> set[str]:
        """Every value some object has in `index` (a copy; O(values), no object is read)."""
        try:
            return set(self._indices[index])
        except KeyError:
            raise KeyError(f"no index {index!r}") from None

    def index_view(self, index: str) -> Mapping[str, object]:
        """A read-only live view of `index` by value (O(1), nothing copied): for membership
        tests, also from a worker thread (a dict look-up is atomic under the GIL)."""
        try:
            return MappingProxyType(self._indices[index])
        except KeyError:
            raise KeyError(f"no index {index!r}") from None

    @property
    def indexers(self) -> dict[str, Indexer]:
        return dict(self._indexers)

    # -- writing (the informer) --------------------------------------------------------------

    def add_indexer(self, name: str, indexer: Indexer) -> None:
        """Add an index (built from the current content)."""
        if name in self._indexers:
            if self._indexers[name] is indexer:
                return
            raise ValueError(f"index {name!r} already exists")
        self._indexers[name] = indexer
        self._indices[name] = {}
        self._values[name] = {}
        for key, data in self._items.items():
            self._index(name, key, _decode(data))

    def upsert(self, obj: Obj) -> Obj | None:
        """Insert or replace; returns the previous object (decoded)."""
        key = key_of(obj)
        old = self._items.get(key)
        self._items[key] = _encode(obj)
        for name in self._indexers:
            self._index(name, key, obj)
        return None if old is None else _decode(old)

    def delete(self, key: ObjectKey) -> Obj | None:
        old = self._items.pop(key, None)
        if old is None:
            return None
        for name in self._indexers:
            self._unindex(name, key)
        return _decode(old)

    def clear(self) -> None:
        self._items.clear()
        for name in self._indexers:
            self._indices[name].clear()
            self._values[name].clear()

    def _index(self, name: str, key: ObjectKey, obj: Obj) -> None:
        values = tuple(self._indexers[name](obj))
        held: str | tuple[str, ...] = values[0] if len(values) == 1 else values
        previous = self._values[name].get(key)
        if previous == held:
            return
        if previous is not None:
            self._unindex(name, key)
        if values:
            self._values[name][key] = held
            index = self._indices[name]
            for value in values:
                bucket = index.get(value)
                if bucket is None or bucket == key:
                    index[value] = key
                elif isinstance(bucket, ObjectKey):
                    index[value] = {bucket, key}
                else:
                    bucket.add(key)

    def _unindex(self, name: str, key: ObjectKey) -> None:
        previous = self._values[name].pop(key, None)
        if previous is None:
            return
        index = self._indices[name]
        for value in (previous,) if isinstance(previous, str) else previous:
            bucket = index.get(value)
            if bucket is None:
                continue
            if isinstance(bucket, ObjectKey):
                if bucket == key:
                    del index[value]
                continue
            bucket.discard(key)
            if len(bucket) == 1:
                index[value] = next(iter(bucket))
            elif not bucket:
                del index[value]


def _encode(obj: Obj) -> bytes:
    """The object as compact JSON, in a buffer of its own size.

    orjson.dumps returns its bytes in the buffer it wrote into, at least 4 KiB whatever the
    length (orjson 3.13: measured with tracemalloc, 4,097 bytes for `{"a":1}`); kept as they
    are, every cached object would hold 4 KiB, twice the 2.2 KB of a Ready LibvirtMachine. The
    copy costs one memcpy per watch event.
    """
    return memoryview(orjson.dumps(obj)).tobytes()


def _decode(data: bytes) -> Obj:
    obj: Obj = orjson.loads(data)
    return obj
