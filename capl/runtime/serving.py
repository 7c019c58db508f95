"""Small aiohttp servers of the manager: health probes and Prometheus metrics.

Bind addresses follow controller-runtime: "host:port", ":port" (all interfaces), "0" disables.
Port 0 picks a free port; `Server.port` tells which one was bound.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web


@dataclass(frozen=True, slots=True)
class BindAddress:
    host: str
    port: int


def parse_bind_address(value: str) -> BindAddress | None:
    """ "0" or "" -> None (disabled); ":8080" -> all interfaces; "[::1]:8080"; "127.0.0.1:0"."""
    value = value.strip()
    if value in ("", "0"):
        return None
    host, sep, port = value.rpartition(":")
    if not sep:
        raise ValueError(f"bind address {value!r} must be host:port, :port or 0")
    host = host.strip("[]") or "0.0.0.0"
    try:
        number = int(port)
    except ValueError:
        raise ValueError(f"bind address {value!r} has no valid port") from None
    if not 0 <= number <= 65535:
        raise ValueError(f"bind address {value!r} has no valid port")
    return BindAddress(host, number)


class Server:
    """An aiohttp application served on one address until `stop()`."""

    def __init__(self, app: web.Application, address: BindAddress, *, ssl_context: object = None):
        self.app = app
        self.address = address
        self.ssl_context = ssl_context
        self._runner: web.AppRunner | None = None
        self.port = address.port

    async def start(self) -> None:
        runner = web.AppRunner(self.app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(
            runner,
            self.address.host,
            self.address.port,
            ssl_context=self.ssl_context,  # type: ignore[arg-type]
            reuse_address=True,
        )
        await site.start()
        self._runner = runner
        server = getattr(site, "_server", None)
        sockets = getattr(server, "sockets", None) or []
        for sock in sockets:
            if sock.family in (socket.AF_INET, socket.AF_INET6):
                self.port = sock.getsockname()[1]
                break

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


Check = Callable[[], bool]


def health_app(*, healthz: dict[str, Check], readyz: dict[str, Check]) -> web.Application:
    """/healthz and /readyz: 200 "ok" when every check passes, else 500 with the failing ones."""

    def handler(checks: dict[str, Check]) -> Callable[[web.Request], object]:
        async def handle(request: web.Request) -> web.Response:
            failed = []
            for name, check in checks.items():
                try:
                    ok = check()
                except Exception:
                    ok = False
                if not ok:
                    failed.append(name)
            if failed:
                body = "".join(f"[-]{n} failed\n" for n in failed)
                return web.Response(status=500, text=body + "check failed\n")
            return web.Response(text="ok")

        return handle

    app = web.Application()
    for path, checks in (("/healthz", healthz), ("/readyz", readyz)):
        h = handler(checks)
        app.router.add_get(path, h)  # type: ignore[arg-type]
        app.router.add_get(path + "/", h)  # type: ignore[arg-type]
    return app


def metrics_app(exposition: Callable[[], bytes]) -> web.Application:
    async def handle(request: web.Request) -> web.Response:
        return web.Response(
            body=exposition(), headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"}
        )

    app = web.Application()
    app.router.add_get("/metrics", handle)
    return app
