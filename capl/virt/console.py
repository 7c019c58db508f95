"""Serial consoles of domains: ``virDomainOpenConsole`` bridged to a socket pair.

``LibvirtConsoles(host)`` implements ``capl.ports.console.Consoles`` for one ``LibvirtHost``
(it reuses the host's shared connection, credentials and worker pool; nothing is opened
twice).

How a console is pumped
-----------------------
``open_console`` opens a *non-blocking* ``virStream`` on the domain's console (in the host's
worker thread) and hands it to a ``_Pump``, which lives entirely on libvirt's event thread
(``capl.virt.events``) the way ``virsh console`` does it:

- a stream callback (``eventAddCallback``) reads guest output when the stream is readable
  and writes pending input when it is writable;
- a handle callback (``virEventAddHandle``) on our end of a ``socketpair`` reads what the
  user typed and writes guest output when the socket is writable;
- both sides buffer (bounded: a side stops reading while the other side's buffer is over
  1 MiB) and interest sets follow the buffers, so nothing ever blocks the event thread.

The caller gets the other end of the socket pair (``SocketConsoleChannel``): a plain
descriptor it can ``select`` on beside a terminal. The pump ends when the stream reports
end-of-file, hang-up or an error (``end_reason`` says which; remaining output is delivered
first), or when the caller closes its end; then it removes both callbacks, aborts or
finishes the stream and closes its socket, so the caller reads ``b""``.

A lock serialises the pump's state between its set-up (worker thread) and its callbacks
(event thread); callbacks only do non-blocking stream and socket I/O.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from typing import TYPE_CHECKING, Any

import libvirt

from capl.ports.console import (
    ConsoleBusy,
    ConsoleChannel,
    ConsoleLog,
    ConsoleLogKind,
    ConsoleUnavailable,
)
from capl.ports.errors import DomainNotFound
from capl.ports.virt import HostId
from capl.virt.host import LibvirtHost
from capl.virt.support import code_of, lookup
from capl.virt.xmlutil import parse

__all__ = ["LibvirtConsoles", "SocketConsoleChannel", "console_log_of"]

_CHUNK = 64 * 1024
_HIGH_WATER = 1024 * 1024
_CLOSE_WAIT = 5.0

_S_READ = libvirt.VIR_STREAM_EVENT_READABLE
_S_WRITE = libvirt.VIR_STREAM_EVENT_WRITABLE
_S_ERROR = libvirt.VIR_STREAM_EVENT_ERROR
_S_HANGUP = libvirt.VIR_STREAM_EVENT_HANGUP
_H_READ = libvirt.VIR_EVENT_HANDLE_READABLE
_H_WRITE = libvirt.VIR_EVENT_HANDLE_WRITABLE
_H_ERROR = libvirt.VIR_EVENT_HANDLE_ERROR
_H_HANGUP = libvirt.VIR_EVENT_HANDLE_HANGUP

_UNSUPPORTED = frozenset(
    {
        libvirt.VIR_ERR_NO_SUPPORT,
        libvirt.VIR_ERR_OPERATION_UNSUPPORTED,
        libvirt.VIR_ERR_ARGUMENT_UNSUPPORTED,
    }
)
_GUEST_ENDED = "the console closed (the domain stopped, or another client took the console over)"


def _message(exc: libvirt.libvirtError) -> str:
    return " ".join((exc.get_error_message() or str(exc)).split())


def console_log_of(domain_xml: str) -> ConsoleLog | None:
    """The file the first serial port is logged to, from a domain's XML."""
    root = parse(domain_xml)
    for element in (root.find("./devices/serial"), root.find("./devices/console")):
        if element is None:
            continue
        log = element.find("log")
        if log is not None and log.get("file"):
            return ConsoleLog(path=str(log.get("file")), kind=ConsoleLogKind.LOG)
        source = element.find("source")
        if element.get("type") == "file" and source is not None and source.get("path"):
            return ConsoleLog(path=str(source.get("path")), kind=ConsoleLogKind.FILE)
    return None


