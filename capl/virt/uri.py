"""Host URIs: validation, redaction, and turning a credentials Secret into files libvirt reads.

Supported
---------
- ``qemu:///system``, ``qemu:///session``, ``qemu+unix://...``: local sockets, no credentials.
- ``test:///default`` (and ``test:///<file>.xml``), ``test+unix:///default``: test driver.
  The test driver behind a remote transport (``test+tls://``, ``test+ssh://``) gets the
  same credential handling as ``qemu`` (the transport, not the driver, decides).
- ``qemu+ssh://user@host[:port]/system``: libvirt spawns ``ssh``. With credentials, the
  Secret's ``ssh-privatekey`` becomes ``keyfile=`` and its ``known_hosts`` is enforced
  through a generated ``ssh`` wrapper (``command=``) that pins ``UserKnownHostsFile``,
  ``StrictHostKeyChecking=yes`` and ``IdentitiesOnly=yes`` — the plain ssh transport has no
  ``known_hosts`` URI parameter. Without ``known_hosts`` the connection is refused unless
  ``HostOptions.insecure_skip_host_key_verification`` is set (then: no checking at all, said
  loudly in the log). Without credentials the manager's own ssh setup is used (BatchMode:
  an unknown host key fails instead of prompting). ``no_tty=1`` always.
- ``qemu+libssh://`` / ``qemu+libssh2://``: the same Secret keys as ``keyfile=``,
  ``known_hosts=``, ``known_hosts_verify=normal`` (``ignore`` only when insecure is allowed),
  ``sshauth=privkey``.
- ``qemu+tls://`` and ``qemu://host/...``: the Secret's ``ca.crt``, ``tls.crt``, ``tls.key``
  become ``cacert.pem``, ``clientcert.pem``, ``clientkey.pem`` in a ``pkipath=`` directory.
- ``qemu+tcp://``: unauthenticated root on the host; refused unless
  ``HostOptions.allow_insecure_tcp``.

Parameters capl controls (``keyfile``, ``pkipath``, ``known_hosts``, ``known_hosts_verify``,
``no_verify``, ``command``, ``sshauth``, ``authfile``) are refused in user URIs.

Files live in a private directory (``mkdtemp``: 0700; files 0600, the wrapper 0700) that
exists while the host is registered and is removed when its connection is closed or
forgotten (and at interpreter exit). Contents are never logged; the host id used in logs
and errors is the URI without query.
"""

from __future__ import annotations

import atexit
import os
import shlex
import shutil
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import SplitResult, parse_qsl, quote, urlencode, urlsplit, urlunsplit

from capl.ports.errors import CredentialsError
from capl.ports.virt import HostId, HostOptions

__all__ = ["ConnectPlan", "host_id_of", "plan_connection"]

SSH_KEY_NAMES = ("ssh-privatekey", "private-key")
KNOWN_HOSTS_KEY = "known_hosts"
TLS_FILES = {"ca.crt": "cacert.pem", "tls.crt": "clientcert.pem", "tls.key": "clientkey.pem"}

_RESERVED_PARAMS = frozenset(
    {
        "keyfile",
        "pkipath",
        "known_hosts",
        "known_hosts_verify",
        "no_verify",
        "command",
        "sshauth",
        "authfile",
    }
)
_DRIVERS = frozenset({"qemu", "test"})
_TRANSPORTS = frozenset({"", "unix", "ssh", "libssh", "libssh2", "tls", "tcp"})

_live_dirs: set[str] = set()
_live_lock = threading.Lock()


def _cleanup_all() -> None:
    with _live_lock:
        for path in list(_live_dirs):
            shutil.rmtree(path, ignore_errors=True)
        _live_dirs.clear()


atexit.register(_cleanup_all)


@dataclass(frozen=True, slots=True)
class ConnectPlan:
    """What to open: ``uri`` (with file parameters; never logged) and the redacted id."""

    uri: str
    host_id: HostId
    driver: str
    transport: str
    remote: bool
    credential_dir: str | None

    def cleanup(self) -> None:
        if self.credential_dir:
            shutil.rmtree(self.credential_dir, ignore_errors=True)
            with _live_lock:
                _live_dirs.discard(self.credential_dir)

    def __repr__(self) -> str:  # never show the uri with its query
        return f"ConnectPlan(host_id={self.host_id!r}, transport={self.transport!r})"


def _without_password(netloc: str) -> str:
    if "@" not in netloc:
        return netloc
    user, _, hostport = netloc.rpartition("@")
    return f"{user.split(':', 1)[0]}@{hostport}"


