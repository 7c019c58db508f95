"""Typed errors of the infrastructure port.

Every error the libvirt adapter raises is one of these, so a controller can branch on the
class (``except DomainNotFound``), and can put ``error.reason`` (CamelCase, stable, suitable
as a ``metav1.Condition`` reason) and ``str(error)`` (a human message that names the real
libvirt error) into conditions and events without further translation.

Rules every raiser follows:

- the message names what failed and the underlying libvirt message, verbatim;
- the message never contains secret material: credentials, bootstrap data, URI query
  parameters (keyfile/pkipath locations are not secret, their contents are);
- ``host`` is the redacted host id (the URI without query), ``code`` the libvirt error code
  when the error came from libvirt.

The hierarchy is deliberately shallow: a family (``NotFound``, ``ImageError``,
``ForeignObjectError``, ``InvalidSpec``) where callers usually catch the family, and leaves
where the reason differs.
"""

from __future__ import annotations

from typing import ClassVar

__all__ = [
    "AddressConflict",
    "AddressExhausted",
    "AlreadyExists",
    "BootstrapDataError",
    "BridgeNotFound",
    "Busy",
    "CredentialsError",
    "DomainNotFound",
    "ForeignDomainError",
    "ForeignObjectError",
    "HostUnreachable",
    "ImageChecksumError",
    "ImageDownloadError",
    "ImageError",
    "ImageFormatError",
    "InvalidSpec",
    "NetworkNotFound",
    "NetworkOverlap",
    "NotFound",
    "OperationInvalid",
    "PoolNotFound",
    "StorageError",
    "StorageFull",
    "Unsupported",
    "VirtError",
    "VolumeNotFound",
]


class VirtError(Exception):
    """Base of every error raised through the infrastructure port.

    ``reason`` defaults to the class's ``REASON``; a raiser may pass a more specific one
    (for example ``PoolBuildFailed`` on a ``StorageError``).
    """

    REASON: ClassVar[str] = "LibvirtError"

    def __init__(
        self,
        message: str,
        *,
        host: str | None = None,
        code: int | None = None,
        reason: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.host = host
        self.code = code
        self.reason = reason or self.REASON

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return f"{type(self).__name__}(reason={self.reason!r}, message={self.message!r})"


# --- lookups -------------------------------------------------------------------------------


class NotFound(VirtError):
    """The named object does not exist (a delete treats this as success)."""

    REASON = "NotFound"


class DomainNotFound(NotFound):
    REASON = "DomainNotFound"


class VolumeNotFound(NotFound):
    REASON = "VolumeNotFound"


class NetworkNotFound(NotFound):
    REASON = "NetworkNotFound"


class PoolNotFound(NotFound):
    REASON = "StoragePoolNotFound"


class AlreadyExists(VirtError):
    """An object with this name/UUID exists already (and is not the one asked for)."""

    REASON = "AlreadyExists"


# --- state and capability ------------------------------------------------------------------


class OperationInvalid(VirtError):
    """libvirt refused the operation in the object's current state (VIR_ERR_OPERATION_INVALID)."""

    REASON = "OperationInvalid"


class Busy(VirtError):
    """A transient refusal that outlived its retries (e.g. a pool with asynchronous jobs)."""

    REASON = "Busy"


class HostUnreachable(VirtError):
    """No connection to the host: connect failed, the connection broke, or auth failed."""

    REASON = "HostUnreachable"


class Unsupported(VirtError):
    """The host's driver does not support this call or flag (VIR_ERR_NO_SUPPORT and kin)."""

    REASON = "Unsupported"


class CredentialsError(VirtError):
    """The host URI or its credentials Secret is unusable (missing key, insecure transport)."""

    REASON = "CredentialsInvalid"


# --- ownership -----------------------------------------------------------------------------


class ForeignObjectError(VirtError):
    """The object exists but is not ours (no capl tag, or another owner's tag): never touched."""

    REASON = "ForeignObject"

    def __init__(
        self,
        message: str,
        *,
        kind: str,
        name: str,
        host: str | None = None,
        code: int | None = None,
        reason: str | None = None,
    ) -> None:
        super().__init__(message, host=host, code=code, reason=reason)
        self.kind = kind
        self.name = name


class ForeignDomainError(ForeignObjectError):
    REASON = "ForeignDomain"

    def __init__(self, message: str, *, name: str, host: str | None = None) -> None:
        super().__init__(message, kind="domain", name=name, host=host)


# --- input ---------------------------------------------------------------------------------


class InvalidSpec(VirtError):
    """A value cannot be expressed safely (control characters, bad CIDR, bad MAC, ...)."""

    REASON = "InvalidSpec"


class DeviceUnavailable(InvalidSpec):
    """No free host device matches a machine's selector when its domain is defined (another
    machine took the last one since placement); placement chooses again after a backoff."""

    REASON = "HardwareUnavailable"


class BootstrapDataError(InvalidSpec):
    """The bootstrap data is malformed (e.g. Ignition that is not JSON or lacks a version)."""

    REASON = "BootstrapDataInvalid"


class BridgeNotFound(InvalidSpec):
    REASON = "BridgeNotFound"


# --- storage -------------------------------------------------------------------------------


class StorageError(VirtError):
    """A storage pool or volume operation failed (build, path, permissions)."""

    REASON = "StorageError"


class StorageFull(StorageError):
    REASON = "StorageFull"


class ImageError(VirtError):
    """The base image could not be imported; nothing of it is left in the pool."""

    REASON = "ImageError"


class ImageDownloadError(ImageError):
    REASON = "ImageDownloadFailed"


class ImageChecksumError(ImageError):
    REASON = "ImageChecksumMismatch"

    def __init__(
        self, message: str, *, expected: str, actual: str, host: str | None = None
    ) -> None:
        super().__init__(message, host=host)
        self.expected = expected
        self.actual = actual


class ImageFormatError(ImageError):
    REASON = "ImageFormatInvalid"


# --- networks ------------------------------------------------------------------------------


class NetworkOverlap(VirtError):
    """The requested CIDR overlaps another network on the host (named in ``other_network``)."""

    REASON = "NetworkOverlap"

    def __init__(
        self, message: str, *, other_network: str, other_cidr: str, host: str | None = None
    ) -> None:
        super().__init__(message, host=host)
        self.other_network = other_network
        self.other_cidr = other_cidr


class AddressConflict(VirtError):
    """A DHCP reservation for this MAC or IP exists with different values (``field``)."""

    REASON = "AddressConflict"

    def __init__(self, message: str, *, field: str, value: str, host: str | None = None) -> None:
        super().__init__(message, host=host)
        self.field = field
        self.value = value


class AddressExhausted(VirtError):
    REASON = "AddressRangeExhausted"
