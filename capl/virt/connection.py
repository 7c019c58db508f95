"""One shared libvirt connection per host: lazy open, keepalive, reconnect, events, counting.

- The connection opens lazily, in a worker thread, on the first call; every caller of that
  host shares it (a ``virConnect`` is thread-safe). Calls run in a bounded per-host
  ``ThreadPoolExecutor`` so a slow host cannot starve the others or the asyncio loop.
- Connections (all but the test driver's) get ``setKeepAlive(5, 3)``: a dead peer is
  noticed in ~20 s. The close
  callback (and any call failing with a connection error) drops the handle, publishes a
  ``HostEvent(DISCONNECTED)``, and starts a reconnector thread with exponential backoff
  (0.5 s doubling to 30 s); a successful (re)open registers the lifecycle callback again and
  publishes ``HostEvent(CONNECTED)``, so the controller can requeue that host's objects.
  Callers arriving during a backoff window get the last ``HostUnreachable`` at once instead
  of piling up connection attempts.
- A failed connect whose libvirt text is a known credentials problem (ssh host key
  mismatch, key refused, TLS certificate not trusted either way) gets a hint in front of
  libvirt's verbatim text that names the Secret key at fault (``connect_hint``).
- Every libvirt call made through ``run`` is counted per host and method
  (``virDomain.create``...) by a transparent proxy around the connection and the objects it
  returns; methods that never leave the process (``name``, ``UUIDString``...) are not
  counted. The benchmark reads the counts ("libvirt calls per machine").
- Object handles (domains, volumes, ...) are not cached across calls: each call looks up
  what it needs and the handles are freed when the call returns, so a reconnect never
  leaves stale handles behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import libvirt

from capl.ports.errors import HostUnreachable, VirtError
from capl.ports.virt import DomainEvent, DomainEventKind, HostEvent, HostEventKind, HostId
from capl.virt.errors import is_connection_error, translate
from capl.virt.events import EventHub, ensure_event_loop
from capl.virt.states import event_detail_name
from capl.virt.uri import ConnectPlan

__all__ = ["CallCounter", "HostConnection", "connect_hint"]

log = logging.getLogger(__name__)

T = TypeVar("T")

KEEPALIVE_INTERVAL = 5
KEEPALIVE_COUNT = 3
_BACKOFF_FIRST = 0.5
_BACKOFF_MAX = 30.0

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


class _Counted:
    """Forwards attribute access to a libvirt object, counting the RPC-backed calls."""

    __slots__ = ("_count", "_target")

    def __init__(self, target: Any, count: Callable[[str], None]) -> None:
        object.__setattr__(self, "_target", target)
        object.__setattr__(self, "_count", count)

    def __getattr__(self, attr: str) -> Any:
        value = getattr(self._target, attr)
        if attr.startswith("_") or attr in _LOCAL_METHODS or not callable(value):
            return value
        method = f"{type(self._target).__name__}.{attr}"
        count = self._count

        def call(*args: Any, **kwargs: Any) -> Any:
            count(method)
            return _wrap(value(*args, **kwargs), count)

        return call


def _wrap(result: Any, count: Callable[[str], None]) -> Any:
    if isinstance(result, _WRAPPED_TYPES):
        return _Counted(result, count)
    if isinstance(result, list) and result and isinstance(result[0], _WRAPPED_TYPES):
        return [_Counted(item, count) for item in result]
    return result


def _backoff(failures: int) -> float:
    return float(min(_BACKOFF_MAX, _BACKOFF_FIRST * (2 ** max(0, failures - 1))))


class HostConnection:
    def __init__(
        self,
        plan: ConnectPlan,
        *,
        hub: EventHub,
        counter: CallCounter,
        max_workers: int = 8,
    ) -> None:
        self.plan = plan
        self.host_id = plan.host_id
        self._hub = hub
        self._counter = counter
        self._executor = ThreadPoolExecutor(
            max_workers=max_workers, thread_name_prefix=f"libvirt-{plan.driver}"
        )
        self._state = threading.Lock()  # short critical sections only (event thread uses it)
        self._opening = threading.Lock()  # serializes connection attempts
        self._conn: Any = None
        self._generation = 0
        self._callback_ids: list[int] = []
        self._failures = 0
        self._next_attempt = 0.0
        self._last_error: HostUnreachable | None = None
        self._closed = False
        self._stop = threading.Event()
        self._reconnector: threading.Thread | None = None
        self._dead: list[Any] = []

    # -- public ---------------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        with self._state:
            return self._conn is not None

    @property
    def generation(self) -> int:
        """Increases with every successful (re)connect."""
        with self._state:
            return self._generation

    async def run(self, action: str, fn: Callable[[Any], T]) -> T:
        """Run ``fn(conn)`` in the host's thread pool; libvirt errors become typed errors."""
        loop = asyncio.get_running_loop()
        try:
            future = loop.run_in_executor(self._executor, self._invoke, action, fn)
        except RuntimeError:  # the executor is shut down: the host was closed
            raise HostUnreachable(
                f"{action}: host {self.host_id} is closed", host=self.host_id
            ) from None
        return await future

    def count(self, method: str) -> None:
        self._counter.add(self.host_id, method)

    async def close(self) -> None:
        """Deregister callbacks, close the connection, remove the credential files."""
        with self._state:
            self._closed = True
            conn, self._conn = self._conn, None
            callback_ids, self._callback_ids = self._callback_ids, []
            dead, self._dead = self._dead, []
        self._stop.set()
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._executor, self._dispose, conn, callback_ids, dead)
        finally:
            self._executor.shutdown(wait=False)
            self.plan.cleanup()

    # -- worker-thread side ---------------------------------------------------------------

    def _invoke(self, action: str, fn: Callable[[Any], T]) -> T:
        conn = self._connection()
        try:
            return fn(_Counted(conn, self.count))
        except VirtError as error:  # raised by the operation itself: say which host
            if error.host is None:
                error.host = self.host_id
            raise
        except libvirt.libvirtError as exc:
            if is_connection_error(exc) or not _alive(conn):
                self._mark_dead(conn, f"{action} failed: {exc.get_error_message()}")
                raise HostUnreachable(
                    f"{action} on {self.host_id}: connection lost: {exc.get_error_message()}",
                    host=self.host_id,
                    code=exc.get_error_code(),
                ) from exc
            raise translate(exc, host=self.host_id, action=action) from exc

    def _connection(self, *, force: bool = False) -> Any:
        with self._state:
            if self._closed:
                raise HostUnreachable(f"host {self.host_id} is closed", host=self.host_id)
            conn = self._conn
        if conn is not None:
            if _alive(conn):
                return conn
            self._mark_dead(conn, "connection is no longer alive")
        with self._opening:
            with self._state:
                if self._conn is not None:
                    return self._conn
                if self._closed:
                    raise HostUnreachable(f"host {self.host_id} is closed", host=self.host_id)
                waiting = self._next_attempt - time.monotonic()
                if not force and waiting > 0 and self._last_error is not None:
                    error = self._last_error
                    raise HostUnreachable(
                        f"{error.message} (next attempt in {waiting:.1f}s)",
                        host=self.host_id,
                        code=error.code,
                    )
            return self._open()

    def _open(self) -> Any:
        ensure_event_loop()
        self.count("virConnect.open")
        try:
            conn = libvirt.open(self.plan.uri)
        except libvirt.libvirtError as exc:
            detail = " ".join((exc.get_error_message() or str(exc)).split())
            hint = connect_hint(self.plan.transport, detail)
            if hint:
                detail = f"{hint}: {detail}"
            error = HostUnreachable(
                f"connect to {self.host_id}: {detail}",
                host=self.host_id,
                code=exc.get_error_code(),
            )
            with self._state:
                self._failures += 1
                self._next_attempt = time.monotonic() + _backoff(self._failures)
                self._last_error = error
            raise error from exc
        if conn is None:  # old bindings returned None instead of raising
            raise HostUnreachable(f"connect to {self.host_id} failed", host=self.host_id)
        with self._state:
            self._generation += 1
            generation = self._generation
        callback_ids: list[int] = []
        if self.plan.driver != "test":  # the test driver has no keepalive
            try:
                self.count("virConnect.setKeepAlive")
                conn.setKeepAlive(KEEPALIVE_INTERVAL, KEEPALIVE_COUNT)
            except libvirt.libvirtError as exc:
                log.debug("keepalive not available on %s: %s", self.host_id, exc)
        try:
            self.count("virConnect.registerCloseCallback")
            conn.registerCloseCallback(self._on_close, generation)
        except libvirt.libvirtError as exc:
            log.debug("close callback not available on %s: %s", self.host_id, exc)
        try:
            self.count("virConnect.domainEventRegisterAny")
            callback_ids.append(
                conn.domainEventRegisterAny(
                    None, libvirt.VIR_DOMAIN_EVENT_ID_LIFECYCLE, self._on_lifecycle, generation
                )
            )
        except libvirt.libvirtError as exc:
            log.warning("domain events not available on %s: %s", self.host_id, exc)
        with self._state:
            if self._closed:
                self._dead.append(conn)
                raise HostUnreachable(f"host {self.host_id} is closed", host=self.host_id)
            self._conn = conn
            self._callback_ids = callback_ids
            self._failures = 0
            self._next_attempt = 0.0
            self._last_error = None
        log.info("connected to %s", self.host_id)
        self._hub.publish(HostEvent(host_id=self.host_id, kind=HostEventKind.CONNECTED))
        return conn

    def _mark_dead(self, conn: Any, why: str) -> None:
        with self._state:
            if self._conn is not conn or self._closed:
                return
            self._conn = None
            self._callback_ids = []
            self._dead.append(conn)
        log.warning("connection to %s lost: %s", self.host_id, why)
        self._hub.publish(
            HostEvent(host_id=self.host_id, kind=HostEventKind.DISCONNECTED, message=why)
        )
        self._start_reconnector()

    def _start_reconnector(self) -> None:
        with self._state:
            if self._closed or (self._reconnector is not None and self._reconnector.is_alive()):
                return
            thread = threading.Thread(
                target=self._reconnect_loop, name=f"libvirt-reconnect-{self.host_id}", daemon=True
            )
            self._reconnector = thread
        thread.start()

    def _reconnect_loop(self) -> None:
        delay = _BACKOFF_FIRST
        while not self._stop.is_set():
            with self._state:
                dead, self._dead = self._dead, []
            self._dispose(None, [], dead)
            try:
                self._connection(force=True)
                return
            except VirtError as exc:
                log.info("reconnect to %s failed, retrying in %.1fs: %s", self.host_id, delay, exc)
            if self._stop.wait(delay):
                return
            delay = min(_BACKOFF_MAX, delay * 2)

    def _dispose(self, conn: Any, callback_ids: list[int], dead: list[Any]) -> None:
        if conn is not None:
            for callback_id in callback_ids:
                with contextlib.suppress(libvirt.libvirtError):
                    conn.domainEventDeregisterAny(callback_id)
            with contextlib.suppress(libvirt.libvirtError):
                conn.unregisterCloseCallback()
            dead = [conn, *dead]
        for handle in dead:
            with contextlib.suppress(libvirt.libvirtError):
                handle.close()

    # -- event-thread side ----------------------------------------------------------------

    def _on_close(self, conn: Any, reason: int, generation: int) -> None:
        with self._state:
            current = self._conn if generation == self._generation else None
        if current is not None:
            self._mark_dead(current, f"closed by libvirt ({_CLOSE_REASONS.get(reason, reason)})")

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


def _alive(conn: Any) -> bool:
    try:
        return bool(conn.isAlive())
    except libvirt.libvirtError:
        return False
