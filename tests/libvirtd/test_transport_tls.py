"""``qemu+tls://`` for real, and ``qemu+tcp://`` only on explicit opt-in.

Against a private, unprivileged libvirtd that listens on loopback with TLS (client
certificates required) and plain TCP (see tests/fixtures/transports.py for why it is a
second, unprivileged daemon and serves ``qemu:///session`` and ``test:///default``, not
``qemu:///system``). Credentials reach `capl.virt.LibvirtHosts` as a Secret's data:
``ca.crt``, ``tls.crt``, ``tls.key``. Proven here:

- with the right certificates the adapter reads the host over the real QEMU driver and
  defines, lists and undefines a domain over the test driver, both through TLS;
- a client certificate from another CA is refused by the daemon; a daemon whose certificate
  is not signed by the Secret's ca.crt (a man in the middle) is refused by the client; a key
  that does not belong to the certificate and garbage PEM are refused; each error names the
  Secret key at fault; missing keys are refused before any connection;
- ``qemu+tcp`` is refused unless `HostOptions.allow_insecure_tcp` is set, and then works;
- the PKI files are 0600 in a 0700 directory and are removed on close.
"""

from __future__ import annotations

import secrets
import time
import uuid
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from capl.ports.errors import CredentialsError, HostUnreachable
from capl.ports.virt import DomainOwner, DomainSpec, HostOptions
from capl.virt import LibvirtHosts
from tests.fixtures.libvirt import record_timing
from tests.fixtures.transports import TlsLibvirtd, file_mode, file_modes, tls_libvirtd

__all__ = ["tls_libvirtd"]  # the session fixture, registered by this import

pytestmark = pytest.mark.libvirtd


async def _refusal(hosts: LibvirtHosts, uri: str, credentials: dict[str, bytes]) -> str:
    host = hosts.get(uri=uri, credentials=credentials)
    with pytest.raises(HostUnreachable) as info:
        await host.info()
    assert info.value.host == host.host_id
    for value in credentials.values():  # certificates are public, keys are not
        if b"PRIVATE KEY" in value:
            body = [ln for ln in value.decode().splitlines() if not ln.startswith("---")]
            assert not any(line in str(info.value) for line in body)
    await hosts.forget(uri)
    return str(info.value)


async def test_qemu_tls_reads_the_host(tls_libvirtd: TlsLibvirtd, hosts: LibvirtHosts) -> None:
    host = hosts.get(
        uri=tls_libvirtd.uri(driver="qemu", path="/session"),
        credentials=tls_libvirtd.credentials,
    )
    started = time.monotonic()
    info = await host.info()
    record_timing(
        "qemu+tls: connect + host info (incl. the fresh daemon's QEMU probe)",
        time.monotonic() - started,
    )
    assert info.hypervisor == "QEMU"
    assert info.domain_types  # the session driver offers at least TCG
    assert await host.list_domains() == []
    assert await host.reachable()


async def test_tls_by_host_name_checks_the_certificate_names_it(
    tls_libvirtd: TlsLibvirtd, hosts: LibvirtHosts
) -> None:
    host = hosts.get(uri=tls_libvirtd.uri(host="localhost"), credentials=tls_libvirtd.credentials)
    assert (await host.info()).hypervisor == "TEST"


async def test_test_driver_over_tls_round_trips_a_domain(
    tls_libvirtd: TlsLibvirtd, hosts: LibvirtHosts
) -> None:
    host = hosts.get(uri=tls_libvirtd.uri(), credentials=tls_libvirtd.credentials)
    started = time.monotonic()
    assert await host.reachable()
    record_timing(
        "test+tls: connect (TLS handshake, both certificates checked)", time.monotonic() - started
    )
    cluster = "tls" + secrets.token_hex(3)
    owner = DomainOwner(
        cluster=cluster, namespace="capl-test", name="m-" + cluster, uid=str(uuid.uuid4())
    )
    spec = DomainSpec(
        name=f"capl-test-tls-{cluster}",
        uuid=str(uuid.uuid4()),
        owner=owner,
        vcpus=1,
        memory_mib=64,
        domain_type="test",
    )
    await host.define_domain(spec)
    try:
        assert [(d.uuid, d.owner) for d in await host.list_domains(cluster=cluster)] == [
            (spec.uuid, owner)
        ]
    finally:
        assert await host.undefine_domain(spec.uuid, owner=owner)
    assert await host.list_domains(cluster=cluster) == []


