"""What a failed connect means for the user, when libvirt's text is a known one.

A failed connect whose libvirt text is a known credentials problem (ssh host key mismatch,
key refused, TLS certificate not trusted either way) gets a hint in front of libvirt's
verbatim text that names the Secret key at fault (``connect_hint``).
"""

from __future__ import annotations

__all__ = ["connect_hint"]

_SSH = frozenset({"ssh", "libssh", "libssh2"})
_TLS = frozenset({"tls"})
# (transports, text in libvirt's message, what it means in terms of the credentials Secret).
# The first match wins; libvirt's own text always follows the hint verbatim.
_CONNECT_HINTS: tuple[tuple[frozenset[str], str, str], ...] = (
    (
        _SSH,
        "REMOTE HOST IDENTIFICATION HAS CHANGED",
        "ssh host key verification failed: the host's key does not match known_hosts"
        " of the credentials Secret",
    ),
    (
        _SSH,
        "host key is known for",
        "ssh host key verification failed: known_hosts of the credentials Secret has no key"
        " for this host (with a port other than 22 the entry is written [host]:port)",
    ),
    (_SSH, "Host key verification failed", "ssh host key verification failed"),
    (
        _SSH,
        "Permission denied",
        "ssh authentication failed: the host did not accept the private key of the"
        " credentials Secret",
    ),
    (
        _TLS,
        "Our own certificate",
        "TLS client certificate unusable: tls.crt is not signed by ca.crt of the"
        " credentials Secret",
    ),
    (
        _TLS,
        "do not match",
        "TLS client certificate unusable: tls.key is not the key of tls.crt",
    ),
    (
        _TLS,
        "Unable to import",
        "TLS credentials unusable: a file of the credentials Secret is not valid PEM",
    ),
    (
        _TLS,
        "Cannot read CA certificate",
        "TLS credentials missing: give the host a credentials Secret with ca.crt, tls.crt"
        " and tls.key",
    ),
    (
        _TLS,
        "Failed to verify peer's certificate",
        "TLS server certificate not trusted: the host's certificate is not signed by ca.crt"
        " of the credentials Secret, or does not name the host of the URI",
    ),
    (
        _TLS,
        "Unable to read TLS confirmation",
        "the host rejected the TLS connection, most likely the client certificate: tls.crt"
        " must be signed by a CA the host trusts (and match its tls_allowed_dn_list)",
    ),
)


def connect_hint(transport: str, detail: str) -> str | None:
    """What a failed connect means for the user, when libvirt's text is a known one."""
    for transports, needle, hint in _CONNECT_HINTS:
        if transport in transports and needle in detail:
            return hint
    return None
