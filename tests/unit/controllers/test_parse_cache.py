"""`capl.controllers.common.parse_cached`: the models of objects as the informer cache holds
them, kept by (model, uid, resourceVersion) — a new resourceVersion is parsed afresh, an
object without uid or resourceVersion is never kept, the cache is bounded; and
`libvirt_cluster_of`, which keeps the LibvirtCluster with its derived defaults the same way."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from capl.api.base import K8sModel
from capl.api.capi import Cluster
from capl.api.meta import ObjectMeta
from capl.controllers import common
from capl.controllers.common import InvalidObject, libvirt_cluster_of, parse_cached
from capl.runtime.objects import Obj, ObjectKey
from capl.runtime.resources import LIBVIRT_CLUSTER
from capl.testing.objects import cluster_obj, libvirt_cluster_obj


@pytest.fixture(autouse=True)
def _empty() -> None:
    common._parsed.clear()


def _stored(obj: Obj, *, uid: str = "uid-1", rv: str = "1") -> Obj:
    stored = copy.deepcopy(obj)
    stored["metadata"] |= {"uid": uid, "resourceVersion": rv}
    return stored


def test_same_resource_version_is_parsed_once() -> None:
    raw = _stored(cluster_obj("c", "ns", libvirt_cluster="lc"))
    first = parse_cached(Cluster, raw)
    assert parse_cached(Cluster, copy.deepcopy(raw)) is first
    assert first.spec.infrastructure_ref is not None
    assert first.spec.infrastructure_ref.name == "lc"


def test_a_new_resource_version_is_parsed_afresh() -> None:
    raw = _stored(cluster_obj("c", "ns", libvirt_cluster="lc"))
    old = parse_cached(Cluster, raw)
    changed = _stored(cluster_obj("c", "ns", libvirt_cluster="lc", paused=True), rv="2")
    new = parse_cached(Cluster, changed)
    assert new is not old
    assert new.spec.paused
    assert not old.spec.paused
    # a re-created object (new uid) with a resourceVersion seen before is its own entry too
    other = parse_cached(Cluster, _stored(changed, uid="uid-2", rv="1"))
    assert other is not old
    assert other.spec.paused


def test_without_uid_or_resource_version_nothing_is_kept() -> None:
    raw = cluster_obj("c", "ns", libvirt_cluster="lc")
    assert parse_cached(Cluster, raw) is not parse_cached(Cluster, raw)
    assert not common._parsed


def test_models_are_kept_apart_and_invalid_objects_raise_each_time() -> None:
    raw = _stored(cluster_obj("c", "ns", libvirt_cluster="lc"))
    cluster, named = parse_cached(Cluster, raw), parse_cached(_Named, raw)
    assert isinstance(cluster, Cluster)
    assert isinstance(named, _Named)
    assert named.metadata.name == "c"
    bad = _stored({"metadata": {"name": "x"}, "spec": {"paused": {"no": "bool"}}}, rv="9")
    for _ in range(2):
        with pytest.raises(InvalidObject, match="paused"):
            parse_cached(Cluster, bad)


def test_least_recently_used_go_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(common, "PARSED_CACHE_SIZE", 3)
    raws = [_stored(cluster_obj("c", "ns", libvirt_cluster="lc"), rv=str(i)) for i in range(4)]
    kept = [parse_cached(Cluster, raw) for raw in raws[:3]]
    assert parse_cached(Cluster, raws[0]) is kept[0]  # used: now the newest
    parse_cached(Cluster, raws[3])  # evicts raws[1], the least recently used
    assert len(common._parsed) == 3
    assert parse_cached(Cluster, raws[0]) is kept[0]
    assert parse_cached(Cluster, raws[1]) is not kept[1]


class _Named(K8sModel):
    metadata: ObjectMeta


class _Cache:
    def __init__(self, objs: dict[ObjectKey, Obj]) -> None:
        self.objs = objs

    def get(self, resource: Any, key: ObjectKey) -> Obj | None:
        assert resource is LIBVIRT_CLUSTER
        return self.objs.get(key)


def test_libvirt_cluster_of_keeps_the_defaulted_model_per_resource_version() -> None:
    cluster_raw = _stored(cluster_obj("c", "ns", libvirt_cluster="lc"), uid="uid-c")
    lc = _stored(
        libvirt_cluster_obj(
            "lc", "ns", cluster=cluster_raw, hosts=[{"name": "h", "uri": "test:///default"}]
        )
    )
    cache = _Cache({ObjectKey("ns", "lc"): lc})
    cluster = parse_cached(Cluster, cluster_raw)
    first = libvirt_cluster_of(cache, cluster)  # type: ignore[arg-type]
    assert first is not None
    assert first.spec.storage_pool is not None  # the derived default is filled in
    assert first.spec.storage_pool.name == "capl-ns.lc"
    assert libvirt_cluster_of(cache, cluster) is first  # type: ignore[arg-type]
    changed = copy.deepcopy(lc)
    changed["metadata"]["resourceVersion"] = "2"
    changed["spec"]["hosts"].append({"name": "h2", "uri": "test:///default"})
    cache.objs[ObjectKey("ns", "lc")] = changed
    again = libvirt_cluster_of(cache, cluster)  # type: ignore[arg-type]
    assert again is not None
    assert [h.name for h in again.spec.hosts] == ["h", "h2"]
