"""libvirt errors -> the typed errors of ``capl.ports.errors``.

``translate`` is the one place that looks at libvirt error codes. Messages keep libvirt's
own text (the real cause belongs in conditions) prefixed with what capl was doing and on
which host (the redacted host id, never the connection URI with its query).
"""

from __future__ import annotations

import libvirt

from capl.ports import errors as e

__all__ = ["is_async_jobs_busy", "is_connection_error", "is_unsupported_flags", "translate"]

_CONNECTION_CODES = frozenset(
    {
        libvirt.VIR_ERR_RPC,
        libvirt.VIR_ERR_NO_CONNECT,
        libvirt.VIR_ERR_INVALID_CONN,
        libvirt.VIR_ERR_AUTH_FAILED,
        libvirt.VIR_ERR_AUTH_CANCELLED,
        getattr(libvirt, "VIR_ERR_AUTH_UNAVAILABLE", -1),
    }
)
_CONNECTION_DOMAINS = frozenset(
    {
        libvirt.VIR_FROM_RPC,
        libvirt.VIR_FROM_REMOTE,
        getattr(libvirt, "VIR_FROM_SSH", -1),
        getattr(libvirt, "VIR_FROM_LIBSSH", -1),
        getattr(libvirt, "VIR_FROM_AUTH", -1),
    }
)

_NOT_FOUND: dict[int, type[e.NotFound]] = {
    libvirt.VIR_ERR_NO_DOMAIN: e.DomainNotFound,
    libvirt.VIR_ERR_NO_NETWORK: e.NetworkNotFound,
    libvirt.VIR_ERR_NO_STORAGE_VOL: e.VolumeNotFound,
    libvirt.VIR_ERR_NO_STORAGE_POOL: e.PoolNotFound,
}
_EXISTS = frozenset(
    {
        libvirt.VIR_ERR_DOM_EXIST,
        libvirt.VIR_ERR_STORAGE_VOL_EXIST,
        libvirt.VIR_ERR_NETWORK_EXIST,
    }
)
_UNSUPPORTED = frozenset(
    {
        libvirt.VIR_ERR_NO_SUPPORT,
        libvirt.VIR_ERR_OPERATION_UNSUPPORTED,
        libvirt.VIR_ERR_ARGUMENT_UNSUPPORTED,
        libvirt.VIR_ERR_CONFIG_UNSUPPORTED,
    }
)
_INVALID = frozenset(
    {
        libvirt.VIR_ERR_XML_ERROR,
        libvirt.VIR_ERR_XML_DETAIL,
        libvirt.VIR_ERR_INVALID_ARG,
    }
)


def _text(exc: libvirt.libvirtError) -> str:
    message = exc.get_error_message() or str(exc)
    return " ".join(message.split())


def is_connection_error(exc: libvirt.libvirtError) -> bool:
    code = exc.get_error_code()
    if code in _CONNECTION_CODES:
        return True
    return code == libvirt.VIR_ERR_SYSTEM_ERROR and exc.get_error_domain() in _CONNECTION_DOMAINS


def is_unsupported_flags(exc: libvirt.libvirtError) -> bool:
    """The driver rejected a flag (the test driver says "unsupported flags (0x..)")."""
    code = exc.get_error_code()
    return code in _UNSUPPORTED or (
        code == libvirt.VIR_ERR_INVALID_ARG and "unsupported flags" in _text(exc)
    )


def is_async_jobs_busy(exc: libvirt.libvirtError) -> bool:
    return "asynchronous jobs running" in _text(exc)


# ENOSPC/EDQUOT from the host's file system, and the storage drivers' own capacity check
_FULL = ("No space left on device", "Disk quota exceeded", "Not enough free space")


def translate(exc: libvirt.libvirtError, *, host: str, action: str) -> e.VirtError:
    """A typed error for ``exc``; ``action`` says what capl was doing ("define domain x")."""
    code = exc.get_error_code()
    detail = _text(exc)
    message = f"{action} on {host}: {detail}"
    if is_connection_error(exc):
        return e.HostUnreachable(message, host=host, code=code)
    if code in _NOT_FOUND:
        return _NOT_FOUND[code](message, host=host, code=code)
    if code == libvirt.VIR_ERR_NO_INTERFACE:
        return e.NotFound(message, host=host, code=code, reason="InterfaceNotFound")
    if code in _EXISTS or "already exists" in detail:
        return e.AlreadyExists(message, host=host, code=code)
    if code == libvirt.VIR_ERR_AGENT_UNRESPONSIVE:
        return e.OperationInvalid(message, host=host, code=code, reason="GuestAgentUnresponsive")
    if is_async_jobs_busy(exc) or code == libvirt.VIR_ERR_RESOURCE_BUSY:
        return e.Busy(message, host=host, code=code)
    if code == libvirt.VIR_ERR_OPERATION_INVALID:
        return e.OperationInvalid(message, host=host, code=code)
    if is_unsupported_flags(exc):
        return e.Unsupported(message, host=host, code=code)
    if code in _INVALID:
        return e.InvalidSpec(message, host=host, code=code)
    if any(text in detail for text in _FULL):
        return e.StorageFull(message, host=host, code=code)
    if code == libvirt.VIR_ERR_OPERATION_TIMEOUT:
        return e.VirtError(message, host=host, code=code, reason="Timeout")
    if exc.get_error_domain() == libvirt.VIR_FROM_STORAGE:
        return e.StorageError(message, host=host, code=code)
    return e.VirtError(message, host=host, code=code)
