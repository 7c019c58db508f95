"""``qemu+ssh://`` for real: the libvirt adapter against a private sshd on loopback.

The credentials reach `capl.virt.LibvirtHosts` exactly as the controller passes a Secret's
data (``ssh-privatekey``, ``known_hosts``). Proven here, end to end through ssh to the system
libvirtd:

- with the right key and host key the adapter reads the host and defines, lists and
  undefines a (never started) domain on the real QEMU driver;
- the test driver behind ssh (``test+ssh://``) gets the same credentials (it used to be
  passed through without them);
- a known_hosts entry with another key (what a man in the middle presents), a known_hosts
  without the host, and a key sshd does not accept are refused with an error that names the
  cause; no known_hosts is refused before any connection unless the insecure option is set;
- the key, known_hosts and the ssh wrapper are 0600/0700 files in a 0700 directory that is
  gone after ``forget``, ``close`` and a credentials change, and no error or log record
  carries the private key.
"""

from __future__ import annotations

import logging
import secrets
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import libvirt
import pytest

from capl.ports.errors import CredentialsError, HostUnreachable
from capl.ports.virt import DomainOwner, DomainSpec, HostOptions
from capl.virt import LibvirtHosts
from tests.fixtures.libvirt import record_timing
from tests.fixtures.transports import SshServer, file_mode, file_modes, generate_ssh_key, ssh_server

__all__ = ["ssh_server"]  # the session fixture, registered by this import

pytestmark = pytest.mark.libvirtd


@pytest.fixture
def domain_names(libvirtd_conn: libvirt.virConnect) -> Iterator[list[str]]:
    """Names of domains a test defines on the system daemon; undefined afterwards."""
    names: list[str] = []
    yield names
    for name in names:
        try:
            domain = libvirtd_conn.lookupByName(name)
        except libvirt.libvirtError:
            continue
        if domain.isActive():
            domain.destroy()
        domain.undefine()


def _read(path: Path) -> bytes:
    return path.read_bytes()


def _key_body(key: bytes) -> list[str]:
    """The base64 lines of a private key: what must never appear in messages or logs."""
    return [line for line in key.decode().splitlines() if line and not line.startswith("---")]


def _owner(cluster: str) -> DomainOwner:
    return DomainOwner(
        cluster=cluster, namespace="capl-test", name="m-" + cluster, uid=str(uuid.uuid4())
    )


def _bare_domain(owner: DomainOwner, *, domain_type: str) -> DomainSpec:
    """A domain without disks or NICs: defined, listed and undefined, never started."""
    return DomainSpec(
        name=f"capl-test-ssh-{owner.cluster}",
        uuid=str(uuid.uuid4()),
        owner=owner,
        vcpus=1,
        memory_mib=64,
        domain_type=domain_type,
        guest_agent=False,
    )


async def test_qemu_ssh_with_secret_reads_the_host_and_manages_a_domain(
    ssh_server: SshServer,
    hosts: LibvirtHosts,
    libvirtd_conn: libvirt.virConnect,
    domain_names: list[str],
) -> None:
    host = hosts.get(uri=ssh_server.uri(), credentials=ssh_server.credentials())
    assert host.host_id == f"qemu+ssh://root@127.0.0.1:{ssh_server.port}/system"
    started = time.monotonic()
    info = await host.info()
    record_timing("qemu+ssh: connect and read host info", time.monotonic() - started)
    assert info.hypervisor == "QEMU"
    assert info.hostname == libvirtd_conn.getHostname()
    assert "qemu" in info.domain_types

    cluster = "ssh" + secrets.token_hex(3)
    spec = _bare_domain(_owner(cluster), domain_type="qemu")
    domain_names.append(spec.name)
    defined = await host.define_domain(spec)
    assert defined.uuid == spec.uuid
    # the domain really is on the system daemon, seen through an independent local connection
    assert libvirtd_conn.lookupByUUIDString(spec.uuid).name() == spec.name
    listed = await host.list_domains(cluster=cluster)
    assert [(d.uuid, d.owner) for d in listed] == [(spec.uuid, spec.owner)]
    assert await host.undefine_domain(spec.uuid, owner=spec.owner)
    assert await host.list_domains(cluster=cluster) == []


async def test_test_driver_behind_ssh_uses_the_secret(
    ssh_server: SshServer, hosts: LibvirtHosts, shared_test_driver: str
) -> None:
    host = hosts.get(
        uri=ssh_server.uri(driver="test", path="/default"),
        credentials=ssh_server.credentials(),
    )
    plan = host.connection.plan
    assert plan.credential_dir is not None, "test+ssh must get the Secret's key and known_hosts"
    cluster = "ssh" + secrets.token_hex(3)
    spec = _bare_domain(_owner(cluster), domain_type="test")
    await host.define_domain(spec)
    try:
        # the same test driver, inside the system libvirtd, seen over its unix socket
        local = hosts.get(uri=shared_test_driver)
        assert [d.uuid for d in await local.list_domains(cluster=cluster)] == [spec.uuid]
    finally:
        assert await host.undefine_domain(spec.uuid, owner=spec.owner)


