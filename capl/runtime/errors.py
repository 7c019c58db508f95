"""Typed errors of the API client Protocols.

The adapter (capl.kube) maps HTTP status codes and transport failures to these, so controllers and
the runtime never see a third-party exception. `code` is the HTTP status (0 for transport errors),
`reason` the metav1.Status reason (e.g. "NotFound", "Conflict", "AlreadyExists", "Expired").
"""

from __future__ import annotations


class ApiError(Exception):
    """A failed API request."""

    def __init__(self, code: int, reason: str = "", message: str = "") -> None:
        super().__init__(f"{code} {reason}: {message}" if reason else f"{code}: {message}")
        self.code = code
        self.reason = reason
        self.message = message


class NotFound(ApiError):
    """404: the object (or its kind) does not exist."""


class Conflict(ApiError):
    """409 Conflict: a resourceVersion precondition failed (optimistic concurrency)."""


class AlreadyExists(ApiError):
    """409 AlreadyExists on create."""


class Gone(ApiError):
    """410: the requested resourceVersion is too old (compacted); the caller must re-list."""


class Forbidden(ApiError):
    """403: RBAC denies the request."""


class Invalid(ApiError):
    """422: the object failed validation."""


class TransportError(ApiError):
    """The request did not get an HTTP answer (connection refused/reset, timeout); code 0."""

    def __init__(self, message: str) -> None:
        super().__init__(0, "Transport", message)


class WatchStalled(TransportError):
    """A watch stayed silent longer than its inactivity timeout."""


class StaleIncarnation(NotFound, Conflict):
    """The patch was computed from an object that no longer exists: the name now belongs to a
    re-created object (another metadata.uid). A NotFound for callers that drop the work of a
    vanished object, a Conflict for the runtime's quiet requeue. Code 409, reason "Conflict"."""

    def __init__(self, message: str) -> None:
        ApiError.__init__(self, 409, "Conflict", message)


_BY_CODE: dict[int, type[ApiError]] = {
    403: Forbidden,
    404: NotFound,
    410: Gone,
    422: Invalid,
}


def error_for(code: int, reason: str = "", message: str = "") -> ApiError:
    """The typed error for an HTTP status and metav1.Status reason."""
    if code == 409:
        cls: type[ApiError] = AlreadyExists if reason == "AlreadyExists" else Conflict
    else:
        cls = _BY_CODE.get(code, ApiError)
    return cls(code, reason, message)
