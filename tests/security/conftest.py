"""Fixtures of the security stage (tests/security): the real `capl manager` process, real
libvirt hosts, and evidence collected afterwards (see tests/security/bed.py).

- `bed`: a `SecurityBed` in the test's namespace on the session control plane, with its own
  admin API client; after the test, whatever the manager did not remove is swept from every
  host directly through libvirt.
- `private_tmp`: a fresh directory to use as the manager's TMPDIR, so the files the manager
  writes (credential files for libvirt and workload clusters) can be found and checked. It
  is 0755, like a shared temporary directory is readable by others: a file that is private
  only because TMPDIR happens to be private does not pass.
- `tls_pki`: the private TLS libvirtd's client credentials as a `pkipath` directory for the
  test's own direct libvirt connection (the manager gets them from a Secret instead).
- Fixtures imported from elsewhere: `capi_crds` (Cluster API CRDs), `capl_manager_factory`
  (the manager process), `tls_libvirtd` (a private, unprivileged libvirtd with TLS on
  loopback, session-scoped: started once for the stage).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from capl.kube import KubeClient
from capl.testbed import ControlPlane
from tests.controllers.conftest import capi_crds
from tests.fixtures.capl import capl_manager_factory
from tests.fixtures.transports import TlsLibvirtd, tls_libvirtd
from tests.security.bed import SecurityBed

__all__ = ["capi_crds", "capl_manager_factory", "tls_libvirtd"]  # re-exported fixtures


@pytest.fixture
async def bed(
    control_plane: ControlPlane, capi_crds: list[str], namespace: str
) -> AsyncIterator[SecurityBed]:
    await control_plane.ensure_running()
    api = await KubeClient.connect(str(control_plane.kubeconfig))
    security = SecurityBed(plane=control_plane, api=api, namespace=namespace)
    try:
        yield security
    finally:
        try:
            await security.sweep()
        finally:
            await api.close()


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
