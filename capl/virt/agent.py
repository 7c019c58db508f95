"""Files inside a guest, read through qemu-guest-agent (blocking; runs in worker threads).

``read_file`` opens, reads and closes one file with the agent's ``guest-file-open``,
``guest-file-read`` (base64 ``buf-b64`` plus ``eof``) and ``guest-file-close``, sent with
``libvirt_qemu.qemuAgentCommand``: libvirt has no dedicated API for them. No SSH and no
network are involved: the agent talks over the domain's virtio-serial channel
``org.qemu.guest_agent.0`` (see ``capl.virt.domainxml``). libvirt notes the first such
command in the domain's QEMU log ("tainted: custom-ga-command"); that is harmless.

Each agent command has a short time limit (``AGENT_TIMEOUT`` seconds) and at most ``limit``
bytes are read, so a slow or chatty guest cannot hold a worker thread for long. What libvirt
answers is mapped to a ``GuestFileState``:

- ``AGENT_UNAVAILABLE``: the agent is not connected or does not answer (VIR_ERR_AGENT_UNRESPONSIVE,
  agent timeouts), or the domain is not running (VIR_ERR_OPERATION_INVALID). It may answer
  later: a booting guest starts its agent late, and a guest without an agent looks the same.
- ``UNSUPPORTED``: the driver has no agent (VIR_ERR_NO_SUPPORT; the test driver is recognised
  without a call), the domain has no agent channel ("QEMU guest agent is not configured"),
  or the agent refuses file commands (disabled with ``--block-rpcs``, or unknown).
- ``ABSENT``: the agent could not open the file: "No such file or directory".

Anything else is raised and becomes a typed error in ``HostConnection.run``. The file's
content is never logged (it may be secret).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
from typing import Any

import libvirt
import libvirt_qemu  # type: ignore[import-untyped]  # no stubs (as libvirt: pyproject.toml)

from capl.ports.errors import DomainNotFound
from capl.ports.virt import GuestFile, GuestFileState
from capl.virt.storage import is_test_driver
from capl.virt.support import code_of, lookup

__all__ = ["AGENT_TIMEOUT", "NO_AGENT", "read_file"]

AGENT_TIMEOUT = 5
"""Seconds libvirt waits for the agent's answer to one command."""

_UNAVAILABLE_CODES = frozenset(
    {
        libvirt.VIR_ERR_AGENT_UNRESPONSIVE,
        libvirt.VIR_ERR_AGENT_UNSYNCED,
        libvirt.VIR_ERR_OPERATION_INVALID,  # the domain is not running
        libvirt.VIR_ERR_OPERATION_TIMEOUT,
        getattr(libvirt, "VIR_ERR_AGENT_COMMAND_TIMEOUT", -1),  # newer libvirt
    }
)
_UNSUPPORTED_CODES = frozenset(
    {
        libvirt.VIR_ERR_NO_SUPPORT,
        libvirt.VIR_ERR_ARGUMENT_UNSUPPORTED,  # no agent channel in the domain
        libvirt.VIR_ERR_OPERATION_UNSUPPORTED,
    }
)
#: Texts of agent-side refusals (the command is disabled or unknown to this agent).
_REFUSED = ("has been disabled", "has not been found", "CommandNotFound", "CommandDisabled")
_ABSENT = "No such file or directory"
NO_AGENT = GuestFile(state=GuestFileState.UNSUPPORTED, detail="the test driver has no guest agent")
"""The answer on the test driver, known without a call (``LibvirtHost.read_guest_file`` gives
it without a worker thread)."""


class _Answer(Exception):
    """A libvirt error that is a state of the answer, not a failure."""

    def __init__(self, state: GuestFileState, detail: str) -> None:
        super().__init__(detail)
        self.state = state


def _text(exc: libvirt.libvirtError) -> str:
    return " ".join((exc.get_error_message() or str(exc)).split())


def _state_of(exc: libvirt.libvirtError) -> GuestFileState | None:
    code = code_of(exc)
    text = _text(exc)
    if code in _UNSUPPORTED_CODES or any(refused in text for refused in _REFUSED):
        return GuestFileState.UNSUPPORTED
    if code in _UNAVAILABLE_CODES:
        return GuestFileState.AGENT_UNAVAILABLE
    if _ABSENT in text:
        return GuestFileState.ABSENT
    return None


def _command(domain: Any, execute: str, **arguments: Any) -> Any:
    """One agent command; its ``return`` value. libvirt errors that describe the agent's
    state become ``_Answer``."""
    request = json.dumps({"execute": execute, "arguments": arguments})
    try:
        reply = libvirt_qemu.qemuAgentCommand(domain, request, AGENT_TIMEOUT, 0)
    except libvirt.libvirtError as exc:
        state = _state_of(exc)
        if state is None:
            raise
        raise _Answer(state, _text(exc)) from None
    try:
        return json.loads(reply)["return"]
    except (ValueError, KeyError, TypeError):
        raise _unexpected(execute) from None


def _unexpected(execute: str) -> _Answer:
    return _Answer(GuestFileState.AGENT_UNAVAILABLE, f"unexpected answer to {execute}")


def _read_all(domain: Any, handle: int, limit: int) -> bytes:
    data = bytearray()
    while len(data) < limit:
        chunk = _command(domain, "guest-file-read", handle=handle, count=limit - len(data))
        if not isinstance(chunk, dict):
            raise _unexpected("guest-file-read")
        try:
            data += base64.b64decode(str(chunk.get("buf-b64", "")), validate=True)
        except binascii.Error:
            raise _unexpected("guest-file-read") from None
        if chunk.get("eof", True) or not chunk.get("count"):
            break
    return bytes(data[:limit])


def read_file(c: Any, uuid: str, path: str, limit: int) -> GuestFile:
    """Up to ``limit`` bytes of ``path`` in the guest of domain ``uuid`` (see the module
    docstring for the states). DomainNotFound when the domain does not exist."""
    if is_test_driver(c):
        return NO_AGENT
    domain = lookup(lambda: c.lookupByUUIDString(uuid), libvirt.VIR_ERR_NO_DOMAIN)
    if domain is None:
        raise DomainNotFound(f"domain {uuid} does not exist")
    try:
        handle = _command(domain, "guest-file-open", path=path, mode="r")
        if not isinstance(handle, int) or isinstance(handle, bool):
            raise _unexpected("guest-file-open")
    except _Answer as answer:
        return GuestFile(state=answer.state, detail=str(answer))
    try:
        data = _read_all(domain, handle, max(0, limit))
    except _Answer as answer:
        return GuestFile(state=answer.state, detail=str(answer))
    finally:
        with contextlib.suppress(libvirt.libvirtError, _Answer):
            _command(domain, "guest-file-close", handle=handle)
    return GuestFile(state=GuestFileState.PRESENT, data=data)
