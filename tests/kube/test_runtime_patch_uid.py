"""apply_patch against the real kube-apiserver when an object was deleted and re-created under
the same name: what the server answers to a patch computed from the old incarnation.

Pinned facts (capl.runtime.patch relies on them):
- PATCH of the resource with another metadata.uid: 422 Invalid, message naming metadata.uid
  ("field is immutable"); with a failing resourceVersion precondition as well: 409 Conflict.
- PATCH of the status subresource with another metadata.uid: accepted (the uid is ignored and
  the status lands on the new incarnation), so the status patch is guarded by a
  resourceVersion instead: 409 Conflict.
"""

from __future__ import annotations

import pytest

from capl.kube import KubeClient
from capl.runtime.errors import Conflict, Invalid, NotFound, StaleIncarnation
from capl.runtime.objects import ObjectKey, copy_obj
from capl.runtime.patch import apply_patch
from capl.testing.toy import TOY, toy

pytestmark = pytest.mark.apiserver


async def _recreated(kube: KubeClient, namespace: str, name: str) -> tuple[dict, dict]:  # type: ignore[type-arg]
    toys = kube.resource(TOY)
    key = ObjectKey(namespace, name)
    old = await toys.create(toy(name, namespace, 1))
    await toys.patch_status(key, {"status": {"observed": 1}})
    old = await toys.get(key)
    assert await toys.delete(key) is None  # no finalizers: gone at once
    new = await toys.create(toy(name, namespace, 2))
    assert new["metadata"]["uid"] != old["metadata"]["uid"]
    return old, new


async def test_what_the_apiserver_answers_to_a_wrong_uid(kube: KubeClient, namespace: str) -> None:
    toys = kube.resource(TOY)
    key = ObjectKey(namespace, "raw")
    old, new = await _recreated(kube, namespace, "raw")
    stale_uid = old["metadata"]["uid"]
    with pytest.raises(Invalid) as raised:
        await toys.patch(key, {"metadata": {"uid": stale_uid, "labels": {"a": "b"}}})
    assert raised.value.code == 422
    assert "metadata.uid" in raised.value.message
    with pytest.raises(Conflict):
        await toys.patch(
            key,
            {"metadata": {"uid": stale_uid, "labels": {"a": "b"}}},
            resource_version=old["metadata"]["resourceVersion"],
        )
    # the status subresource ignores metadata.uid: this lands on the new incarnation
    landed = await toys.patch_status(
        key, {"metadata": {"uid": stale_uid}, "status": {"observed": 7}}
    )
    assert landed["metadata"]["uid"] == new["metadata"]["uid"]
    assert landed["status"] == {"observed": 7}
    # ... but honours a resourceVersion precondition
    with pytest.raises(Conflict):
        await toys.patch_status(
            key, {"status": {"observed": 8}}, resource_version=old["metadata"]["resourceVersion"]
        )
    # the current uid is a no-op
    same = await toys.patch(key, {"metadata": {"uid": new["metadata"]["uid"], "labels": {}}})
    assert same["metadata"]["resourceVersion"] == landed["metadata"]["resourceVersion"]


async def test_apply_patch_from_an_old_incarnation_changes_nothing(
    kube: KubeClient, namespace: str
) -> None:
    toys = kube.resource(TOY)
    key = ObjectKey(namespace, "m")
    old, new = await _recreated(kube, namespace, "m")
    # spec (and status): StaleIncarnation, a NotFound and a Conflict
    desired = copy_obj(old)
    desired["spec"] = {"value": 9}
    desired["status"] = {"observed": 9}
    with pytest.raises(StaleIncarnation) as raised:
        await apply_patch(toys, old, desired)
    assert isinstance(raised.value, NotFound)
    assert isinstance(raised.value, Conflict)
    # finalizers (resourceVersion precondition): Conflict
    desired = copy_obj(old)
    desired["metadata"]["finalizers"] = ["capl.dev/test"]
    with pytest.raises(Conflict):
        await apply_patch(toys, old, desired)
    # status only: Conflict
    desired = copy_obj(old)
    desired["status"] = {"observed": 9}
    with pytest.raises(Conflict):
        await apply_patch(toys, old, desired)
    assert await toys.get(key) == new  # untouched: same resourceVersion, spec, no status
    # deleted and not re-created: NotFound as before
    await toys.delete(key)
    desired = copy_obj(new)
    desired["metadata"]["labels"] = {"a": "b"}
    with pytest.raises(NotFound):
        await apply_patch(toys, new, desired)


async def test_apply_patch_to_the_same_incarnation_sends_two_requests(
    kube: KubeClient, namespace: str
) -> None:
    toys = kube.resource(TOY)
    key = ObjectKey(namespace, "ok")
    obj = await toys.create(toy("ok", namespace, 1))
    desired = copy_obj(obj)
    desired["metadata"]["finalizers"] = ["capl.dev/test"]
    desired["spec"] = {"value": 2}
    desired["status"] = {"observed": 2}
    result = await apply_patch(toys, obj, desired)
    assert result["metadata"]["finalizers"] == ["capl.dev/test"]
    assert result["spec"] == {"value": 2}
    assert result["status"] == {"observed": 2}
    desired = copy_obj(result)
    desired["status"] = {"observed": 3}
    result = await apply_patch(toys, result, desired)
    assert result["status"] == {"observed": 3}
    counts = {(r.method, r.subresource): n for r, n in kube.stats.object_counts(key=key).items()}
    assert counts == {("POST", ""): 1, ("PATCH", ""): 1, ("PATCH", "status"): 2}
    assert kube.stats.total(method="PATCH", code=409) == 0
    await toys.patch(key, {"metadata": {"finalizers": None}})
