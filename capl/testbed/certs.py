"""A tiny certificate authority and kubeconfig writer for the local control plane.

One self-signed CA per control plane signs everything: the kube-apiserver serving certificate
(SANs 127.0.0.1, ::1, localhost and the in-cluster service names) and the client
certificates users authenticate with (x509 client-cert authentication: CN is the user name,
O entries are the groups; `system:masters` makes an administrator). Keys are ECDSA P-256:
generating one takes microseconds, which keeps the control plane's start-up short, and both
Go's TLS stack and OpenSSL accept them everywhere we need them.

The same CA serves the test bed's other TLS endpoints (private libvirt daemons): with
`key_encipherment=True` its leaf certificates also carry keyEncipherment, which libvirt's
GnuTLS checks demand when keyUsage is critical.

The service-account token keys are a separate key pair (kube-apiserver signs tokens with the
private key and verifies them with the public one); they are not part of the CA.

Everything here is pure computation plus writing files: no processes, no network, so the unit
tests cover it without any binaries.
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = datetime.timedelta(days=365)
_BACKDATE = datetime.timedelta(hours=1)  # tolerate a little clock skew between processes

DEFAULT_SERVING_HOSTS: tuple[str, ...] = (
    "127.0.0.1",
    "::1",
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)


@dataclass(frozen=True, kw_only=True)
class KeyPair:
    """A certificate and its private key, both PEM encoded."""

    cert_pem: bytes
    key_pem: bytes

    @property
    def certificate(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate(self.cert_pem)

    def write(self, *, cert_path: Path, key_path: Path) -> None:
        """Write the certificate (0644) and the key (0600) to files."""
        write_file(cert_path, self.cert_pem, mode=0o644)
        write_file(key_path, self.key_pem, mode=0o600)


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        encoding=serialization.Encoding.PEM,
        format=serialization.PrivateFormat.PKCS8,
        encryption_algorithm=serialization.NoEncryption(),
    )


def _key_usage(*, ca: bool, key_encipherment: bool = False) -> x509.KeyUsage:
    """digitalSignature always; keyCertSign and cRLSign for the CA itself."""
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=key_encipherment,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )


def write_file(path: Path, data: bytes, *, mode: int) -> None:
    """Write `data` to `path` with permissions `mode` (also when the file exists)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(path, mode)  # O_CREAT's mode does not apply to an existing file


class CertificateAuthority:
    """A self-signed CA that issues serving and client certificates."""

    def __init__(
        self, *, common_name: str = "capl-testbed-ca", key_encipherment: bool = False
    ) -> None:
        """key_encipherment: leaf certificates also allow keyEncipherment (libvirt's TLS)."""
        self._key_encipherment = key_encipherment
        self._key = _new_key()
        now = datetime.datetime.now(datetime.UTC)
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        public = self._key.public_key()
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(public)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _BACKDATE)
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(_key_usage(ca=True), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
            .sign(self._key, hashes.SHA256())
        )

    @property
    def cert_pem(self) -> bytes:
        return self._cert.public_bytes(serialization.Encoding.PEM)

    @property
    def certificate(self) -> x509.Certificate:
        return self._cert

    def issue_serving(self, *, hosts: Sequence[str] = DEFAULT_SERVING_HOSTS) -> KeyPair:
        """A TLS server certificate valid for the given IP addresses and DNS names."""
        if not hosts:
            raise ValueError("a serving certificate needs at least one host")
        names: list[x509.GeneralName] = []
        for host in hosts:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])])
        return self._issue(
            subject=subject,
            usage=ExtendedKeyUsageOID.SERVER_AUTH,
            san=x509.SubjectAlternativeName(names),
        )

    def issue_client(self, *, user: str, groups: Sequence[str] = ()) -> KeyPair:
        """A client certificate kube-apiserver maps to `user` (CN) in `groups` (O)."""
        attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in groups]
        attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, user))
        return self._issue(subject=x509.Name(attributes), usage=ExtendedKeyUsageOID.CLIENT_AUTH)

    def _issue(
        self,
        *,
        subject: x509.Name,
        usage: x509.ObjectIdentifier,
        san: x509.SubjectAlternativeName | None = None,
    ) -> KeyPair:
        key = _new_key()
        now = datetime.datetime.now(datetime.UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _BACKDATE)
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                _key_usage(ca=False, key_encipherment=self._key_encipherment), critical=True
            )
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()),
                critical=False,
            )
        )
        if san is not None:
            builder = builder.add_extension(san, critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        return KeyPair(
            cert_pem=cert.public_bytes(serialization.Encoding.PEM), key_pem=_key_pem(key)
        )


@dataclass(frozen=True, kw_only=True)
class ServiceAccountKeys:
    """The key pair kube-apiserver signs and verifies service-account tokens with."""

    private_pem: bytes
    public_pem: bytes

    @classmethod
    def generate(cls) -> ServiceAccountKeys:
        key = _new_key()
        public = key.public_key().public_bytes(
            encoding=serialization.Encoding.PEM,
            format=serialization.PublicFormat.SubjectPublicKeyInfo,
        )
        return cls(private_pem=_key_pem(key), public_pem=public)

    def write(self, *, private_path: Path, public_path: Path) -> None:
        write_file(private_path, self.private_pem, mode=0o600)
        write_file(public_path, self.public_pem, mode=0o644)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def kubeconfig(
    *,
    server: str,
    ca_pem: bytes,
    client: KeyPair,
    user: str,
    cluster: str = "capl-testbed",
    namespace: str | None = None,
) -> dict[str, Any]:
    """A self-contained kubeconfig (certificates embedded) for one user of one cluster."""
    context: dict[str, Any] = {"cluster": cluster, "user": user}
    if namespace is not None:
        context["namespace"] = namespace
    context_name = f"{user}@{cluster}"
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "preferences": {},
        "clusters": [
            {
                "name": cluster,
                "cluster": {"server": server, "certificate-authority-data": _b64(ca_pem)},
            }
        ],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate-data": _b64(client.cert_pem),
                    "client-key-data": _b64(client.key_pem),
                },
            }
        ],
        "contexts": [{"name": context_name, "context": context}],
        "current-context": context_name,
    }


def write_kubeconfig(path: Path, config: dict[str, Any]) -> Path:
    """Write a kubeconfig readable only by its owner (it carries a private key)."""
    write_file(path, yaml.safe_dump(config, sort_keys=False).encode(), mode=0o600)
    return path
