"""The console port: a domain's serial console as a plain, selectable byte channel.

``capl console`` bridges a terminal to a domain's serial console. The libvirt side (a
non-blocking ``virStream`` driven by libvirt's event thread) is an adapter concern; what the
command sees is a ``ConsoleChannel`` that behaves like one end of a socket pair: ``fileno``
for ``select``, ``recv`` (``b""`` once the console has ended), ``sendall`` and ``close``.
That keeps the terminal code free of libvirt and lets tests drive it with a socket pair.

Where the host's driver cannot open consoles (the libvirt test driver, or a console already
taken with no ``force``), the command falls back to following the console *log*, the file
the domain's first serial port is logged to (``<serial><log file=.../>``) or a file-backed
serial (``<serial type='file'>``). ``console_log`` says where that file is; it lives on the
host, so it can be read directly only when the host is this machine (``local``).
"""

from __future__ import annotations

import enum
import socket
from dataclasses import dataclass
from typing import Protocol

from capl.ports.errors import Busy, Unsupported
from capl.ports.virt import HostId

__all__ = [
    "ConsoleBusy",
    "ConsoleChannel",
    "ConsoleLog",
    "ConsoleLogKind",
    "ConsoleUnavailable",
    "Consoles",
    "Graphics",
    "GraphicsUnavailable",
    "VncDisplay",
]


class ConsoleUnavailable(Unsupported):
    """The host's driver cannot open a console for this domain (e.g. the test driver)."""

    REASON = "ConsoleUnavailable"


class ConsoleBusy(Busy):
    """Another client holds the console; opening it with ``force`` takes it over."""

    REASON = "ConsoleBusy"


class ConsoleLogKind(enum.StrEnum):
    LOG = "log"
    """The serial port's ``<log file=...>`` (a pty console whose output is also logged)."""
    FILE = "file"
    """A file-backed serial port (``<serial type='file'>``): output only, no input."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsoleLog:
    """Where a domain's serial output is written on its host."""

    path: str
    kind: ConsoleLogKind


class ConsoleChannel(Protocol):
    """An open console: bytes from the guest arrive on ``recv``; ``sendall`` types."""

    def fileno(self) -> int:
        """A descriptor that polls readable when output (or the end) is waiting."""
        ...

    def recv(self, size: int, /) -> bytes:
        """Up to ``size`` bytes of guest output; ``b""`` when the console has ended."""
        ...

    def sendall(self, data: bytes, /) -> None:
        """Send input to the guest (silently dropped once the console has ended)."""
        ...

    @property
    def end_reason(self) -> str | None:
        """Why the console ended (None while it is open, or when the user closed it)."""
        ...

    def close(self) -> None:
        """End the session and release the stream; idempotent."""
        ...


class Consoles(Protocol):
    """The consoles of one host's domains."""

    @property
    def host_id(self) -> HostId: ...

    @property
    def local(self) -> bool:
        """Whether the host is this machine (its files, e.g. console logs, are readable here)."""
        ...

    async def open_console(
        self, uuid: str, *, device: str | None = None, force: bool = False
    ) -> ConsoleChannel:
        """Open the domain's console (``device``: an alias such as ``serial0``; None: the
        first console). Raises DomainNotFound, ConsoleUnavailable, ConsoleBusy (without
        ``force``), OperationInvalid (the domain is not running), HostUnreachable."""
        ...

    async def console_log(self, uuid: str) -> ConsoleLog | None:
        """Where the domain's first serial port is logged, if anywhere (DomainNotFound)."""
        ...


# --- the graphical console (`capl vnc`) ------------------------------------------------------


class GraphicsUnavailable(Unsupported):
    """The domain has no VNC display, or it cannot be reached from here."""

    REASON = "GraphicsUnavailable"


@dataclass(frozen=True, slots=True, kw_only=True)
class VncDisplay:
    """A running domain's VNC display as its live XML says (never a password's value)."""

    index: int
    """Position among the domain's graphics devices (``virDomainOpenGraphicsFD``'s idx)."""
    socket: str | None
    """The unix socket on the host it listens on (``<listen type='socket'>``), if any."""
    tcp: str | None
    """``address:port`` of a TCP listener, if the domain has one (capl never makes one)."""
    password: bool
    """Whether the display asks for a password (a viewer must know it)."""


class Graphics(Protocol):
    """The graphical consoles of one host's domains."""

    @property
    def host_id(self) -> HostId: ...

    async def vnc_display(self, uuid: str) -> VncDisplay | None:
        """The first VNC display of a running domain; None when it has none.
        Raises DomainNotFound, OperationInvalid (not running)."""
        ...

    async def open_vnc(self, uuid: str, display: VncDisplay) -> socket.socket:
        """A new client connection to the display (a connected stream socket whose other
        end QEMU holds, ``virDomainOpenGraphicsFD``): only through a local libvirt socket.
        Raises GraphicsUnavailable (remote host), DomainNotFound."""
        ...
