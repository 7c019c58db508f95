"""A lean HTTP/1.1 keep-alive connection pool for the API server's plain requests.

Why: a request through aiohttp's ClientSession costs about 300 µs of CPU on these machines
(URL and header objects, the connector's bookkeeping, response objects, tracing hooks), the
same exchange over asyncio streams about 130 µs; a manager makes three such requests per
machine (docs/benchmarks.md). Watches, and every request when a proxy is configured, stay
on aiohttp (`capl.kube.client`).

What it does, and no more: one request at a time per connection (no pipelining), connections
kept alive and reused most-recently-used first, at most `limit` requests in flight (callers
beyond wait), idle connections dropped after `idle_ttl` seconds (the API server closes idle
connections on its own schedule; a connection it has closed is noticed before it is used
when possible). A request on a reused connection that gets no byte of answer because the
server had closed it is sent once more on a fresh connection when its method is idempotent
(GET, HEAD, PUT, DELETE, OPTIONS), as aiohttp and Go's net/http do; for any other method
the failure is raised (the request may have been processed). Bodies come with a
Content-Length or chunked; no compression is asked for, so none is decoded.

Failures are `OSError`s (`ConnectionError` for a malformed or cut answer) or `TimeoutError`.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Callable

__all__ = ["HttpPool", "ProtocolError"]

IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})
_MAX_HEAD = 2**16
_STREAM_LIMIT = 2**21


class ProtocolError(ConnectionError):
    """The server's answer was malformed or cut short."""


class _Stale(ConnectionError):
    """A reused connection closed before the first byte of the answer."""


class _Conn:
    __slots__ = ("idle_since", "reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.idle_since = 0.0

    def usable(self) -> bool:
        return not (self.writer.is_closing() or self.reader.at_eof())

    def close(self) -> None:
        self.writer.close()


class HttpPool:
    """Requests to one `host:port` (TLS when `ssl_context` is given)."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        ssl_context: ssl.SSLContext | None,
        server_hostname: str | None = None,
        limit: int = 128,
        connect_timeout: float = 10.0,
        idle_ttl: float = 15.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.host = host
        self.port = port
        self._ssl = ssl_context
        self._server_hostname = server_hostname
        self._slots = asyncio.Semaphore(limit)
        self._connect_timeout = connect_timeout
        self._idle_ttl = idle_ttl
        self._clock = clock
        self._idle: list[_Conn] = []
        self._closed = False
        name = f"[{host}]" if ":" in host else host
        authority = name if port in (80, 443) else f"{name}:{port}"
        self._host_header = f"Host: {authority}\r\n".encode()

    @property
    def idle(self) -> int:
        return len(self._idle)

    async def request(
        self,
        method: str,
        target: str,
        headers: dict[str, str],
        body: bytes | None,
        *,
        read_timeout: float | None,
    ) -> tuple[int, bytes]:
        """Send one request; (status code, body)."""
        if self._closed:
            raise ConnectionError("the HTTP pool is closed")
        head = [f"{method} {target} HTTP/1.1\r\n".encode(), self._host_header]
        head.extend(f"{k}: {v}\r\n".encode() for k, v in headers.items())
        if body is not None:
            head.append(b"Content-Length: %d\r\n" % len(body))
        head.append(b"\r\n")
        if body:
            head.append(body)
        data = b"".join(head)
        async with self._slots:
            conn, reused = await self._acquire()
            try:
                return await self._exchange(conn, method, data, read_timeout)
            except _Stale:
                if not (reused and method in IDEMPOTENT):
                    raise ConnectionError(
                        f"{method} {target}: the server closed the connection without an answer"
                    ) from None
            conn, _ = await self._acquire(fresh=True)
            return await self._exchange(conn, method, data, read_timeout)

    async def close(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    # -- connections ------------------------------------------------------------------------

    async def _acquire(self, *, fresh: bool = False) -> tuple[_Conn, bool]:
        now = self._clock()
        while self._idle and not fresh:
            conn = self._idle.pop()
            if now - conn.idle_since < self._idle_ttl and conn.usable():
                return conn, True
            conn.close()
        async with asyncio.timeout(self._connect_timeout):
            reader, writer = await asyncio.open_connection(
                self.host,
                self.port,
                ssl=self._ssl,
                server_hostname=self._server_hostname if self._ssl is not None else None,
                limit=_STREAM_LIMIT,
            )
        return _Conn(reader, writer), False

    def _release(self, conn: _Conn) -> None:
        if self._closed or not conn.usable():
            conn.close()
            return
        conn.idle_since = self._clock()
        self._idle.append(conn)

    async def _exchange(
        self, conn: _Conn, method: str, data: bytes, read_timeout: float | None
    ) -> tuple[int, bytes]:
        keep = False
        try:
            conn.writer.write(data)
            async with asyncio.timeout(read_timeout):
                await conn.writer.drain()
                status, keep, payload = await _read_answer(conn.reader, method)
        finally:
            if keep:
                self._release(conn)
            else:
                conn.close()
        return status, payload


async def _read_answer(reader: asyncio.StreamReader, method: str) -> tuple[int, bool, bytes]:
    """(status, keep-alive, body) of one answer."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            raise _Stale("connection closed before the answer") from None
        raise ProtocolError("the answer's head was cut short") from None
    except asyncio.LimitOverrunError:
        raise ProtocolError("the answer's head is too large") from None
    if len(head) > _MAX_HEAD:
        raise ProtocolError("the answer's head is too large")
    lines = head[:-4].split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1."):
        raise ProtocolError(f"not an HTTP/1.x answer: {lines[0][:80]!r}")
    try:
        status = int(parts[1])
    except ValueError:
        raise ProtocolError(f"bad status line: {lines[0][:80]!r}") from None
    length: int | None = None
    chunked = False
    keep = parts[0] != b"HTTP/1.0"
    for raw in lines[1:]:
        name, sep, value = raw.partition(b":")
        if not sep:
            continue
        name = name.strip().lower()
        if name == b"content-length":
            try:
                length = int(value)
            except ValueError:
                raise ProtocolError(f"bad Content-Length: {value[:40]!r}") from None
        elif name == b"transfer-encoding":
            chunked = b"chunked" in value.lower()
        elif name == b"connection":
            token = value.strip().lower()
            keep = token != b"close" and (keep or token == b"keep-alive")
    try:
        if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
            return status, keep, b""
        if chunked:
            return status, keep, await _read_chunked(reader)
        if length is not None:
            return status, keep, await reader.readexactly(length)
        return status, False, await reader.read()  # until the server closes
    except asyncio.IncompleteReadError:
        raise ProtocolError("the answer's body was cut short") from None
    except asyncio.LimitOverrunError:
        raise ProtocolError("a chunk header of the answer is too large") from None


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    parts: list[bytes] = []
    while True:
        line = await reader.readuntil(b"\r\n")
        try:
            size = int(line.split(b";", 1)[0], 16)
        except ValueError:
            raise ProtocolError(f"bad chunk size: {line[:40]!r}") from None
        if size == 0:
            while await reader.readuntil(b"\r\n") != b"\r\n":  # trailers
                pass
            return b"".join(parts)
        chunk = await reader.readexactly(size + 2)
        if chunk[-2:] != b"\r\n":
            raise ProtocolError("a chunk of the answer does not end in CRLF")
        parts.append(chunk[:-2])
