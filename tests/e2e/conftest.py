"""e2e: end to end with the real Cluster API manager, clusterctl, `capl manager` and TCG guests.

Fixtures: tests/fixtures/capi.py and the `capl manager` process fixture from
tests/fixtures/capl.py (both registered in tests/conftest.py); here the module-scoped `view`
(direct libvirt reads) and `management_parts` (what `ManagementParts.running` starts a
management cluster from). The harness (management and workload clusters, the stand-in
kubelet, direct libvirt reads) is the package tests/e2e/harness/.
"""

from collections.abc import Iterator

import pytest

from capl.testbed.capi import CapiAssets
from capl.testbed.clusterctl import LocalProvider
from tests.e2e.harness import REPORT, LibvirtView, ManagementParts
from tests.fixtures.capi import ControlPlaneFactory
from tests.fixtures.capl import CaplManagerFactory


@pytest.fixture(scope="module")
def view(libvirtd_uri: str) -> Iterator[LibvirtView]:
    """Direct reads of the real libvirtd (tests/e2e/harness/libvirt_view.py `LibvirtView`)."""
    libvirt_view = LibvirtView(libvirtd_uri)
    yield libvirt_view
    libvirt_view.close()


@pytest.fixture(scope="module")
def management_parts(
    control_plane_factory: ControlPlaneFactory,
    capi_assets: CapiAssets,
    libvirt_provider: LocalProvider,
    capl_manager_factory: CaplManagerFactory,
    tmp_path_factory: pytest.TempPathFactory,
) -> ManagementParts:
    """`async with management_parts.running(name) as mgmt:` in a module-scoped fixture."""
    return ManagementParts(
        plane_factory=control_plane_factory,
        capi=capi_assets,
        provider=libvirt_provider,
        capl_factory=capl_manager_factory,
        tmp_path_factory=tmp_path_factory,
    )


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if REPORT:
        terminalreporter.write_sep("-", "e2e measurements")
        for line in REPORT:
            terminalreporter.write_line(line)
