"""kcp: a KubeadmControlPlane of one machine running `kubeadm init` in a TCG guest of capl's
node image, and a worker joining it — Cluster API's own control-plane path, offline.

Its own stage (`make e2e-kcp`), outside `make test`: the control plane alone takes minutes
under TCG (the figures are in the terminal summary and the README). One cluster per module:

- the CIDR of the cluster network is chosen first, because the Cluster API managers must
  resolve the cluster's endpoint `api.<dnsDomain>` through that network's dnsmasq (its
  first address), the way a management cluster with split DNS would: the core manager,
  the kubeadm bootstrap and control-plane managers run with a resolv.conf of their own
  (`capl.testbed.process.own_resolver`, a private mount namespace; the machine's resolver
  is untouched);
- `clusterctl generate cluster --flavor offline-kcp` (templates/cluster-template-offline-kcp.yaml)
  on qemu:///system, nat mode, Ignition for every machine.
"""

from __future__ import annotations

import ipaddress
import secrets
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from capl.testbed.capi import CapiAssets
from capl.testbed.clusterctl import LocalProvider
from capl.testbed.kubeadm_providers import KubeadmProviders
from tests.e2e.harness import REPORT, LibvirtView, report, start_management
from tests.fixtures.capi import ControlPlaneFactory
from tests.fixtures.capl import CaplManagerFactory
from tests.kcp.bed import KcpCluster, create_kcp_cluster
from tests.nodes.bed import delete_real_cluster
from tests.nodes.conftest import node_image, view

__all__ = ["node_image", "view"]

CAPL_KCP_ARGS = ("--machine-shutdown-timeout=30s", "--bootstrap-timeout=20m")


@pytest.fixture(scope="module")
async def kcp_cluster(
    control_plane_factory: ControlPlaneFactory,
    capi_assets: CapiAssets,
    libvirt_provider: LocalProvider,
    capl_manager_factory: CaplManagerFactory,
    view: LibvirtView,
    node_image: Path,
    libvirtd_uri: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[KcpCluster]:
    cidr = view.free_cidr()
    gateway = str(next(ipaddress.ip_network(cidr).hosts()))
    workdir = tmp_path_factory.mktemp("kcp")
    resolv_conf = workdir / "resolv.conf"
    resolv_conf.write_text(f"nameserver {gateway}\noptions timeout:2 attempts:2\n")
    mgmt = await start_management(
        name="kcp",
        plane_factory=control_plane_factory,
        capi=capi_assets,
        provider=libvirt_provider,
        capl_factory=capl_manager_factory,
        workdir=workdir / "management",
        capl_args=CAPL_KCP_ARGS,
        resolv_conf=resolv_conf,
    )
    providers = KubeadmProviders.for_plane(
        plane=mgmt.plane, capi=capi_assets, workdir=workdir / "kubeadm-providers"
    )
    for manager in providers.managers:
        manager.resolv_conf = resolv_conf
    kcp: KcpCluster | None = None
    try:
        await providers.start()
        kcp = await create_kcp_cluster(
            mgmt,
            namespace=f"kcp-{secrets.token_hex(3)}",
            name="kcp",
            view=view,
            uri=libvirtd_uri,
            cidr=cidr,
            node_image=node_image,
        )
        yield kcp
    finally:
        if kcp is not None:
            await _teardown(kcp, view)
        await providers.stop()
        await mgmt.close()


async def _teardown(kcp: KcpCluster, view: LibvirtView) -> None:
    """Delete the cluster through the API (a test may have done so); then stop capl and remove
    whatever is left directly."""
    try:
        await delete_real_cluster(kcp, within=300)
    except Exception as exc:  # reported below with what had to be removed by hand
        report(f"cluster deletion failed: {exc}")
    finally:
        await kcp.close()
        await kcp.management.capl.stop()
        left = view.force_cleanup(
            domain_prefix=kcp.domain_prefix, network=kcp.network, pool=kcp.pool
        )
    assert not left, f"had to remove by hand: {left}"


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if REPORT:
        terminalreporter.write_sep("-", "KubeadmControlPlane in TCG: measurements")
        for line in REPORT:
            terminalreporter.write_line(line)