async def test_pki_files_are_private_and_removed_on_close(
    tls_libvirtd: TlsLibvirtd, hosts: LibvirtHosts
) -> None:
    host = hosts.get(uri=tls_libvirtd.uri(), credentials=tls_libvirtd.credentials)
    await host.info()
    plan = host.connection.plan
    pki = Path(parse_qs(urlsplit(plan.uri).query)["pkipath"][0])
    directory = Path(plan.credential_dir or "")
    assert pki.parent == directory
    assert file_mode(directory) == 0o700
    assert file_mode(pki) == 0o700
    assert file_modes(pki) == {
        "cacert.pem": 0o600,
        "clientcert.pem": 0o600,
        "clientkey.pem": 0o600,
    }
    assert "pkipath" not in repr(plan)
    assert "pkipath" not in host.host_id
    await hosts.close()
    assert file_modes(directory) is None


async def test_client_certificate_from_another_ca_is_refused_by_the_host(
    tls_libvirtd: TlsLibvirtd, hosts: LibvirtHosts
) -> None:
    message = await _refusal(hosts, tls_libvirtd.uri(), tls_libvirtd.foreign_client)
    assert "the host rejected the TLS connection, most likely the client certificate" in message


async def test_host_certificate_not_signed_by_the_secret_ca_is_refused(
    tls_libvirtd: TlsLibvirtd, hosts: LibvirtHosts
) -> None:
    message = await _refusal(hosts, tls_libvirtd.uri(), tls_libvirtd.untrusting)
    assert "TLS server certificate not trusted" in message
    assert "Failed to verify peer's certificate" in message


async def test_client_certificate_not_signed_by_the_secret_ca_is_refused_locally(
    tls_libvirtd: TlsLibvirtd, hosts: LibvirtHosts
) -> None:
    credentials = {**tls_libvirtd.foreign_client, "ca.crt": tls_libvirtd.credentials["ca.crt"]}
    message = await _refusal(hosts, tls_libvirtd.uri(), credentials)
    assert "tls.crt is not signed by ca.crt of the credentials Secret" in message


async def test_key_of_another_certificate_is_refused(
    tls_libvirtd: TlsLibvirtd, hosts: LibvirtHosts
) -> None:
    credentials = {**tls_libvirtd.credentials, "tls.key": tls_libvirtd.foreign_client["tls.key"]}
    message = await _refusal(hosts, tls_libvirtd.uri(), credentials)
    assert "tls.key is not the key of tls.crt" in message


async def test_garbage_ca_is_refused(tls_libvirtd: TlsLibvirtd, hosts: LibvirtHosts) -> None:
    credentials = {**tls_libvirtd.credentials, "ca.crt": b"not a certificate\n"}
    message = await _refusal(hosts, tls_libvirtd.uri(), credentials)
    assert "not valid PEM" in message


async def test_missing_tls_keys_are_refused_before_connecting(
    tls_libvirtd: TlsLibvirtd, hosts: LibvirtHosts
) -> None:
    for missing in ("ca.crt", "tls.crt", "tls.key"):
        credentials = {k: v for k, v in tls_libvirtd.credentials.items() if k != missing}
        with pytest.raises(CredentialsError, match=missing.replace(".", r"\.")):
            hosts.get(uri=tls_libvirtd.uri(), credentials=credentials)
    assert hosts.hosts() == []


async def test_plain_tcp_is_refused_unless_allowed_explicitly(
    tls_libvirtd: TlsLibvirtd, hosts: LibvirtHosts
) -> None:
    for driver, path in (("qemu", "/session"), ("test", "/default")):
        uri = tls_libvirtd.tcp_uri(driver=driver, path=path)
        with pytest.raises(CredentialsError, match=r"qemu\+tcp is unauthenticated"):
            hosts.get(uri=uri)
        with pytest.raises(CredentialsError, match="allow insecure TCP explicitly"):
            hosts.get(uri=uri, credentials=tls_libvirtd.credentials)
    assert hosts.hosts() == []
    allowed = hosts.get(
        uri=tls_libvirtd.tcp_uri(driver="qemu", path="/session"),
        options=HostOptions(allow_insecure_tcp=True),
    )
    assert allowed.connection.plan.credential_dir is None
    assert (await allowed.info()).hypervisor == "QEMU"


async def test_tls_without_a_secret_is_refused(
    tls_libvirtd: TlsLibvirtd, hosts: LibvirtHosts
) -> None:
    """No Secret: libvirt falls back to the manager's own /etc/pki, which does not hold a
    client certificate for this daemon."""
    message = await _refusal(hosts, tls_libvirtd.uri(), {})
    if "Cannot read CA certificate" in message:
        assert "TLS credentials missing" in message
