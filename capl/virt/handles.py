"""The handles of one libvirt host: which ``virConnect`` serves a call, keepalive, loss and
reconnect, and the event callbacks on the primary handle.

Handles
-------
libvirt 9.0's RPC client misbehaves when several threads wait on one ``virConnect`` and the
connection dies: keepalive closing it wakes only one of the waiting threads, the others stay
blocked, and when the link returns the process can crash inside libvirt
(tests/chaos/test_remote_connection_drop.py). So a connection that speaks RPC (every URI
except the in-process test driver ``test:///...``) is never used by two calls at once:

- each call checks a handle (a ``virConnect``) out of the host's pool of idle handles, or
  opens a new one, uses it alone, and gives it back; there are never more handles than
  threads that run calls (the host's ``max_workers`` plus one per ``serial`` key), and a
  lightly used host needs one;
- the first handle is the *primary*: it carries the close callback and the domain lifecycle
  callbacks (run on the process-wide libvirt event thread, ``capl.virt.events``) and, while no
  call uses it, serves calls like any other handle (callbacks make no RPC calls);
- a call that makes a stream (volume upload, console) hands its handle over to that stream:
  it never goes back to the pool, so the stream's later calls, from whatever thread, are the
  only ones on it; the stream's reference keeps the connection open while it lives;
- a handle is closed only when no call uses it (returned stale, or idle); closing happens on a
  short-lived thread, since closing a connection whose peer vanished can block.

``test:///...`` runs the driver inside this process, without RPC: one shared handle serves all
calls at once (as the driver allows), and each ``test:///file.xml`` connection would have
private state anyway.

Keepalive and loss
------------------
Every handle that speaks RPC asks for ``setKeepAlive(5, 3)`` (a failure is only logged): a
dead peer is noticed in ~20 s, and each blocked call on it fails then. A connection error on
any handle, a failed open, or the primary's close callback marks the host *lost*: the epoch
advances (every handle opened before is stale and closed once free), ``HostEvent
(DISCONNECTED)`` is published, and a reconnector thread reopens the primary with exponential
backoff (0.5 s doubling to 30 s, first attempt at once); its success bumps ``generation``,
registers the callbacks again and publishes ``HostEvent(CONNECTED)`` so the controllers
requeue that host's objects. While the host is lost, and during the backoff window after a
failed first connect, new calls fail at once with ``HostUnreachable`` (the last error and
when the next attempt is due) instead of queueing on a dead host.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import urlsplit

import libvirt

from capl.ports.errors import HostUnreachable, VirtError
from capl.ports.virt import DomainEvent, HostEvent, HostEventKind
from capl.virt.connecthints import connect_hint
from capl.virt.counting import LOOKUP_GONE, CallCounter, Counted
from capl.virt.errors import is_connection_error, translate
from capl.virt.events import EventHub, ensure_event_loop
from capl.virt.states import close_reason_name, event_detail_name, event_kind
from capl.virt.uri import ConnectPlan

__all__ = ["Handle", "HandlePool", "alive", "dispose_later", "in_process"]

log = logging.getLogger(__name__)

T = TypeVar("T")

KEEPALIVE_INTERVAL = 5
KEEPALIVE_COUNT = 3
_BACKOFF_FIRST = 0.5
_BACKOFF_MAX = 30.0


def _backoff(failures: int) -> float:
    return float(min(_BACKOFF_MAX, _BACKOFF_FIRST * (2 ** max(0, failures - 1))))


def _code(exc: VirtError | libvirt.libvirtError) -> int | None:
    return exc.code if isinstance(exc, VirtError) else exc.get_error_code()


def in_process(plan: ConnectPlan) -> bool:
    """True when the driver runs inside this process (``test:///...``: no transport, no
    host), so there is no RPC: no keepalive, and one handle may serve every call."""
    try:
        scheme = urlsplit(plan.uri).scheme
    except ValueError:
        return False
    return plan.driver == "test" and "+" not in scheme and not plan.remote


def alive(conn: Any) -> bool:
    try:
        return bool(conn.isAlive())
    except libvirt.libvirtError:
        return False


def _dispose(handles: list[Handle]) -> None:
    """Deregister a primary's callbacks and close each handle (no call uses them)."""
    for handle in handles:
        conn = handle.conn
        if handle.primary:
            for callback_id in handle.callback_ids:
                with contextlib.suppress(libvirt.libvirtError):
                    conn.domainEventDeregisterAny(callback_id)
            with contextlib.suppress(libvirt.libvirtError):
                conn.unregisterCloseCallback()
        with contextlib.suppress(libvirt.libvirtError):
            conn.close()


