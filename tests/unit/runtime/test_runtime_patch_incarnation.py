"""apply_patch ties its patches to the incarnation (metadata.uid) of the object they were
computed from, without extra requests; a stale incarnation reads as NotFound and Conflict.

FakeApi ignores metadata.uid in patches, so `UidCheckingClient` adds what kube-apiserver does
(tests/kube/test_runtime_patch_uid.py pins the real answers): a main patch whose metadata.uid
differs from the stored object's is rejected with 422 Invalid; the status subresource ignores
metadata.uid.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from capl.runtime.errors import Conflict, Invalid, NotFound, StaleIncarnation
from capl.runtime.objects import ObjectKey, copy_obj
from capl.runtime.patch import Patcher, apply_patch
from capl.runtime.resources import LIBVIRT_MACHINE
from tests.fixtures.runtime import FakeApi, FakeClient

KEY = ObjectKey("ns", "m")


class UidCheckingClient:
    """A FakeClient resource that records the patches and checks metadata.uid like the
    API server does on the main resource."""

    def __init__(self, api: FakeApi) -> None:
        self.api = api
        self.inner = FakeClient(api).resource(LIBVIRT_MACHINE)
        self.sent: list[tuple[str, dict[str, Any], str | None]] = []
        self.answers: list[dict[str, Any]] = []

    @property
    def resource(self) -> Any:
        return self.inner.resource

    async def patch(
        self, key: ObjectKey, patch: Mapping[str, Any], *, resource_version: str | None = None
    ) -> Any:
        self.sent.append(("", dict(patch), resource_version))
        uid = (patch.get("metadata") or {}).get("uid")
        current = self.api.objects[LIBVIRT_MACHINE].get(key)
        if uid and current is not None and current["metadata"]["uid"] != uid:
            if resource_version and current["metadata"]["resourceVersion"] != resource_version:
                raise Conflict(409, "Conflict", "the object has been modified")
            raise Invalid(
                422,
                "Invalid",
                f'LibvirtMachine "{key.name}" is invalid: metadata.uid: '
                f'Invalid value: "{uid}": field is immutable',
            )
        answer = await self.inner.patch(key, patch, resource_version=resource_version)
        self.answers.append(answer)
        return answer

    async def patch_status(
        self, key: ObjectKey, patch: Mapping[str, Any], *, resource_version: str | None = None
    ) -> Any:
        self.sent.append(("status", dict(patch), resource_version))
        answer = await self.inner.patch_status(key, patch, resource_version=resource_version)
        self.answers.append(answer)
        return answer


def put(api: FakeApi, **spec: Any) -> dict[str, Any]:
    return api.put(LIBVIRT_MACHINE, {"metadata": {"name": "m", "namespace": "ns"}, "spec": spec})


def recreate(api: FakeApi) -> dict[str, Any]:
    del api.objects[LIBVIRT_MACHINE][KEY]
    return put(api)


async def test_main_patch_carries_the_uid_and_status_the_answered_resource_version() -> None:
    api = FakeApi()
    rc = UidCheckingClient(api)
    obj = put(api)
    desired = copy_obj(obj)
    desired["metadata"]["labels"] = {"a": "b"}
    desired["status"] = {"ready": True}
    result = await apply_patch(rc, obj, desired)  # type: ignore[arg-type]
    (main, main_body, main_rv), (sub, status_body, status_rv) = rc.sent
    assert (main, sub) == ("", "status")
    assert main_body == {"metadata": {"labels": {"a": "b"}, "uid": obj["metadata"]["uid"]}}
    assert main_rv is None  # a label change needs no resourceVersion precondition
    assert status_body == {"status": {"ready": True}}
    assert status_rv == rc.answers[0]["metadata"]["resourceVersion"]
    assert status_rv != obj["metadata"]["resourceVersion"]
    assert result == rc.answers[1]
    assert api.stats.writes_total() == 2  # no extra request


async def test_status_only_patch_carries_the_resource_version_read() -> None:
    api = FakeApi()
    rc = UidCheckingClient(api)
    obj = put(api)
    desired = copy_obj(obj)
    desired["status"] = {"ready": True}
    await apply_patch(rc, obj, desired)  # type: ignore[arg-type]
    assert rc.sent == [("status", {"status": {"ready": True}}, obj["metadata"]["resourceVersion"])]
    # precondition=False opts out, and with it out of the incarnation check
    desired2 = copy_obj(desired)
    desired2["status"]["ready"] = False
    await apply_patch(rc, desired, desired2, precondition=False)  # type: ignore[arg-type]
    assert rc.sent[-1] == ("status", {"status": {"ready": False}}, None)


async def test_a_main_patch_to_a_recreated_object_is_a_stale_incarnation() -> None:
    api = FakeApi()
    rc = UidCheckingClient(api)
    old = put(api)
    new = recreate(api)
    desired = copy_obj(old)
    desired["spec"] = {"x": 1}
    desired["status"] = {"ready": True}
    with pytest.raises(StaleIncarnation) as raised:
        await apply_patch(rc, old, desired)  # type: ignore[arg-type]
    # callers that drop the work of a vanished object, and the runtime's quiet requeue
    assert isinstance(raised.value, NotFound)
    assert isinstance(raised.value, Conflict)
    assert raised.value.code == 409
    assert "re-created" in str(raised.value)
    assert len(rc.sent) == 1  # the status patch was not attempted
    assert api.objects[LIBVIRT_MACHINE][KEY] == new


async def test_a_precondition_failure_on_a_recreated_object_stays_a_conflict() -> None:
    api = FakeApi()
    rc = UidCheckingClient(api)
    old = put(api)
    recreate(api)
    desired = copy_obj(old)
    desired["metadata"]["finalizers"] = ["ours"]
    with pytest.raises(Conflict) as raised:
        await apply_patch(rc, old, desired)  # type: ignore[arg-type]
    assert not isinstance(raised.value, StaleIncarnation)


async def test_a_status_patch_to_a_recreated_object_conflicts() -> None:
    api = FakeApi()
    rc = UidCheckingClient(api)
    old = put(api)
    new = recreate(api)
    desired = copy_obj(old)
    desired["status"] = {"ready": True}
    with pytest.raises(Conflict):
        await apply_patch(rc, old, desired)  # type: ignore[arg-type]
    assert api.objects[LIBVIRT_MACHINE][KEY] == new


async def test_other_invalid_answers_are_not_mapped() -> None:
    api = FakeApi()
    obj = put(api)

    class Rejecting(UidCheckingClient):
        async def patch(
            self, key: ObjectKey, patch: Mapping[str, Any], *, resource_version: str | None = None
        ) -> Any:
            raise Invalid(422, "Invalid", 'LibvirtMachine "m" is invalid: spec.x: Invalid value')

    desired = copy_obj(obj)
    desired["spec"] = {"x": -1}
    with pytest.raises(Invalid) as raised:
        await apply_patch(Rejecting(api), obj, desired)  # type: ignore[arg-type]
    assert not isinstance(raised.value, StaleIncarnation)


async def test_objects_without_uid_get_no_uid() -> None:
    api = FakeApi()
    rc = UidCheckingClient(api)
    obj = put(api)
    bare = copy_obj(obj)
    del bare["metadata"]["uid"]
    desired = copy_obj(bare)
    desired["metadata"]["labels"] = {"a": "b"}
    await apply_patch(rc, bare, desired)  # type: ignore[arg-type]
    assert rc.sent[0][1] == {"metadata": {"labels": {"a": "b"}}}


async def test_patcher_follows_the_answer() -> None:
    api = FakeApi()
    rc = UidCheckingClient(api)
    obj = put(api)
    p = Patcher(rc, obj)  # type: ignore[arg-type]
    p.obj["status"] = {"phase": "a"}
    await p.apply()
    p.obj["status"]["phase"] = "b"
    await p.apply()  # the second status patch is conditioned on the first one's answer
    assert [rv for _, _, rv in rc.sent] == [
        obj["metadata"]["resourceVersion"],
        rc.answers[0]["metadata"]["resourceVersion"],
    ]
    assert api.objects[LIBVIRT_MACHINE][KEY]["status"] == {"phase": "b"}
