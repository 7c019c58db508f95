"""The manager's webhook server speaks TLS >= 1.2 only, with the certificate from
--webhook-cert-dir.

Against the real `capl manager` process (its webhook port on loopback, certificate pair
written by the fixture into the directory given as --webhook-cert-dir):

- plain HTTP to the webhook port gets no HTTP answer at all (the request is not served);
- TLS 1.2 and TLS 1.3 handshakes succeed, verified against the CA that issued the
  certificate in --webhook-cert-dir, and the certificate served is byte for byte the one in
  that directory; an AdmissionReview posted over that connection is answered;
- TLS 1.0 and 1.1 are refused by the server: the same client context completes a handshake
  with a throw-away local server that allows those versions (so the refusal is the manager's,
  not the client library's);
- a new certificate pair written into the directory (as a cert-manager renewal does) is
  served on the next handshake, without a restart.

The non-root container user is checked by tests/unit/test_dockerfile.py.
"""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
import uuid
from pathlib import Path

import aiohttp
import pytest
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from capl.api import constants as c
from capl.api.admission import WEBHOOKS
from capl.testbed import ControlPlane, certs
from capl.testbed.caplmanager import CaplManager
from tests.fixtures.capl import CaplManagerFactory

pytestmark = [
    pytest.mark.apiserver,
    # offering TLS 1.0/1.1 on purpose, to see them refused
    pytest.mark.filterwarnings("ignore:ssl.TLSVersion.TLSv1:DeprecationWarning"),
]

NAMESPACE = "capl-webhook-tls"  # watched by the manager; nothing is ever created there
LEGACY = (ssl.TLSVersion.TLSv1, ssl.TLSVersion.TLSv1_1)


@pytest.fixture(scope="module")
async def manager(
    control_plane: ControlPlane, capi_crds: list[str], capl_manager_factory: CaplManagerFactory
) -> CaplManager:
    process = await capl_manager_factory(
        control_plane, name="capl-webhook-tls", namespace=NAMESPACE, log_level="info"
    )
    await process.start()
    return process


def client_context(manager: CaplManager, version: ssl.TLSVersion | None = None) -> ssl.SSLContext:
    """Verifies the server against the webhook CA; pinned to `version` when given (legacy
    versions need OpenSSL's security level 0 to be offered at all)."""
    ctx = ssl.create_default_context(cadata=manager.ca_pem.decode())
    if version is not None:
        if version in LEGACY:
            ctx.set_ciphers("DEFAULT:@SECLEVEL=0")
        ctx.minimum_version = version
        ctx.maximum_version = version
    return ctx


def handshake(port: int, ctx: ssl.SSLContext) -> tuple[str, bytes]:
    """(negotiated version, server certificate DER) of one TLS handshake with 127.0.0.1."""
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        der = tls.getpeercert(binary_form=True)
        assert der is not None
        return str(tls.version()), der


def pem_to_der(pem: bytes) -> bytes:
    return x509.load_pem_x509_certificate(pem).public_bytes(Encoding.DER)


async def test_plain_http_is_not_served(manager: CaplManager) -> None:
    request = (
        f"POST {WEBHOOKS[0].path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        "Content-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}"
    ).encode()

    def exchange() -> bytes:
        with socket.create_connection(("127.0.0.1", manager.webhook_port), timeout=10) as s:
            s.sendall(request)
            received = b""
            try:
                while chunk := s.recv(4096):
                    received += chunk
            except (ConnectionResetError, TimeoutError):
                pass
            return received

    answer = await asyncio.to_thread(exchange)
    assert not answer.startswith(b"HTTP/"), answer[:200]
    # whatever came back is at most a TLS alert record (content type 21), never data
    assert answer == b"" or answer[0] == 0x15, answer[:20]


