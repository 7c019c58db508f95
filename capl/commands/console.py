"""`capl console MACHINE`: the interactive serial console of a machine's domain.

Like `virtctl console`, but through libvirt:

1. Find the machine: a LibvirtMachine of that name, else a Cluster API Machine of that name
   whose ``spec.infrastructureRef`` is a LibvirtMachine (so both names users see work).
2. Find the host: the LibvirtCluster of the machine's cluster has ``spec.hosts[]`` with the
   URI, the credentials Secret and the insecure-transport opt-ins; the connection is made
   exactly as the manager makes it (both steps: ``capl.commands.target``).
3. Open the console (``capl.virt.console.LibvirtConsoles``: a non-blocking libvirt stream
   pumped by libvirt's event thread into a socket pair) and bridge it to the terminal in raw
   mode: bytes go through unchanged; Ctrl-] (0x1d) leaves. The terminal is restored on
   every way out (escape, end of the console, errors, SIGTERM/SIGHUP).

Where the driver cannot open a console (the libvirt test driver), or with ``--log``, the
command follows the console *log* instead (the serial port's ``<log file>`` or a file
serial, read from the domain XML), read-only, like ``tail -f``: the last 16 KiB first, then
new output as it is written; a truncated or replaced file is followed from its start. That
file is on the host, so this works when the host is this machine.

Exit codes: 0 left with Ctrl-] (or the console ended), 1 failure, 2 usage, 3 the machine or
its domain does not exist, 4 the API server or the host cannot be reached.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import select
import signal
import sys
import termios
import tty
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING, Any

from capl.commands.shared import (
    add_api_flags,
    connect,
    default_namespace,
    formatter,
)
from capl.commands.target import ConsoleTarget, resolve_target
from capl.errors import EXIT_FAILED, EXIT_NOT_FOUND, EXIT_OK, EXIT_UNREACHABLE, CliError

if TYPE_CHECKING:
    from capl.ports.console import ConsoleChannel, ConsoleLog
    from capl.virt import LibvirtHosts

__all__ = [
    "ESCAPE",
    "bridge",
    "follow_log",
    "register",
]

ESCAPE = b"\x1d"
"""Ctrl-]: leaves the console (as in telnet, virsh and virtctl)."""
_INTERRUPT = b"\x03"
_TAIL_BYTES = 16 * 1024
_LOG_POLL = 0.25
_READ = 64 * 1024


# --- the terminal --------------------------------------------------------------------------------


class _Signalled(BaseException):
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def raw_terminal(fd: int) -> Iterator[bool]:
    """Raw mode on ``fd`` when it is a terminal (yields whether it is); always restored.

    SIGTERM and SIGHUP raise ``_Signalled`` inside the block so the ``finally`` runs; in raw
    mode the terminal sends Ctrl-C and Ctrl-Z as bytes (they reach the guest).
    """
    is_tty = os.isatty(fd)
    saved = termios.tcgetattr(fd) if is_tty else None

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        raise _Signalled(signum)

    previous: dict[signal.Signals, Any] = {}
    for stop in (signal.SIGTERM, signal.SIGHUP):
        with contextlib.suppress(ValueError):  # not the main thread
            previous[stop] = signal.signal(stop, on_signal)
    try:
        if saved is not None:
            tty.setraw(fd, termios.TCSANOW)
        yield is_tty
    finally:
        if saved is not None:
            with contextlib.suppress(termios.error):
                termios.tcsetattr(fd, termios.TCSADRAIN, saved)
        for stop, handler in previous.items():
            signal.signal(stop, handler)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            written = os.write(fd, view)
        except BlockingIOError:
            select.select([], [fd], [])
            continue
        view = view[written:]


def bridge(channel: ConsoleChannel, *, stdin_fd: int, stdout_fd: int) -> str:
    """Copy between the terminal and the console until Ctrl-], the end of input or of the
    console; returns "escape", "input-closed" or "console-closed"."""
    watching = [stdin_fd, channel.fileno()]
    while True:
        readable, _, _ = select.select(watching, [], [])
        if channel.fileno() in readable:
            data = channel.recv(_READ)
            if not data:
                return "console-closed"
            _write_all(stdout_fd, data)
        if stdin_fd in readable:
            typed = os.read(stdin_fd, 4096)
            if not typed:
                return "input-closed"
            at = typed.find(ESCAPE)
            if at >= 0:
                if at:
                    channel.sendall(typed[:at])
                return "escape"
            channel.sendall(typed)


class _Follower:
    """Reads what is appended to a file, reopening it when it is truncated or replaced."""

    def __init__(self, path: str, *, tail: int) -> None:
        self.path = path
        self._tail = tail
        self._handle: Any = None
        self._inode: tuple[int, int] | None = None
        self._first = True

    def read(self) -> bytes:
        if self._handle is None and not self._open():
            return b""
        try:
            stat = os.stat(self.path)
        except OSError:
            stat = None
        if stat is not None and (
            (stat.st_dev, stat.st_ino) != self._inode or stat.st_size < self._handle.tell()
        ):
            self.close()
            if not self._open():
                return b""
        chunks: list[bytes] = []
        while True:
            chunk = self._handle.read(_READ)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)

    def _open(self) -> bool:
        try:
            handle = open(self.path, "rb")  # noqa: SIM115 - kept open while following
        except OSError:
            return False
        stat = os.fstat(handle.fileno())
        if self._first:
            handle.seek(max(0, stat.st_size - self._tail))
            self._first = False
        self._handle, self._inode = handle, (stat.st_dev, stat.st_ino)
        return True

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None

    @property
    def exists(self) -> bool:
        return self._handle is not None or os.path.exists(self.path)


def follow_log(
    path: str,
    *,
    stdin_fd: int,
    stdout_fd: int,
    interval: float = _LOG_POLL,
    tail: int = _TAIL_BYTES,
    on_missing: Callable[[], None] | None = None,
) -> str:
    """Print the end of ``path`` and what is appended to it until Ctrl-] (or Ctrl-C: the log
    takes no input) or the end of input; returns "escape" or "input-closed"."""
    follower = _Follower(path, tail=tail)
    warned = False
    try:
        while True:
            data = follower.read()
            if data:
                _write_all(stdout_fd, data)
            elif not warned and not follower.exists and on_missing is not None:
                on_missing()
                warned = True
            readable, _, _ = select.select([stdin_fd], [], [], interval)
            if readable:
                typed = os.read(stdin_fd, 4096)
                if not typed:
                    return "input-closed"
                if ESCAPE in typed or _INTERRUPT in typed:
                    return "escape"
    finally:
        follower.close()


# --- the command ---------------------------------------------------------------------------------


def register(sub: Any) -> None:
    p = sub.add_parser(
        "console",
        help="the serial console of a machine's domain",
        formatter_class=formatter,
        description=(
            "Attach the terminal to the serial console of a machine's libvirt domain.\n"
            "MACHINE is a LibvirtMachine or a Cluster API Machine. Ctrl-] leaves.\n"
            "Where the host's driver cannot open consoles (the libvirt test driver), the\n"
            "console log is followed instead (read-only)."
        ),
        epilog=(
            "examples:\n"
            "  capl console demo-md-0-7x2kq -n default\n"
            "  capl console demo-control-plane-abcde --kubeconfig ~/.kube/mgmt.yaml\n"
            "  capl console worker-0 --force         take the console over from another client\n"
            "  capl console worker-0 --log           follow the console log file instead\n"
            "\n"
            "exit codes: 0 left with Ctrl-], 3 no such machine or domain, 4 unreachable"
        ),
    )
    p.add_argument("machine", metavar="MACHINE", help="LibvirtMachine or Machine name")
    p.add_argument("-n", "--namespace", default=None, help="namespace (default: context's)")
    add_api_flags(p)
    p.add_argument(
        "--force", action="store_true", help="disconnect another client holding the console"
    )
    p.add_argument(
        "--devname", default=None, help="console device alias, e.g. serial1 (default: the first)"
    )
    p.add_argument("--log", action="store_true", help="follow the console log instead of attaching")
    p.set_defaults(run=run)


@dataclass(slots=True)
class _Session:
    """What `_open` hands to the terminal loop: a console, or a log file to follow."""

    hosts: LibvirtHosts
    target: ConsoleTarget
    channel: ConsoleChannel | None = None
    log: ConsoleLog | None = None
    why_log: str = ""


def run(args: argparse.Namespace) -> int:
    namespace = args.namespace or default_namespace(args.kubeconfig, context=args.context)
    session = asyncio.run(_open(args, namespace))
    try:
        return _interact(session)
    finally:
        if session.channel is not None:
            session.channel.close()
        asyncio.run(session.hosts.close())


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _interact(session: _Session) -> int:
    target = session.target
    stdin_fd, stdout_fd = sys.stdin.fileno(), sys.stdout.fileno()
    sys.stdout.flush()
    where = f"{target.namespace}/{target.machine} (domain {target.uuid} on {target.host.name})"
    try:
        if session.channel is not None:
            # raw mode first: what the user types after the banner goes to the guest
            # (a CR ends the line: raw mode does no output processing)
            with raw_terminal(stdin_fd):
                _say(f"Connected to {where}. Escape character is ^]\r")
                how = bridge(session.channel, stdin_fd=stdin_fd, stdout_fd=stdout_fd)
            if how == "console-closed":
                _say(f"\ncapl: {session.channel.end_reason or 'the console closed'}")
            else:
                _say("")
            return EXIT_OK
        assert session.log is not None
        path = session.log.path
        with raw_terminal(stdin_fd):
            _say(
                f"{session.why_log}: following the console log {path} of {where} "
                "(read-only). Ctrl-] leaves\r"
            )
            follow_log(
                path,
                stdin_fd=stdin_fd,
                stdout_fd=stdout_fd,
                on_missing=lambda: _say(f"capl: waiting for {path} to appear\r"),
            )
        _say("")
        return EXIT_OK
    except _Signalled as stop:
        _say(f"\ncapl: stopped by signal {stop.signum}")
        return 128 + stop.signum


async def _open(args: argparse.Namespace, namespace: str) -> _Session:
    from capl.ports.console import ConsoleBusy, ConsoleUnavailable
    from capl.ports.errors import CredentialsError, DomainNotFound, HostUnreachable, VirtError
    from capl.ports.virt import DomainState
    from capl.virt import LibvirtHosts
    from capl.virt.console import LibvirtConsoles

    client = await connect(args.kubeconfig, context=args.context)
    async with client:
        target = await resolve_target(client, namespace=namespace, name=args.machine)
    hosts = LibvirtHosts(max_workers_per_host=2)
    try:
        host = target.host.connect(hosts)
        consoles = LibvirtConsoles(host)
        session = _Session(hosts=hosts, target=target)
        info = await host.get_domain(target.uuid)
        if info is None:
            raise CliError(
                f"the domain {target.uuid} of LibvirtMachine {namespace}/{target.machine} "
                f"does not exist on host {target.host.name} ({host.host_id})",
                code=EXIT_NOT_FOUND,
            )
        if not args.log:
            if info.state == DomainState.SHUTOFF:
                raise CliError(
                    f"the domain of {namespace}/{target.machine} is not running "
                    f"(state {info.state}); --log shows its console log",
                    code=EXIT_FAILED,
                )
            try:
                session.channel = await consoles.open_console(
                    target.uuid, device=args.devname, force=args.force
                )
                return session
            except ConsoleUnavailable:
                driver = host.host_id.split(":", 1)[0].split("+", 1)[0]
                session.why_log = (
                    f"capl: the {driver} driver of {host.host_id} cannot open consoles"
                )
            except ConsoleBusy as exc:
                raise CliError(str(exc), code=EXIT_FAILED) from exc
        else:
            session.why_log = "capl: --log"
        session.log = await consoles.console_log(target.uuid)
        if session.log is None:
            raise CliError(
                f"{session.why_log.removeprefix('capl: ')}, and the domain of "
                f"{namespace}/{target.machine} logs no serial output to a file",
                code=EXIT_FAILED,
            )
        if not consoles.local:
            raise CliError(
                f"the console log of {namespace}/{target.machine} is {session.log.path} on host "
                f"{target.host.name} ({host.host_id}), not on this machine: read it there",
                code=EXIT_FAILED,
            )
        return session
    except BaseException as exc:
        await hosts.close()
        if isinstance(exc, DomainNotFound):
            raise CliError(str(exc), code=EXIT_NOT_FOUND) from exc
        if isinstance(exc, HostUnreachable):
            raise CliError(str(exc), code=EXIT_UNREACHABLE) from exc
        if isinstance(exc, CredentialsError | VirtError):
            raise CliError(str(exc), code=EXIT_FAILED) from exc
        raise
