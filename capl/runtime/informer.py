"""Informers: one list+watch per kind feeding a shared Store and event handlers.

Life of an informer:
1. List (paged) and replace the store. The first list makes `has_synced` true. A later re-list
   (after 410 Gone) compares with the cache and emits synthetic deltas: add for new keys, update
   for keys whose resourceVersion changed, delete for keys that vanished, so no key is lost or
   duplicated across the gap.
2. Watch from the list's resourceVersion with bookmarks and a server timeout (jittered between
   `watch_timeout` and twice that, like client-go). A normal end of the watch (server timeout) or
   a dropped connection resumes the watch from the last resourceVersion seen (events or
   bookmarks); only 410 Gone forces a re-list.
3. A watchdog on the injected clock restarts a watch that has been silent longer than the
   inactivity timeout (default: twice the server timeout of that watch), so a stalled TCP
   connection is noticed even when no error ever arrives.
4. Optionally every `resync_period` all cached objects are re-delivered to handlers as
   update(obj, obj) - no API call.
5. `metadata.managedFields` is dropped from every object as it arrives (unless
   `keep_managed_fields`), like controller-runtime's TransformStripManagedFields: nothing in
   a controller reads it, and it is often the largest part of an object - memory, and every
   private copy a reconcile makes of a cached object.

Handlers are called synchronously from the informer task; they should only enqueue keys.
`Cache` holds one informer per resource and is what controllers and webhooks share.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

import structlog

from capl.runtime.client import Client, ResourceClient, WatchEvent
from capl.runtime.clock import Clock, LoopClock, Timer
from capl.runtime.errors import ApiError, Gone, WatchStalled
from capl.runtime.objects import Obj, ObjectKey, key_of, resource_version
from capl.runtime.resources import Resource
from capl.runtime.store import Indexer, KeyList, Store

log = structlog.get_logger("capl.runtime.informer")

ObjList = list[Obj]
ResourceList = list[Resource]


class EventHandler(Protocol):
    def on_add(self, obj: Obj) -> None: ...

    def on_update(self, old: Obj, new: Obj) -> None:
        """`old is new` (same object) for a periodic resync."""
        ...

    def on_delete(self, obj: Obj) -> None: ...


@dataclass(frozen=True, slots=True)
class FuncHandler:
    """An EventHandler from plain functions (any may be None)."""

    add: Callable[[Obj], None] | None = None
    update: Callable[[Obj, Obj], None] | None = None
    delete: Callable[[Obj], None] | None = None

    def on_add(self, obj: Obj) -> None:
        if self.add is not None:
            self.add(obj)

    def on_update(self, old: Obj, new: Obj) -> None:
        if self.update is not None:
            self.update(old, new)

    def on_delete(self, obj: Obj) -> None:
        if self.delete is not None:
            self.delete(obj)


@dataclass(frozen=True, kw_only=True, slots=True)
class InformerOptions:
    namespace: str | None = None
    """Watch one namespace (None: all). Ignored for cluster-scoped kinds."""
    label_selector: str | None = None
    field_selector: str | None = None
    watch_timeout: float = 300.0
    """Server-side timeoutSeconds; each watch uses a random value in [t, 2t)."""
    inactivity_timeout: float | None = None
    """Restart a watch silent this long; None: twice the watch's server timeout."""
    resync_period: float | None = None
    page_size: int | None = 500
    backoff_initial: float = 0.8
    backoff_max: float = 30.0
    keep_managed_fields: bool = False


class Backoff:
    """Jittered exponential backoff for retrying failed list/watch calls."""

    def __init__(self, initial: float, maximum: float) -> None:
        self.initial = initial
        self.maximum = maximum
        self._next = initial

    def next(self) -> float:
        delay = self._next
        self._next = min(self.maximum, self._next * 2)
        return delay * (1.0 + random.random() * 0.5)

    def reset(self) -> None:
        self._next = self.initial