@pytest.mark.parametrize("version", [ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3])
async def test_modern_tls_serves_the_certificate_from_the_cert_dir(
    manager: CaplManager, version: ssl.TLSVersion
) -> None:
    ctx = client_context(manager, version)
    negotiated, der = await asyncio.to_thread(handshake, manager.webhook_port, ctx)
    assert (
        negotiated
        == {ssl.TLSVersion.TLSv1_2: "TLSv1.2", ssl.TLSVersion.TLSv1_3: "TLSv1.3"}[version]
    )
    assert der == pem_to_der((manager.cert_dir / "tls.crt").read_bytes())


async def test_an_admission_review_is_answered_over_tls(manager: CaplManager) -> None:
    spec = next(w for w in WEBHOOKS if w.kind == c.Kind.LIBVIRT_CLUSTER and not w.mutating)
    uid = str(uuid.uuid4())
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": c.GROUP, "version": "v1alpha1", "kind": spec.kind.value},
            "resource": {"group": c.GROUP, "version": "v1alpha1", "resource": spec.plural.value},
            "operation": "CREATE",
            "namespace": NAMESPACE,
            "name": "probe",
            "object": {
                "apiVersion": c.API_VERSION,
                "kind": spec.kind.value,
                "metadata": {"name": "probe", "namespace": NAMESPACE},
                "spec": {
                    "hosts": [{"name": "h", "uri": "test:///default"}],
                    "network": {"cidr": "10.99.0.0/24", "mode": "isolated"},
                },
            },
        },
    }
    connector = aiohttp.TCPConnector(ssl=client_context(manager))
    async with (
        aiohttp.ClientSession(connector=connector) as session,
        session.post(f"{manager.webhook_url}{spec.path}", json=review) as resp,
    ):
        assert resp.status == 200
        answer = json.loads(await resp.text())
    assert answer["response"]["uid"] == uid
    assert "allowed" in answer["response"]


@pytest.mark.parametrize("version", LEGACY, ids=["TLSv1.0", "TLSv1.1"])
async def test_legacy_tls_is_refused(
    manager: CaplManager, version: ssl.TLSVersion, tmp_path: Path
) -> None:
    # a local server allowing the legacy version proves this client can speak it here
    ca = certs.CertificateAuthority()
    pair = ca.issue_serving(hosts=("127.0.0.1",))
    pair.write(cert_path=tmp_path / "tls.crt", key_path=tmp_path / "tls.key")
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.set_ciphers("DEFAULT:@SECLEVEL=0")
    server_ctx.minimum_version = ssl.TLSVersion.TLSv1
    server_ctx.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=server_ctx)
    port = server.sockets[0].getsockname()[1]
    control = ssl.create_default_context(cadata=ca.cert_pem.decode())
    control.set_ciphers("DEFAULT:@SECLEVEL=0")
    control.minimum_version = control.maximum_version = version
    try:
        negotiated, _ = await asyncio.to_thread(handshake, port, control)
        assert (
            negotiated
            == {ssl.TLSVersion.TLSv1: "TLSv1", ssl.TLSVersion.TLSv1_1: "TLSv1.1"}[version]
        )
    finally:
        server.close()
        await server.wait_closed()

    with pytest.raises(ssl.SSLError):
        await asyncio.to_thread(handshake, manager.webhook_port, client_context(manager, version))


async def test_a_renewed_certificate_is_served_without_restart(manager: CaplManager) -> None:
    cert, key = manager.cert_dir / "tls.crt", manager.cert_dir / "tls.key"
    original = cert.read_bytes(), key.read_bytes()
    ca = certs.CertificateAuthority(common_name="capl-renewed-webhook-ca")
    renewed = ca.issue_serving(hosts=("127.0.0.1", "localhost"))
    try:
        renewed.write(cert_path=cert, key_path=key)
        ctx = ssl.create_default_context(cadata=ca.cert_pem.decode())
        _, der = await asyncio.to_thread(handshake, manager.webhook_port, ctx)
        assert der == pem_to_der(renewed.cert_pem)
        assert manager.running
    finally:  # the manager's own CA again, for whatever runs next
        certs.write_file(cert, original[0], mode=0o644)
        certs.write_file(key, original[1], mode=0o600)
