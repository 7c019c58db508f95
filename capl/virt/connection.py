"""Connections to one libvirt host: per-call handles, keepalive, deadlines, reconnect, events.

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

Deadlines and the in-flight cap
-------------------------------
Every call has an asyncio-side deadline (``call_timeout``, 30 s by default; calls made in a
``long_calls()`` block, e.g. base image imports, and volume uploads get ``long_call_timeout``).
When it passes, the caller gets ``HostUnreachable`` naming the host and the action and moves
on; the thread stays behind until libvirt returns (keepalive bounds that on a dead link), and
a call still queued is dropped. Calls submitted and not yet finished (including those left
behind) are capped per host (``max_inflight``): beyond it new calls fail at once, so a host
that stopped answering cannot collect an unbounded queue while other hosts carry on.

Other duties
------------
- A failed connect whose libvirt text is a known credentials problem (ssh host key mismatch,
  key refused, TLS certificate not trusted either way) gets a hint in front of libvirt's
  verbatim text that names the Secret key at fault (``connect_hint``).
- Every libvirt call made through ``run`` is counted per host and method
  (``virDomain.create``...) by a transparent proxy around the connection and the objects it
  returns; methods that never leave the process (``name``, ``UUIDString``...) are not
  counted. The benchmark reads the counts ("libvirt calls per machine").
- Object handles (domains, volumes, ...) are not cached across calls: each call looks up
  what it needs and the handles are freed when the call returns, so a reconnect never
  leaves stale handles behind.
- Operations that must not overlap (read-modify-write of one network or pool) name a
  ``serial`` key and run, in order, on that key's own single thread: they queue there rather
  than in the shared pool (where a worker waiting for a lock is lost to every other
  operation), and run back to back without a round trip through the event loop between two
  of them (which a busy loop would stretch).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextvars import ContextVar
from typing import Any, TypeVar
from urllib.parse import urlsplit

import libvirt

from capl.ports.errors import HostUnreachable, VirtError
from capl.ports.virt import DomainEvent, DomainEventKind, HostEvent, HostEventKind, HostId
from capl.virt.errors import is_connection_error, translate
from capl.virt.events import EventHub, ensure_event_loop
from capl.virt.states import event_detail_name
from capl.virt.uri import ConnectPlan

__all__ = [
    "CALL_TIMEOUT",
    "LONG_CALL_TIMEOUT",
    "CallCounter",
    "HostConnection",
    "connect_hint",
    "in_process",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

KEEPALIVE_INTERVAL = 5
KEEPALIVE_COUNT = 3
CALL_TIMEOUT = 30.0
"""Seconds an ordinary call may take before its caller gets ``HostUnreachable``."""
LONG_CALL_TIMEOUT = 1800.0
"""The same for long calls: volume uploads, base image imports (``long_calls()``)."""
_BACKOFF_FIRST = 0.5
_BACKOFF_MAX = 30.0

_long_calls: ContextVar[bool] = ContextVar("capl_virt_long_calls", default=False)

_LOCAL_METHODS = frozenset(
    {"name", "UUIDString", "UUID", "key", "ID", "connect", "isAlive", "getURI"}
)
_WRAPPED_TYPES = (
    libvirt.virDomain,
    libvirt.virNetwork,
    libvirt.virStoragePool,
    libvirt.virStorageVol,
    libvirt.virStream,
    libvirt.virInterface,
)

_EVENT_KINDS = {
    libvirt.VIR_DOMAIN_EVENT_DEFINED: DomainEventKind.DEFINED,
    libvirt.VIR_DOMAIN_EVENT_UNDEFINED: DomainEventKind.UNDEFINED,
    libvirt.VIR_DOMAIN_EVENT_STARTED: DomainEventKind.STARTED,
    libvirt.VIR_DOMAIN_EVENT_SUSPENDED: DomainEventKind.SUSPENDED,
    libvirt.VIR_DOMAIN_EVENT_RESUMED: DomainEventKind.RESUMED,
    libvirt.VIR_DOMAIN_EVENT_STOPPED: DomainEventKind.STOPPED,
    libvirt.VIR_DOMAIN_EVENT_SHUTDOWN: DomainEventKind.SHUTDOWN,
    libvirt.VIR_DOMAIN_EVENT_PMSUSPENDED: DomainEventKind.PMSUSPENDED,
    libvirt.VIR_DOMAIN_EVENT_CRASHED: DomainEventKind.CRASHED,
}
_CLOSE_REASONS = {0: "error", 1: "end of file", 2: "keepalive timeout", 3: "client closed"}

_SSH = frozenset({"ssh", "libssh", "libssh2"})
_TLS = frozenset({"tls"})
# (transports, text in libvirt's message, what it means in terms of the credentials Secret).
# The first match wins; libvirt's own text always follows the hint verbatim.
_CONNECT_HINTS: tuple[tuple[frozenset[str], str, str], ...] = (
    (
        _SSH,
        "REMOTE HOST IDENTIFICATION HAS CHANGED",
        "ssh host key verification failed: the host's key does not match known_hosts"
        " of the credentials Secret",
    ),
    (
        _SSH,
        "host key is known for",
        "ssh host key verification failed: known_hosts of the credentials Secret has no key"
        " for this host (with a port other than 22 the entry is written [host]:port)",
    ),
    (_SSH, "Host key verification failed", "ssh host key verification failed"),
    (
        _SSH,
        "Permission denied",
        "ssh authentication failed: the host did not accept the private key of the"
        " credentials Secret",
    ),
    (
        _TLS,
        "Our own certificate",
        "TLS client certificate unusable: tls.crt is not signed by ca.crt of the"
        " credentials Secret",
    ),
    (
        _TLS,
        "do not match",
        "TLS client certificate unusable: tls.key is not the key of tls.crt",
    ),
    (
        _TLS,
        "Unable to import",
        "TLS credentials unusable: a file of the credentials Secret is not valid PEM",
    ),
    (
        _TLS,
        "Cannot read CA certificate",
        "TLS credentials missing: give the host a credentials Secret with ca.crt, tls.crt"
        " and tls.key",
    ),
    (
        _TLS,
        "Failed to verify peer's certificate",
        "TLS server certificate not trusted: the host's certificate is not signed by ca.crt"
        " of the credentials Secret, or does not name the host of the URI",
    ),
    (
        _TLS,
        "Unable to read TLS confirmation",
        "the host rejected the TLS connection, most likely the client certificate: tls.crt"
        " must be signed by a CA the host trusts (and match its tls_allowed_dn_list)",
    ),
)


def connect_hint(transport: str, detail: str) -> str | None:
    """What a failed connect means for the user, when libvirt's text is a known one."""
    for transports, needle, hint in _CONNECT_HINTS:
        if transport in transports and needle in detail:
            return hint
    return None