class Informer:
    """List+watch of one resource into a Store; see the module docstring."""

    def __init__(
        self,
        client: ResourceClient,
        *,
        options: InformerOptions | None = None,
        clock: Clock | None = None,
        indexers: Mapping[str, Indexer] | None = None,
    ) -> None:
        self.client = client
        self.resource: Resource = client.resource
        self.options = options or InformerOptions()
        self.clock: Clock = clock or LoopClock()
        self.store = Store(indexers)
        self._handlers: list[EventHandler] = []
        self._synced = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._resync_task: asyncio.Task[None] | None = None
        self.last_resource_version = ""
        self._last_activity = 0.0
        self._namespace = self.options.namespace if self.resource.namespaced else None
        self._log = log.bind(resource=str(self.resource))
        # counters for tests and diagnostics
        self.lists = 0
        self.watches = 0
        self.relists_after_gone = 0
        self.stalls = 0
        self.errors = 0
        self.events = 0

    # -- handlers, indexes -------------------------------------------------------------------

    def add_handler(self, handler: EventHandler) -> None:
        """Register a handler; objects already cached are delivered to it as adds."""
        self._handlers.append(handler)
        for obj in self.store:
            self._call(handler.on_add, obj)

    def remove_handler(self, handler: EventHandler) -> None:
        with contextlib.suppress(ValueError):
            self._handlers.remove(handler)

    def add_indexer(self, name: str, indexer: Indexer) -> None:
        self.store.add_indexer(name, indexer)

    # -- state -------------------------------------------------------------------------------

    @property
    def has_synced(self) -> bool:
        return self._synced.is_set()

    async def wait_synced(self) -> None:
        await self._synced.wait()

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        """Start the list+watch loop (idempotent)."""
        if self.running:
            return
        self._task = asyncio.create_task(self.run(), name=f"informer:{self.resource}")
        if self.options.resync_period:
            self._resync_task = asyncio.create_task(
                self._resync_loop(self.options.resync_period), name=f"resync:{self.resource}"
            )

    async def stop(self) -> None:
        for task in (self._resync_task, self._task):
            if task is not None and not task.done():
                task.cancel()
        for task in (self._resync_task, self._task):
            if task is not None:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._task = self._resync_task = None

    def resync(self) -> None:
        """Deliver every cached object to the handlers as update(obj, obj)."""
        for obj in self.store:
            for handler in self._handlers:
                self._call(handler.on_update, obj, obj)

    # -- the loop ----------------------------------------------------------------------------

    async def run(self) -> None:
        backoff = Backoff(self.options.backoff_initial, self.options.backoff_max)
        need_list = True
        while True:
            try:
                if need_list:
                    await self._list_and_replace()
                    need_list = False
                    backoff.reset()
                events_before = self.events
                started = self.clock.now()
                await self._watch_once()
                if self.events > events_before:
                    backoff.reset()
                elif self.clock.now() - started < 1.0:
                    # ended at once without an event: do not spin on a misbehaving server
                    await self.clock.sleep(backoff.next())
            except Gone:
                self.relists_after_gone += 1
                self._log.info("watch expired, re-listing", rv=self.last_resource_version)
                need_list = True
            except asyncio.CancelledError:
                raise
            except WatchStalled:
                self.stalls += 1
                self._log.warning("watch stalled, restarting", rv=self.last_resource_version)
                await self.clock.sleep(backoff.next() * 0.1)
            except ApiError as exc:
                self.errors += 1
                delay = backoff.next()
                self._log.warning(
                    "list/watch failed, retrying",
                    error=str(exc),
                    code=exc.code,
                    relist=need_list,
                    retry_in=round(delay, 3),
                )
                await self.clock.sleep(delay)
            except Exception as exc:
                self.errors += 1
                delay = backoff.next()
                self._log.error("informer error", error=repr(exc), exc_info=True)
                await self.clock.sleep(delay)

    async def _list_and_replace(self) -> None:
        result = await self.client.list(
            namespace=self._namespace,
            label_selector=self.options.label_selector,
            field_selector=self.options.field_selector,
            limit=self.options.page_size,
        )
        self.lists += 1
        if not self.options.keep_managed_fields:
            for obj in result.items:
                _strip_managed_fields(obj)
        self._replace(result.items)
        self.last_resource_version = result.resource_version
        if not self._synced.is_set():
            self._synced.set()
            self._log.debug("synced", objects=len(self.store), rv=result.resource_version)

    def _replace(self, items: list[Obj]) -> None:
        seen: set[ObjectKey] = set()
        store = self.store
        for obj in items:
            key = key_of(obj)
            seen.add(key)
            old = store.upsert(obj)
            if old is None:
                self._dispatch_add(obj)
            elif resource_version(old) != resource_version(obj):
                self._dispatch_update(old, obj)
        for key in store.list_keys():
            if key not in seen:
                gone = store.delete(key)
                if gone is not None:
                    self._dispatch_delete(gone)

    async def _watch_once(self) -> None:
        timeout = int(self.options.watch_timeout * (1.0 + random.random()))
        inactivity = self.options.inactivity_timeout or 2.0 * timeout
        self.watches += 1
        self._last_activity = self.clock.now()
        task = asyncio.create_task(self._consume(timeout, inactivity))
        stalled = False
        timer: Timer | None = None

        def check() -> None:
            nonlocal timer, stalled
            if task.done():
                return
            due = self._last_activity + inactivity
            if self.clock.now() >= due:
                stalled = True
                task.cancel()
            else:
                timer = self.clock.call_at(due, check)

        timer = self.clock.call_at(self._last_activity + inactivity, check)
        try:
            await asyncio.wait({task})
        except asyncio.CancelledError:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
            raise
        finally:
            if timer is not None:
                timer.cancel()
        if stalled:
            raise WatchStalled(f"no watch event for {inactivity:.0f}s")
        task.result()

    async def _consume(self, server_timeout: int, inactivity: float) -> None:
        stream = self.client.watch(
            resource_version=self.last_resource_version,
            namespace=self._namespace,
            label_selector=self.options.label_selector,
            field_selector=self.options.field_selector,
            timeout_seconds=server_timeout,
            allow_bookmarks=True,
            inactivity_timeout=inactivity + 5.0,
        )
        async with contextlib.aclosing(stream):
            async for event in stream:
                self._last_activity = self.clock.now()
                self._apply(event)

    def _apply(self, event: WatchEvent) -> None:
        obj = event.object
        rv = resource_version(obj)
        if event.type == "BOOKMARK":
            if rv:
                self.last_resource_version = rv
            return
        self.events += 1
        if not self.options.keep_managed_fields:
            _strip_managed_fields(obj)
        if event.type == "DELETED":
            gone = self.store.delete(key_of(obj))
            self._dispatch_delete(gone if gone is not None else obj)
        else:
            old = self.store.upsert(obj)
            if old is None:
                self._dispatch_add(obj)
            elif resource_version(old) != rv:
                self._dispatch_update(old, obj)
        if rv:
            self.last_resource_version = rv

    # -- dispatch ----------------------------------------------------------------------------

    def _dispatch_add(self, obj: Obj) -> None:
        for handler in self._handlers:
            self._call(handler.on_add, obj)

    def _dispatch_update(self, old: Obj, new: Obj) -> None:
        for handler in self._handlers:
            self._call(handler.on_update, old, new)

    def _dispatch_delete(self, obj: Obj) -> None:
        for handler in self._handlers:
            self._call(handler.on_delete, obj)

    def _call(self, fn: Callable[..., None], *args: Any) -> None:
        try:
            fn(*args)
        except Exception:
            self._log.exception("event handler failed")

    async def _resync_loop(self, period: float) -> None:
        await self._synced.wait()
        while True:
            await self.clock.sleep(period)
            self.resync()


