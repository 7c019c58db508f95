"""Informer against the in-memory API: sync, resume, 410 re-list with synthetic deltas, stalls."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from capl.runtime.clock import FakeClock
from capl.runtime.errors import TransportError
from capl.runtime.informer import Cache, FuncHandler, Informer, InformerOptions
from capl.runtime.objects import CLUSTER_NAME_LABEL, Obj, ObjectKey
from capl.runtime.resources import CONFIG_MAP, NODE
from capl.runtime.store import INDEX_CLUSTER, INDEX_OWNER_UID, cluster_index_value
from tests.fixtures.runtime import FakeApi, FakeClient, eventually


def cm(name: str, ns: str = "ns", **labels: str) -> Obj:
    return {"metadata": {"name": name, "namespace": ns, "labels": labels}, "data": {"v": "0"}}


class Recorder:
    def __init__(self) -> None:
        self.log: list[tuple[str, str]] = []

    def handler(self) -> FuncHandler:
        return FuncHandler(
            add=lambda o: self.log.append(("add", o["metadata"]["name"])),
            update=lambda a, b: self.log.append(
                ("resync" if a is b else "update", b["metadata"]["name"])
            ),
            delete=lambda o: self.log.append(("delete", o["metadata"]["name"])),
        )


@pytest.fixture
def api() -> FakeApi:
    return FakeApi()


@pytest.fixture
async def informer(api: FakeApi) -> AsyncIterator[tuple[Informer, Recorder, FakeClock]]:
    clock = FakeClock()
    inf = Informer(
        FakeClient(api).resource(CONFIG_MAP),
        options=InformerOptions(watch_timeout=60, inactivity_timeout=30, backoff_initial=0.01),
        clock=clock,
    )
    rec = Recorder()
    inf.add_handler(rec.handler())
    yield inf, rec, clock
    await inf.stop()


def same_as_server(inf: Informer, api: FakeApi) -> bool:
    server = {k: o["metadata"]["resourceVersion"] for k, o in api.objects[CONFIG_MAP].items()}
    cached = {
        k: o["metadata"]["resourceVersion"]
        for k, o in ((k, inf.store.get(k)) for k in inf.store.list_keys())
        if o is not None
    }
    return server == cached


async def test_list_then_watch(api: FakeApi, informer: Any) -> None:
    inf, rec, _ = informer
    api.put(CONFIG_MAP, cm("a"))
    inf.start()
    await inf.wait_synced()
    assert rec.log == [("add", "a")]
    client = FakeClient(api).resource(CONFIG_MAP)
    await client.patch(ObjectKey("ns", "a"), {"data": {"v": "1"}})
    await client.create(cm("b"))
    await client.delete(ObjectKey("ns", "a"))
    await eventually(lambda: len(rec.log) == 4)
    assert rec.log == [("add", "a"), ("update", "a"), ("add", "b"), ("delete", "a")]
    assert same_as_server(inf, api)
    assert inf.lists == 1


async def test_resume_from_last_rv_after_a_dropped_connection(api: FakeApi, informer: Any) -> None:
    inf, rec, clock = informer
    inf.start()
    await inf.wait_synced()
    client = FakeClient(api).resource(CONFIG_MAP)
    await client.create(cm("a"))
    await eventually(lambda: rec.log == [("add", "a")])
    api.drop_watches()
    await client.create(cm("b"))  # happens while the informer is reconnecting
    await eventually(lambda: inf.errors == 1)
    clock.advance(1.0)  # the retry backoff
    await eventually(lambda: rec.log == [("add", "a"), ("add", "b")])
    assert inf.lists == 1  # resumed, no re-list
    assert api.watch_calls[-1]["rv"] == api.watch_calls[-1]["rv"]
    assert int(api.watch_calls[-1]["rv"]) > int(api.watch_calls[0]["rv"])


async def test_gone_relists_with_synthetic_deltas(api: FakeApi, informer: Any) -> None:
    inf, rec, clock = informer
    for name in ("keep", "change", "remove"):
        api.put(CONFIG_MAP, cm(name))
    inf.start()
    await inf.wait_synced()
    api.pause_watches()  # the informer misses everything below
    client = FakeClient(api).resource(CONFIG_MAP)
    await client.patch(ObjectKey("ns", "change"), {"data": {"v": "1"}})
    await client.delete(ObjectKey("ns", "remove"))
    await client.create(cm("new"))
    api.compact()
    api.drop_watches()  # connection breaks; resuming from the old RV now gets 410
    api.resume_watches()
    await eventually(lambda: inf.errors == 1)
    clock.advance(1.0)
    await eventually(lambda: inf.relists_after_gone == 1 and inf.lists == 2)
    assert sorted(rec.log[3:]) == [("add", "new"), ("delete", "remove"), ("update", "change")]
    assert same_as_server(inf, api)
    # and the watch continues from the new list
    await client.create(cm("later"))
    await eventually(lambda: ("add", "later") in rec.log)


async def test_silent_watch_is_restarted(api: FakeApi, informer: Any) -> None:
    inf, rec, clock = informer
    inf.start()
    await inf.wait_synced()
    await eventually(lambda: len(api.watch_calls) == 1)
    api.pause_watches()
    client = FakeClient(api).resource(CONFIG_MAP)
    await client.create(cm("a"))  # never delivered on the stalled watch
    clock.advance(29.0)
    assert inf.stalls == 0
    clock.advance(1.5)  # past the 30 s inactivity timeout
    await eventually(lambda: inf.stalls == 1)
    api.resume_watches()
    clock.advance(1.0)  # retry delay
    await eventually(lambda: rec.log == [("add", "a")])
    assert len(api.watch_calls) == 2
    assert inf.lists == 1


async def test_watch_errors_retry_with_backoff(api: FakeApi, informer: Any) -> None:
    inf, _rec, clock = informer
    api.fail("list", TransportError("refused"), times=2)
    inf.start()
    await eventually(lambda: inf.errors == 1)
    assert not inf.has_synced
    clock.advance(1.0)
    await eventually(lambda: inf.errors == 2)
    clock.advance(1.0)
    await inf.wait_synced()


async def test_resync_redelivers_cached_objects_without_api_calls(
    api: FakeApi, informer: Any
) -> None:
    inf, rec, _ = informer
    api.put(CONFIG_MAP, cm("a"))
    api.put(CONFIG_MAP, cm("b"))
    inf.start()
    await inf.wait_synced()
    before = api.stats.total()
    inf.resync()
    assert sorted(rec.log[2:]) == [("resync", "a"), ("resync", "b")]
    assert api.stats.total() == before


async def test_periodic_resync_on_the_clock(api: FakeApi) -> None:
    clock = FakeClock()
    inf = Informer(
        FakeClient(api).resource(CONFIG_MAP),
        options=InformerOptions(resync_period=600),
        clock=clock,
    )
    rec = Recorder()
    inf.add_handler(rec.handler())
    api.put(CONFIG_MAP, cm("a"))
    inf.start()
    try:
        await inf.wait_synced()
        await eventually(lambda: clock.pending >= 2)  # resync sleeper + watchdog
        clock.advance(600)
        await eventually(lambda: ("resync", "a") in rec.log)
    finally:
        await inf.stop()


async def test_late_handler_gets_cached_objects_as_adds(api: FakeApi, informer: Any) -> None:
    inf, _, _ = informer
    api.put(CONFIG_MAP, cm("a"))
    inf.start()
    await inf.wait_synced()
    late = Recorder()
    inf.add_handler(late.handler())
    assert late.log == [("add", "a")]


async def test_indexes(api: FakeApi, informer: Any) -> None:
    inf, _, _ = informer
    owned = cm("m1", **{CLUSTER_NAME_LABEL: "c1"})
    owned["metadata"]["ownerReferences"] = [{"kind": "Machine", "name": "x", "uid": "u-1"}]
    api.put(CONFIG_MAP, owned)
    api.put(CONFIG_MAP, cm("m2", **{CLUSTER_NAME_LABEL: "c1"}))
    api.put(CONFIG_MAP, cm("m3", ns="other", **{CLUSTER_NAME_LABEL: "c1"}))
    inf.add_indexer("data-v", lambda o: [o["data"]["v"]])
    inf.start()
    await inf.wait_synced()
    names = sorted(
        o["metadata"]["name"]
        for o in inf.store.by_index(INDEX_CLUSTER, cluster_index_value("ns", "c1"))
    )
    assert names == ["m1", "m2"]
    assert [o["metadata"]["name"] for o in inf.store.by_index(INDEX_OWNER_UID, "u-1")] == ["m1"]
    assert len(inf.store.by_index("data-v", "0")) == 3
    client = FakeClient(api).resource(CONFIG_MAP)
    await client.patch(ObjectKey("ns", "m2"), {"metadata": {"labels": {CLUSTER_NAME_LABEL: None}}})
    await eventually(
        lambda: len(inf.store.by_index(INDEX_CLUSTER, cluster_index_value("ns", "c1"))) == 1
    )


async def test_index_values_follow_the_objects(api: FakeApi, informer: Any) -> None:
    inf, _, _ = informer
    api.put(CONFIG_MAP, cm("a"))
    api.put(CONFIG_MAP, cm("b"))
    inf.add_indexer("data-v", lambda o: [o["data"]["v"]])
    inf.start()
    await inf.wait_synced()
    assert inf.store.index_values("data-v") == {"0"}
    client = FakeClient(api).resource(CONFIG_MAP)
    await client.patch(ObjectKey("ns", "a"), {"data": {"v": "1"}})
    await eventually(lambda: inf.store.index_values("data-v") == {"0", "1"})
    await client.delete(ObjectKey("ns", "b"))
    await eventually(lambda: inf.store.index_values("data-v") == {"1"})
    values = inf.store.index_values("data-v")
    values.add("mine")  # a copy: the index is not changed through it
    assert inf.store.index_values("data-v") == {"1"}
    with pytest.raises(KeyError):
        inf.store.index_values("no-such-index")


async def test_managed_fields_are_not_cached(api: FakeApi) -> None:
    fields = [{"manager": "kubectl", "operation": "Update", "fieldsV1": {"f:data": {}}}]
    listed = cm("listed")
    listed["metadata"]["managedFields"] = fields
    api.put(CONFIG_MAP, listed)
    informers = [
        Informer(FakeClient(api).resource(CONFIG_MAP), options=options)
        for options in (InformerOptions(), InformerOptions(keep_managed_fields=True))
    ]
    try:
        for inf in informers:
            inf.start()
            await inf.wait_synced()
        watched = cm("watched")
        watched["metadata"]["managedFields"] = fields
        await FakeClient(api).resource(CONFIG_MAP).create(watched)
        for inf in informers:
            await eventually(lambda inf=inf: inf.store.get(ObjectKey("ns", "watched")) is not None)
        stripped, kept = informers
        for name in ("listed", "watched"):
            assert "managedFields" not in stripped.store.get(ObjectKey("ns", name))["metadata"]
            assert kept.store.get(ObjectKey("ns", name))["metadata"]["managedFields"] == fields
    finally:
        for inf in informers:
            await inf.stop()


async def test_namespace_and_selector_scoping(api: FakeApi) -> None:
    clock = FakeClock()
    cache = Cache(
        FakeClient(api), namespace="ns", clock=clock, label_selectors={CONFIG_MAP: "team=a"}
    )
    api.put(CONFIG_MAP, cm("in", team="a"))
    api.put(CONFIG_MAP, cm("wrong-team", team="b"))
    api.put(CONFIG_MAP, cm("wrong-ns", ns="other", team="a"))
    api.put(NODE, {"metadata": {"name": "n1"}})
    cache.start([CONFIG_MAP, NODE])
    try:
        await cache.wait_synced()
        assert [o["metadata"]["name"] for o in cache.list(CONFIG_MAP)] == ["in"]
        assert cache.get(NODE, ObjectKey("", "n1")) is not None  # cluster-scoped: no namespace
        assert cache.has_synced()
    finally:
        await cache.stop()
