"""The API client Protocols the runtime and the controllers work against.

capl.kube implements them on kubernetes_asyncio; tests implement them in memory. A `Client` hands
out one `ResourceClient` per `Resource`. All calls take and return raw JSON objects (`Obj`) and
raise the typed errors of capl.runtime.errors. Writes are merge patches (RFC 7386) of
metadata/spec and, separately, of the status subresource; objects are never replaced whole.

A resourceVersion precondition (`resource_version=...`) is sent inside the patch body as
metadata.resourceVersion, which makes the API server answer 409 Conflict when the object changed.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from capl.runtime.metrics import RequestStats
from capl.runtime.objects import Obj, ObjectKey
from capl.runtime.resources import Resource

WatchEventType = Literal["ADDED", "MODIFIED", "DELETED", "BOOKMARK"]


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One event of a watch stream. BOOKMARK events carry only metadata.resourceVersion."""

    type: WatchEventType
    object: Obj


@dataclass(slots=True)
class ObjectList:
    """The result of a list: the items and the collection's resourceVersion to watch from."""

    items: list[Obj]
    resource_version: str
    extra: dict[str, Any] = field(default_factory=dict)


class ResourceClient(Protocol):
    """Typed access to one kind. `namespace` arguments are ignored for cluster-scoped kinds."""

    @property
    def resource(self) -> Resource: ...

    async def get(self, key: ObjectKey) -> Obj:
        """The object; NotFound if it does not exist."""
        ...

    async def list(
        self,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        limit: int | None = None,
    ) -> ObjectList:
        """All matching objects (all namespaces when namespace is None), paging internally."""
        ...

    def watch(
        self,
        *,
        resource_version: str,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        timeout_seconds: int | None = None,
        allow_bookmarks: bool = True,
        inactivity_timeout: float | None = None,
    ) -> AsyncGenerator[WatchEvent, None]:
        """Events after `resource_version` until the server ends the watch (normal return).

        Raises Gone when the resourceVersion is too old (the caller re-lists), WatchStalled when
        nothing arrived for `inactivity_timeout` seconds, TransportError when the connection
        failed. Close the generator (`aclose`) to drop the connection early.
        """
        ...

    async def create(self, obj: Mapping[str, Any]) -> Obj:
        """Create; AlreadyExists if the name is taken. Namespace comes from obj.metadata."""
        ...

    async def patch(
        self, key: ObjectKey, patch: Mapping[str, Any], *, resource_version: str | None = None
    ) -> Obj:
        """JSON merge patch of the object (metadata/spec); status changes are ignored by CRDs
        with a status subresource. With resource_version: Conflict if the object changed."""
        ...

    async def patch_status(
        self, key: ObjectKey, patch: Mapping[str, Any], *, resource_version: str | None = None
    ) -> Obj:
        """JSON merge patch of the status subresource."""
        ...

    async def delete(
        self,
        key: ObjectKey,
        *,
        uid: str | None = None,
        resource_version: str | None = None,
        propagation_policy: str | None = None,
    ) -> Obj | None:
        """Delete (with optional uid/resourceVersion preconditions); NotFound if absent.
        Returns the object when the server still holds it (finalizers), else None."""
        ...


class Client(Protocol):
    """Entry point: one ResourceClient per resource, plus request accounting."""

    def resource(self, resource: Resource) -> ResourceClient: ...

    @property
    def stats(self) -> RequestStats:
        """Counts of requests by method and code (and per object when tracking is on)."""
        ...

    async def close(self) -> None: ...
