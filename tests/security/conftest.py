"""Fixtures of the security stage (tests/security): the real `capl manager` process, real
libvirt hosts, and evidence collected afterwards (see tests/security/bed.py).

- `bed`: a `SecurityBed` in the test's namespace on the session control plane, with its own
  admin API client; after the test, whatever the manager did not remove is swept from every
  host directly through libvirt (tests/fixtures/bed.py `bed_fixture`).
- `private_tmp`: a fresh directory to use as the manager's TMPDIR, so the files the manager
  writes (credential files for libvirt and workload clusters) can be found and checked. It
  is 0755, like a shared temporary directory is readable by others: a file that is private
  only because TMPDIR happens to be private does not pass.
- `tls_pki`: the private TLS libvirtd's client credentials as a `pkipath` directory for the
  test's own direct libvirt connection (the manager gets them from a Secret instead).
- From elsewhere: `capi_crds` (the Cluster API CRDs) and `capl_manager_factory` (the
  manager process), both registered in tests/conftest.py; `tls_libvirtd` (a private,
  unprivileged libvirtd with TLS on loopback, session-scoped: started once for the stage),
  imported here.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.fixtures.bed import bed_fixture
from tests.fixtures.transports import TlsLibvirtd, tls_libvirtd
from tests.security.bed import SecurityBed

__all__ = ["tls_libvirtd"]  # the session fixture, registered by this import


bed = bed_fixture(SecurityBed)


@pytest.fixture
def private_tmp(tmp_path: Path) -> Path:
    path = tmp_path / "manager-tmp"
    path.mkdir()
    os.chmod(path, 0o755)
    return path


@pytest.fixture
def tls_pki(tls_libvirtd: TlsLibvirtd, tmp_path: Path) -> Path:
    pki = tmp_path / "test-pki"
    pki.mkdir(mode=0o700)
    for key, filename in (
        ("ca.crt", "cacert.pem"),
        ("tls.crt", "clientcert.pem"),
        ("tls.key", "clientkey.pem"),
    ):
        path = pki / filename
        path.write_bytes(tls_libvirtd.credentials[key])
        os.chmod(path, 0o600)
    return pki
