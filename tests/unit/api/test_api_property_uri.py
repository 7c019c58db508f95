"""Hostile host URIs and credentials through `capl.virt.uri` (what a LibvirtCluster's
``spec.hosts[].uri`` and its credentials Secret become).

Properties, for any string as URI and any query a user may append:

- `host_id_of` never raises (the controllers map host events back to objects with it),
  carries no query, fragment or password;
- `plan_connection` returns a plan or raises `CredentialsError`, nothing else;
- the URI handed to libvirt, split the way libvirt splits a query (on ``&`` *and* ``;``,
  then unescaped), carries every parameter capl controls (``keyfile``, ``command``,
  ``known_hosts``, ``pkipath``, ...) exactly once and with capl's value: a user's query can
  neither add nor override one (upper case, percent-encoding and ``;`` tricks included);
- a refusal leaves no credential directory behind, and every credential file lives in a
  0700 directory with mode 0600 (the ssh wrapper 0700).
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from capl.ports.errors import CredentialsError
from capl.ports.virt import HostOptions
from capl.virt.uri import ConnectPlan, host_id_of, plan_connection

CAPL_PARAMS = frozenset(
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
SSH = {"ssh-privatekey": b"-----BEGIN OPENSSH PRIVATE KEY-----\nk\n", "known_hosts": b"h k\n"}
TLS = {"ca.crt": b"CA\n", "tls.crt": b"CERT\n", "tls.key": b"KEY\n"}

uri_text = st.one_of(
    st.text(max_size=60),
    st.builds(
        lambda scheme, netloc, path, query: f"{scheme}://{netloc}{path}{query}",
        st.sampled_from(
            [
                "qemu",
                "test",
                "qemu+ssh",
                "qemu+libssh",
                "qemu+libssh2",
                "qemu+tls",
                "qemu+tcp",
                "test+tls",
                "test+ssh",
                "qemu+unix",
                "xen",
                "QEMU+SSH",
                "qemu+",
                "+ssh",
            ]
        ),
        st.one_of(
            st.sampled_from(
                [
                    "",
                    "h",
                    "root@h",
                    "root:pw@h",
                    "h:22",
                    "h:abc",
                    "h:0",
                    "h:70000",
                    "[::1",
                    "[::1]:22",
                    "-oProxyCommand=x",
                    "u@h@g",
                    "h\n",
                    "h%20x",
                ]
            ),
            st.text(max_size=10),
        ),
        st.sampled_from(["/system", "/session", "/default", "", "/", "/sys%3Fkeyfile=1"]),
        st.one_of(st.just(""), st.text(max_size=20).map(lambda q: "?" + q)),
    ),
)

param_name = st.one_of(
    st.sampled_from(sorted(CAPL_PARAMS)),
    st.sampled_from(["KeyFile", "%6Beyfile", "PKIPATH", "no_tty", "socket", "netcat", "mode"]),
    st.text(alphabet="abcdefghijklmnopqrstuvwxyz_%;&=", min_size=1, max_size=8),
)
user_query = st.lists(
    st.tuples(param_name, st.text(max_size=12), st.sampled_from(["&", ";"])),
    max_size=4,
).map(lambda items: "".join(f"{sep}{name}={value}" for name, value, sep in items).lstrip("&;"))


def libvirt_params(uri: str) -> list[tuple[str, str]]:
    """The query as libvirt's virURIParseParams reads it: split on & and ;, unescape."""
    query = urlsplit(uri).query
    params = []
    for item in query.replace(";", "&").split("&"):
        if not item:
            continue
        name, _, value = item.partition("=")
        params.append((unquote(name).lower(), unquote(value)))
    return params


@contextmanager
def credentials_root() -> Iterator[Path]:
    """CAPL_CREDENTIALS_DIR pointed at a fresh directory (to see what is left behind)."""
    with tempfile.TemporaryDirectory() as root:
        before = os.environ.get("CAPL_CREDENTIALS_DIR")
        os.environ["CAPL_CREDENTIALS_DIR"] = root
        try:
            yield Path(root)
        finally:
            if before is None:
                del os.environ["CAPL_CREDENTIALS_DIR"]
            else:
                os.environ["CAPL_CREDENTIALS_DIR"] = before


