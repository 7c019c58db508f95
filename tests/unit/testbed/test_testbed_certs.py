"""The test bed's CA, certificates and kubeconfigs, checked without any binaries."""

from __future__ import annotations

import base64
import datetime
import ipaddress
import stat
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from capl.testbed import certs


@pytest.fixture(scope="module")
def ca() -> certs.CertificateAuthority:
    return certs.CertificateAuthority(common_name="unit-ca")


def test_ca_is_a_self_signed_ca(ca: certs.CertificateAuthority) -> None:
    cert = ca.certificate
    assert cert.subject == cert.issuer
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert cert.extensions.get_extension_for_class(x509.KeyUsage).value.key_cert_sign
    cert.verify_directly_issued_by(cert)
    now = datetime.datetime.now(datetime.UTC)
    assert cert.not_valid_before_utc < now < cert.not_valid_after_utc


def test_serving_certificate_covers_loopback_and_service_names(
    ca: certs.CertificateAuthority,
) -> None:
    pair = ca.issue_serving()
    cert = pair.certificate
    cert.verify_directly_issued_by(ca.certificate)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(san.get_values_for_type(x509.IPAddress)) == {
        ipaddress.ip_address("127.0.0.1"),
        ipaddress.ip_address("::1"),
    }
    assert {"localhost", "kubernetes.default.svc"} <= set(san.get_values_for_type(x509.DNSName))
    usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usage) == [ExtendedKeyUsageOID.SERVER_AUTH]
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca


def test_serving_certificate_needs_a_host(ca: certs.CertificateAuthority) -> None:
    with pytest.raises(ValueError, match="at least one host"):
        ca.issue_serving(hosts=())


def test_client_certificate_carries_user_and_groups(ca: certs.CertificateAuthority) -> None:
    pair = ca.issue_client(user="alice", groups=["system:masters", "team-a"])
    cert = pair.certificate
    cert.verify_directly_issued_by(ca.certificate)
    cn = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    orgs = cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)
    assert [a.value for a in cn] == ["alice"]
    assert sorted(str(a.value) for a in orgs) == ["system:masters", "team-a"]
    usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usage) == [ExtendedKeyUsageOID.CLIENT_AUTH]


def test_key_matches_certificate(ca: certs.CertificateAuthority) -> None:
    pair = ca.issue_client(user="bob")
    key = serialization.load_pem_private_key(pair.key_pem, password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    assert key.public_key() == pair.certificate.public_key()


def test_key_files_are_private(ca: certs.CertificateAuthority, tmp_path: Path) -> None:
    pair = ca.issue_client(user="carol")
    pair.write(cert_path=tmp_path / "pki" / "c.crt", key_path=tmp_path / "pki" / "c.key")
    assert stat.S_IMODE((tmp_path / "pki" / "c.key").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "pki" / "c.crt").stat().st_mode) == 0o644
    # Rewriting an existing, more open file still ends with private permissions.
    (tmp_path / "pki" / "c.key").chmod(0o666)
    pair.write(cert_path=tmp_path / "pki" / "c.crt", key_path=tmp_path / "pki" / "c.key")
    assert stat.S_IMODE((tmp_path / "pki" / "c.key").stat().st_mode) == 0o600
    assert (tmp_path / "pki" / "c.key").read_bytes() == pair.key_pem


def test_service_account_keys_form_a_pair(tmp_path: Path) -> None:
    keys = certs.ServiceAccountKeys.generate()
    keys.write(private_path=tmp_path / "sa.key", public_path=tmp_path / "sa.pub")
    private = serialization.load_pem_private_key((tmp_path / "sa.key").read_bytes(), password=None)
    public = serialization.load_pem_public_key((tmp_path / "sa.pub").read_bytes())
    assert isinstance(private, ec.EllipticCurvePrivateKey)
    assert private.public_key() == public
    assert stat.S_IMODE((tmp_path / "sa.key").stat().st_mode) == 0o600


def test_kubeconfig_embeds_everything(ca: certs.CertificateAuthority, tmp_path: Path) -> None:
    client = ca.issue_client(user="dave", groups=["devs"])
    config = certs.kubeconfig(
        server="https://127.0.0.1:6443",
        ca_pem=ca.cert_pem,
        client=client,
        user="dave",
        namespace="ns1",
    )
    path = certs.write_kubeconfig(tmp_path / "kc", config)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600

    loaded = yaml.safe_load(path.read_text())
    assert loaded["kind"] == "Config"
    context_name = loaded["current-context"]
    (context,) = [c["context"] for c in loaded["contexts"] if c["name"] == context_name]
    assert context == {"cluster": "capl-testbed", "user": "dave", "namespace": "ns1"}
    (cluster,) = [c["cluster"] for c in loaded["clusters"] if c["name"] == context["cluster"]]
    (user,) = [u["user"] for u in loaded["users"] if u["name"] == context["user"]]
    assert cluster["server"] == "https://127.0.0.1:6443"
    assert base64.b64decode(cluster["certificate-authority-data"]) == ca.cert_pem
    assert base64.b64decode(user["client-certificate-data"]) == client.cert_pem
    assert base64.b64decode(user["client-key-data"]) == client.key_pem