def host_id_of(uri: str) -> HostId:
    """The URI without query and fragment (and without a password, should one be given).

    Never raises: the controllers map host events back to objects with it, also for URIs
    that `plan_connection` refuses (e.g. an unclosed IPv6 bracket urllib cannot split).
    """
    try:
        parts = urlsplit(uri.strip())
    except ValueError:
        base = uri.strip().split("#", 1)[0].split("?", 1)[0]
        scheme, separator, rest = base.partition("://")
        netloc, slash, path = rest.partition("/")
        return HostId(f"{scheme}{separator}{_without_password(netloc)}{slash}{path}")
    return HostId(f"{parts.scheme}://{_without_password(parts.netloc)}{parts.path}")


def _write(directory: Path, name: str, content: bytes, mode: int) -> Path:
    path = directory / name
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "wb") as handle:
        handle.write(content)
    os.chmod(path, mode)
    return path


def _private_dir() -> Path:
    base = os.environ.get("CAPL_CREDENTIALS_DIR") or None
    path = tempfile.mkdtemp(prefix="capl-host-", dir=base)
    os.chmod(path, 0o700)
    with _live_lock:
        _live_dirs.add(path)
    return Path(path)


def _key(credentials: Mapping[str, bytes], names: tuple[str, ...]) -> bytes | None:
    for name in names:
        value = credentials.get(name)
        if value:
            return value if value.endswith(b"\n") else value + b"\n"
    return None


def plan_connection(
    uri: str,
    *,
    credentials: Mapping[str, bytes] | None = None,
    options: HostOptions | None = None,
) -> ConnectPlan:
    """Validate ``uri`` and write the credential files it needs; raises CredentialsError."""
    options = options or HostOptions()
    uri = uri.strip()
    host_id = host_id_of(uri)
    parts, driver, transport, params = _parse(uri, host_id)
    remote = bool(parts.hostname)
    transport = _check_transport(transport, remote=remote, options=options, host_id=host_id)
    if transport in {"unix", "tcp"}:
        return ConnectPlan(
            uri=uri,
            host_id=host_id,
            driver=driver,
            transport=transport,
            remote=remote,
            credential_dir=None,
        )
    extra, directory = _credential_params(transport, credentials, options, host_id)
    query = urlencode(params + extra, quote_via=quote, safe="/")
    full = urlunsplit((parts.scheme, parts.netloc, parts.path, query, ""))
    return ConnectPlan(
        uri=full,
        host_id=host_id,
        driver=driver,
        transport=transport,
        remote=remote,
        credential_dir=str(directory) if directory else None,
    )


def _parse(uri: str, host_id: HostId) -> tuple[SplitResult, str, str, list[tuple[str, str]]]:
    """(parts, driver, transport as written, query parameters) of a URI capl accepts: a
    known driver and transport, no parameter capl sets itself, no password, no host name
    that ssh would read as an option."""
    try:
        parts = urlsplit(uri)
        if parts.port == 0:  # .port raises ValueError for non-numbers and > 65535
            raise ValueError("port 0")
    except ValueError as exc:
        raise CredentialsError(
            f"host URI {host_id}: not a valid URI ({exc})", host=host_id
        ) from None
    driver, _, transport = parts.scheme.partition("+")
    if driver not in _DRIVERS:
        raise CredentialsError(
            f"host URI {host_id}: driver {driver!r} is not supported (use qemu or test)",
            host=host_id,
        )
    if transport not in _TRANSPORTS:
        raise CredentialsError(
            f"host URI {host_id}: transport {transport!r} is not supported", host=host_id
        )
    params = parse_qsl(parts.query, keep_blank_values=True)
    reserved = sorted({name for name, _ in params if name.lower() in _RESERVED_PARAMS})
    if reserved:
        raise CredentialsError(
            f"host URI {host_id}: parameters {', '.join(reserved)} are set by capl from the "
            "credentials Secret and options, remove them from the URI",
            host=host_id,
        )
    if ":" in parts.netloc.rpartition("@")[0]:
        raise CredentialsError(
            f"host URI {host_id}: passwords in URIs are not supported", host=host_id
        )
    if (parts.hostname or "").startswith("-"):  # would read as an option to ssh
        raise CredentialsError(
            f"host URI {host_id}: host name {parts.hostname!r} must not start with '-'",
            host=host_id,
        )
    return parts, driver, transport, params


