"""Fixtures of the tests against the real kube-apiserver (tests/kube).

- `kube`: a `capl.kube.KubeClient` as admin of the session control plane (per-object request
  accounting on), with the `Toy` test CRD (capl/testing/toy.py) installed; closed after
  the test.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from capl.kube import KubeClient
from capl.testbed import ControlPlane
from capl.testing.toy import ensure_toy_crd


@pytest.fixture
async def kube(control_plane: ControlPlane) -> AsyncIterator[KubeClient]:
    await control_plane.ensure_running()
    client = await KubeClient.connect(str(control_plane.kubeconfig), track_objects=True)
    try:
        await ensure_toy_crd(client)
        yield client
    finally:
        await client.close()
