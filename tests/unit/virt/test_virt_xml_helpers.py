"""Pure helpers next to the XML: deterministic names and MACs, URIs and credential files,
the NoCloud ISO builder, Ignition validation, error translation and image sniffing."""

from __future__ import annotations

import io
import json
import os
import stat
import struct
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import libvirt
import pycdlib
import pytest
import yaml

from capl.ports import errors as e
from capl.ports.bootstrap import build_nocloud_iso, validate_ignition
from capl.ports.naming import (
    base_image_volume_name,
    is_capl_name,
    machine_hostname,
    machine_mac,
    machine_names,
    normalize_mac,
    pool_owner_marker,
)
from capl.ports.virt import HostOptions, VolumeFormat
from capl.virt.errors import translate
from capl.virt.images import redact_url, sniff_format
from capl.virt.uri import host_id_of, plan_connection

# --- names and MACs --------------------------------------------------------------------------


def test_machine_names_are_deterministic_unique_and_prefixed() -> None:
    a = machine_names(namespace="default", name="demo-cp-0")
    assert a == machine_names(namespace="default", name="demo-cp-0")
    assert a.domain.startswith("capl-default-demo-cp-0-")
    for volume in (a.root_volume, a.ignition_volume, a.cidata_volume, a.extra_volume(1)):
        assert volume.startswith(a.prefix + "-")
        assert a.owns_volume(volume)
        assert is_capl_name(volume)
    # the readable part is ambiguous, the hash is not
    assert (
        machine_names(namespace="a-b", name="c").prefix
        != machine_names(namespace="a", name="b-c").prefix
    )
    long = machine_names(namespace="n" * 63, name="m" * 253)
    assert len(long.root_volume) < 140
    assert not machine_names(namespace="x", name="m1").owns_volume(
        machine_names(namespace="x", name="m10").root_volume
    )


def test_machine_mac_is_deterministic_local_range_and_varies() -> None:
    mac = machine_mac(cluster="c", namespace="ns", name="m")
    assert mac == machine_mac(cluster="c", namespace="ns", name="m")
    assert mac.startswith("52:54:00:")
    assert normalize_mac(mac) == mac
    assert machine_mac(cluster="c", namespace="ns", name="m", attempt=1) != mac
    assert machine_mac(cluster="c2", namespace="ns", name="m") != mac
    macs = {machine_mac(cluster="c", namespace="ns", name=f"m{i}") for i in range(300)}
    assert len(macs) >= 298  # 24 bits: collisions are possible, hence ``attempt``


def test_normalize_mac() -> None:
    assert normalize_mac("52-54-00-AB-CD-EF") == "52:54:00:ab:cd:ef"
    with pytest.raises(e.InvalidSpec):
        normalize_mac("01:00:5e:00:00:01")  # multicast
    with pytest.raises(e.InvalidSpec):
        normalize_mac("52:54:00:00:00")


def test_hostname_and_image_and_pool_marker_names() -> None:
    assert machine_hostname("worker-1") == "worker-1"
    long = machine_hostname("w" * 80)
    assert len(long) <= 63
    assert machine_hostname("a.b") != "a.b"
    digest = "ab" * 32
    assert base_image_volume_name(image="fcos", digest=digest) == base_image_volume_name(
        image="fcos", digest=digest.upper()
    )
    assert base_image_volume_name(image="fcos", digest=digest) != base_image_volume_name(
        image="fcos", url="http://x/y"
    )
    assert pool_owner_marker(namespace="default", name="demo") == ".capl-owner.default.demo"
    assert is_capl_name(pool_owner_marker(namespace="default", name="demo"))
    assert len(pool_owner_marker(namespace="n" * 63, name="m" * 253)) < 255


# --- URIs and credential files ---------------------------------------------------------------


def test_host_id_drops_query_and_password() -> None:
    assert host_id_of("qemu:///system") == "qemu:///system"
    assert host_id_of("test:///default") == "test:///default"
    assert (
        host_id_of("qemu+ssh://root:pw@h.example:2222/system?keyfile=/x&no_tty=1")
        == "qemu+ssh://root@h.example:2222/system"
    )


