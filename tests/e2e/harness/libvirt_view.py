"""Direct looks at libvirt for the e2e tests.

libvirt (`LibvirtView`)
    Reads libvirt directly (libvirt-python, not capl's adapter): domains with owner metadata,
    volumes of a pool, DHCP hosts and DNS records from the network XML, leases;
    `resolve_a` asks the network's dnsmasq itself. Its own connection, reopened when the
    shared libvirtd restarts under it. `force_cleanup` removes what a failed test left.

    `resolve_a` is one plain UDP DNS query (stdlib only).
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import secrets
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar
from xml.etree import ElementTree

import libvirt

from tests.fixtures.libvirt_direct import (
    NetworkFacts,
    free_cidr,
    owner_tag,
    parse_network_xml,
    sweep,
)

# --- libvirt, read directly ------------------------------------------------------------------


@dataclass(frozen=True)
class DomainFacts:
    name: str
    uuid: str
    id: int
    """The runtime id of a running domain (-1 when off): a restart changes it."""
    state: int
    memory_kib: int
    vcpus: int
    domain_type: str
    owner: dict[str, str]
    """capl's ownership metadata (cluster, namespace, name, uid, kind); empty when absent."""

    @property
    def running(self) -> bool:
        return bool(self.state == libvirt.VIR_DOMAIN_RUNNING)


_CONNECTION_ERRORS = frozenset(
    {
        libvirt.VIR_ERR_INTERNAL_ERROR,  # "client socket is closed"
        libvirt.VIR_ERR_SYSTEM_ERROR,  # "Cannot write data: Broken pipe"
        libvirt.VIR_ERR_RPC,
        libvirt.VIR_ERR_NO_CONNECT,
        libvirt.VIR_ERR_INVALID_CONN,
    }
)
R = TypeVar("R")


def _reconnecting(method: Callable[..., R]) -> Callable[..., R]:
    """Run a LibvirtView method again on a fresh connection when the daemon went away
    under the old one (another test stage may restart the shared libvirtd)."""

    @functools.wraps(method)
    def wrapper(self: LibvirtView, *args: Any, **kwargs: Any) -> R:
        try:
            return method(self, *args, **kwargs)
        except libvirt.libvirtError as exc:
            if exc.get_error_code() not in _CONNECTION_ERRORS or self._alive():
                raise
            self._drop()
            return method(self, *args, **kwargs)

    return wrapper


