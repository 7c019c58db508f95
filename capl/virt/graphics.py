"""VNC displays of domains: ``capl.ports.console.Graphics`` on one ``LibvirtHost``.

capl's domains get ``<graphics type='vnc'><listen type='socket'/></graphics>`` (``spec.vnc``):
QEMU listens on a unix socket in libvirt's per-domain directory, never on TCP. Two ways in:

- a local libvirt connection (``qemu:///system``, ``qemu+unix://``): ``open_vnc`` calls
  ``virDomainOpenGraphicsFD``: libvirtd makes a socket pair, hands one end to QEMU as a new
  VNC client and passes the other end to us over its unix socket (file-descriptor passing).
  This needs no access to the socket's directory, only to libvirt;
- a remote host over ssh: libvirt's remote protocol cannot pass descriptors through ssh, so
  ``ssh_forward_argv`` builds an ``ssh -N -L 127.0.0.1:PORT:<socket>`` command from the
  host's connection plan (the same key, ``known_hosts`` pinning and wrapper the libvirt
  connection uses): OpenSSH forwards the local TCP port to the remote unix socket.

Other remote transports (tls, tcp) have no way to the socket: ``GraphicsUnavailable``.
"""

from __future__ import annotations

import contextlib
import os
import socket
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlsplit

import libvirt

from capl.ports.console import GraphicsUnavailable, VncDisplay
from capl.ports.errors import DomainNotFound, OperationInvalid
from capl.ports.virt import HostId
from capl.virt.host import LibvirtHost
from capl.virt.support import lookup
from capl.virt.uri import ConnectPlan
from capl.virt.xmlutil import parse

__all__ = ["LibvirtGraphics", "ssh_forward_argv", "vnc_display_of"]


def vnc_display_of(domain_xml: str) -> VncDisplay | None:
    """The first VNC display of a live domain XML."""
    root = parse(domain_xml)
    for index, graphics in enumerate(root.findall("./devices/graphics")):
        if graphics.get("type") != "vnc":
            continue
        path = graphics.get("socket")
        tcp = None
        for listen in graphics.findall("listen"):
            if listen.get("type") == "socket" and listen.get("socket"):
                path = path or listen.get("socket")
            elif listen.get("type") == "address" and listen.get("address"):
                tcp = f"{listen.get('address')}:{graphics.get('port')}"
        if tcp is None and graphics.get("listen") and graphics.get("port") not in (None, "-1"):
            tcp = f"{graphics.get('listen')}:{graphics.get('port')}"
        return VncDisplay(
            index=index, socket=path, tcp=tcp, password=graphics.get("passwd") is not None
        )
    return None


def ssh_forward_argv(
    plan: ConnectPlan, *, remote_socket: str, local_port: int, local_address: str = "127.0.0.1"
) -> list[str]:
    """``ssh`` forwarding ``local_address:local_port`` to ``remote_socket`` on the plan's host."""
    if plan.transport not in {"ssh", "libssh", "libssh2"}:
        raise GraphicsUnavailable(
            f"the VNC display of a remote host is reached through ssh; {plan.host_id} uses "
            f"the {plan.transport or 'tls'} transport (connect the host with qemu+ssh://)",
            host=plan.host_id,
        )
    parts = urlsplit(plan.uri)
    params = dict(parse_qsl(parts.query))
    argv = [params.get("command") or "ssh"]
    if params.get("keyfile"):
        argv += ["-i", params["keyfile"], "-o", "IdentitiesOnly=yes"]
    if params.get("no_verify") == "1" or params.get("known_hosts_verify") == "ignore":
        argv += ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null"]
    elif params.get("known_hosts"):
        argv += ["-o", f"UserKnownHostsFile={params['known_hosts']}"]
        argv += ["-o", "StrictHostKeyChecking=yes"]
    if parts.port:
        argv += ["-p", str(parts.port)]
    if parts.username:
        argv += ["-l", parts.username]
    argv += ["-o", "BatchMode=yes", "-o", "ExitOnForwardFailure=yes", "-N", "-T"]
    bind = f"[{local_address}]" if ":" in local_address else local_address
    argv += ["-L", f"{bind}:{local_port}:{remote_socket}", "--", str(parts.hostname)]
    return argv


class LibvirtGraphics:
    """``capl.ports.console.Graphics`` on one ``LibvirtHost``."""

    def __init__(self, host: LibvirtHost) -> None:
        self._host = host

    @property
    def host_id(self) -> HostId:
        return self._host.host_id

    @property
    def plan(self) -> ConnectPlan:
        plan: ConnectPlan = self._host.connection.plan
        return plan

    async def vnc_display(self, uuid: str) -> VncDisplay | None:
        host_id = self.host_id

        def op(c: Any) -> VncDisplay | None:
            domain = _domain(c, uuid, host_id)
            if not domain.isActive():
                raise OperationInvalid(
                    f"domain {uuid} ({domain.name()}) is not running", host=host_id
                )
            return vnc_display_of(domain.XMLDesc(0))

        result: VncDisplay | None = await self._host.connection.run(
            f"read the graphics of domain {uuid}", op
        )
        return result

    async def open_vnc(self, uuid: str, display: VncDisplay) -> socket.socket:
        host_id = self.host_id
        if self.plan.remote:
            raise GraphicsUnavailable(
                f"{host_id} is remote: libvirt cannot pass a VNC connection through its "
                "transport (use an ssh tunnel to the display's socket)",
                host=host_id,
            )

        def op(c: Any) -> socket.socket:
            domain = _domain(c, uuid, host_id)
            fd = domain.openGraphicsFD(display.index, libvirt.VIR_DOMAIN_OPEN_GRAPHICS_SKIPAUTH)
            try:
                return socket.socket(fileno=fd)
            except OSError:
                with contextlib.suppress(OSError):
                    os.close(fd)
                raise

        result: socket.socket = await self._host.connection.run(
            f"open the VNC display of domain {uuid}", op
        )
        return result


def _domain(c: Any, uuid: str, host_id: HostId) -> Any:
    domain = lookup(lambda: c.lookupByUUIDString(uuid), libvirt.VIR_ERR_NO_DOMAIN)
    if domain is None:
        raise DomainNotFound(f"domain {uuid} does not exist on {host_id}", host=host_id)
    return domain


if TYPE_CHECKING:
    from capl.ports.console import Graphics

    def _implements_the_port(graphics: LibvirtGraphics) -> Graphics:
        """mypy checks here that the adapter satisfies the port's Protocol."""
        return graphics