@pytest.mark.parametrize(
    ("uri", "match"),
    [
        ("xen:///system", "driver"),
        ("qemu+foo://h/system", "transport"),
        ("qemu+tcp://h/system", "qemu\\+tcp is unauthenticated"),
        ("qemu+ssh://h/system?keyfile=/etc/shadow", "keyfile"),
        ("qemu+ssh://u:secret@h/system", "passwords"),
        ("qemu+ssh:///system", "needs a host name"),
    ],
)
def test_bad_uris_are_refused(uri: str, match: str) -> None:
    with pytest.raises(e.CredentialsError, match=match) as info:
        plan_connection(uri)
    assert "secret" not in str(info.value)


def test_local_and_test_uris_pass_through() -> None:
    for uri in ("qemu:///system", "qemu:///session", "test:///default", "test+unix:///default"):
        plan = plan_connection(uri)
        assert plan.uri == uri
        assert plan.credential_dir is None
    tcp = plan_connection("qemu+tcp://h/system", options=HostOptions(allow_insecure_tcp=True))
    assert tcp.uri == "qemu+tcp://h/system"


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_ssh_credentials_become_private_files_and_a_pinned_ssh_wrapper() -> None:
    key = b"-----BEGIN OPENSSH PRIVATE KEY-----\nsecret\n-----END OPENSSH PRIVATE KEY-----"
    plan = plan_connection(
        "qemu+ssh://root@h.example:2222/system?socket=/run/libvirt/libvirt-sock",
        credentials={"ssh-privatekey": key, "known_hosts": b"[h.example]:2222 ssh-ed25519 AAAA"},
    )
    try:
        assert plan.credential_dir is not None
        directory = Path(plan.credential_dir)
        assert _mode(directory) == 0o700
        query = parse_qs(urlsplit(plan.uri).query)
        assert query["socket"] == ["/run/libvirt/libvirt-sock"]
        assert query["no_tty"] == ["1"]
        keyfile = Path(query["keyfile"][0])
        assert keyfile.read_bytes() == key + b"\n"
        assert _mode(keyfile) == 0o600
        wrapper = Path(query["command"][0])
        script = wrapper.read_text()
        assert f"UserKnownHostsFile={directory / 'known_hosts'}" in script
        assert "StrictHostKeyChecking=yes" in script
        assert _mode(directory / "known_hosts") == 0o600
        assert plan.host_id == "qemu+ssh://root@h.example:2222/system"
        assert "secret" not in repr(plan)
        assert "keyfile" not in repr(plan)
    finally:
        plan.cleanup()
    assert not Path(plan.credential_dir).exists()


def test_ssh_without_known_hosts_is_refused_unless_explicitly_insecure() -> None:
    creds = {"ssh-privatekey": b"k"}
    with pytest.raises(e.CredentialsError, match="known_hosts"):
        plan_connection("qemu+ssh://h/system", credentials=creds)
    plan = plan_connection(
        "qemu+libssh://h/system",
        credentials=creds,
        options=HostOptions(insecure_skip_host_key_verification=True),
    )
    try:
        query = parse_qs(urlsplit(plan.uri).query)
        assert query["known_hosts_verify"] == ["ignore"]
        assert query["sshauth"] == ["privkey"]
    finally:
        plan.cleanup()
    with pytest.raises(e.CredentialsError, match="ssh-privatekey"):
        plan_connection("qemu+ssh://h/system", credentials={"known_hosts": b"x"})


def test_libssh_uses_known_hosts_parameter() -> None:
    plan = plan_connection(
        "qemu+libssh2://h/system", credentials={"ssh-privatekey": b"k", "known_hosts": b"h k"}
    )
    try:
        query = parse_qs(urlsplit(plan.uri).query)
        assert query["known_hosts_verify"] == ["normal"]
        assert Path(query["known_hosts"][0]).read_bytes() == b"h k"
    finally:
        plan.cleanup()