class LibvirtView:
    """Direct, read-mostly access to one libvirt daemon (blocking calls, all fast); its own
    connection, opened again when the daemon restarted."""

    def __init__(self, uri: str, *, reconnect_within: float = 60.0) -> None:
        self.uri = uri
        self.reconnect_within = reconnect_within
        self._conn: libvirt.virConnect | None = None

    @property
    def conn(self) -> libvirt.virConnect:
        if self._conn is not None and self._alive():
            return self._conn
        self._drop()
        deadline = time.monotonic() + self.reconnect_within
        while True:
            try:
                self._conn = libvirt.open(self.uri)
                return self._conn
            except libvirt.libvirtError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.5)  # libvirtd is restarting; nothing else to wait on here

    def _alive(self) -> bool:
        try:
            return self._conn is not None and bool(self._conn.isAlive())
        except libvirt.libvirtError:
            return False

    def _drop(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(libvirt.libvirtError):
                self._conn.close()
        self._conn = None

    def close(self) -> None:
        self._drop()

    @_reconnecting
    def domains(self, prefix: str) -> dict[str, DomainFacts]:
        """Every domain whose name starts with `prefix`, by name."""
        out: dict[str, DomainFacts] = {}
        for dom in self.conn.listAllDomains(0):
            try:
                name = dom.name()
                if not name.startswith(prefix):
                    continue
                out[name] = self._facts(dom)
            except libvirt.libvirtError as exc:
                if exc.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
                    continue  # undefined while we looked
                raise
        return out

    def _facts(self, dom: libvirt.virDomain) -> DomainFacts:
        state, _reason = dom.state()
        root = ElementTree.fromstring(dom.XMLDesc(0))
        return DomainFacts(
            name=dom.name(),
            uuid=dom.UUIDString().lower(),
            id=int(dom.ID()) if dom.isActive() else -1,
            state=int(state),
            memory_kib=int(root.findtext("memory") or 0),
            vcpus=int(root.findtext("vcpu") or 0),
            domain_type=str(root.get("type")),
            owner=owner_tag(root),
        )

    @_reconnecting
    def domain(self, name: str) -> DomainFacts | None:
        try:
            return self._facts(self.conn.lookupByName(name))
        except libvirt.libvirtError as exc:
            if exc.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
                return None
            raise

    @_reconnecting
    def destroy(self, name: str) -> None:
        """Stop a domain out of band (`virsh destroy`)."""
        self.conn.lookupByName(name).destroy()

    @_reconnecting
    def volumes(self, pool: str) -> set[str] | None:
        """Volume names of the pool (refreshed), None when the pool does not exist."""
        try:
            handle = self.conn.storagePoolLookupByName(pool)
        except libvirt.libvirtError as exc:
            if exc.get_error_code() == libvirt.VIR_ERR_NO_STORAGE_POOL:
                return None
            raise
        if handle.isActive():
            with contextlib.suppress(libvirt.libvirtError):
                handle.refresh(0)
            return {v.name() for v in handle.listAllVolumes(0)}
        return set()

    def pool_exists(self, pool: str) -> bool:
        return self.volumes(pool) is not None

    @_reconnecting
    def network(self, name: str) -> NetworkFacts | None:
        try:
            net = self.conn.networkLookupByName(name)
        except libvirt.libvirtError as exc:
            if exc.get_error_code() == libvirt.VIR_ERR_NO_NETWORK:
                return None
            raise
        return parse_network_xml(net.XMLDesc(0), active=bool(net.isActive()))

    @_reconnecting
    def leases(self, network: str) -> list[dict[str, Any]]:
        try:
            return list(self.conn.networkLookupByName(network).DHCPLeases())
        except libvirt.libvirtError:
            return []

    @_reconnecting
    def free_cidr(self) -> str:
        """A random /24 in 10.0.0.0/8 that no libvirt network, address or route uses."""
        return free_cidr(conn=self.conn)

    @_reconnecting
    def force_cleanup(
        self, *, domain_prefix: str, network: str | None, pool: str | None
    ) -> list[str]:
        """Remove what a test left: domains named `domain_prefix...`, the pool (volumes,
        directory) and the network. Returns what it removed (empty when all was clean)."""
        return sweep(self.conn, domain_prefix=domain_prefix, network=network, pool=pool)


def resolve_a(server: str, name: str, *, timeout: float = 2.0) -> set[str]:
    """The A records `server` (a dnsmasq on a test network's bridge) answers for `name`:
    one plain UDP query, no recursion wanted (stdlib only)."""
    query_id = secrets.randbelow(1 << 16)
    header = query_id.to_bytes(2, "big") + b"\x00\x00" + b"\x00\x01" + b"\x00" * 6
    question = b"".join(len(p).to_bytes(1, "big") + p.encode() for p in name.split("."))
    packet = header + question + b"\x00" + b"\x00\x01\x00\x01"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(timeout)
        sock.sendto(packet, (server, 53))
        reply, _ = sock.recvfrom(4096)
    if reply[:2] != query_id.to_bytes(2, "big"):
        raise RuntimeError(f"DNS reply for {name} from {server} has a foreign id")
    answers = int.from_bytes(reply[6:8], "big")
    pos = len(packet)
    found: set[str] = set()
    for _ in range(answers):
        if reply[pos] & 0xC0 == 0xC0:  # a compressed name: a pointer
            pos += 2
        else:
            while reply[pos]:
                pos += reply[pos] + 1
            pos += 1
        rtype = int.from_bytes(reply[pos : pos + 2], "big")
        length = int.from_bytes(reply[pos + 8 : pos + 10], "big")
        data = reply[pos + 10 : pos + 10 + length]
        pos += 10 + length
        if rtype == 1 and length == 4:
            found.add(str(ipaddress.IPv4Address(data)))
    return found
