"""An injectable clock, so timing logic (backoff, delayed requeues, leases) runs on fake time.

`Clock.now()` is monotonic seconds; `call_at(when, callback)` schedules a plain callback;
`sleep(delay)` suspends the caller. `LoopClock` uses the running asyncio loop. `FakeClock` only
moves when a test calls `advance()`, which fires due callbacks synchronously in deadline order
(and wakes sleepers), so queue and rate-limit tests need no real sleeping at all.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable
from typing import Protocol


class Timer(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    def now(self) -> float:
        """Monotonic time in seconds."""
        ...

    def call_at(self, when: float, callback: Callable[[], None]) -> Timer:
        """Run `callback` once `now() >= when`."""
        ...

    async def sleep(self, delay: float) -> None: ...

    def wall(self) -> float:
        """Wall-clock seconds since the epoch (timestamps written to objects)."""
        ...


class LoopClock:
    """The real clock: the running event loop's time."""

    def now(self) -> float:
        return asyncio.get_running_loop().time()

    def call_at(self, when: float, callback: Callable[[], None]) -> Timer:
        return asyncio.get_running_loop().call_at(when, callback)

    async def sleep(self, delay: float) -> None:
        await asyncio.sleep(max(0.0, delay))

    def wall(self) -> float:
        return time.time()


class _FakeTimer:
    __slots__ = ("callback", "cancelled")

    def __init__(self, callback: Callable[[], None]) -> None:
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class FakeClock:
    """Time that moves only with `advance()`; starts at `start` (wall time at `wall_start`)."""

    def __init__(self, start: float = 1000.0, wall_start: float = 1_800_000_000.0) -> None:
        self._now = start
        self._wall_offset = wall_start - start
        self._timers: list[tuple[float, int, _FakeTimer]] = []
        self._seq = itertools.count()

    def now(self) -> float:
        return self._now

    def wall(self) -> float:
        return self._now + self._wall_offset

    def call_at(self, when: float, callback: Callable[[], None]) -> Timer:
        timer = _FakeTimer(callback)
        heapq.heappush(self._timers, (when, next(self._seq), timer))
        return timer

    async def sleep(self, delay: float) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def wake() -> None:
            if not future.done():
                future.set_result(None)

        timer = self.call_at(self._now + max(0.0, delay), wake)
        try:
            await future
        finally:
            timer.cancel()

    def advance(self, delta: float) -> None:
        """Move time forward by `delta`, firing every timer that falls due, in order."""
        target = self._now + delta
        while self._timers and self._timers[0][0] <= target:
            when, _, timer = heapq.heappop(self._timers)
            self._now = max(self._now, when)
            if not timer.cancelled:
                timer.callback()
        self._now = target

    @property
    def pending(self) -> int:
        """Number of live timers (for assertions)."""
        return sum(1 for _, _, t in self._timers if not t.cancelled)
