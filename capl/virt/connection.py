"""Connections to one libvirt host: how a call is scheduled and timed (``HostConnection``).

Which ``virConnect`` serves a call, keepalive, loss, reconnect and the event callbacks are the
handle pool's (``capl.virt.handles``); counting calls is ``capl.virt.counting``'s; hints for
failed connects are ``capl.virt.connecthints``'s. ``HostConnection.run`` puts them together:
a call runs ``fn(conn)`` on a worker thread with a handle of its own, counted, and libvirt
errors come back as typed errors naming the host.

Deadlines and the in-flight cap
-------------------------------
Every call has an asyncio-side deadline (``call_timeout``, 30 s by default; calls made in a
``long_calls()`` block, e.g. base image imports, and volume uploads get ``long_call_timeout``).
When it passes, the caller gets ``HostUnreachable`` naming the host and the action and moves
on; the thread stays behind until libvirt returns (keepalive bounds that on a dead link), and
a call still queued is dropped. Calls submitted and not yet finished (including those left
behind) are capped per host (``max_inflight``): beyond it new calls fail at once, so a host
that stopped answering cannot collect an unbounded queue while other hosts carry on.

Serial keys and object handles
------------------------------
Object handles (domains, volumes, ...) are not cached across calls: each call looks up
what it needs and the handles are freed when the call returns, so a reconnect never
leaves stale handles behind.

Operations that must not overlap (read-modify-write of one network or pool) name a
``serial`` key and run, in order, on that key's own single thread: they queue there rather
than in the shared pool (where a worker waiting for a lock is lost to every other
operation), and run back to back without a round trip through the event loop between two
of them (which a busy loop would stretch).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextvars import ContextVar
from typing import Any, TypeVar

from capl.ports.errors import HostUnreachable
from capl.virt.connecthints import connect_hint
from capl.virt.counting import CallCounter
from capl.virt.events import EventHub
from capl.virt.handles import HandlePool, in_process
from capl.virt.uri import ConnectPlan

__all__ = [
    "CALL_TIMEOUT",
    "LONG_CALL_TIMEOUT",
    "CallCounter",
    "HostConnection",
    "connect_hint",
    "in_process",
]

T = TypeVar("T")

CALL_TIMEOUT = 30.0
"""Seconds an ordinary call may take before its caller gets ``HostUnreachable``."""
LONG_CALL_TIMEOUT = 1800.0
"""The same for long calls: volume uploads, base image imports (``long_calls()``)."""

_long_calls: ContextVar[bool] = ContextVar("capl_virt_long_calls", default=False)


class HostConnection:
    """The connections to one libvirt host (see the module docstring)."""

    def __init__(
        self,
        plan: ConnectPlan,
        *,
        hub: EventHub,
        counter: CallCounter,
        max_workers: int = 8,
        call_timeout: float = CALL_TIMEOUT,
        long_call_timeout: float = LONG_CALL_TIMEOUT,
        max_inflight: int | None = None,
    ) -> None:
        self.plan = plan
        self.host_id = plan.host_id
        self.call_timeout = call_timeout
        self.long_call_timeout = long_call_timeout
        self.max_inflight = max_inflight if max_inflight is not None else 4 * max_workers
        self.pool = HandlePool(plan, hub=hub, counter=counter)
        """The handles, their keepalive, loss and reconnect (``capl.virt.handles``)."""
        self._executor = ThreadPoolExecutor(
            max_workers=max_workers, thread_name_prefix=f"libvirt-{plan.driver}"
        )
        self._state = threading.Lock()
        self._inflight = 0
        self._closed = False
        self._serial: dict[str, ThreadPoolExecutor] = {}

    # -- public ---------------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        return self.pool.connected

    @property
    def generation(self) -> int:
        """Increases with every successful (re)connect."""
        return self.pool.generation

    @property
    def inflight(self) -> int:
        """Calls submitted and not finished, including those whose caller gave up."""
        with self._state:
            return self._inflight

    @property
    def handles(self) -> int:
        """Open handles the pool holds idle (the primary included when idle)."""
        return self.pool.idle

    @contextlib.contextmanager
    def long_calls(self) -> Iterator[None]:
        """Calls made inside (and by tasks created inside) get ``long_call_timeout``."""
        token = _long_calls.set(True)
        try:
            yield
        finally:
            _long_calls.reset(token)

    async def run(
        self,
        action: str,
        fn: Callable[[Any], T],
        *,
        serial: str | None = None,
        time_limit: float | None = None,
    ) -> T:
        """Run ``fn(conn)`` in the host's thread pool (or, with ``serial``, on that key's own
        thread, after the operations queued there before) on a connection no other call
        uses; libvirt errors become typed errors. ``HostUnreachable`` when the host is lost,
        too many calls are pending, or no answer came within ``time_limit`` (default: the
        connection's ``call_timeout``, or ``long_call_timeout`` inside ``long_calls()``)."""
        limit = time_limit
        if limit is None:
            limit = self.long_call_timeout if _long_calls.get() else self.call_timeout
        refused = self.pool.refusal(action)
        with self._state:
            if refused is None and self._inflight >= self.max_inflight:
                refused = HostUnreachable(
                    f"{action} on {self.host_id}: {self._inflight} calls to the host are "
                    f"still unanswered (limit {self.max_inflight})",
                    host=self.host_id,
                )
            if refused is None:
                self._inflight += 1
        if refused is not None:
            raise refused
        try:
            executor = self._executor if serial is None else self._serial_executor(serial)
            submitted = executor.submit(self.pool.invoke, action, fn)
        except RuntimeError:  # the executor is shut down: the host was closed
            self._call_done(None)
            raise HostUnreachable(
                f"{action}: host {self.host_id} is closed", host=self.host_id
            ) from None
        # the answer comes back by one call_soon_threadsafe and the deadline is one timer:
        # about half the CPU of asyncio.wrap_future under asyncio.timeout, for the
        # half-dozen calls of every machine
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[T] = loop.create_future()

        def finished(future: concurrent.futures.Future[T]) -> None:  # on the worker thread
            self._call_done(future)
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                loop.call_soon_threadsafe(_settle, future, waiter)

        submitted.add_done_callback(finished)
        timer = loop.call_later(limit, _expire, waiter)
        try:
            return await waiter
        except _Expired:
            raise HostUnreachable(
                f"{action} on {self.host_id}: no answer from the host within {limit:g} s",
                host=self.host_id,
            ) from None
        finally:
            timer.cancel()
            if not submitted.done():
                submitted.cancel()  # given up on (deadline, cancelled): dropped if queued

    def mark_lost(self, why: str) -> None:
        """What the close callback does: the connection is gone, reconnect in the background."""
        self.pool.mark_lost(why)

    def count(self, method: str) -> None:
        self.pool.count(method)

    async def close(self) -> None:
        """Deregister callbacks, close the idle handles (handles in use are closed when
        their call returns), stop the threads, remove the credential files."""
        with self._state:
            self._closed = True
            serial, self._serial = list(self._serial.values()), {}
        try:
            thread = self.pool.close()
            if thread is not None:  # bounded: a peer that vanished must not hold us up
                await asyncio.to_thread(thread.join, 10.0)
        finally:
            # queued calls still run, and fail at once: the host is closed
            self._executor.shutdown(wait=False)
            for executor in serial:
                executor.shutdown(wait=False)
            self.plan.cleanup()

    # -- asyncio side helpers -------------------------------------------------------------

    def _serial_executor(self, key: str) -> ThreadPoolExecutor:
        with self._state:
            if self._closed:
                raise RuntimeError("closed")
            executor = self._serial.get(key)
            if executor is None:
                executor = self._serial[key] = ThreadPoolExecutor(
                    max_workers=1, thread_name_prefix=f"libvirt-{self.plan.driver}-{key}"
                )
            return executor

    def _call_done(self, _future: concurrent.futures.Future[Any] | None) -> None:
        with self._state:
            self._inflight -= 1


class _Expired(Exception):
    """A call's deadline passed (set on its waiter by the timer)."""


def _expire(waiter: asyncio.Future[Any]) -> None:
    if not waiter.done():
        waiter.set_exception(_Expired())


def _settle(future: concurrent.futures.Future[T], waiter: asyncio.Future[T]) -> None:
    """On the loop: hand a finished call's outcome to its waiter (unless given up on)."""
    if waiter.done() or future.cancelled():
        return
    error = future.exception()
    if error is None:
        waiter.set_result(future.result())
    else:
        waiter.set_exception(error)
