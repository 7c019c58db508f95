"""Minimal JSON merge patches (RFC 7386) between the object as read and the desired object.

A reconcile reads an object, copies it (`copy_obj`), changes the copy, and calls
`apply_patch(client, original, desired)`. Two patches at most are sent: one for everything but
status (metadata labels/annotations/finalizers/ownerReferences, spec, data...) and one for the
status subresource. Nothing is sent when nothing changed. Lists are replaced whole (merge-patch
semantics), so a change to metadata.finalizers or metadata.ownerReferences carries a
metadata.resourceVersion precondition: if someone else changed the object meanwhile, the API
server answers 409 and the controller requeues quietly instead of overwriting their list.
Server-managed metadata (resourceVersion, uid, generation, managedFields, ...) is never diffed.

Incarnations. An object deleted and re-created under the same name within milliseconds must not
receive a patch computed from its predecessor. Neither patch costs an extra request for that:

- The main patch always carries metadata.uid of `original`. Setting uid to its current value is
  a no-op; kube-apiserver rejects a different one with 422 Invalid ("metadata.uid: ... field is
  immutable"; measured on v1.35, tests/kube/test_runtime_patch_uid.py). When the patch also
  carries a resourceVersion precondition, that check runs first and the answer is 409.
- The status subresource ignores metadata.uid altogether (its update strategy copies all
  metadata from the stored object before validation: a wrong uid is accepted and the status
  lands on the new incarnation). The only check it honours is metadata.resourceVersion, and
  resourceVersions are never reused across incarnations. So a status patch always carries one:
  the resourceVersion the main patch of the same call returned, or that of `original`. A
  status patch from a stale read therefore answers 409 too (the controller requeues quietly and
  recomputes from a fresher read, instead of sending a diff against data that is not the
  server's).

A 422 naming metadata.uid is raised as `StaleIncarnation`, both a NotFound (the object the
patch was computed from is gone) and a Conflict (the runtime's controller requeues quietly; the
next reconcile reads the new incarnation, or nothing).

Read-your-writes (`ReadYourWrites`). The informer may not have delivered a reconciler's last
patch when its next reconcile starts (often the very reconcile that patch triggered). Working
from the cache then recomputes the same change and sends it again, or fails a precondition.
So a reconciler remembers, per key, the newest object its writes returned and every
resourceVersion those writes superseded (the object's before each patch, including the
answer of a main patch that a status patch then superseded). While the cache still shows
one of those, the reconcile works from the remembered object; any other resourceVersion (our
own write delivered, or someone else's) means the cache caught up, and the memory goes.
resourceVersions are opaque strings in Kubernetes: they are compared for equality only,
never ordered. A write by someone else between our read and our write is not recognised as
older than ours; the reconcile then works from the cache, and a precondition answers 409 if it
was stale (requeued quietly).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from capl.runtime.client import ResourceClient
from capl.runtime.errors import Invalid, StaleIncarnation
from capl.runtime.objects import Obj, ObjectKey, copy_obj, key_of, meta, resource_version
from capl.runtime.objects import uid as uid_of

SERVER_MANAGED_METADATA = frozenset(
    {
        "resourceVersion",
        "managedFields",
        "generation",
        "creationTimestamp",
        "uid",
        "selfLink",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "name",
        "namespace",
        "generateName",
    }
)
CONFLICT_SENSITIVE_METADATA = frozenset({"finalizers", "ownerReferences"})


def merge_patch(original: Mapping[str, Any], desired: Mapping[str, Any]) -> dict[str, Any]:
    """The RFC 7386 patch turning `original` into `desired` ({} when equal).

    Keys missing from `desired` become null; nested dicts are diffed; anything else (lists,
    scalars) is replaced whole when different. A desired value of None also deletes the key.
    """
    patch: dict[str, Any] = {}
    for key, old in original.items():
        if key not in desired and old is not None:
            patch[key] = None
    for key, new in desired.items():
        old = original.get(key)
        if new is None:
            if old is not None:
                patch[key] = None
            continue
        if isinstance(new, Mapping) and isinstance(old, Mapping):
            sub = merge_patch(old, new)
            if sub:
                patch[key] = sub
        elif key not in original or old != new or type(old) is not type(new):
            patch[key] = _strip_nulls(new)
    return patch


def _strip_nulls(value: Any) -> Any:
    # a null inside a new sub-object would mean "delete"; drop it so the value arrives as meant
    if isinstance(value, Mapping):
        return {k: _strip_nulls(v) for k, v in value.items() if v is not None}
    return value


def _body(obj: Mapping[str, Any]) -> dict[str, Any]:
    body = {k: v for k, v in obj.items() if k not in ("status", "metadata", "apiVersion", "kind")}
    metadata = obj.get("metadata") or {}
    body["metadata"] = {k: v for k, v in metadata.items() if k not in SERVER_MANAGED_METADATA}
    return body


def diff(
    original: Mapping[str, Any], desired: Mapping[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(patch of metadata/spec/..., patch of status), each {} when there is nothing to send."""
    main = merge_patch(_body(original), _body(desired))
    if main.get("metadata") == {}:
        del main["metadata"]
    status_patch: dict[str, Any] = {}
    old_status, new_status = original.get("status"), desired.get("status")
    if old_status != new_status:
        if isinstance(old_status, Mapping) and isinstance(new_status, Mapping):
            status_patch = merge_patch(old_status, new_status)
        else:
            status_patch = {"__whole__": new_status}
    return main, status_patch