_disposing = threading.Lock()


def dispose_later(handles: list[Handle]) -> threading.Thread | None:
    """Close ``handles`` on a short-lived thread: closing a connection whose peer vanished
    blocks until keepalive gives up, and no caller should wait for that. Each handle is
    closed once, whoever asks how often."""
    with _disposing:
        handles = [h for h in handles if not h.disposed]
        for handle in handles:
            handle.disposed = True
    if not handles:
        return None
    thread = threading.Thread(target=_dispose, args=(handles,), name="libvirt-close", daemon=True)
    thread.start()
    return thread


class Handle:
    """One ``virConnect`` and what the pool knows about it."""

    __slots__ = (
        "callback_ids",
        "conn",
        "disposed",
        "epoch",
        "lent",
        "lookups",
        "lookups_epoch",
        "primary",
        "shared",
        "streams",
        "users",
    )

    def __init__(self, conn: Any, *, epoch: int, primary: bool, shared: bool) -> None:
        self.conn = conn
        self.epoch = epoch
        self.primary = primary
        self.shared = shared  # the in-process driver's one handle: calls use it at once
        self.streams: set[int] = set()  # streams made on it and not finished or aborted
        self.lent = False  # left the pool for its streams; back when the last one ends
        self.users = 0
        self.disposed = False
        self.callback_ids: list[int] = []
        self.lookups: dict[tuple[str, str], Any] = {}  # pools, networks (counting.remembered)
        self.lookups_epoch = 0


