"""The informer's Store keeps objects encoded and decodes each read (the caller's own copy);
an index value held by one key keeps the key alone, and moves between that and a set as keys
come and go, without losing or duplicating a key."""

from __future__ import annotations

import tracemalloc
from typing import Any

import orjson
import pytest

from capl.runtime.objects import ObjectKey
from capl.runtime.store import INDEX_CLUSTER, Store

LABEL = "cluster.x-k8s.io/cluster-name"


def _obj(name: str, cluster: str | None, rv: str = "1") -> dict[str, Any]:
    labels = {LABEL: cluster} if cluster else {}
    return {
        "metadata": {"name": name, "namespace": "ns", "labels": labels, "resourceVersion": rv},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


def test_reads_are_private_copies_of_what_was_stored() -> None:
    store = Store()
    obj = _obj("a", "c1")
    assert store.upsert(obj) is None
    first = store.get(ObjectKey("ns", "a"))
    assert first == obj
    assert first is not obj
    first["status"]["conditions"][0]["status"] = "False"  # the caller's copy only
    obj["metadata"]["labels"].clear()  # nor does the stored object follow the original
    again = store.get(ObjectKey("ns", "a"))
    assert again is not None
    assert again["status"]["conditions"][0]["status"] == "True"
    assert again["metadata"]["labels"] == {LABEL: "c1"}
    old = store.upsert(_obj("a", "c1", rv="2"))
    assert old is not None
    assert old["metadata"]["resourceVersion"] == "1"
    assert [o["metadata"]["name"] for o in store.list(selector={LABEL: "c1"})] == ["a"]
    assert [o["metadata"]["name"] for o in store] == ["a"]


def test_index_buckets_move_between_one_key_and_a_set() -> None:
    store = Store()
    value = "ns/c1"
    keys = [ObjectKey("ns", n) for n in ("a", "b", "c")]
    for key in keys:
        store.upsert(_obj(key.name, "c1"))
    assert sorted(store.index_keys(INDEX_CLUSTER, value)) == keys
    store.delete(keys[0])
    store.upsert(_obj("b", "c2"))  # b moves to another cluster
    assert store.index_keys(INDEX_CLUSTER, value) == [keys[2]]
    assert store.index_keys(INDEX_CLUSTER, "ns/c2") == [keys[1]]
    assert [o["metadata"]["name"] for o in store.by_index(INDEX_CLUSTER, value)] == ["c"]
    store.upsert(_obj("c", "c1", rv="2"))  # same value again: still one key, not two
    assert store.index_keys(INDEX_CLUSTER, value) == [keys[2]]
    store.upsert(_obj("a", "c1"))  # one key becomes a set again
    assert sorted(store.index_keys(INDEX_CLUSTER, value)) == [keys[0], keys[2]]
    store.upsert(_obj("c", None))  # unlabelled: leaves the index
    store.delete(keys[0])
    assert store.index_keys(INDEX_CLUSTER, value) == []
    assert store.index_values(INDEX_CLUSTER) == {"ns/c2"}
    # an index added later is built from the stored objects
    store.add_indexer("name", lambda obj: [obj["metadata"]["name"]])
    assert store.index_keys("name", "b") == [keys[1]]


def test_an_index_view_is_live_and_read_only() -> None:
    store = Store()
    view = store.index_view(INDEX_CLUSTER)
    assert "ns/c1" not in view
    store.upsert(_obj("a", "c1"))
    assert "ns/c1" in view  # no copy: it follows the store
    store.upsert(_obj("a", "c2"))
    assert set(view) == {"ns/c2"}
    with pytest.raises(TypeError):
        view["ns/c3"] = ObjectKey("ns", "x")  # type: ignore[index]
    with pytest.raises(KeyError, match="no index 'nope'"):
        store.index_view("nope")


def test_a_stored_object_takes_about_its_encoded_size() -> None:
    # orjson.dumps hands back its (at least 4 KiB) write buffer: the store keeps an exact copy

    objects = [_obj(f"m{i:04}", "c1") for i in range(500)]
    store = Store()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for obj in objects:
            store.upsert(obj)
        per_object = (tracemalloc.get_traced_memory()[0] - before) / len(objects)
    finally:
        tracemalloc.stop()
    encoded = len(orjson.dumps(objects[0]))
    assert encoded < 200
    # the bytes (encoded + ~33 B header), its key and dict slot, index entries: well under
    # the 4 KiB a kept orjson buffer alone takes
    assert per_object < 1024, per_object
