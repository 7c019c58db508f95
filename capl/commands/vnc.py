"""`capl vnc MACHINE`: the graphical console of a machine's domain on a local port.

Like `virtctl vnc --proxy-only`, but through libvirt: the command listens on a loopback
port (``--address`` must be a loopback address) and every VNC viewer that connects there is
joined to the domain's VNC display:

- local host (``qemu:///system``): each connection gets its own ``virDomainOpenGraphicsFD``
  (``capl.virt.graphics``): libvirtd hands QEMU one end of a socket pair; the display's unix
  socket is never opened by capl and no TCP port is opened on the host;
- remote host over ssh: ``ssh -N -L 127.0.0.1:PORT:<display socket>`` with the host's
  credentials (the key and ``known_hosts`` of its Secret, as the manager's connection);
  the host's sshd must allow forwarding (``AllowTcpForwarding yes`` or ``local``, the
  OpenSSH default: it governs forwards to unix sockets too). The tunnel counts as up once
  the port answers with the display's RFB greeting.

The display is a unix socket only (LibvirtMachine ``spec.vnc: true``), without a password:
whoever may use libvirt on the host may see it, as with `virsh`. The command prints
``VNC of NS/NAME at 127.0.0.1:PORT`` and serves until Ctrl-C/SIGTERM (exit 0).

Exit codes: 0 stopped, 1 failure (no VNC display, domain not running), 2 usage,
3 no such machine or domain, 4 the API server or the host cannot be reached.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import signal
import socket
import sys
from typing import TYPE_CHECKING, Any

from capl.commands.onhost import machine_host
from capl.commands.shared import add_api_flags, default_namespace, formatter
from capl.errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE, CliError

if TYPE_CHECKING:
    from capl.commands.target import ConsoleTarget
    from capl.ports.console import VncDisplay
    from capl.virt.graphics import LibvirtGraphics

__all__ = ["register"]

_CHUNK = 64 * 1024
_SSH_READY_TIMEOUT = 30.0


def register(sub: Any) -> None:
    p = sub.add_parser(
        "vnc",
        help="the graphical (VNC) console of a machine on a local port",
        formatter_class=formatter,
        description=(
            "Serve the VNC display of a machine's libvirt domain on a loopback port: point a\n"
            "VNC viewer at it. MACHINE is a LibvirtMachine (with spec.vnc: true) or a Cluster\n"
            "API Machine. Ctrl-C stops."
        ),
        epilog=(
            "examples:\n"
            "  capl vnc demo-md-0-7x2kq -n default           prints the port to connect to\n"
            "  capl vnc worker-0 --port 5901 & vncviewer 127.0.0.1::5901\n"
            "\n"
            "exit codes: 0 stopped, 1 no VNC display or not running, 3 no such machine or\n"
            "domain, 4 unreachable"
        ),
    )
    p.add_argument("machine", metavar="MACHINE", help="LibvirtMachine or Machine name")
    p.add_argument("-n", "--namespace", default=None, help="namespace (default: context's)")
    add_api_flags(p)
    p.add_argument("--address", default="127.0.0.1", help="loopback address to listen on")
    p.add_argument("--port", type=int, default=0, help="port to listen on (0: any free one)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        if not ipaddress.ip_address(args.address).is_loopback:
            raise ValueError
    except ValueError:
        raise CliError(
            f"--address {args.address} is not a loopback address: the VNC display is "
            "served to this machine only",
            code=EXIT_USAGE,
        ) from None
    if not 0 <= args.port <= 65535:
        raise CliError(f"--port {args.port} is not a port number", code=EXIT_USAGE)
    namespace = args.namespace or default_namespace(args.kubeconfig, context=args.context)
    return asyncio.run(_serve(args, namespace))


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


async def _serve(args: argparse.Namespace, namespace: str) -> int:
    from capl.ports.errors import OperationInvalid
    from capl.virt.graphics import LibvirtGraphics

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    async with machine_host(args, namespace) as (target, host):
        graphics = LibvirtGraphics(host)
        try:
            display = await graphics.vnc_display(target.uuid)
        except OperationInvalid:
            raise CliError(
                f"the domain of {namespace}/{target.machine} is not running", code=EXIT_FAILED
            ) from None
        if display is None:
            raise CliError(
                f"the domain of {namespace}/{target.machine} has no VNC display (set spec.vnc: "
                "true on the LibvirtMachine; it applies when the domain is defined)",
                code=EXIT_FAILED,
            )
        if display.tcp:
            _say(f"capl: warning: the domain also listens for VNC on TCP {display.tcp}")
        if graphics.plan.remote:
            await _ssh_forward(args, target, graphics, display, stop)
        else:
            await _proxy(args, target, graphics, display, stop)
    return EXIT_OK


def _announce(target: ConsoleTarget, address: str, port: int) -> None:
    where = f"{target.namespace}/{target.machine} (domain {target.uuid} on {target.host.name})"
    print(f"VNC of {where} at {address}:{port}", flush=True)
    _say(f"capl: connect a VNC viewer to {address}::{port} (Ctrl-C stops)")


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(_CHUNK):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(OSError, RuntimeError):
            writer.close()


async def _proxy(
    args: argparse.Namespace,
    target: ConsoleTarget,
    graphics: LibvirtGraphics,
    display: VncDisplay,
    stop: asyncio.Event,
) -> None:
    """Serve viewers on the loopback port; each gets its own connection to the display."""
    from capl.ports.errors import VirtError

    async def client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            vnc = await graphics.open_vnc(target.uuid, display)
        except VirtError as exc:
            _say(f"capl: cannot open the VNC display: {exc}")
            writer.close()
            return
        vnc.setblocking(False)
        vnc_reader, vnc_writer = await asyncio.open_connection(sock=vnc)
        await asyncio.gather(_pump(reader, vnc_writer), _pump(vnc_reader, writer))

    server = await asyncio.start_server(client, host=args.address, port=args.port)
    async with server:
        _announce(target, args.address, server.sockets[0].getsockname()[1])
        await stop.wait()


def _free_port(address: str) -> int:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.bind((address, 0))
        port: int = probe.getsockname()[1]
        return port


async def _ssh_forward(
    args: argparse.Namespace,
    target: ConsoleTarget,
    graphics: LibvirtGraphics,
    display: VncDisplay,
    stop: asyncio.Event,
) -> None:
    """``ssh -L`` from the loopback port to the display's socket on the remote host."""
    from capl.virt.graphics import ssh_forward_argv

    if not display.socket:
        raise CliError(
            f"the VNC display of {args.namespace}/{target.machine} has no unix socket to "
            "forward to",
            code=EXIT_FAILED,
        )
    port = args.port or _free_port(args.address)
    argv = ssh_forward_argv(
        graphics.plan, remote_socket=display.socket, local_port=port, local_address=args.address
    )
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
    )
    try:
        await _wait_listening(args.address, port, proc)
        _announce(target, args.address, port)
        ended = asyncio.ensure_future(proc.wait())
        stopped = asyncio.ensure_future(stop.wait())
        await asyncio.wait({ended, stopped}, return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        if ended.done():
            raise CliError(f"the ssh tunnel ended (ssh exited {proc.returncode})")
        ended.cancel()
    finally:
        if proc.returncode is None:
            proc.terminate()
            await proc.wait()


async def _wait_listening(address: str, port: int, proc: asyncio.subprocess.Process) -> None:
    """Until the forwarded port answers with the display's RFB greeting; a clear error when
    ssh exits or its server refuses the forward (sshd's ``AllowTcpForwarding no`` also
    denies forwards to unix sockets)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + _SSH_READY_TIMEOUT
    while True:
        if proc.returncode is not None or loop.time() > deadline:
            raise CliError(
                "the ssh tunnel to the VNC display did not come up: "
                + (await _ssh_errors(proc) or "no answer in time")
            )
        try:
            reader, writer = await asyncio.open_connection(address, port)
        except OSError:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), 0.2)
            continue
        try:
            greeting = await asyncio.wait_for(reader.read(12), _SSH_READY_TIMEOUT)
        except (TimeoutError, OSError):
            greeting = b""
        finally:
            writer.close()
        if greeting.startswith(b"RFB "):
            return
        raise CliError(
            "the host's ssh server did not forward to the VNC display's socket (sshd must "
            "allow forwarding: AllowTcpForwarding yes or local, the OpenSSH default): "
            + (await _ssh_errors(proc) or "the connection closed")
        )


async def _ssh_errors(proc: asyncio.subprocess.Process) -> str:
    """What ssh said on stderr so far (one line)."""
    if proc.stderr is None:
        return ""
    try:
        data = await asyncio.wait_for(proc.stderr.read(4096), 2)
    except TimeoutError:
        return ""
    return " ".join(data.decode(errors="replace").split())