class CallCounter:
    """Thread-safe counts of libvirt calls per host and method."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: defaultdict[HostId, defaultdict[str, int]] = defaultdict(
            lambda: defaultdict(int)
        )

    def add(self, host: HostId, method: str) -> None:
        with self._lock:
            self._counts[host][method] += 1

    def snapshot(self) -> dict[HostId, dict[str, int]]:
        with self._lock:
            return {host: dict(methods) for host, methods in self._counts.items()}

    def total(self, host: HostId | None = None) -> int:
        with self._lock:
            hosts = [host] if host is not None else list(self._counts)
            return sum(sum(self._counts[h].values()) for h in hosts if h in self._counts)

    def reset(self) -> None:
        with self._lock:
            self._counts.clear()


class _Handle:
    """One ``virConnect`` and what the pool knows about it."""

    __slots__ = (
        "callback_ids",
        "conn",
        "disposed",
        "epoch",
        "lent",
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


class _Counted:
    """Forwards attribute access to a libvirt object, counting the RPC-backed calls; a stream
    made through it keeps its handle out of the pool until the stream is finished or aborted
    (see the module docstring)."""

    __slots__ = ("_handle", "_owner", "_target")

    def __init__(self, target: Any, owner: HostConnection, handle: _Handle) -> None:
        object.__setattr__(self, "_target", target)
        object.__setattr__(self, "_owner", owner)
        object.__setattr__(self, "_handle", handle)

    def __getattr__(self, attr: str) -> Any:
        target = self._target
        value = getattr(target, attr)
        if attr.startswith("_") or attr in _LOCAL_METHODS or not callable(value):
            return value
        method = f"{type(target).__name__}.{attr}"
        owner = self._owner
        handle = self._handle
        ends_stream = attr in _STREAM_ENDS and isinstance(target, libvirt.virStream)

        def call(*args: Any, **kwargs: Any) -> Any:
            owner.count(method)
            try:
                return _wrap(value(*args, **kwargs), owner, handle)
            finally:
                if ends_stream:
                    owner._stream_ended(handle, id(target))

        return call


_STREAM_ENDS = frozenset({"finish", "abort"})


def _wrap(result: Any, owner: HostConnection, handle: _Handle) -> Any:
    if isinstance(result, _WRAPPED_TYPES):
        if isinstance(result, libvirt.virStream) and not handle.shared:
            owner._stream_made(handle, id(result))
        return _Counted(result, owner, handle)
    if isinstance(result, list) and result and isinstance(result[0], _WRAPPED_TYPES):
        return [_Counted(item, owner, handle) for item in result]
    return result


def _backoff(failures: int) -> float:
    return float(min(_BACKOFF_MAX, _BACKOFF_FIRST * (2 ** max(0, failures - 1))))


def in_process(plan: ConnectPlan) -> bool:
    """True when the driver runs inside this process (``test:///...``: no transport, no
    host), so there is no RPC: no keepalive, and one handle may serve every call."""
    try:
        scheme = urlsplit(plan.uri).scheme
    except ValueError:
        return False
    return plan.driver == "test" and "+" not in scheme and not plan.remote


def _alive(conn: Any) -> bool:
    try:
        return bool(conn.isAlive())
    except libvirt.libvirtError:
        return False


def _dispose(handles: list[_Handle]) -> None:
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


def _dispose_later(handles: list[_Handle]) -> threading.Thread | None:
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
        self._hub = hub
        self._counter = counter
        self._in_process = in_process(plan)
        self._executor = ThreadPoolExecutor(
            max_workers=max_workers, thread_name_prefix=f"libvirt-{plan.driver}"
        )
        self._state = threading.Lock()  # short critical sections only (event thread uses it)
        self._opening = threading.Lock()  # serializes opening the primary
        self._primary: _Handle | None = None
        self._idle: list[_Handle] = []
        self._epoch = 0  # advances on every loss: handles of older epochs are stale
        self._generation = 0  # advances on every successful (re)open of the primary
        self._lost = False  # the connection was lost and the reconnector is at work
        self._failures = 0
        self._next_attempt = 0.0
        self._last_error: HostUnreachable | None = None
        self._inflight = 0
        self._closed = False
        self._stop = threading.Event()
        self._reconnecting = False  # a reconnector thread is at work
        self._serial: dict[str, ThreadPoolExecutor] = {}

    # -- public ---------------------------------------------------------------------------

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
    def inflight(self) -> int:
        """Calls submitted and not finished, including those whose caller gave up."""
        with self._state:
            return self._inflight

    @property
    def handles(self) -> int:
        """Open handles the pool holds idle (the primary included when idle)."""
        with self._state:
            return len(self._idle)

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
        with self._state:
            refused = self._unavailable(action)
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
            submitted = executor.submit(self._invoke, action, fn)
        except RuntimeError:  # the executor is shut down: the host was closed
            self._call_done(None)
            raise HostUnreachable(
                f"{action}: host {self.host_id} is closed", host=self.host_id
            ) from None
        submitted.add_done_callback(self._call_done)
        try:
            return await asyncio.wait_for(asyncio.wrap_future(submitted), limit)
        except TimeoutError:
            raise HostUnreachable(
                f"{action} on {self.host_id}: no answer from the host within {limit:g} s",
                host=self.host_id,
            ) from None

    def mark_lost(self, why: str) -> None:
        """What the close callback does: the connection is gone, reconnect in the background."""
        with self._state:
            epoch = self._epoch
        self._lose(
            epoch, HostUnreachable(f"connection to {self.host_id} lost: {why}", host=self.host_id)
        )

    def count(self, method: str) -> None:
        self._counter.add(self.host_id, method)

    async def close(self) -> None:
        """Deregister callbacks, close the idle handles (handles in use are closed when
        their call returns), stop the threads, remove the credential files."""
        with self._state:
            self._closed = True
            self._epoch += 1
            free = self._take_free()
            serial, self._serial = list(self._serial.values()), {}
        self._stop.set()
        try:
            thread = _dispose_later(free)
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
        return HostUnreachable(
            f"{action}: {error.message} ({when})", host=self.host_id, code=error.code
        )

    def _take_free(self) -> list[_Handle]:
        """Empty the pool (holding ``_state``): the handles no call uses, for disposal."""
        free = list(self._idle)
        self._idle = []
        primary, self._primary = self._primary, None
        # an idle primary is in the pool already; the in-process one never is
        if primary is not None and primary.shared and primary.users == 0:
            free.append(primary)
        return free

    # -- worker-thread side ---------------------------------------------------------------

    def _invoke(self, action: str, fn: Callable[[Any], T]) -> T:
        handle = self._checkout(action)
        broken: HostUnreachable | None = None
        try:
            return fn(_Counted(handle.conn, self, handle))
        except VirtError as error:  # raised by the operation itself: say which host
            if error.host is None:
                error.host = self.host_id
            if isinstance(error, HostUnreachable) and not _alive(handle.conn):
                broken = error
            raise
        except libvirt.libvirtError as exc:
            if is_connection_error(exc) or not _alive(handle.conn):
                broken = HostUnreachable(
                    f"{action} on {self.host_id}: connection lost: {exc.get_error_message()}",
                    host=self.host_id,
                    code=exc.get_error_code(),
                )
                raise broken from exc
            raise translate(exc, host=self.host_id, action=action) from exc
        finally:
            self._checkin(handle, broken)

    def _checkout(self, action: str) -> _Handle:
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
                if candidate.epoch == epoch and _alive(candidate.conn):
                    return candidate
                self._discard(candidate, epoch)
                continue
            if primary is None:
                opened = self._open_primary(action, checkout=True, force=False)
                if opened is not None:
                    return opened
                continue  # someone else opened it meanwhile: take a handle from the pool
            return self._open_worker(action, epoch)

    def _discard(self, handle: _Handle, epoch: int) -> None:
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
            _dispose_later([handle])

    def _checkin(self, handle: _Handle, broken: HostUnreachable | None) -> None:
        if broken is None and not _alive(handle.conn):
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

    def _release(self, handle: _Handle) -> None:
        """A handle no call or stream uses any more: back to the pool, or closed if stale."""
        alive = _alive(handle.conn)
        dispose = False
        with self._state:
            if handle.users or handle.lent or handle.streams:
                return
            current = handle.epoch == self._epoch and not self._closed
            if current and alive:
                if not handle.shared:
                    self._idle.append(handle)
            elif handle is not self._primary:
                dispose = True
        if dispose:
            _dispose_later([handle])

    def _stream_made(self, handle: _Handle, key: int) -> None:
        with self._state:
            handle.streams.add(key)

    def _stream_ended(self, handle: _Handle, key: int) -> None:
        with self._state:
            handle.streams.discard(key)
            if handle.streams or not handle.lent:
                return
            handle.lent = False
        self._release(handle)

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

    def _open_worker(self, action: str, epoch: int) -> _Handle:
        try:
            conn = self._connect()
        except HostUnreachable as error:
            self._lose(epoch, error)
            raise
        handle = _Handle(conn, epoch=epoch, primary=False, shared=False)
        handle.users = 1
        with self._state:
            stale = self._closed or epoch != self._epoch
        if stale:
            _dispose_later([handle])
            with self._state:
                refused = self._unavailable(action)
            raise refused or HostUnreachable(
                f"{action} on {self.host_id}: connection lost meanwhile", host=self.host_id
            )
        return handle

    def _open_primary(self, action: str, *, checkout: bool, force: bool) -> _Handle | None:
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
            handle = _Handle(conn, epoch=epoch, primary=True, shared=self._in_process)
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
                _dispose_later([handle])
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
        _dispose_later(free)
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
            why = f"closed by libvirt ({_CLOSE_REASONS.get(reason, reason)})"
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
                kind=_EVENT_KINDS.get(event, DomainEventKind.UNKNOWN),
                detail=event_detail_name(event, detail),
            )
        )
