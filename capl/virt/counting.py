"""Counting libvirt calls per host and method, and the proxy that does it.

Every libvirt call made through ``HostConnection.run`` is counted per host and method
(``virDomain.create``...) by a transparent proxy (``Counted``) around the connection and the
objects it returns; methods that never leave the process (``name``, ``UUIDString``...) are not
counted. The benchmark reads the counts ("libvirt calls per machine"). A stream made through
the proxy tells the handle's owner, which keeps that handle out of its pool until the stream
is finished or aborted (``capl.virt.handles``).

``remembered`` keeps the storage pools and networks looked up by name on the connection
handle that looked them up, so that the volume and DHCP/DNS calls of a scale-out do not each
pay a look-up first. A remembered object is dropped when this process defines or removes a
pool or network on the host (``forget_lookups``: every handle of the host starts afresh),
and from its handle when an operation fails with a not-found code (``LOOKUP_GONE``: removed
or re-created by someone else), which is then run once more, looking up afresh
(``HandlePool.invoke``). Handles die with their connection, and so does what they remember.
A network re-created behind this process's back keeps its name but not its UUID, and a
handle names the network by both: the stale handle's first call fails. Every network
operation makes a call on the handle before it answers (a removal deletes straight away, a
positive answer of the DHCP/DNS entry cache is confirmed by a read, a negative one leads to
an update or a lease read), so a stale handle is never answered from the entry cache alone.

With ``CAPL_LIBVIRT_TRACE`` set, every counted call is also recorded (``capl.virt.calltrace``,
for the work-floor benchmark).
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import libvirt

from capl.ports.virt import HostId
from capl.virt import calltrace

if TYPE_CHECKING:
    from capl.virt.handles import Handle, HandlePool

__all__ = ["LOOKUP_GONE", "CallCounter", "Counted", "forget_lookups", "remembered"]

_LOCAL_METHODS = frozenset(
    {"name", "UUIDString", "UUID", "key", "ID", "connect", "isAlive", "getURI"}
)
_STREAM_ENDS = frozenset({"finish", "abort"})
LOOKUP_GONE = frozenset({libvirt.VIR_ERR_NO_STORAGE_POOL, libvirt.VIR_ERR_NO_NETWORK})
"""Error codes that say a remembered pool or network handle may be stale (``remembered``)."""
_WRAPPED_TYPES = (
    libvirt.virDomain,
    libvirt.virNetwork,
    libvirt.virStoragePool,
    libvirt.virStorageVol,
    libvirt.virStream,
    libvirt.virInterface,
)


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


class Counted:
    """Forwards attribute access to a libvirt object, counting the RPC-backed calls; a stream
    made through it keeps its handle out of the pool until the stream is finished or aborted
    (see the module docstring)."""

    __slots__ = ("_handle", "_owner", "_target")

    def __init__(self, target: Any, owner: HandlePool, handle: Handle) -> None:
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
            trace = calltrace.TRACE
            try:
                if trace is None:
                    return wrap(value(*args, **kwargs), owner, handle)
                result = trace.call(owner.host_id, method, target, value, args, kwargs)
                return wrap(result, owner, handle)
            finally:
                if ends_stream:
                    owner.stream_ended(handle, id(target))

        return call


def wrap(result: Any, owner: HandlePool, handle: Handle) -> Any:
    if isinstance(result, _WRAPPED_TYPES):
        if isinstance(result, libvirt.virStream) and not handle.shared:
            owner.stream_made(handle, id(result))
        return Counted(result, owner, handle)
    if isinstance(result, list) and result and isinstance(result[0], _WRAPPED_TYPES):
        return [Counted(item, owner, handle) for item in result]
    return result


def remembered(c: Any, kind: str, name: str, fetch: Callable[[], Any]) -> Any:
    """``fetch()`` (a look-up by name on ``c``), remembered on the handle behind ``c`` until
    the host's look-ups are forgotten (see the module docstring). A ``c`` that is not a
    counted handle (tests) looks up every time."""
    if not isinstance(c, Counted):
        return fetch()
    handle: Handle = object.__getattribute__(c, "_handle")
    owner: HandlePool = object.__getattribute__(c, "_owner")
    epoch = owner.lookup_epoch
    cache = handle.lookups
    if handle.lookups_epoch != epoch:
        cache.clear()
        handle.lookups_epoch = epoch
    key = (kind, name)
    found = cache.get(key)
    if found is None:
        found = fetch()
        if found is not None:
            cache[key] = found
    return found


def forget_lookups(c: Any) -> None:
    """Every handle of ``c``'s host forgets what it remembered (a pool or network was
    defined or removed by this process)."""
    if isinstance(c, Counted):
        object.__getattribute__(c, "_owner").forget_lookups()
