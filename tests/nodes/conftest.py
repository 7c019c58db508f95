"""nodes: real Kubernetes nodes (kubelet, containerd, kubeadm join through the kubeadm
bootstrap provider's Ignition and cloud-config) in TCG guests of capl's node image.

One cluster per module (tests/nodes/bed.py); the tests of a module run in file order
against it. The expensive parts are shared: one management cluster, one hosted control
plane, the workers booted once.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from capl.testbed.capi import CapiAssets
from capl.testbed.clusterctl import LocalProvider
from capl.testbed.kubeadm_providers import KubeadmProviders
from tests.e2e.harness import REPORT, LibvirtView, Management, report, start_management
from tests.fixtures.capi import ControlPlaneFactory
from tests.fixtures.capl import CaplManagerFactory
from tests.fixtures.common import require_part
from tests.nodes.bed import (
    NODE_IMAGE_ENV,
    RealCluster,
    create_real_cluster,
    delete_real_cluster,
    env_path,
)

# The bootstrap timeout is short enough for the bad-input test to see it within the module
# (it looks last), long enough for good nodes booting side by side on two cores (a slow
# good node that passes it turns True again, after one Warning event).
CAPL_NODES_ARGS = ("--machine-shutdown-timeout=30s", "--bootstrap-timeout=10m")


@pytest.fixture(scope="session")
def node_image() -> Path:
    path = env_path(NODE_IMAGE_ENV)
    if path is None or not path.is_file():
        require_part("the node image", f"set {NODE_IMAGE_ENV} (make node-image prints it)")
        raise AssertionError("not reached")
    return path


@pytest.fixture(scope="module")
def view(libvirtd_uri: str) -> Iterator[LibvirtView]:
    libvirt_view = LibvirtView(libvirtd_uri)
    yield libvirt_view
    libvirt_view.close()


@pytest.fixture(scope="module")
async def management(
    control_plane_factory: ControlPlaneFactory,
    capi_assets: CapiAssets,
    libvirt_provider: LocalProvider,
    capl_manager_factory: CaplManagerFactory,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[Management]:
    mgmt = await start_management(
        name="nodes",
        plane_factory=control_plane_factory,
        capi=capi_assets,
        provider=libvirt_provider,
        capl_factory=capl_manager_factory,
        workdir=tmp_path_factory.mktemp("management"),
        capl_args=CAPL_NODES_ARGS,
    )
    providers = KubeadmProviders.for_plane(
        plane=mgmt.plane, capi=capi_assets, workdir=tmp_path_factory.mktemp("kubeadm-providers")
    )
    try:
        await providers.start()
        yield mgmt
    finally:
        await providers.stop()
        await mgmt.close()


@pytest.fixture(scope="module")
async def real_cluster(
    management: Management,
    view: LibvirtView,
    node_image: Path,
    libvirtd_uri: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[RealCluster]:
    namespace = f"nodes-{secrets.token_hex(3)}"
    real = await create_real_cluster(
        management,
        namespace=namespace,
        name="rn",
        view=view,
        uri=libvirtd_uri,
        node_image=node_image,
        workdir=tmp_path_factory.mktemp("workload"),
        ignition_workers=1,
        cloud_config_workers=1,
    )
    try:
        yield real
    finally:
        await _teardown(real, management, view)


async def _teardown(real: RealCluster, management: Management, view: LibvirtView) -> None:
    """Delete the cluster through the API (a test may have done so); then stop capl — it
    would re-create a domain removed under it — and remove whatever is left directly."""
    try:
        await delete_real_cluster(real, within=300)
    except Exception as exc:  # reported below with what had to be removed by hand
        report(f"cluster deletion failed: {exc}")
    finally:
        if real.workload is not None:
            await real.workload.close()
        await real.control_plane.stop()
        await management.capl.stop()
        left = view.force_cleanup(
            domain_prefix=real.domain_prefix, network=real.network, pool=real.pool
        )
    assert not left, f"had to remove by hand: {left}"


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if REPORT:
        terminalreporter.write_sep("-", "real-node measurements")
        for line in REPORT:
            terminalreporter.write_line(line)
