"""core/v1 Event recorder with client-go style aggregation.

`recorder.event(obj, "Normal"|"Warning", reason, message)` never blocks and never raises: the
event goes to a bounded in-memory queue written by one background task. An event identical to a
recent one (same involved object, type, reason, message, within `window` seconds) is not created
again: the existing Event's `count` and `lastTimestamp` are patched instead. The identity cache
is an LRU bounded by `cache_size`. Write failures are logged at debug level only: events are
best effort and must never fail a reconcile. Never put secret material in a message.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import structlog

from capl.runtime.client import ResourceClient
from capl.runtime.clock import Clock, LoopClock
from capl.runtime.errors import ApiError, NotFound
from capl.runtime.objects import Obj, ObjectKey, meta

log = structlog.get_logger("capl.runtime.events")

EventType = Literal["Normal", "Warning"]
NORMAL: EventType = "Normal"
WARNING: EventType = "Warning"
MAX_MESSAGE = 1024


class Recorder(Protocol):
    """What controllers use to emit events."""

    def event(self, obj: Obj, type_: EventType, reason: str, message: str) -> None: ...


class NullRecorder:
    """Drops events (unit tests, tools)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, str, str]] = []

    def event(self, obj: Obj, type_: EventType, reason: str, message: str) -> None:
        self.events.append((str(meta(obj).get("name")), type_, reason, message))


@dataclass(slots=True)
class _Seen:
    name: str
    namespace: str
    count: int
    last: float


def _micro(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


class EventRecorder:
    """Writes core/v1 Events through `client` (a ResourceClient for events)."""

    def __init__(
        self,
        client: ResourceClient,
        *,
        component: str = "capl",
        instance: str | None = None,
        clock: Clock | None = None,
        window: float = 600.0,
        cache_size: int = 4096,
        max_pending: int = 1000,
    ) -> None:
        self.client = client
        self.component = component
        self.instance = instance or socket.gethostname()
        self.clock: Clock = clock or LoopClock()
        self.window = window
        self.cache_size = cache_size
        self._seen: OrderedDict[tuple[str, ...], _Seen] = OrderedDict()
        self._pending: asyncio.Queue[tuple[Obj, EventType, str, str, float]] = asyncio.Queue(
            max_pending
        )
        self._task: asyncio.Task[None] | None = None
        self.written = 0
        self.aggregated = 0
        self.dropped = 0

    def normal(self, obj: Obj, reason: str, message: str) -> None:
        self.event(obj, NORMAL, reason, message)

    def warning(self, obj: Obj, reason: str, message: str) -> None:
        self.event(obj, WARNING, reason, message)

    def event(self, obj: Obj, type_: EventType, reason: str, message: str) -> None:
        try:
            self._pending.put_nowait((obj, type_, reason, message[:MAX_MESSAGE], self.clock.wall()))
        except asyncio.QueueFull:
            self.dropped += 1
            log.debug("event dropped, queue full", reason=reason)
            return
        self._ensure_task()

    def _ensure_task(self) -> None:
        if self._task is None or self._task.done():
            with contextlib.suppress(RuntimeError):  # no loop yet: written once start() runs
                self._task = asyncio.get_running_loop().create_task(self._run(), name="events")

    def start(self) -> None:
        self._ensure_task()

    async def flush(self) -> None:
        """Wait until every queued event was written (or failed)."""
        self._ensure_task()
        await self._pending.join()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            item = await self._pending.get()
            try:
                await self._write(*item)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.debug("event not recorded", error=str(exc), reason=item[2])
            finally:
                self._pending.task_done()

    async def _write(
        self, obj: Obj, type_: EventType, reason: str, message: str, now: float
    ) -> None:
        m = meta(obj)
        namespace = m.get("namespace") or "default"
        ident = (
            str(m.get("uid") or ""),
            str(obj.get("kind") or ""),
            namespace,
            str(m.get("name") or ""),
            type_,
            reason,
            message,
        )
        seen = self._seen.get(ident)
        timestamp = _micro(now)
        if seen is not None and now - seen.last < self.window:
            self._seen.move_to_end(ident)
            try:
                await self.client.patch(
                    ObjectKey(seen.namespace, seen.name),
                    {"count": seen.count + 1, "lastTimestamp": timestamp},
                )
                seen.count += 1
                seen.last = now
                self.aggregated += 1
                return
            except NotFound:
                del self._seen[ident]
            except ApiError as exc:
                log.debug("event aggregation failed", error=str(exc))
                return
        name = f"{m.get('name')}.{time.time_ns():x}"
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": namespace},
            "involvedObject": {
                "apiVersion": obj.get("apiVersion"),
                "kind": obj.get("kind"),
                "name": m.get("name"),
                "namespace": m.get("namespace"),
                "uid": m.get("uid"),
                "resourceVersion": m.get("resourceVersion"),
            },
            "reason": reason,
            "message": message,
            "type": type_,
            "count": 1,
            "firstTimestamp": timestamp,
            "lastTimestamp": timestamp,
            "source": {"component": self.component, "host": self.instance},
            "reportingComponent": self.component,
            "reportingInstance": self.instance,
        }
        body["involvedObject"] = {k: v for k, v in body["involvedObject"].items() if v}
        await self.client.create(body)
        self.written += 1
        self._seen[ident] = _Seen(name, namespace, 1, now)
        while len(self._seen) > self.cache_size:
            self._seen.popitem(last=False)


def default_instance() -> str:
    return os.environ.get("POD_NAME") or socket.gethostname()