def test_tls_credentials_become_a_pki_directory() -> None:
    creds = {"ca.crt": b"CA", "tls.crt": b"CERT", "tls.key": b"KEY"}
    plan = plan_connection("qemu+tls://h.example/system", credentials=creds)
    try:
        pki = Path(parse_qs(urlsplit(plan.uri).query)["pkipath"][0])
        assert (pki / "cacert.pem").read_bytes() == b"CA"
        assert (pki / "clientcert.pem").read_bytes() == b"CERT"
        assert (pki / "clientkey.pem").read_bytes() == b"KEY"
        assert all(_mode(p) == 0o600 for p in pki.iterdir())
    finally:
        plan.cleanup()
    with pytest.raises(e.CredentialsError, match=r"tls\.key"):
        plan_connection("qemu+tls://h/system", credentials={"ca.crt": b"a", "tls.crt": b"b"})
    before = set(os.listdir(os.environ.get("TMPDIR", "/tmp")))
    with pytest.raises(e.CredentialsError):
        plan_connection("qemu://h/system", credentials={"ca.crt": b"a"})
    leftovers = {n for n in set(os.listdir(os.environ.get("TMPDIR", "/tmp"))) - before}
    assert not any(n.startswith("capl-host-") for n in leftovers)


# --- bootstrap data --------------------------------------------------------------------------


def test_nocloud_iso_reads_back() -> None:
    user_data = b"#cloud-config\nhostname: worker-1\n"
    network = b"version: 2\nethernets: {}\n"
    image = build_nocloud_iso(
        user_data=user_data, instance_id="uid-1", hostname="worker-1", network_config=network
    )
    iso = pycdlib.PyCdlib()
    iso.open_fp(io.BytesIO(image))
    try:
        assert iso.pvd.volume_identifier.decode().strip() == "cidata"

        def read(path: str) -> bytes:
            out = io.BytesIO()
            iso.get_file_from_iso_fp(out, joliet_path=path)
            return out.getvalue()

        assert read("/user-data") == user_data
        assert yaml.safe_load(read("/meta-data")) == {
            "instance-id": "uid-1",
            "local-hostname": "worker-1",
        }
        assert read("/network-config") == network
        rr = io.BytesIO()
        iso.get_file_from_iso_fp(rr, rr_path="/user-data")
        assert rr.getvalue() == user_data
    finally:
        iso.close()


def test_ignition_validation() -> None:
    good = json.dumps({"ignition": {"version": "3.4.0"}, "storage": {}}).encode()
    assert validate_ignition(good)["ignition"]["version"] == "3.4.0"
    cases = {
        b"": "empty",
        b"\xff\xfe": "UTF-8",
        b'{"ignition": ': "not valid JSON",
        b"[1, 2]": "JSON object",
        b'{"storage": {}}': 'no "ignition" object',
        b'{"ignition": {"version": 3}}': "ignition.version",
        b'{"ignition": {"version": "three"}}': "ignition.version",
    }
    for data, match in cases.items():
        with pytest.raises(e.BootstrapDataError, match=match) as info:
            validate_ignition(data)
        assert info.value.reason == "BootstrapDataInvalid"
    secret = b'{"ignition": {"version": "3.4.0"}, "passwd": "hunter2"'
    with pytest.raises(e.BootstrapDataError) as info:
        validate_ignition(secret)
    assert "hunter2" not in str(info.value)


# --- error translation -----------------------------------------------------------------------


def _libvirt_error(code: int, message: str, domain: int = 0) -> libvirt.libvirtError:
    exc = libvirt.libvirtError(message)
    exc.err = (code, domain, message, 2, None, None, None, 0, 0)
    return exc


