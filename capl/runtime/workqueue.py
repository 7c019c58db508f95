"""A work queue with one entry per key, like client-go's rate-limiting queue.

Semantics:
- `dirty` holds keys waiting to be processed, `processing` keys a worker holds. Adding a key that
  is dirty merges; adding a key that is being processed marks it dirty and it is queued again
  only when the worker calls `done`, so N adds during one reconcile give exactly one re-run and
  a key is never handed to two workers at once.
- `add_after(key, delay)` parks the key until the deadline; a key parked twice keeps the earliest
  deadline. Parked keys are woken by a single clock timer (so a fake clock drives them).
- `add_rate_limited(key)` asks the rate limiter for the delay: by default the max of a per-key
  exponential backoff (5 ms doubling to 1000 s) and an overall token bucket (10 qps, burst 100),
  like client-go's DefaultControllerRateLimiter. `forget(key)` resets the key's backoff.
- `shutdown(drain=...)` stops accepting keys; getters raise `ShutDown` once nothing is left
  to hand out (immediately without drain).

The queue is single-threaded asyncio; use `loop.call_soon_threadsafe(queue.add, key)` from
other threads.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections import deque
from collections.abc import Hashable
from typing import Generic, Protocol, TypeVar

from capl.runtime.clock import Clock, LoopClock, Timer
from capl.runtime.metrics import QueueMetrics, RuntimeMetrics

K = TypeVar("K", bound=Hashable)
K_contra = TypeVar("K_contra", bound=Hashable, contravariant=True)


class ShutDown(Exception):
    """The queue was shut down and has nothing more to hand out."""


class RateLimiter(Protocol[K_contra]):
    def when(self, key: K_contra) -> float:
        """Delay in seconds before the key may be retried; records a failure."""
        ...

    def forget(self, key: K_contra) -> None: ...

    def retries(self, key: K_contra) -> int: ...


class ItemExponentialFailureRateLimiter(Generic[K]):
    """base * 2**failures per key, capped at max_delay."""

    def __init__(self, *, base_delay: float = 0.005, max_delay: float = 1000.0) -> None:
        self.base_delay = base_delay
        self.max_delay = max_delay
        self._failures: dict[K, int] = {}

    def when(self, key: K) -> float:
        n = self._failures.get(key, 0)
        self._failures[key] = n + 1
        if n > 62:
            return self.max_delay
        return float(min(self.base_delay * float(2**n), self.max_delay))

    def forget(self, key: K) -> None:
        self._failures.pop(key, None)

    def retries(self, key: K) -> int:
        return self._failures.get(key, 0)


class BucketRateLimiter(Generic[K]):
    """An overall token bucket: `qps` tokens per second, `burst` tokens at most.

    Each call reserves a token; the answer is how long until that token exists.
    """

    def __init__(self, *, qps: float = 10.0, burst: int = 100, clock: Clock | None = None) -> None:
        self.qps = qps
        self.burst = burst
        self.clock = clock or LoopClock()
        self._tokens = float(burst)
        self._last: float | None = None

    def when(self, key: K) -> float:
        now = self.clock.now()
        if self._last is not None:
            self._tokens = min(float(self.burst), self._tokens + (now - self._last) * self.qps)
        self._last = now
        self._tokens -= 1.0
        if self._tokens >= 0:
            return 0.0
        return -self._tokens / self.qps

    def forget(self, key: K) -> None:
        return None

    def retries(self, key: K) -> int:
        return 0


class MaxOfRateLimiter(Generic[K]):
    """The longest delay any of the limiters asks for."""

    def __init__(self, *limiters: RateLimiter[K]) -> None:
        self.limiters = limiters

    def when(self, key: K) -> float:
        return max(limiter.when(key) for limiter in self.limiters)

    def forget(self, key: K) -> None:
        for limiter in self.limiters:
            limiter.forget(key)

    def retries(self, key: K) -> int:
        return max(limiter.retries(key) for limiter in self.limiters)


def default_rate_limiter(
    *,
    clock: Clock | None = None,
    base_delay: float = 0.005,
    max_delay: float = 1000.0,
    qps: float = 10.0,
    burst: int = 100,
) -> MaxOfRateLimiter[K]:
    """client-go's DefaultControllerRateLimiter: MaxOf(ItemExponentialFailure, Bucket)."""
    return MaxOfRateLimiter(
        ItemExponentialFailureRateLimiter(base_delay=base_delay, max_delay=max_delay),
        BucketRateLimiter(qps=qps, burst=burst, clock=clock),
    )


