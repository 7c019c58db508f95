"""Read-your-writes (capl.runtime.patch.ReadYourWrites): which object a reconcile works from
while the informer has not delivered its own last write. resourceVersions are opaque strings,
compared for equality only: these use versions that do not order as numbers."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from capl.runtime.objects import Obj, ObjectKey, copy_obj
from capl.runtime.patch import Patcher, ReadYourWrites
from capl.runtime.resources import LIBVIRT_MACHINE

KEY = ObjectKey("ns", "m")


def obj(rv: str, **status: Any) -> Obj:
    return {
        "metadata": {"name": "m", "namespace": "ns", "uid": "u1", "resourceVersion": rv},
        "spec": {"a": 1},
        "status": dict(status),
    }


class OpaqueServer:
    """A ResourceClient double whose answers carry the resourceVersions it is given, in order
    (the patches are applied to spec/metadata/status like a merge patch, one level deep)."""

    def __init__(self, stored: Obj, versions: list[str]) -> None:
        self.stored = copy_obj(stored)
        self.versions = versions
        self.sent: list[tuple[str, dict[str, Any], str | None]] = []

    @property
    def resource(self) -> Any:
        return LIBVIRT_MACHINE

    def _answer(self, body: Mapping[str, Any]) -> Obj:
        for part, value in body.items():
            if isinstance(value, Mapping):
                self.stored.setdefault(part, {}).update(value)
        self.stored["metadata"]["resourceVersion"] = self.versions.pop(0)
        self.stored["metadata"]["managedFields"] = [{"manager": "capl"}]
        return copy_obj(self.stored)

    async def patch(
        self, key: ObjectKey, body: Mapping[str, Any], *, resource_version: str | None = None
    ) -> Obj:
        self.sent.append(("main", dict(body), resource_version))
        return self._answer(body)

    async def patch_status(
        self, key: ObjectKey, body: Mapping[str, Any], *, resource_version: str | None = None
    ) -> Obj:
        self.sent.append(("status", dict(body), resource_version))
        return self._answer(body)


def test_without_a_write_the_cache_is_read() -> None:
    writes = ReadYourWrites()
    cached = obj("7")
    assert writes.read(KEY, cached) is cached
    assert writes.read(KEY, None) is None


async def test_a_lagging_cache_yields_our_write_until_it_shows_something_else() -> None:
    writes = ReadYourWrites()
    read = obj("zz9")
    server = OpaqueServer(read, ["aa1"])  # "aa1" sorts before "zz9" and is no number
    patcher = Patcher(server, read, writes=writes)  # type: ignore[arg-type]
    patcher.obj["status"]["ready"] = True
    await patcher.apply()
    assert patcher.wrote
    # the informer still has the object as read: the reconcile works from our answer
    mine = writes.read(KEY, obj("zz9"))
    assert mine is not None
    assert mine["metadata"]["resourceVersion"] == "aa1"
    assert mine["status"] == {"ready": True}
    assert "managedFields" not in mine["metadata"]  # like the cache's objects
    # the informer delivered our write: the cache again, and the memory is gone
    caught_up = obj("aa1", ready=True)
    assert writes.read(KEY, caught_up) is caught_up
    assert KEY not in writes
    assert writes.read(KEY, obj("zz9")) is not mine


async def test_the_answer_of_a_main_patch_a_status_patch_superseded_counts_as_ours() -> None:
    writes = ReadYourWrites()
    read = obj("10")
    server = OpaqueServer(read, ["9", "8"])  # going "down" as numbers: opaque all the same
    patcher = Patcher(server, read, writes=writes)  # type: ignore[arg-type]
    patcher.obj["spec"]["a"] = 2
    patcher.obj["status"]["ready"] = True
    await patcher.apply()
    assert [kind for kind, _, _ in server.sent] == ["main", "status"]
    assert server.sent[1][2] == "9"  # the status patch is tied to the main patch's answer
    for lagging in ("10", "9"):  # the cache may show the intermediate version
        mine = writes.read(KEY, obj(lagging))
        assert mine is not None
        assert mine["metadata"]["resourceVersion"] == "8"


async def test_someone_elses_write_wins_over_our_memory() -> None:
    writes = ReadYourWrites()
    read = obj("10")
    server = OpaqueServer(read, ["11"])
    patcher = Patcher(server, read, writes=writes)  # type: ignore[arg-type]
    patcher.obj["status"]["ready"] = True
    await patcher.apply()
    # a version we never superseded: someone else wrote after us ("2" is no older for that)
    theirs = obj("2", ready=False)
    assert writes.read(KEY, theirs) is theirs
    assert KEY not in writes


async def test_memory_accumulates_across_reconciles_while_the_cache_lags() -> None:
    writes = ReadYourWrites()
    first = obj("r-a")
    server = OpaqueServer(first, ["r-b", "r-c"])
    p1 = Patcher(server, first, writes=writes)  # type: ignore[arg-type]
    p1.obj["status"]["step"] = 1
    await p1.apply()
    second = writes.read(KEY, obj("r-a"))
    assert second is not None
    p2 = Patcher(server, second, writes=writes)  # type: ignore[arg-type]
    p2.obj["status"]["step"] = 2
    await p2.apply()
    for lagging in ("r-a", "r-b"):
        mine = writes.read(KEY, obj(lagging))
        assert mine is not None
        assert mine["metadata"]["resourceVersion"] == "r-c"


async def test_nothing_sent_remembers_nothing_and_forget_and_vanish_drop_it() -> None:
    writes = ReadYourWrites()
    read = obj("5")
    server = OpaqueServer(read, ["6"])
    patcher = Patcher(server, read, writes=writes)  # type: ignore[arg-type]
    await patcher.apply()
    assert not patcher.wrote
    assert len(writes) == 0
    patcher.obj["status"]["ready"] = True
    await patcher.apply()
    assert len(writes) == 1
    writes.forget(KEY)
    assert len(writes) == 0
    await Patcher(server, obj("6"), writes=writes).apply()  # type: ignore[arg-type]
    p = Patcher(server, obj("6"), writes=writes)  # type: ignore[arg-type]
    p.obj["status"]["x"] = 1
    server.versions.append("7")
    await p.apply()
    assert writes.read(KEY, None) is None  # gone from the cache: forgotten
    assert len(writes) == 0