def _check_transport(transport: str, *, remote: bool, options: HostOptions, host_id: HostId) -> str:
    """The transport libvirt will use (none written: tls to a host, else unix); network
    transports need a host name, and qemu+tcp needs the explicit option."""
    if not transport:
        transport = "tls" if remote else "unix"
    if transport in {"ssh", "libssh", "libssh2", "tls", "tcp"} and not remote:
        raise CredentialsError(
            f"host URI {host_id}: transport {transport} needs a host name", host=host_id
        )
    if transport == "tcp" and not options.allow_insecure_tcp:
        raise CredentialsError(
            f"host URI {host_id}: qemu+tcp is unauthenticated and unencrypted (root on the "
            "host for anyone on the network); use qemu+ssh or qemu+tls, or allow insecure "
            "TCP explicitly",
            host=host_id,
        )
    return transport


def _credential_params(
    transport: str,
    credentials: Mapping[str, bytes] | None,
    options: HostOptions,
    host_id: HostId,
) -> tuple[list[tuple[str, str]], Path | None]:
    """The URI parameters of an ssh or tls transport, and the private directory holding the
    credential files they name (None: no files); nothing is left behind on failure."""
    extra: list[tuple[str, str]] = []
    directory: Path | None = None
    try:
        if transport in {"ssh", "libssh", "libssh2"}:
            if transport == "ssh":
                extra.append(("no_tty", "1"))
            if credentials:
                directory = _private_dir()
                extra.extend(_ssh_params(directory, transport, credentials, options, host_id))
            elif options.insecure_skip_host_key_verification:
                extra.append(("no_verify", "1"))
                if transport != "ssh":
                    extra.append(("known_hosts_verify", "ignore"))
        elif transport == "tls" and credentials:
            directory = _private_dir()
            extra.append(("pkipath", str(_tls_files(directory, credentials, host_id))))
    except BaseException:
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)
            with _live_lock:
                _live_dirs.discard(str(directory))
        raise
    return extra, directory


def _ssh_params(
    directory: Path,
    transport: str,
    credentials: Mapping[str, bytes],
    options: HostOptions,
    host_id: HostId,
) -> list[tuple[str, str]]:
    key = _key(credentials, SSH_KEY_NAMES)
    if key is None:
        raise CredentialsError(
            f"host {host_id}: the credentials Secret has no {SSH_KEY_NAMES[0]!r} key",
            host=host_id,
        )
    keyfile = _write(directory, "id", key, 0o600)
    known = credentials.get(KNOWN_HOSTS_KEY)
    if not known and not options.insecure_skip_host_key_verification:
        raise CredentialsError(
            f"host {host_id}: the credentials Secret has no {KNOWN_HOSTS_KEY!r} key; host key "
            "verification needs it (or allow skipping it explicitly)",
            host=host_id,
        )
    known_file = _write(directory, "known_hosts", known, 0o600) if known else None
    params = [("keyfile", str(keyfile))]
    if transport == "ssh":
        if known_file is not None:
            ssh_options = [
                f"UserKnownHostsFile={known_file}",
                "GlobalKnownHostsFile=/dev/null",
                "StrictHostKeyChecking=yes",
            ]
        else:
            ssh_options = ["UserKnownHostsFile=/dev/null", "StrictHostKeyChecking=no"]
        ssh_options += ["IdentitiesOnly=yes", "IdentityAgent=none", "BatchMode=yes"]
        ssh_binary = shutil.which("ssh") or "ssh"
        argv = [ssh_binary, *(arg for opt in ssh_options for arg in ("-o", opt))]
        script = "#!/bin/sh\nexec " + " ".join(shlex.quote(a) for a in argv) + ' "$@"\n'
        wrapper = _write(directory, "ssh", script.encode(), 0o700)
        params.append(("command", str(wrapper)))
    else:
        params.append(("sshauth", "privkey"))
        if known_file is not None:
            params += [("known_hosts", str(known_file)), ("known_hosts_verify", "normal")]
        else:
            params.append(("known_hosts_verify", "ignore"))
    return params


def _tls_files(directory: Path, credentials: Mapping[str, bytes], host_id: HostId) -> Path:
    missing = [name for name in TLS_FILES if not credentials.get(name)]
    if missing:
        raise CredentialsError(
            f"host {host_id}: the credentials Secret lacks {', '.join(missing)} for qemu+tls",
            host=host_id,
        )
    pki = directory / "pki"
    pki.mkdir(mode=0o700)
    for key, filename in TLS_FILES.items():
        _write(pki, filename, credentials[key], 0o600)
    return pki
