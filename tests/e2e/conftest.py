"""e2e: end to end with the real Cluster API manager, clusterctl, `capl manager` and TCG guests.

Fixtures: tests/fixtures/capi.py (registered in tests/conftest.py) and the `capl manager`
process fixture from tests/fixtures/capl.py (imported here; register that module as a plugin
in tests/conftest.py to share it with other test directories). The harness (management and
workload clusters, the stand-in kubelet, direct libvirt reads) is tests/e2e/harness.py.
"""

import pytest

from tests.fixtures.capl import capl_manager_factory

__all__ = ["capl_manager_factory"]


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    from tests.e2e.harness import REPORT

    if REPORT:
        terminalreporter.write_sep("-", "e2e measurements")
        for line in REPORT:
            terminalreporter.write_line(line)