def needs_precondition(main_patch: Mapping[str, Any]) -> bool:
    """A patch that replaces finalizers or ownerReferences must not overwrite a concurrent edit."""
    metadata = main_patch.get("metadata")
    return isinstance(metadata, Mapping) and bool(CONFLICT_SENSITIVE_METADATA & metadata.keys())


async def apply_patch(
    client: ResourceClient,
    original: Obj,
    desired: Obj,
    *,
    precondition: bool | None = None,
    status: bool = True,
    answered: Callable[[Obj], None] | None = None,
) -> Obj:
    """Send the minimal patches from `original` to `desired`; return the newest object.

    precondition: None = automatic (when finalizers/ownerReferences change), True = always send
    metadata.resourceVersion of `original`, False = never (on the main patch; see below).
    status=False skips the status patch.

    Every patch is tied to the incarnation of `original` (module docstring): the main patch by
    metadata.uid, the status patch by a resourceVersion (the main patch's answer when one was
    sent, else `original`'s; precondition=False drops it, and with it the incarnation check).
    Raises Conflict when a precondition fails and StaleIncarnation (a Conflict and a NotFound)
    when the object was re-created meanwhile; the controller requeues quietly.
    `answered` is called with the server's answer to each patch sent, in order.
    """
    main, status_patch = diff(original, desired)
    key = key_of(original)
    result = original
    rv = resource_version(original)
    uid = uid_of(original)
    if main:
        use_rv = needs_precondition(main) if precondition is None else precondition
        if uid:
            main = {**main, "metadata": {**(main.get("metadata") or {}), "uid": uid}}
        try:
            result = await client.patch(key, main, resource_version=rv if use_rv else None)
        except Invalid as exc:
            if "metadata.uid" in exc.message:
                raise StaleIncarnation(
                    f"{key}: re-created since read (uid {uid} is gone): {exc.message}"
                ) from exc
            raise
        if answered is not None:
            answered(result)
    if status and status_patch:
        if "__whole__" in status_patch:
            body: dict[str, Any] = {"status": status_patch["__whole__"]}
        else:
            body = {"status": status_patch}
        status_rv = None if precondition is False else resource_version(result) or None
        result = await client.patch_status(key, body, resource_version=status_rv)
        if answered is not None:
            answered(result)
    return result


@dataclass(slots=True)
class _Written:
    latest: Obj
    superseded: set[str] = field(default_factory=set)


class ReadYourWrites:
    """Per key, the newest object this process wrote (see the module docstring).

    writes = ReadYourWrites()
    obj = writes.read(key, cache.get(resource, key))   # the cache, or our newer write
    patcher = Patcher(client, obj, writes=writes)      # records what it writes
    writes.forget(key)                                 # the object is gone
    """

    def __init__(self) -> None:
        self._by_key: dict[ObjectKey, _Written] = {}

    def read(self, key: ObjectKey, cached: Obj | None) -> Obj | None:
        """The object to reconcile: `cached`, or the one our last write returned while the
        cache still shows a resourceVersion that write superseded. None when not cached."""
        if cached is None:
            self._by_key.pop(key, None)
            return None
        written = self._by_key.get(key)
        if written is None:
            return cached
        if resource_version(cached) in written.superseded:
            return written.latest
        del self._by_key[key]  # caught up (our write, or a newer one of someone else)
        return cached

    def wrote(self, key: ObjectKey, *, before: str, answer: Obj) -> None:
        """A write to `key` changed resourceVersion `before` into `answer` (kept without
        managedFields, like the cache's objects: see capl.runtime.informer)."""
        meta(answer).pop("managedFields", None)
        written = self._by_key.get(key)
        if written is None:
            written = self._by_key[key] = _Written(latest=answer)
        written.latest = answer
        if before and before != resource_version(answer):
            written.superseded.add(before)

    def forget(self, key: ObjectKey) -> None:
        self._by_key.pop(key, None)

    def __contains__(self, key: object) -> bool:
        return key in self._by_key

    def __len__(self) -> int:
        return len(self._by_key)


class Patcher:
    """Holds the object as read and a private copy to change; `apply()` sends the difference.

    p = Patcher(client, cached_obj)
    p.obj.setdefault("status", {})["ready"] = True
    await p.apply()

    With `writes`, every answer is recorded there (read-your-writes, module docstring).
    """

    def __init__(
        self, client: ResourceClient, obj: Obj, *, writes: ReadYourWrites | None = None
    ) -> None:
        self.client = client
        self.original = obj
        self.obj = copy_obj(obj)
        self.writes = writes
        self.wrote = False
        """Whether a patch was sent (and answered) through this patcher."""

    def changed(self) -> bool:
        main, status = diff(self.original, self.obj)
        return bool(main or status)

    async def apply(self, *, precondition: bool | None = None, status: bool = True) -> Obj:
        key = key_of(self.original)
        before = [resource_version(self.original)]

        def answered(answer: Obj) -> None:
            self.wrote = True
            if self.writes is not None:
                self.writes.wrote(key, before=before[0], answer=answer)
            before[0] = resource_version(answer)

        result = await apply_patch(
            self.client,
            self.original,
            self.obj,
            precondition=precondition,
            status=status,
            answered=answered,
        )
        if result is not self.original:
            self.original = result
            self.obj = copy_obj(result)
        return result