class _Pump:
    """Moves bytes between a non-blocking console stream and a socket, on the event thread."""

    def __init__(self, stream: Any, sock: socket.socket) -> None:
        self._stream = stream
        self._sock = sock
        self._lock = threading.RLock()
        self._to_guest = bytearray()
        self._to_user = bytearray()
        self._watch = -1
        self._eof = False
        self._finished = False
        self._user_closed = False
        self.reason: str | None = None
        self.done = threading.Event()

    # -- set-up (worker thread) -------------------------------------------------------------

    def start(self) -> None:
        with self._lock:
            self._stream.eventAddCallback(_S_READ | _S_ERROR | _S_HANGUP, self._on_stream, None)
            try:
                self._watch = libvirt.virEventAddHandle(
                    self._sock.fileno(), _H_READ, self._on_socket, None
                )
            except BaseException:
                self._finish(None)
                raise

    # -- callbacks (event thread) -----------------------------------------------------------

    def _on_stream(self, _stream: Any, events: int, _opaque: object) -> None:
        with self._lock:
            if self._finished:
                return
            if events & (_S_READ | _S_HANGUP) and not self._eof:
                self._read_stream()
            if not self._finished and events & _S_WRITE:
                self._write_stream()
            if not self._finished and events & _S_ERROR and not events & _S_READ:
                self._finish("the console stream failed")
            self._after_io()

    def _on_socket(self, _watch: int, _fd: int, events: int, _opaque: object) -> None:
        with self._lock:
            if self._finished:
                return
            if events & (_H_READ | _H_HANGUP | _H_ERROR):
                self._read_socket()
            if not self._finished and events & _H_WRITE:
                self._write_socket()
            self._after_io()

    # -- I/O ----------------------------------------------------------------------------------

    def _read_stream(self) -> None:
        while len(self._to_user) < _HIGH_WATER:
            try:
                data = self._stream.recv(_CHUNK)
            except libvirt.libvirtError as exc:
                self._finish(f"the console stream failed: {_message(exc)}")
                return
            if isinstance(data, int):  # -2: would block
                return
            if not data:
                self._eof = True
                return
            self._to_user += data

    def _write_stream(self) -> None:
        while self._to_guest:
            try:
                sent = self._stream.send(bytes(self._to_guest[:_CHUNK]))
            except libvirt.libvirtError as exc:
                self._finish(f"the console stream failed: {_message(exc)}")
                return
            if sent < 0:  # -2: would block
                return
            del self._to_guest[:sent]

    def _read_socket(self) -> None:
        while len(self._to_guest) < _HIGH_WATER:
            try:
                data = self._sock.recv(_CHUNK)
            except BlockingIOError:
                break
            except OSError:
                data = b""
            if not data:
                self._user_closed = True
                self._finish(None)
                return
            self._to_guest += data
        self._write_stream()

    def _write_socket(self) -> None:
        while self._to_user:
            try:
                sent = self._sock.send(self._to_user[:_CHUNK])
            except BlockingIOError:
                return
            except OSError:
                self._user_closed = True
                self._finish(None)
                return
            del self._to_user[:sent]

    def _after_io(self) -> None:
        if self._finished:
            return
        if self._to_user:
            self._write_socket()
            if self._finished:
                return
        if self._eof and not self._to_user:
            self._finish(_GUEST_ENDED)
            return
        stream_events = _S_WRITE if self._to_guest else 0
        if not self._eof and len(self._to_user) < _HIGH_WATER:
            stream_events |= _S_READ
        socket_events = _H_READ if len(self._to_guest) < _HIGH_WATER else 0
        if self._to_user:
            socket_events |= _H_WRITE
        with contextlib.suppress(libvirt.libvirtError):
            self._stream.eventUpdateCallback(stream_events)
        if self._watch >= 0:
            libvirt.virEventUpdateHandle(self._watch, socket_events)

    def _finish(self, reason: str | None) -> None:
        if self._finished:
            return
        self._finished = True
        self.reason = reason
        with contextlib.suppress(libvirt.libvirtError):
            self._stream.eventRemoveCallback()
        with contextlib.suppress(libvirt.libvirtError):
            if self._eof:
                self._stream.finish()
            else:
                self._stream.abort()
        if self._watch >= 0:
            with contextlib.suppress(libvirt.libvirtError):
                libvirt.virEventRemoveHandle(self._watch)
            self._watch = -1
        self._sock.close()
        self.done.set()

    def cancel(self) -> None:
        """End from outside the event thread (set-up failure, or a stuck event loop)."""
        with self._lock:
            self._finish(self.reason)