def _strip_managed_fields(obj: Obj) -> None:
    metadata = obj.get("metadata")
    if isinstance(metadata, dict):
        metadata.pop("managedFields", None)


class Cache:
    """One shared informer per resource, created on first use; the controllers' read side.

    `namespace` scopes every namespaced informer; `label_selectors` optionally narrows the list
    and watch of a resource on the server (objects outside the selector are invisible).
    """

    def __init__(
        self,
        client: Client,
        *,
        namespace: str | None = None,
        clock: Clock | None = None,
        options: InformerOptions | None = None,
        label_selectors: Mapping[Resource, str] | None = None,
    ) -> None:
        self.client = client
        self.clock = clock or LoopClock()
        self.options = replace(options or InformerOptions(), namespace=namespace)
        self.label_selectors = dict(label_selectors or {})
        self._informers: dict[Resource, Informer] = {}

    def informer(self, resource: Resource) -> Informer:
        """The shared informer of a resource (not started)."""
        informer = self._informers.get(resource)
        if informer is None:
            options = self.options
            selector = self.label_selectors.get(resource)
            if selector:
                options = replace(options, label_selector=selector)
            informer = Informer(self.client.resource(resource), options=options, clock=self.clock)
            self._informers[resource] = informer
        return informer

    @property
    def informers(self) -> dict[Resource, Informer]:
        return dict(self._informers)

    def store(self, resource: Resource) -> Store:
        return self.informer(resource).store

    def get(self, resource: Resource, key: ObjectKey) -> Obj | None:
        """The cached object (decoded for this call: the caller's own), None if absent."""
        return self.informer(resource).store.get(key)

    def list(
        self,
        resource: Resource,
        *,
        namespace: str | None = None,
        selector: Mapping[str, str] | None = None,
    ) -> ObjList:
        return self.informer(resource).store.list(namespace=namespace, selector=selector)

    def by_index(self, resource: Resource, index: str, value: str) -> ObjList:
        return self.informer(resource).store.by_index(index, value)

    def index_keys(self, resource: Resource, index: str, value: str) -> KeyList:
        """The keys of the cached objects of `resource` whose `index` holds `value` (nothing
        decoded)."""
        return self.informer(resource).store.index_keys(index, value)

    def index_values(self, resource: Resource, index: str) -> set[str]:
        """Every value of `index` over the cached objects of `resource` (see Store)."""
        return self.informer(resource).store.index_values(index)

    def index_view(self, resource: Resource, index: str) -> Mapping[str, object]:
        """The values of `index` over the cached objects of `resource`, live and read-only
        (see Store.index_view): membership without a copy."""
        return self.informer(resource).store.index_view(index)

    def start(self, resources: ResourceList | None = None) -> None:
        for resource in resources if resources is not None else list(self._informers):
            self.informer(resource).start()

    def has_synced(self) -> bool:
        """All started informers have synced."""
        return all(i.has_synced for i in self._informers.values() if i.running)

    async def wait_synced(self, resources: ResourceList | None = None) -> None:
        targets = resources if resources is not None else list(self._informers)
        await asyncio.gather(*(self.informer(r).wait_synced() for r in targets))

    async def stop(self, resources: ResourceList | None = None) -> None:
        targets = resources if resources is not None else list(self._informers)
        await asyncio.gather(*(self.informer(r).stop() for r in targets))