async def _refusal(hosts: LibvirtHosts, uri: str, credentials: dict[str, bytes]) -> str:
    host = hosts.get(uri=uri, credentials=credentials)
    with pytest.raises(HostUnreachable) as info:
        await host.info()
    assert info.value.host == host.host_id
    return str(info.value)


async def test_host_key_mismatch_is_refused_naming_the_cause(
    ssh_server: SshServer, hosts: LibvirtHosts, tmp_path: Path
) -> None:
    _, impostor = generate_ssh_key(tmp_path, "impostor")
    wrong = f"[127.0.0.1]:{ssh_server.port} {impostor}\n".encode()
    message = await _refusal(hosts, ssh_server.uri(), ssh_server.credentials(known_hosts=wrong))
    assert "ssh host key verification failed" in message
    assert "does not match known_hosts" in message
    assert "REMOTE HOST IDENTIFICATION HAS CHANGED" in message  # libvirt's text follows


async def test_host_missing_from_known_hosts_is_refused(
    ssh_server: SshServer, hosts: LibvirtHosts
) -> None:
    other_host = b"kvm9.example.invalid " + ssh_server.host_key_line.split(" ", 1)[1].encode()
    message = await _refusal(
        hosts, ssh_server.uri(), ssh_server.credentials(known_hosts=other_host + b"\n")
    )
    assert "known_hosts of the credentials Secret has no key for this host" in message
    assert "[host]:port" in message


async def test_a_key_sshd_does_not_accept_is_refused(
    ssh_server: SshServer, hosts: LibvirtHosts, tmp_path: Path
) -> None:
    stranger, _ = generate_ssh_key(tmp_path, "stranger")
    credentials = {**ssh_server.credentials(), "ssh-privatekey": stranger}
    message = await _refusal(hosts, ssh_server.uri(), credentials)
    assert "ssh authentication failed" in message
    assert "Permission denied (publickey)" in message


async def test_no_known_hosts_is_refused_unless_explicitly_insecure(
    ssh_server: SshServer, hosts: LibvirtHosts
) -> None:
    credentials = ssh_server.credentials(known_hosts=b"")
    assert "known_hosts" not in credentials
    with pytest.raises(CredentialsError, match="no 'known_hosts' key"):
        hosts.get(uri=ssh_server.uri(), credentials=credentials)
    assert hosts.hosts() == []
    insecure = hosts.get(
        uri=ssh_server.uri(),
        credentials=credentials,
        options=HostOptions(insecure_skip_host_key_verification=True),
    )
    assert (await insecure.info()).hypervisor == "QEMU"
    wrapper = Path(insecure.connection.plan.credential_dir or "") / "ssh"
    assert b"StrictHostKeyChecking=no" in _read(wrapper)


async def test_credential_files_are_private_and_removed(
    ssh_server: SshServer, hosts: LibvirtHosts
) -> None:
    uri = ssh_server.uri()
    host = hosts.get(uri=uri, credentials=ssh_server.credentials())
    await host.info()
    directory = Path(host.connection.plan.credential_dir or "")
    assert file_mode(directory) == 0o700
    assert file_modes(directory) == {"id": 0o600, "known_hosts": 0o600, "ssh": 0o700}
    assert _read(directory / "id").strip() == ssh_server.client_key.strip()

    # a changed Secret replaces the connection; the old files go with the old connection
    rotated = hosts.get(uri=uri, credentials={**ssh_server.credentials(), "extra": b"x"})
    assert rotated is not host
    await hosts.wait_closed()
    assert file_modes(directory) is None
    directory = Path(rotated.connection.plan.credential_dir or "")
    await rotated.info()

    await hosts.forget(uri)
    assert file_modes(directory) is None
    again = hosts.get(uri=uri, credentials=ssh_server.credentials())
    directory = Path(again.connection.plan.credential_dir or "")
    assert file_modes(directory) is not None
    await hosts.close()
    assert file_modes(directory) is None


async def test_no_error_or_log_record_carries_the_private_key(
    ssh_server: SshServer,
    hosts: LibvirtHosts,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    _, impostor = generate_ssh_key(tmp_path, "impostor")
    messages = []
    for known_hosts in (
        f"[127.0.0.1]:{ssh_server.port} {impostor}\n".encode(),
        ssh_server.host_key_line.encode(),
    ):
        uri = ssh_server.uri()
        host = hosts.get(uri=uri, credentials=ssh_server.credentials(known_hosts=known_hosts))
        try:
            await host.info()
        except HostUnreachable as exc:
            messages += [str(exc), repr(exc)]
        messages.append(repr(host.connection.plan))
        await hosts.forget(uri)
    seen = "\n".join(messages + [r.getMessage() for r in caplog.records])
    for line in _key_body(ssh_server.client_key):
        assert line not in seen
