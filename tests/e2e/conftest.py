"""e2e: end to end with the real Cluster API manager, clusterctl, `capl manager` and TCG guests.

Fixtures: tests/fixtures/capi.py and the `capl manager` process fixture from
tests/fixtures/capl.py (both registered in tests/conftest.py). The harness (management and
workload clusters, the stand-in kubelet, direct libvirt reads) is tests/e2e/harness.py.
"""

from collections.abc import Iterator

import pytest

from tests.e2e.harness import REPORT, LibvirtView


@pytest.fixture(scope="module")
def view(libvirtd_uri: str) -> Iterator[LibvirtView]:
    """Direct reads of the real libvirtd (tests/e2e/harness.py `LibvirtView`)."""
    libvirt_view = LibvirtView(libvirtd_uri)
    yield libvirt_view
    libvirt_view.close()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if REPORT:
        terminalreporter.write_sep("-", "e2e measurements")
        for line in REPORT:
            terminalreporter.write_line(line)
