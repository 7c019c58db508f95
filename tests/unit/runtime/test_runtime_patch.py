"""Merge patches, status patches, preconditions, conditions helpers."""

from __future__ import annotations

import pytest

from capl.runtime import conditions as c
from capl.runtime.errors import Conflict
from capl.runtime.objects import ObjectKey, copy_obj
from capl.runtime.patch import Patcher, apply_patch, diff, merge_patch
from capl.runtime.resources import LIBVIRT_MACHINE
from tests.fixtures.runtime import FakeApi, FakeClient, apply_merge_patch


@pytest.mark.parametrize(
    ("original", "desired", "patch"),
    [
        ({"a": 1}, {"a": 1}, {}),
        ({"a": 1}, {"a": 2}, {"a": 2}),
        ({"a": 1, "b": 2}, {"a": 1}, {"b": None}),
        ({"a": {"x": 1, "y": 2}}, {"a": {"x": 1, "y": 3}}, {"a": {"y": 3}}),
        ({"a": [1, 2]}, {"a": [1, 2, 3]}, {"a": [1, 2, 3]}),
        ({"a": 1}, {"a": {"x": None, "y": 1}}, {"a": {"y": 1}}),
        ({"a": True}, {"a": 1}, {"a": 1}),
        ({}, {"a": {"b": {"c": 1}}}, {"a": {"b": {"c": 1}}}),
        ({"a": {"b": 1}}, {"a": None}, {"a": None}),
    ],
)
def test_merge_patch(original: dict, desired: dict, patch: dict) -> None:  # type: ignore[type-arg]
    assert merge_patch(original, desired) == patch
    assert apply_merge_patch(original, patch) == strip_nulls(desired)


def strip_nulls(value: object) -> object:
    if isinstance(value, dict):
        return {k: strip_nulls(v) for k, v in value.items() if v is not None}
    return value


def test_diff_ignores_server_managed_metadata_and_splits_status() -> None:
    obj = {
        "apiVersion": "v1",
        "kind": "X",
        "metadata": {
            "name": "a",
            "namespace": "ns",
            "resourceVersion": "5",
            "uid": "u",
            "generation": 2,
            "managedFields": [{}],
            "labels": {"k": "v"},
        },
        "spec": {"s": 1},
        "status": {"ready": False},
    }
    desired = copy_obj(obj)
    desired["metadata"]["resourceVersion"] = "6"
    desired["metadata"]["managedFields"] = []
    assert diff(obj, desired) == ({}, {})
    desired["metadata"]["labels"]["k2"] = "v2"
    desired["status"]["ready"] = True
    assert diff(obj, desired) == (
        {"metadata": {"labels": {"k2": "v2"}}},
        {"ready": True},
    )


async def test_apply_patch_sends_nothing_without_a_diff_and_two_patches_with() -> None:
    api = FakeApi()
    rc = FakeClient(api).resource(LIBVIRT_MACHINE)
    obj = api.put(LIBVIRT_MACHINE, {"metadata": {"name": "m", "namespace": "ns"}, "spec": {}})
    assert await apply_patch(rc, obj, copy_obj(obj)) is obj
    assert api.stats.writes_total() == 0
    desired = copy_obj(obj)
    desired["metadata"]["annotations"] = {"a": "b"}
    desired["status"] = {"ready": True}
    result = await apply_patch(rc, obj, desired)
    assert result["status"] == {"ready": True}
    assert result["metadata"]["annotations"] == {"a": "b"}
    key = ObjectKey("ns", "m")
    counts = api.stats.object_counts(key=key, method="PATCH")
    assert sorted(r.subresource for r in counts) == ["", "status"]


