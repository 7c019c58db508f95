"""capl.kube.http.HttpPool: keep-alive, chunked answers, a connection the server closed.

The server here is a stand-in: a loopback asyncio server that answers scripted bytes. The
real API server is what tests/kube talks to through the same pool; it cannot be made to cut
an answer short, close a kept-alive connection or answer HTTP/1.0 on demand.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from capl.kube.http import HttpPool, ProtocolError

OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
Answer = Callable[[int, int], bytes | None]
"""(connection number, request number on that connection) -> bytes to send, None to close
the connection without answering."""


@dataclass
class Server:
    answer: Answer
    port: int = 0
    connections: int = 0
    requests: list[bytes] = field(default_factory=list)
    close_after_answer: bool = False

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        number = self.connections
        on_connection = 0
        try:
            while True:
                on_connection += 1
                head = await reader.readuntil(b"\r\n\r\n")
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        await reader.readexactly(int(line.split(b":")[1]))
                self.requests.append(head)
                answer = self.answer(number, on_connection)
                if answer is None:
                    break
                writer.write(answer)
                await writer.drain()
                if self.close_after_answer:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


Serve = Callable[..., Awaitable[Server]]


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    servers: list[asyncio.Server] = []

    async def started(answer: Answer, **kwargs: bool) -> Server:
        server = Server(answer, **kwargs)
        listening = await asyncio.start_server(server.handle, "127.0.0.1", 0)
        servers.append(listening)
        server.port = listening.sockets[0].getsockname()[1]
        return server

    yield started
    for listening in servers:
        listening.close()


def pool_for(server: Server, **kwargs: Any) -> HttpPool:
    return HttpPool("127.0.0.1", server.port, ssl_context=None, **kwargs)


async def test_answers_reuse_one_connection(serve: Serve) -> None:
    server = await serve(lambda _n, _h: OK)
    pool = pool_for(server)
    try:
        for _ in range(3):
            assert await pool.request("GET", "/api", {}, None, read_timeout=5) == (200, b"{}")
        assert server.connections == 1
        assert pool.idle == 1
        assert server.requests[0].startswith(b"GET /api HTTP/1.1\r\nHost: 127.0.0.1:")
    finally:
        await pool.close()


async def test_request_carries_its_body_and_headers(
    serve: Serve,
) -> None:
    server = await serve(lambda _n, _h: OK)
    pool = pool_for(server)
    try:
        await pool.request("PATCH", "/x?a=b", {"Content-Type": "a/b"}, b"12345", read_timeout=5)
        head = server.requests[0]
        assert head.startswith(b"PATCH /x?a=b HTTP/1.1\r\n")
        assert b"Content-Type: a/b\r\n" in head
        assert b"Content-Length: 5\r\n" in head
    finally:
        await pool.close()


async def test_chunked_answer_is_joined(serve: Serve) -> None:
    body = (
        b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n"
    )
    server = await serve(lambda _n, _h: body)
    pool = pool_for(server)
    try:
        assert await pool.request("POST", "/c", {}, b"{}", read_timeout=5) == (201, b"abcde")
        assert await pool.request("POST", "/c", {}, b"{}", read_timeout=5) == (201, b"abcde")
        assert server.connections == 1  # a chunked answer leaves the connection usable
    finally:
        await pool.close()


async def test_connection_close_and_http_1_0_are_not_kept(
    serve: Serve,
) -> None:
    answers = {
        1: b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 1\r\n\r\na",
        2: b"HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\nb",
    }
    server = await serve(lambda n, _h: answers.get(n, OK))
    pool = pool_for(server)
    try:
        assert await pool.request("GET", "/", {}, None, read_timeout=5) == (200, b"a")
        assert pool.idle == 0
        assert await pool.request("GET", "/", {}, None, read_timeout=5) == (200, b"b")
        assert pool.idle == 0
        assert await pool.request("GET", "/", {}, None, read_timeout=5) == (200, b"{}")
        assert server.connections == 3
    finally:
        await pool.close()


async def test_a_kept_connection_the_server_closed_is_retried_only_when_idempotent(
    serve: Serve,
) -> None:
    # the server answers the first request of each connection, then closes it without a
    # word when the next request comes (an idle timeout racing the request)
    server = await serve(lambda _n, index: OK if index == 1 else None)
    pool = pool_for(server)
    try:
        assert await pool.request("GET", "/a", {}, None, read_timeout=5) == (200, b"{}")
        assert await pool.request("GET", "/b", {}, None, read_timeout=5) == (200, b"{}")
        assert server.connections == 2  # the GET went again, on a fresh connection
        with pytest.raises(ConnectionError, match="without an answer"):
            await pool.request("POST", "/c", {}, b"{}", read_timeout=5)
        assert [h.split(b" ")[1] for h in server.requests].count(b"/c") == 1  # not resent
    finally:
        await pool.close()


async def test_a_cut_answer_is_a_protocol_error(
    serve: Serve,
) -> None:
    server = await serve(
        lambda _n, _h: b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", close_after_answer=True
    )
    pool = pool_for(server)
    try:
        with pytest.raises(ProtocolError, match="body was cut short"):
            await pool.request("GET", "/", {}, None, read_timeout=5)
        assert pool.idle == 0
    finally:
        await pool.close()


async def test_not_http_is_a_protocol_error(serve: Serve) -> None:
    server = await serve(lambda _n, _h: b"SSH-2.0-OpenSSH\r\n\r\n")
    pool = pool_for(server)
    try:
        with pytest.raises(ProtocolError, match=r"not an HTTP/1\.x answer"):
            await pool.request("GET", "/", {}, None, read_timeout=5)
    finally:
        await pool.close()


async def test_idle_connections_expire(serve: Serve) -> None:
    now = [100.0]
    server = await serve(lambda _n, _h: OK)
    pool = pool_for(server, idle_ttl=15.0, clock=lambda: now[0])
    try:
        await pool.request("GET", "/", {}, None, read_timeout=5)
        now[0] += 14.0
        await pool.request("GET", "/", {}, None, read_timeout=5)
        assert server.connections == 1
        now[0] += 15.0
        await pool.request("GET", "/", {}, None, read_timeout=5)
        assert server.connections == 2
    finally:
        await pool.close()


async def test_a_silent_server_runs_into_the_read_timeout(
    serve: Serve,
) -> None:
    never = asyncio.Event()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await never.wait()
        writer.close()

    listening = await asyncio.start_server(silent, "127.0.0.1", 0)
    pool = HttpPool("127.0.0.1", listening.sockets[0].getsockname()[1], ssl_context=None)
    try:
        with pytest.raises(TimeoutError):
            await pool.request("GET", "/", {}, None, read_timeout=0.2)
        assert pool.idle == 0
    finally:
        never.set()
        await pool.close()
        listening.close()