class WorkQueue(Generic[K]):
    """The key-merging, delaying, rate-limited queue described in the module docstring."""

    def __init__(
        self,
        *,
        name: str = "",
        clock: Clock | None = None,
        rate_limiter: RateLimiter[K] | None = None,
        metrics: RuntimeMetrics | None = None,
    ) -> None:
        self.name = name
        self.clock: Clock = clock or LoopClock()
        self.rate_limiter: RateLimiter[K] = rate_limiter or default_rate_limiter(clock=self.clock)
        self._queue: deque[K] = deque()
        self._dirty: set[K] = set()
        self._processing: dict[K, float] = {}
        self._added_at: dict[K, float] = {}
        self._waiting: list[tuple[float, int, K]] = []
        self._waiting_at: dict[K, float] = {}
        self._seq = itertools.count()
        self._timer: Timer | None = None
        self._timer_at: float | None = None
        self._getters: deque[asyncio.Future[None]] = deque()
        self._drained: list[asyncio.Future[None]] = []
        self._shutting_down = False
        self._drain = False
        self._metrics_owner = metrics
        self._metrics = (
            QueueMetrics(metrics, name) if metrics is None else metrics.queue(name, self)
        )
        self.adds = 0
        self.merged = 0

    # -- adding ------------------------------------------------------------------------------

    def add(self, key: K) -> None:
        """Queue a key now (merges with a queued key; re-runs once after an in-flight one)."""
        if self._shutting_down:
            return
        if key in self._dirty:
            self.merged += 1
            return
        self.adds += 1
        if self._metrics.enabled:
            self._metrics.adds.inc()
        self._dirty.add(key)
        self._added_at[key] = self.clock.now()
        if key in self._processing:
            return
        self._queue.append(key)
        self._wake_one()

    def add_after(self, key: K, delay: float) -> None:
        """Queue a key after `delay` seconds; the earliest pending deadline for a key wins."""
        if self._shutting_down:
            return
        if delay <= 0:
            self.add(key)
            return
        at = self.clock.now() + delay
        current = self._waiting_at.get(key)
        if current is not None and current <= at:
            return
        self._waiting_at[key] = at
        heapq.heappush(self._waiting, (at, next(self._seq), key))
        self._arm_timer()

    def add_rate_limited(self, key: K) -> None:
        """Queue a key after the rate limiter's delay (backoff on failure)."""
        if self._shutting_down:
            return
        if self._metrics.enabled:
            self._metrics.retries.inc()
        self.add_after(key, self.rate_limiter.when(key))

    def forget(self, key: K) -> None:
        """Reset the key's failure backoff (call after a successful reconcile)."""
        self.rate_limiter.forget(key)

    def num_requeues(self, key: K) -> int:
        return self.rate_limiter.retries(key)

    # -- taking ------------------------------------------------------------------------------

    def get_nowait(self) -> K | None:
        """The next key, or None if none is ready (raises ShutDown when finished)."""
        if self._queue and not (self._shutting_down and not self._drain):
            key = self._queue.popleft()
            self._dirty.discard(key)
            now = self.clock.now()
            self._processing[key] = now
            added = self._added_at.pop(key, None)
            if self._metrics.enabled and added is not None:
                self._metrics.queue_duration.observe(now - added)
            return key
        if self._shutting_down:
            raise ShutDown
        return None

    async def get(self) -> K:
        """Wait for the next key; the caller must call `done(key)` when finished."""
        while True:
            key = self.get_nowait()
            if key is not None:
                return key
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._getters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self._wake_one()  # pass the wake-up on
                raise
            finally:
                if waiter in self._getters:
                    self._getters.remove(waiter)

    def done(self, key: K) -> None:
        """The worker finished the key; a key added meanwhile is queued again now."""
        started = self._processing.pop(key, None)
        if started is not None and self._metrics.enabled:
            self._metrics.work_duration.observe(self.clock.now() - started)
        if key in self._dirty:
            if self._shutting_down and not self._drain:
                self._dirty.discard(key)
            else:
                self._queue.append(key)
                self._wake_one()
        if not self._processing and self._drained:
            for fut in self._drained:
                if not fut.done():
                    fut.set_result(None)
            self._drained.clear()
        if self._shutting_down and not self._queue:
            self._wake_all()

    # -- shutdown ----------------------------------------------------------------------------

    def shutdown(self, *, drain: bool = False) -> None:
        """Stop accepting keys. drain=True: keep handing out already queued keys."""
        self._shutting_down = True
        self._drain = drain
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._waiting.clear()
        self._waiting_at.clear()
        if not drain:
            for key in self._queue:
                self._dirty.discard(key)
                self._added_at.pop(key, None)
            self._queue.clear()
        self._wake_all()
        if self._metrics_owner is not None:
            self._metrics_owner.forget_queue(self)

    async def wait_idle(self) -> None:
        """Wait until no key is being processed."""
        if not self._processing:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._drained.append(fut)
        await fut

    @property
    def shutting_down(self) -> bool:
        return self._shutting_down

    # -- introspection (also the gauges read at scrape time) ---------------------------------

    def depth(self) -> int:
        return len(self._dirty)

    def __len__(self) -> int:
        return len(self._queue)

    @property
    def processing(self) -> frozenset[K]:
        return frozenset(self._processing)

    @property
    def waiting(self) -> dict[K, float]:
        """Parked keys and their deadlines."""
        return dict(self._waiting_at)

    def is_dirty(self, key: K) -> bool:
        return key in self._dirty

    def unfinished_work_seconds(self) -> float:
        now = self.clock.now()
        return sum(now - t for t in self._processing.values())

    def longest_running_processor_seconds(self) -> float:
        if not self._processing:
            return 0.0
        return self.clock.now() - min(self._processing.values())

    # -- internals ---------------------------------------------------------------------------

    def _wake_one(self) -> None:
        while self._getters:
            waiter = self._getters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def _wake_all(self) -> None:
        while self._getters:
            waiter = self._getters.popleft()
            if not waiter.done():
                waiter.set_result(None)

    def _arm_timer(self) -> None:
        if not self._waiting:
            return
        first = self._waiting[0][0]
        if self._timer is not None and self._timer_at is not None and self._timer_at <= first:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = first
        self._timer = self.clock.call_at(first, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = None
        now = self.clock.now()
        while self._waiting and self._waiting[0][0] <= now:
            at, _, key = heapq.heappop(self._waiting)
            if self._waiting_at.get(key) == at:
                del self._waiting_at[key]
                self.add(key)
        self._arm_timer()
