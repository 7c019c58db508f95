"""Controllers: level-based reconcilers driven by a key-merging work queue.

A `Controller` watches its primary resource (with predicates, by default skipping status-only
updates) and any number of secondary resources mapped to primary keys (`Watch`). Every event
only enqueues a key; workers (`concurrency` of them) take keys from the queue and call
`reconciler.reconcile(key)`:

- returns Result() -> forget the key's backoff (success)
- Result(requeue_after=s) -> forget, then enqueue again after s seconds
- Result(requeue=True) -> rate-limited requeue (backoff grows)
- raises Conflict -> rate-limited requeue, logged at debug only (someone else wrote first)
- raises anything else -> rate-limited requeue, logged as an error with the traceback

Non-Kubernetes events (libvirt domain lifecycle) use `enqueue` / `enqueue_threadsafe`.
Each reconcile runs with structlog context: controller, kind, namespace, name, reconcileID (a
random UUID from a PRNG seeded once, not from os.urandom: a syscall per reconcile shows in a
profile of a busy manager).

Rate limits apply to retries only (as in controller-runtime): a key added by an event, by
`enqueue` or by `requeue_after` is queued at once (or at its deadline); only failures and
`Result(requeue=True)` go through the rate limiter (per-key exponential backoff, overall token
bucket), so the overall bucket never throttles a burst of new objects.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import structlog

from capl.runtime.clock import Clock, LoopClock
from capl.runtime.errors import ApiError, Conflict, TransportError
from capl.runtime.handlers import PRIMARY_DEFAULT_PREDICATES, Mapper, Predicate, map_self
from capl.runtime.informer import Cache, Informer
from capl.runtime.metrics import RuntimeMetrics
from capl.runtime.objects import Obj, ObjectKey, labels
from capl.runtime.resources import Resource
from capl.runtime.workqueue import RateLimiter, ShutDown, WorkQueue

log = structlog.get_logger("capl.runtime.controller")

_ids = random.Random()

#: The longest wait before a reconcile that failed on an unavailable API server is retried.
TRANSIENT_RETRY_MAX = 10.0


def transient_api_error(exc: BaseException) -> bool:
    """No answer from the API server, 429 Too Many Requests, or a 5xx: worth retrying soon,
    not worth a traceback."""
    if isinstance(exc, TransportError):
        return True
    return isinstance(exc, ApiError) and (exc.code == 429 or exc.code >= 500)


def _reconcile_id() -> str:
    return str(uuid.UUID(int=_ids.getrandbits(128), version=4))


@dataclass(frozen=True, slots=True)
class Result:
    """What a reconcile asks for next."""

    requeue: bool = False
    requeue_after: float | None = None


DONE = Result()


class Reconciler(Protocol):
    """Reads the world for `key`, makes it so, reports status; returns what to do next."""

    async def reconcile(self, key: ObjectKey) -> Result: ...


@dataclass(frozen=True, slots=True)
class Watch:
    """A secondary resource whose events map to primary keys."""

    resource: Resource
    mapper: Mapper
    predicates: Sequence[Predicate] = ()


@dataclass(frozen=True, slots=True)
class ControllerOptions:
    concurrency: int = 1
    rate_limiter: RateLimiter[ObjectKey] | None = None
    key_filter: Callable[[Obj], bool] | None = None
    """Only reconcile primaries for which this is true (e.g. the --watch-filter label)."""


class _Handler:
    """Maps informer events of one watch into queue adds."""

    __slots__ = ("controller", "mapper", "predicates", "primary")

    def __init__(
        self,
        controller: Controller,
        mapper: Mapper,
        predicates: Sequence[Predicate],
        primary: bool,
    ) -> None:
        self.controller = controller
        self.mapper = mapper
        self.predicates = tuple(predicates)
        self.primary = primary

    def on_add(self, obj: Obj) -> None:
        if all(p.create(obj) for p in self.predicates):
            self._enqueue(obj)

    def on_update(self, old: Obj, new: Obj) -> None:
        if all(p.update(old, new) for p in self.predicates):
            if old is new or self.primary:
                self._enqueue(new)
            else:
                keys = set(self.mapper(old))
                keys.update(self.mapper(new))
                for key in keys:
                    self.controller._enqueue_mapped(key)

    def on_delete(self, obj: Obj) -> None:
        if all(p.delete(obj) for p in self.predicates):
            self._enqueue(obj)

    def _enqueue(self, obj: Obj) -> None:
        if self.primary:
            self.controller._enqueue_primary(obj)
        else:
            for key in self.mapper(obj):
                self.controller._enqueue_mapped(key)


class Controller:
    """Runs a Reconciler over the keys of its primary resource; see the module docstring."""

    def __init__(
        self,
        name: str,
        *,
        for_: Resource,
        reconciler: Reconciler,
        cache: Cache,
        watches: Sequence[Watch] = (),
        predicates: Sequence[Predicate] = PRIMARY_DEFAULT_PREDICATES,
        options: ControllerOptions | None = None,
        clock: Clock | None = None,
        metrics: RuntimeMetrics | None = None,
    ) -> None:
        self.name = name
        self.resource = for_
        self.reconciler = reconciler
        self.cache = cache
        self.options = options or ControllerOptions()
        self.clock: Clock = clock or cache.clock or LoopClock()
        self.metrics = metrics
        self.queue: WorkQueue[ObjectKey] = WorkQueue(
            name=name, clock=self.clock, rate_limiter=self.options.rate_limiter, metrics=metrics
        )
        self.watches = tuple(watches)
        self._primary = cache.informer(for_)
        self._informers: list[Informer] = [self._primary]
        self._primary.add_handler(_Handler(self, map_self, predicates, primary=True))
        for watch in self.watches:
            informer = cache.informer(watch.resource)
            informer.add_handler(_Handler(self, watch.mapper, watch.predicates, primary=False))
            if informer not in self._informers:
                self._informers.append(informer)
        self._workers: list[asyncio.Task[None]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._active = 0
        self._log = log.bind(controller=name)
        if metrics is not None:
            self._m_total = {
                r: metrics.reconcile_total.labels(name, r)
                for r in ("success", "error", "requeue", "requeue_after")
            }
            self._m_errors = metrics.reconcile_errors.labels(name)
            self._m_time = metrics.reconcile_time.labels(name)
            self._m_active = metrics.active_workers.labels(name)
            metrics.max_concurrent_reconciles.labels(name).set(self.options.concurrency)
            self._m_active.set(0)
        # counters (tests, diagnostics)
        self.reconciles = 0
        self.failures = 0

    # -- enqueueing --------------------------------------------------------------------------

    @property
    def resources(self) -> list[Resource]:
        """Resources whose informers this controller needs."""
        return [i.resource for i in self._informers]

    def enqueue(self, key: ObjectKey) -> None:
        """Enqueue a primary key now (external triggers)."""
        self.queue.add(key)

    def enqueue_threadsafe(self, key: ObjectKey) -> None:
        """Enqueue from another thread (e.g. the libvirt event thread)."""
        loop = self._loop
        if loop is None:
            raise RuntimeError("controller is not running")
        loop.call_soon_threadsafe(self.queue.add, key)

    def _enqueue_primary(self, obj: Obj) -> None:
        key_filter = self.options.key_filter
        if key_filter is not None and not key_filter(obj):
            return
        meta = obj["metadata"]
        self.queue.add(ObjectKey(meta.get("namespace") or "", meta["name"]))

    def _enqueue_mapped(self, key: ObjectKey) -> None:
        key_filter = self.options.key_filter
        if key_filter is not None:
            primary = self._primary.store.get(key)
            if primary is None or not key_filter(primary):
                return
        self.queue.add(key)

    # -- running -----------------------------------------------------------------------------

    def start_informers(self) -> None:
        for informer in self._informers:
            informer.start()

    async def wait_synced(self) -> None:
        await asyncio.gather(*(i.wait_synced() for i in self._informers))

    async def run(self) -> None:
        """Start informers, wait for their sync, run the workers until `shutdown`."""
        self._loop = asyncio.get_running_loop()
        self.start_informers()
        await self.wait_synced()
        if self.queue.shutting_down:
            return
        self._workers = [
            asyncio.create_task(self._worker(), name=f"{self.name}-worker-{i}")
            for i in range(self.options.concurrency)
        ]
        self._log.info("controller started", workers=self.options.concurrency)
        try:
            await asyncio.wait(self._workers)
        finally:
            for task in self._workers:
                task.cancel()

    async def shutdown(self, *, grace: float = 0.0) -> None:
        """Stop taking keys; give in-flight reconciles `grace` seconds, then cancel them."""
        self.queue.shutdown(drain=False)
        await asyncio.sleep(0)  # idle workers see ShutDown and return
        workers = [t for t in self._workers if not t.done()]
        pending: set[asyncio.Task[None]] = set()
        if workers:
            _, pending = await asyncio.wait(workers, timeout=grace if grace > 0 else 0)
        for task in pending:
            task.cancel()
        for task in workers:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._log.info("controller stopped", cancelled=len(pending))

    async def _worker(self) -> None:
        queue = self.queue
        while True:
            try:
                key = await queue.get()
            except ShutDown:
                return
            try:
                await self._process(key)
            finally:
                queue.done(key)

    async def _process(self, key: ObjectKey) -> None:
        metrics = self.metrics is not None
        self._active += 1
        if metrics:
            self._m_active.inc()
        started = time.perf_counter()
        self.reconciles += 1
        outcome = "success"
        try:
            with structlog.contextvars.bound_contextvars(
                controller=self.name,
                kind=self.resource.kind,
                namespace=key.namespace,
                name=key.name,
                reconcileID=_reconcile_id(),
            ):
                try:
                    result = await self.reconciler.reconcile(key)
                except asyncio.CancelledError:
                    raise
                except Conflict as exc:
                    outcome = "requeue"
                    log.debug("conflict, requeueing", error=exc.message)
                    self.queue.add_rate_limited(key)
                    return
                except Exception as exc:
                    outcome = "error"
                    self.failures += 1
                    if transient_api_error(exc):
                        # the API server is away or overloaded: one line, no traceback, and
                        # a retry whose delay stays under TRANSIENT_RETRY_MAX (the key's own
                        # backoff would otherwise grow to many minutes during an outage)
                        delay = min(self.queue.rate_limiter.when(key), TRANSIENT_RETRY_MAX)
                        log.warning("API server unavailable", error=str(exc), retry_in=delay)
                        self.queue.add_after(key, delay)
                        return
                    log.exception("reconcile failed", retries=self.queue.num_requeues(key))
                    self.queue.add_rate_limited(key)
                    return
                if result.requeue_after is not None and result.requeue_after > 0:
                    outcome = "requeue_after"
                    self.queue.forget(key)
                    self.queue.add_after(key, result.requeue_after)
                elif result.requeue:
                    outcome = "requeue"
                    self.queue.add_rate_limited(key)
                else:
                    self.queue.forget(key)
        finally:
            self._active -= 1
            if metrics:
                self._m_active.dec()
                self._m_time.observe(time.perf_counter() - started)
                self._m_total[outcome].inc()
                if outcome == "error":
                    self._m_errors.inc()

    @property
    def active_workers(self) -> int:
        return self._active


def label_filter(key: str, value: str) -> Callable[[Obj], bool]:
    """A key filter for ControllerOptions: the object carries label key=value."""

    def check(obj: Obj) -> bool:
        return labels(obj).get(key) == value

    return check