async def test_finalizer_changes_carry_a_resource_version_precondition() -> None:
    api = FakeApi()
    rc = FakeClient(api).resource(LIBVIRT_MACHINE)
    stale = api.put(LIBVIRT_MACHINE, {"metadata": {"name": "m", "namespace": "ns"}, "spec": {}})
    # someone else adds their finalizer meanwhile
    await rc.patch(ObjectKey("ns", "m"), {"metadata": {"finalizers": ["theirs"]}})
    desired = copy_obj(stale)
    desired["metadata"]["finalizers"] = ["ours"]
    with pytest.raises(Conflict):
        await apply_patch(rc, stale, desired)
    assert api.objects[LIBVIRT_MACHINE][ObjectKey("ns", "m")]["metadata"]["finalizers"] == [
        "theirs"
    ]
    # a label change on the same stale object does not need one
    desired = copy_obj(stale)
    desired["metadata"]["labels"] = {"a": "b"}
    await apply_patch(rc, stale, desired)


async def test_patcher() -> None:
    api = FakeApi()
    rc = FakeClient(api).resource(LIBVIRT_MACHINE)
    obj = api.put(LIBVIRT_MACHINE, {"metadata": {"name": "m", "namespace": "ns"}, "spec": {}})
    p = Patcher(rc, obj)
    assert not p.changed()
    c.set_condition(p.obj, "Ready", False, reason="Waiting")
    assert p.changed()
    await p.apply()
    assert not p.changed()
    assert api.stats.writes_total() == 1
    c.set_condition(p.obj, "Ready", False, reason="Waiting")  # same again: no write
    await p.apply()
    assert api.stats.writes_total() == 1
    assert obj.get("status") is None  # the original was never touched


def test_conditions_transition_time_moves_only_with_status() -> None:
    times = iter(["t1", "t2", "t3"])
    now = lambda: next(times)  # noqa: E731
    obj: dict = {"metadata": {"generation": 3}}  # type: ignore[type-arg]
    assert c.set_condition(obj, "Ready", False, reason="Creating", message="m", now=now)
    cond = c.get_condition(obj, "Ready")
    assert cond == {
        "type": "Ready",
        "status": "False",
        "reason": "Creating",
        "message": "m",
        "observedGeneration": 3,
        "lastTransitionTime": "t1",
    }
    assert not c.set_condition(obj, "Ready", False, reason="Creating", message="m", now=now)
    assert c.set_condition(obj, "Ready", False, reason="Booting", message="m2", now=now)
    assert c.get_condition(obj, "Ready")["lastTransitionTime"] == "t1"  # type: ignore[index]
    assert c.set_condition(obj, "Ready", True, reason="Running", now=now)
    assert c.get_condition(obj, "Ready")["lastTransitionTime"] == "t2"  # type: ignore[index]
    assert c.is_true(obj, "Ready")
    assert not c.is_false(obj, "Ready")
    with pytest.raises(ValueError, match="CamelCase"):
        c.set_condition(obj, "Ready", True, reason="not camel")
    with pytest.raises(ValueError, match="True/False/Unknown"):
        c.set_condition(obj, "Ready", "yes", reason="X")  # type: ignore[arg-type]
    assert c.remove_condition(obj, "Ready")
    assert c.get_condition(obj, "Ready") is None


def test_rfc3339_has_seconds_and_utc() -> None:
    assert c.rfc3339(0) == "1970-01-01T00:00:00Z"


def test_summary() -> None:
    obj: dict = {"metadata": {"generation": 1}}  # type: ignore[type-arg]
    order = ["InfrastructureReady", "VMRunning"]
    c.summarize(obj, order, now=lambda: "t")
    ready = c.get_condition(obj, "Ready")
    assert ready is not None
    assert ready["status"] == "Unknown"
    c.set_condition(obj, "InfrastructureReady", True, reason="Ready", now=lambda: "t")
    c.set_condition(
        obj, "VMRunning", False, reason="DomainCreating", message="defining", now=lambda: "t"
    )
    c.summarize(obj, order, now=lambda: "t")
    ready = c.get_condition(obj, "Ready")
    assert ready is not None
    assert (ready["status"], ready["reason"], ready["message"]) == (
        "False",
        "DomainCreating",
        "defining",
    )
    c.set_condition(obj, "VMRunning", True, reason="Running", now=lambda: "t")
    c.summarize(obj, order, now=lambda: "t")
    assert c.is_true(obj, "Ready")
    # the status dict itself works too
    status = obj["status"]
    assert c.is_true(status, "VMRunning")