def _plan(
    uri: str, *, credentials: dict[str, bytes] | None, options: HostOptions | None = None
) -> tuple[ConnectPlan | None, CredentialsError | None]:
    try:
        return plan_connection(uri, credentials=credentials, options=options), None
    except CredentialsError as exc:
        return None, exc


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@settings(max_examples=400, deadline=None, derandomize=True)
@given(uri=uri_text, credentials=st.sampled_from([None, SSH, TLS, {**SSH, **TLS}]))
@example(uri="qemu+ssh://[::1/system", credentials=SSH)
@example(uri="qemu+ssh://root:hunter2@h/system?x=1#frag", credentials=None)
@example(uri="qemu+ssh://h:abc/system", credentials=SSH)
@example(uri="qemu+ssh://-oProxyCommand=x/system", credentials=SSH)
def test_any_uri_gives_a_plan_or_a_credentials_error(
    uri: str, credentials: dict[str, bytes] | None
) -> None:
    host_id = host_id_of(uri)
    assert "?" not in host_id
    assert "#" not in host_id
    assert "hunter2" not in host_id
    with credentials_root() as root:
        plan, refusal = _plan(uri, credentials=credentials)
        if plan is None:
            assert refusal is not None
            assert refusal.reason == "CredentialsInvalid"
            assert str(refusal).startswith(("host URI ", "host "))
            assert "hunter2" not in str(refusal)
            assert list(root.iterdir()) == [], "a refusal left credential files behind"
            return
        try:
            assert plan.host_id == host_id
            assert "hunter2" not in repr(plan)
            if plan.credential_dir is not None:
                _assert_private(Path(plan.credential_dir))
        finally:
            plan.cleanup()
        assert list(root.iterdir()) == []


def _assert_private(directory: Path) -> None:
    assert _mode(directory) == 0o700
    for path in directory.rglob("*"):
        expected = 0o700 if path.is_dir() or path.name == "ssh" else 0o600
        assert _mode(path) == expected, path


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    transport=st.sampled_from(["ssh", "libssh", "libssh2", "tls"]),
    driver=st.sampled_from(["qemu", "test"]),
    query=user_query,
    insecure=st.booleans(),
)
@example(transport="ssh", driver="qemu", query="socket=/x;keyfile=/etc/shadow", insecure=False)
@example(transport="ssh", driver="qemu", query="%6Beyfile=/etc/shadow", insecure=False)
@example(transport="tls", driver="test", query="PKIPATH=/etc/pki", insecure=False)
@example(transport="ssh", driver="qemu", query="command=/bin/sh", insecure=True)
def test_a_user_query_cannot_set_or_override_what_capl_controls(
    transport: str, driver: str, query: str, insecure: bool
) -> None:
    uri = f"{driver}+{transport}://root@kvm1.example.invalid:2222/system?{query}"
    credentials = TLS if transport == "tls" else SSH
    options = HostOptions(insecure_skip_host_key_verification=insecure)
    plan, refusal = _plan(uri, credentials=credentials, options=options)
    if plan is None:
        assert "set by capl" in str(refusal)
        return
    try:
        params = libvirt_params(plan.uri)
        ours = [(name, value) for name, value in params if name in CAPL_PARAMS]
        names = [name for name, _ in ours]
        assert len(names) == len(set(names)), f"a capl parameter appears twice: {params}"
        directory = plan.credential_dir
        assert directory is not None
        for name, value in ours:
            if name in {"keyfile", "command", "known_hosts", "pkipath"}:
                assert value.startswith(directory + "/"), (name, value)
        expected = {"tls": {"pkipath"}, "ssh": {"keyfile", "command"}}.get(
            transport, {"keyfile", "sshauth", "known_hosts", "known_hosts_verify"}
        )
        assert expected <= set(names), (expected, names)
    finally:
        plan.cleanup()


@pytest.mark.parametrize(
    ("uri", "match"),
    [
        ("qemu+ssh://[::1/system", "not a valid URI"),
        ("qemu+ssh://h:abc/system", "not a valid URI"),
        ("qemu+ssh://h:0/system", "not a valid URI"),
        ("qemu+ssh://h:70000/system", "not a valid URI"),
        ("qemu+ssh://-oProxyCommand=x/system", "must not start with '-'"),
    ],
)
def test_malformed_authorities_are_credentials_errors(uri: str, match: str) -> None:
    with pytest.raises(CredentialsError, match=match):
        plan_connection(uri, credentials=SSH)
    assert host_id_of(uri).startswith("qemu+ssh://")


def test_remote_test_driver_gets_the_credentials_too() -> None:
    for uri, credentials, key in (
        ("test+tls://h/default", TLS, "pkipath"),
        ("test+ssh://root@h/default", SSH, "keyfile"),
    ):
        plan = plan_connection(uri, credentials=credentials)
        try:
            assert plan.credential_dir is not None
            assert key in dict(libvirt_params(plan.uri))
        finally:
            plan.cleanup()
