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
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from capl.runtime.client import ResourceClient
from capl.runtime.errors import Invalid, StaleIncarnation
from capl.runtime.objects import Obj, copy_obj, key_of, resource_version
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
    if status and status_patch:
        if "__whole__" in status_patch:
            body: dict[str, Any] = {"status": status_patch["__whole__"]}
        else:
            body = {"status": status_patch}
        status_rv = None if precondition is False else resource_version(result) or None
        result = await client.patch_status(key, body, resource_version=status_rv)
    return result


class Patcher:
    """Holds the object as read and a private copy to change; `apply()` sends the difference.

    p = Patcher(client, cached_obj)
    p.obj.setdefault("status", {})["ready"] = True
    await p.apply()
    """

    def __init__(self, client: ResourceClient, obj: Obj) -> None:
        self.client = client
        self.original = obj
        self.obj = copy_obj(obj)

    def changed(self) -> bool:
        main, status = diff(self.original, self.obj)
        return bool(main or status)

    async def apply(self, *, precondition: bool | None = None, status: bool = True) -> Obj:
        result = await apply_patch(
            self.client, self.original, self.obj, precondition=precondition, status=status
        )
        if result is not self.original:
            self.original = result
            self.obj = copy_obj(result)
        return result