class HandlePool:
    """The handles of one host and their life (see the module docstring). ``invoke`` runs on
    worker threads; the callbacks run on the libvirt event thread."""

    def __init__(self, plan: ConnectPlan, *, hub: EventHub, counter: CallCounter) -> None:
        self.plan = plan
        self.host_id = plan.host_id
        self._hub = hub
        self._counter = counter
        self._in_process = in_process(plan)
        self._state = threading.Lock()  # short critical sections only (event thread uses it)
        self._opening = threading.Lock()  # serializes opening the primary
        self._primary: Handle | None = None
        self._idle: list[Handle] = []
        self._epoch = 0  # advances on every loss: handles of older epochs are stale
        self._generation = 0  # advances on every successful (re)open of the primary
        self._lost = False  # the connection was lost and the reconnector is at work
        self._failures = 0
        self._next_attempt = 0.0
        self._last_error: HostUnreachable | None = None
        self._closed = False
        self._stop = threading.Event()
        self._reconnecting = False  # a reconnector thread is at work
        self.lookup_epoch = 0  # advances when the handles must forget their look-ups

    @property
    def connected(self) -> bool:
        with self._state:
            return self._primary is not None and not self._lost

    @property
    def generation(self) -> int:
        """Increases with every successful (re)connect."""
        with self._state:
            return self._generation

    @property
    def idle(self) -> int:
        """Open handles the pool holds idle (the primary included when idle)."""
        with self._state:
            return len(self._idle)

    def refusal(self, action: str) -> HostUnreachable | None:
        """Why a call must fail at once (closed, lost, in the backoff window), or None."""
        with self._state:
            return self._unavailable(action)

    def mark_lost(self, why: str) -> None:
        """What the close callback does: the connection is gone, reconnect in the background."""
        with self._state:
            epoch = self._epoch
        self._lose(
            epoch, HostUnreachable(f"connection to {self.host_id} lost: {why}", host=self.host_id)
        )

    def count(self, method: str) -> None:
        self._counter.add(self.host_id, method)

    def forget_lookups(self) -> None:
        """Every handle forgets the pools and networks it remembered (counting.remembered)."""
        with self._state:
            self.lookup_epoch += 1

    def close(self) -> threading.Thread | None:
        """Fail every new call, stop the reconnector, close the idle handles (handles in use
        are closed when their call returns); returns the thread closing them, if any."""
        with self._state:
            self._closed = True
            self._epoch += 1
            free = self._take_free()
        self._stop.set()
        return dispose_later(free)

    def _unavailable(self, action: str) -> HostUnreachable | None:
        """Why a call must fail at once, or None (holding ``_state``)."""
        if self._closed:
            return HostUnreachable(f"{action}: host {self.host_id} is closed", host=self.host_id)
        error = self._last_error
        if error is None:
            return None
        waiting = self._next_attempt - time.monotonic()
        if self._lost:
            when = f"next attempt in {waiting:.1f}s" if waiting > 0 else "reconnecting"
        elif waiting > 0:
            when = f"next attempt in {waiting:.1f}s"
        else:
            return None  # the backoff window after a failed connect is over: try again
        # the same words as the failed connect itself (only the schedule is added): a caller
        # that reports the outage (a condition) sees one message whether its call tried to
        # connect or was refused during the backoff, so an unchanged outage writes nothing
        return HostUnreachable(f"{error.message} ({when})", host=self.host_id, code=error.code)

    def _take_free(self) -> list[Handle]:
        """Empty the pool (holding ``_state``): the handles no call uses, for disposal."""
        free = list(self._idle)
        self._idle = []
        primary, self._primary = self._primary, None
        # an idle primary is in the pool already; the in-process one never is
        if primary is not None and primary.shared and primary.users == 0:
            free.append(primary)
        return free

    # -- worker-thread side ---------------------------------------------------------------

    def invoke(self, action: str, fn: Callable[[Any], T]) -> T:
        handle = self._checkout(action)
        broken: HostUnreachable | None = None
        try:
            try:
                return fn(Counted(handle.conn, self, handle))
            except (VirtError, libvirt.libvirtError) as exc:
                if not (handle.lookups and _code(exc) in LOOKUP_GONE):
                    raise
                # a pool or network the handle remembered is gone (re-created elsewhere):
                # once more, looked up afresh (the stale object's first call failed, so
                # nothing was changed through it)
                handle.lookups.clear()
                return fn(Counted(handle.conn, self, handle))
        except VirtError as error:  # raised by the operation itself: say which host
            if error.host is None:
                error.host = self.host_id
            if isinstance(error, HostUnreachable) and not alive(handle.conn):
                broken = error
            raise
        except libvirt.libvirtError as exc:
            if is_connection_error(exc) or not alive(handle.conn):
                broken = HostUnreachable(
                    f"{action} on {self.host_id}: connection lost: {exc.get_error_message()}",
                    host=self.host_id,
                    code=exc.get_error_code(),
                )
                raise broken from exc
            raise translate(exc, host=self.host_id, action=action) from exc
        finally:
            self._checkin(handle, broken)

    def _checkout(self, action: str) -> Handle:
        """A handle for one call: idle, or newly opened (the primary first)."""
        while True:
            with self._state:
                refused = self._unavailable(action)
                if refused is not None:
                    raise refused
                primary, epoch = self._primary, self._epoch
                if primary is not None and primary.shared:
                    primary.users += 1
                    return primary
                candidate = self._idle.pop() if primary is not None and self._idle else None
                if candidate is not None:
                    candidate.users += 1
            if candidate is not None:
                # isAlive is local (no RPC); asked outside our lock
                if candidate.epoch == epoch and alive(candidate.conn):
                    return candidate
                self._discard(candidate, epoch)
                continue
            if primary is None:
                opened = self._open_primary(action, checkout=True, force=False)
                if opened is not None:
                    return opened
                continue  # someone else opened it meanwhile: take a handle from the pool
            return self._open_worker(action, epoch)

    def _discard(self, handle: Handle, epoch: int) -> None:
        """An idle handle found dead or stale (checked out by us); a dead current primary
        means the host is lost."""
        if handle.primary and handle.epoch == epoch:
            self._lose(
                epoch,
                HostUnreachable(
                    f"connection to {self.host_id} lost: connection is no longer alive",
                    host=self.host_id,
                ),
            )
        with self._state:
            handle.users -= 1
            free = handle is not self._primary
        if free:
            dispose_later([handle])

    def _checkin(self, handle: Handle, broken: HostUnreachable | None) -> None:
        if broken is None and not alive(handle.conn):
            broken = HostUnreachable(
                f"connection to {self.host_id} lost: connection is no longer alive",
                host=self.host_id,
            )
        if broken is not None:
            self._lose(handle.epoch, broken)
        with self._state:
            handle.users -= 1
            if handle.streams and not handle.shared:
                handle.lent = True  # its streams own it until they end
                return
        self._release(handle)

    def _release(self, handle: Handle) -> None:
        """A handle no call or stream uses any more: back to the pool, or closed if stale."""
        is_alive = alive(handle.conn)
        dispose = False
        with self._state:
            if handle.users or handle.lent or handle.streams:
                return
            current = handle.epoch == self._epoch and not self._closed
            if current and is_alive:
                if not handle.shared:
                    self._idle.append(handle)
            elif handle is not self._primary:
                dispose = True
        if dispose:
            dispose_later([handle])

    def stream_made(self, handle: Handle, key: int) -> None:
        with self._state:
            handle.streams.add(key)

    def stream_ended(self, handle: Handle, key: int) -> None:
        with self._state:
            handle.streams.discard(key)
            if handle.streams or not handle.lent:
                return
            handle.lent = False
        self._release(handle)

    def open_dedicated(self, action: str) -> Any:
        """A ``virConnect`` outside the pool for one call that holds its connection for
        minutes (a migration job): keepalive on, no callbacks, not counted per call; the
        caller closes it (``dispose_connection``). Refused fast while the host is lost."""
        with self._state:
            refused = self._unavailable(action)
        if refused is not None:
            raise refused
        return self._connect()

    def _connect(self) -> Any:
        """Open one ``virConnect`` (keepalive on when it speaks RPC)."""
        ensure_event_loop()
        self.count("virConnect.open")
        try:
            conn = libvirt.open(self.plan.uri)
        except libvirt.libvirtError as exc:
            detail = " ".join((exc.get_error_message() or str(exc)).split())
            hint = connect_hint(self.plan.transport, detail)
            if hint:
                detail = f"{hint}: {detail}"
            raise HostUnreachable(
                f"connect to {self.host_id}: {detail}",
                host=self.host_id,
                code=exc.get_error_code(),
            ) from exc
        if conn is None:  # old bindings returned None instead of raising
            raise HostUnreachable(f"connect to {self.host_id} failed", host=self.host_id)
        if not self._in_process:  # a remote peer (or libvirtd) can vanish: notice it
            try:
                self.count("virConnect.setKeepAlive")
                conn.setKeepAlive(KEEPALIVE_INTERVAL, KEEPALIVE_COUNT)
            except libvirt.libvirtError as exc:
                log.debug("keepalive not available on %s: %s", self.host_id, exc)
        return conn

    def _open_worker(self, action: str, epoch: int) -> Handle:
        try:
            conn = self._connect()
        except HostUnreachable as error:
            self._lose(epoch, error)
            raise
        handle = Handle(conn, epoch=epoch, primary=False, shared=False)
        handle.users = 1
        with self._state:
            stale = self._closed or epoch != self._epoch
        if stale:
            dispose_later([handle])
            with self._state:
                refused = self._unavailable(action)
            raise refused or HostUnreachable(
                f"{action} on {self.host_id}: connection lost meanwhile", host=self.host_id
            )
        return handle

    def _open_primary(self, action: str, *, checkout: bool, force: bool) -> Handle | None:
        """Open the primary connection; None when another thread opened it meanwhile.
        ``force``: the reconnector, which ignores the lost state and the backoff window."""
        with self._opening:
            with self._state:
                if self._closed:
                    raise HostUnreachable(f"host {self.host_id} is closed", host=self.host_id)
                if self._primary is not None:
                    return None
                if not force:
                    refused = self._unavailable(action)
                    if refused is not None:
                        raise refused
                epoch = self._epoch
            try:
                conn = self._connect()
            except HostUnreachable as error:
                with self._state:
                    self._failures += 1
                    self._next_attempt = time.monotonic() + _backoff(self._failures)
                    self._last_error = error
                raise
            handle = Handle(conn, epoch=epoch, primary=True, shared=self._in_process)
            with self._state:
                generation = self._generation + 1
            try:
                self.count("virConnect.registerCloseCallback")
                conn.registerCloseCallback(self._on_close, generation)
            except libvirt.libvirtError as exc:
                log.debug("close callback not available on %s: %s", self.host_id, exc)
            try:
                self.count("virConnect.domainEventRegisterAny")
                handle.callback_ids.append(
                    conn.domainEventRegisterAny(
                        None, libvirt.VIR_DOMAIN_EVENT_ID_LIFECYCLE, self._on_lifecycle, generation
                    )
                )
            except libvirt.libvirtError as exc:
                log.warning("domain events not available on %s: %s", self.host_id, exc)
            with self._state:
                usable = not self._closed and epoch == self._epoch
                if usable:
                    self._generation = generation
                    self._primary = handle
                    self._lost = False
                    self._failures = 0
                    self._next_attempt = 0.0
                    self._last_error = None
                    if checkout or handle.shared:
                        handle.users += int(checkout)
                    else:
                        self._idle.append(handle)
            if not usable:
                dispose_later([handle])
                raise HostUnreachable(
                    f"{action}: host {self.host_id} was closed or lost meanwhile",
                    host=self.host_id,
                )
        log.info("connected to %s", self.host_id)
        self._hub.publish(HostEvent(host_id=self.host_id, kind=HostEventKind.CONNECTED))
        return handle

    def _lose(self, epoch: int, error: HostUnreachable) -> None:
        """The connection of ``epoch`` is gone: make every handle of it stale, fail new
        calls fast, reconnect in the background (once per loss)."""
        with self._state:
            if self._closed or epoch != self._epoch:
                return  # closed, or a loss already handled
            self._epoch += 1
            self._lost = True
            self._last_error = error
            self._next_attempt = 0.0
            free = self._take_free()
        dispose_later(free)
        log.warning("%s", error.message)
        self._hub.publish(
            HostEvent(host_id=self.host_id, kind=HostEventKind.DISCONNECTED, message=error.message)
        )
        self._start_reconnector()

    def _start_reconnector(self) -> None:
        with self._state:
            if self._closed or self._reconnecting:
                return
            self._reconnecting = True
        thread = threading.Thread(
            target=self._reconnect_loop, name=f"libvirt-reconnect-{self.host_id}", daemon=True
        )
        thread.start()

    def _reconnect_loop(self) -> None:
        """Reopen the primary until it holds; the decision to stop and ``_reconnecting`` change
        under one lock, so a loss right then starts a new loop instead of being missed."""
        delay = _BACKOFF_FIRST
        while True:
            with self._state:
                if not self._lost or self._closed or self._stop.is_set():
                    self._reconnecting = False
                    return
            try:
                self._open_primary("reconnect", checkout=False, force=True)
            except VirtError as exc:
                log.info("reconnect to %s failed, retrying in %.1fs: %s", self.host_id, delay, exc)
            else:
                with self._state:
                    if not self._lost:
                        self._reconnecting = False
                        return
                # lost again at once: keep backing off
            with self._state:
                self._next_attempt = time.monotonic() + delay
            self._stop.wait(delay)
            delay = min(_BACKOFF_MAX, delay * 2)

    # -- event-thread side ----------------------------------------------------------------

    def _on_close(self, conn: Any, reason: int, generation: int) -> None:
        with self._state:
            primary = self._primary
            current = primary is not None and generation == self._generation and not self._lost
            epoch = self._epoch
        if current:
            why = f"closed by libvirt ({close_reason_name(reason)})"
            self._lose(
                epoch,
                HostUnreachable(f"connection to {self.host_id} lost: {why}", host=self.host_id),
            )

    def _on_lifecycle(
        self, conn: Any, domain: Any, event: int, detail: int, generation: int
    ) -> None:
        try:
            uuid, name = domain.UUIDString(), domain.name()
        except libvirt.libvirtError:
            return
        self._hub.publish(
            DomainEvent(
                host_id=self.host_id,
                uuid=uuid,
                name=name,
                kind=event_kind(event),
                detail=event_detail_name(event, detail),
            )
        )
