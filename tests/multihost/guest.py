"""Commands in a running test guest, typed on its serial console through capl's own console
adapter (`capl.virt.LibvirtConsoles`, over the same TLS or ssh connection the manager uses).

The test guest runs a root shell on ttyS0 (hack/guest/inittab). `run_in_guest` sends
``<command>; echo CAPL-RC-<token>=$?`` and reads the console until the marker line with the
exit status appears (the echoed command line itself shows ``=$?``, never digits). A shell
not started yet (the guest still booting) loses what was typed: the line is sent again every
`resend` seconds until the deadline.
"""

from __future__ import annotations

import asyncio
import re
import secrets
import select
import time
from dataclasses import dataclass

from capl.ports.console import ConsoleChannel
from capl.virt import LibvirtHost
from capl.virt.console import LibvirtConsoles


@dataclass(frozen=True)
class GuestRun:
    status: int
    output: str
    """Everything the console printed meanwhile (kernel messages included)."""


def _converse(
    channel: ConsoleChannel, line: bytes, token: bytes, *, within: float, resend: float
) -> GuestRun:
    marker = re.compile(rb"CAPL-RC-" + token + rb"=(\d+)")
    deadline = time.monotonic() + within
    seen = b""
    next_send = 0.0
    while time.monotonic() < deadline:
        if time.monotonic() >= next_send:
            channel.sendall(b"\n" + line)
            next_send = time.monotonic() + resend
        ready, _, _ = select.select([channel], [], [], 0.5)
        if ready:
            data = channel.recv(65536)
            if not data:
                raise AssertionError(
                    f"the console ended: {channel.end_reason}; saw:\n{seen[-2000:]!r}"
                )
            seen += data
            found = marker.search(seen)
            if found:
                return GuestRun(status=int(found.group(1)), output=seen.decode(errors="replace"))
    raise AssertionError(
        f"no answer from the guest's shell within {within:g} s; saw:\n{seen[-2000:]!r}"
    )


async def run_in_guest(
    host: LibvirtHost, uuid: str, command: str, *, within: float = 60.0, resend: float = 15.0
) -> GuestRun:
    """Run `command` in the guest's shell; its exit status and the console output."""
    token = secrets.token_hex(4).encode()
    line = command.encode() + b"; echo CAPL-RC-" + token + b"=$?\n"
    channel = await LibvirtConsoles(host).open_console(uuid, force=True)
    try:
        return await asyncio.to_thread(
            _converse, channel, line, token, within=within, resend=resend
        )
    finally:
        await asyncio.to_thread(channel.close)