@pytest.mark.parametrize(
    ("code", "domain", "message", "expected", "reason"),
    [
        (libvirt.VIR_ERR_NO_DOMAIN, 0, "no domain", e.DomainNotFound, "DomainNotFound"),
        (libvirt.VIR_ERR_NO_NETWORK, 0, "no net", e.NetworkNotFound, "NetworkNotFound"),
        (libvirt.VIR_ERR_NO_STORAGE_VOL, 0, "no vol", e.VolumeNotFound, "VolumeNotFound"),
        (libvirt.VIR_ERR_NO_STORAGE_POOL, 0, "no pool", e.PoolNotFound, "StoragePoolNotFound"),
        (libvirt.VIR_ERR_DOM_EXIST, 0, "exists", e.AlreadyExists, "AlreadyExists"),
        (libvirt.VIR_ERR_STORAGE_VOL_EXIST, 0, "exists", e.AlreadyExists, "AlreadyExists"),
        (libvirt.VIR_ERR_NETWORK_EXIST, 0, "exists", e.AlreadyExists, "AlreadyExists"),
        (
            libvirt.VIR_ERR_OPERATION_INVALID,
            0,
            "not running",
            e.OperationInvalid,
            "OperationInvalid",
        ),
        (libvirt.VIR_ERR_NO_SUPPORT, 0, "nope", e.Unsupported, "Unsupported"),
        (libvirt.VIR_ERR_INVALID_ARG, 0, "unsupported flags (0x4)", e.Unsupported, "Unsupported"),
        (
            libvirt.VIR_ERR_AGENT_UNRESPONSIVE,
            0,
            "agent",
            e.OperationInvalid,
            "GuestAgentUnresponsive",
        ),
        (libvirt.VIR_ERR_RPC, 0, "rpc", e.HostUnreachable, "HostUnreachable"),
        (
            libvirt.VIR_ERR_SYSTEM_ERROR,
            libvirt.VIR_FROM_RPC,
            "eof",
            e.HostUnreachable,
            "HostUnreachable",
        ),
        (libvirt.VIR_ERR_AUTH_FAILED, 0, "auth", e.HostUnreachable, "HostUnreachable"),
        (libvirt.VIR_ERR_XML_ERROR, 0, "bad xml", e.InvalidSpec, "InvalidSpec"),
        (
            libvirt.VIR_ERR_INTERNAL_ERROR,
            0,
            "pool 'p' has asynchronous jobs running.",
            e.Busy,
            "Busy",
        ),
        (
            libvirt.VIR_ERR_SYSTEM_ERROR,
            libvirt.VIR_FROM_STORAGE,
            "write: No space left on device",
            e.StorageFull,
            "StorageFull",
        ),
        (
            libvirt.VIR_ERR_SYSTEM_ERROR,
            libvirt.VIR_FROM_STORAGE,
            "cannot create",
            e.StorageError,
            "StorageError",
        ),
        (
            libvirt.VIR_ERR_OPERATION_FAILED,
            0,
            "domain 'x' already exists with uuid y",
            e.AlreadyExists,
            "AlreadyExists",
        ),
        (libvirt.VIR_ERR_INTERNAL_ERROR, 0, "boom", e.VirtError, "LibvirtError"),
    ],
)
def test_each_libvirt_code_has_a_typed_error(
    code: int, domain: int, message: str, expected: type[e.VirtError], reason: str
) -> None:
    error = translate(_libvirt_error(code, message, domain), host="qemu:///system", action="do x")
    assert type(error) is expected
    assert error.reason == reason
    assert error.code == code
    assert str(error) == f"do x on qemu:///system: {message}"


# --- images ----------------------------------------------------------------------------------


def test_sniff_format_and_redaction() -> None:
    header = b"QFI\xfb" + b"\0" * 20 + struct.pack(">Q", 10 * 1024**3)
    assert sniff_format(header) == (VolumeFormat.QCOW2, 10 * 1024**3)
    assert sniff_format(b"\0" * 512) == (VolumeFormat.RAW, None)
    with pytest.raises(e.ImageFormatError, match="HTML"):
        sniff_format(b"  <!DOCTYPE html><html>")
    with pytest.raises(e.ImageFormatError, match="truncated"):
        sniff_format(b"QFI\xfb\0\0")
    assert (
        redact_url("https://user:tok@example.com:8443/img.qcow2?sig=abc#x")
        == "https://example.com:8443/img.qcow2"
    )