class SocketConsoleChannel:
    """The caller's end of a console: ``capl.ports.console.ConsoleChannel``."""

    def __init__(self, sock: socket.socket, pump: _Pump) -> None:
        self._sock = sock
        self._pump = pump
        self._closed = False

    def fileno(self) -> int:
        return self._sock.fileno()

    def recv(self, size: int, /) -> bytes:
        try:
            return self._sock.recv(size)
        except OSError:
            return b""

    def sendall(self, data: bytes, /) -> None:
        with contextlib.suppress(OSError):  # the pump has ended: recv reports it
            self._sock.sendall(data)

    @property
    def end_reason(self) -> str | None:
        return self._pump.reason

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        if not self._pump.done.wait(_CLOSE_WAIT):
            self._pump.cancel()

    def __enter__(self) -> SocketConsoleChannel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LibvirtConsoles:
    """``capl.ports.console.Consoles`` on one ``LibvirtHost``."""

    def __init__(self, host: LibvirtHost) -> None:
        self._host = host

    @property
    def host_id(self) -> HostId:
        return self._host.host_id

    @property
    def local(self) -> bool:
        return not self._host.connection.plan.remote

    async def open_console(
        self, uuid: str, *, device: str | None = None, force: bool = False
    ) -> ConsoleChannel:
        host_id = self.host_id

        def op(c: Any) -> ConsoleChannel:
            domain = _domain(c, uuid, host_id)
            stream = c.newStream(libvirt.VIR_STREAM_NONBLOCK)
            flags = libvirt.VIR_DOMAIN_CONSOLE_FORCE if force else 0
            try:
                domain.openConsole(device, stream, flags)
            except libvirt.libvirtError as exc:
                with contextlib.suppress(libvirt.libvirtError):
                    stream.abort()
                special = _console_error(exc, uuid, host_id)
                if special is None:
                    raise
                raise special from exc
            ours, theirs = socket.socketpair()
            ours.setblocking(False)
            pump = _Pump(stream, ours)
            try:
                pump.start()
            except BaseException:
                theirs.close()
                raise
            return SocketConsoleChannel(theirs, pump)

        return await self._host.connection.run(f"open the console of domain {uuid}", op)

    async def console_log(self, uuid: str) -> ConsoleLog | None:
        host_id = self.host_id

        def op(c: Any) -> ConsoleLog | None:
            return console_log_of(_domain(c, uuid, host_id).XMLDesc(0))

        return await self._host.connection.run(f"read the console log of domain {uuid}", op)


def _domain(c: Any, uuid: str, host_id: HostId) -> Any:
    domain = lookup(lambda: c.lookupByUUIDString(uuid), libvirt.VIR_ERR_NO_DOMAIN)
    if domain is None:
        raise DomainNotFound(f"domain {uuid} does not exist on {host_id}", host=host_id)
    return domain


def _console_error(
    exc: libvirt.libvirtError, uuid: str, host_id: HostId
) -> ConsoleUnavailable | ConsoleBusy | None:
    code = code_of(exc)
    text = _message(exc)
    if code in _UNSUPPORTED:
        return ConsoleUnavailable(
            f"the console of domain {uuid} cannot be opened on {host_id}: {text}",
            host=host_id,
            code=code,
        )
    if "console session exists" in text or "console is in use" in text.lower():
        return ConsoleBusy(
            f"the console of domain {uuid} is in use by another client on {host_id} "
            f"(take it over with --force): {text}",
            host=host_id,
            code=code,
        )
    return None


if TYPE_CHECKING:
    from capl.ports.console import Consoles

    def _implements_the_port(consoles: LibvirtConsoles) -> Consoles:
        """mypy checks here that the adapter satisfies the port's Protocol."""
        return consoles
