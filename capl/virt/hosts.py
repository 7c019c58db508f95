"""``LibvirtHosts``: the process-wide ``capl.ports.virt.Hosts`` registry.

One ``LibvirtHost`` (and so one connection) per host id (the URI without query). ``get`` is
cheap and does no I/O beyond writing credential files: the controllers call it on every
reconcile with the URI and the credentials Secret's data; a changed Secret or changed options
(compared by digest, never stored in clear beyond the files libvirt needs) replace the host's
connection, and the old one is closed in the background.

Per-host limits are the registry's: worker threads (``max_workers_per_host``), the time limit
of ordinary and long calls (``call_timeout``, ``long_call_timeout``) and the cap on calls in
flight (``max_inflight_per_host``, default 4 x workers); see ``capl.virt.connection``.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from capl.ports.virt import HostId, HostOptions, VirtEvent, VirtEventListener
from capl.virt.connection import CALL_TIMEOUT, LONG_CALL_TIMEOUT, CallCounter, HostConnection
from capl.virt.events import EventHub, EventSubscription
from capl.virt.host import LibvirtHost
from capl.virt.images import ImageImporter
from capl.virt.uri import host_id_of, plan_connection

__all__ = ["LibvirtHosts"]

log = logging.getLogger(__name__)


def _fingerprint(uri: str, credentials: Mapping[str, bytes] | None, options: HostOptions) -> str:
    digest = hashlib.sha256(uri.strip().encode())
    for key in sorted(credentials or {}):
        digest.update(b"\0" + key.encode() + b"\0" + (credentials or {})[key])
    digest.update(repr(options).encode())
    return digest.hexdigest()


class LibvirtHosts:
    def __init__(
        self,
        *,
        max_workers_per_host: int = 8,
        call_timeout: float = CALL_TIMEOUT,
        long_call_timeout: float = LONG_CALL_TIMEOUT,
        max_inflight_per_host: int | None = None,
    ) -> None:
        self._max_workers = max_workers_per_host
        self._call_timeout = call_timeout
        self._long_call_timeout = long_call_timeout
        self._max_inflight = max_inflight_per_host
        self._hub = EventHub()
        self._importer = ImageImporter()
        self._lock = threading.Lock()
        self._hosts: dict[HostId, tuple[str, LibvirtHost]] = {}
        self._closing: set[asyncio.Task[None]] = set()
        self.calls = CallCounter()
        """libvirt calls per host and method (``calls.snapshot()``, ``calls.total()``)."""

    def host_id(self, uri: str) -> HostId:
        return host_id_of(uri)

    def get(
        self,
        *,
        uri: str,
        credentials: Mapping[str, bytes] | None = None,
        options: HostOptions | None = None,
    ) -> LibvirtHost:
        options = options or HostOptions()
        host_id = host_id_of(uri)
        fingerprint = _fingerprint(uri, credentials, options)
        with self._lock:
            current = self._hosts.get(host_id)
            if current is not None and current[0] == fingerprint:
                return current[1]
        plan = plan_connection(uri, credentials=credentials, options=options)
        connection = HostConnection(
            plan,
            hub=self._hub,
            counter=self.calls,
            max_workers=self._max_workers,
            call_timeout=self._call_timeout,
            long_call_timeout=self._long_call_timeout,
            max_inflight=self._max_inflight,
        )
        host = LibvirtHost(connection, importer=self._importer)
        with self._lock:
            current = self._hosts.get(host_id)
            if current is not None and current[0] == fingerprint:  # lost a race: use theirs
                self._close_later(host)
                return current[1]
            self._hosts[host_id] = (fingerprint, host)
        if current is not None:
            log.info("credentials or options of %s changed: reconnecting", host_id)
            self._close_later(current[1])
        return host

    def hosts(self) -> list[LibvirtHost]:
        with self._lock:
            return [host for _, host in self._hosts.values()]

    def subscribe(
        self, listener: VirtEventListener, *, wants: Callable[[VirtEvent], bool] | None = None
    ) -> EventSubscription:
        return self._hub.subscribe(listener, wants=wants)

    async def forget(self, uri: str) -> None:
        with self._lock:
            current = self._hosts.pop(host_id_of(uri), None)
        if current is not None:
            await current[1].close()

    async def close(self) -> None:
        with self._lock:
            hosts = [host for _, host in self._hosts.values()]
            self._hosts.clear()
        await asyncio.gather(*(host.close() for host in hosts), return_exceptions=True)
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)

    async def wait_closed(self) -> None:
        """Wait for replaced hosts to finish closing (their credential files are gone then)."""
        while self._closing:
            await asyncio.gather(*list(self._closing), return_exceptions=True)

    def _close_later(self, host: LibvirtHost) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            threading.Thread(target=lambda: asyncio.run(host.close()), daemon=True).start()
            return
        task = loop.create_task(host.close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)


if TYPE_CHECKING:
    from capl.ports.virt import Host, Hosts

    def _implements_the_port(hosts: LibvirtHosts, host: LibvirtHost) -> tuple[Hosts, Host]:
        """mypy checks here that the adapter satisfies the port's Protocols."""
        return hosts, host
