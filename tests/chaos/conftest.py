"""Fixtures of the chaos stage (tests/chaos): real `capl manager` processes, broken on purpose.

Every test here runs the product's entry point (`capl manager`, through
tests/fixtures/capl.py `CaplManager`) against the session's kube-apiserver and libvirt, then
breaks something — the manager (SIGKILL), kube-apiserver (restart) and etcd (compaction), the
leader of two managers, a libvirt host's network link, libvirtd itself — and checks that
nothing is lost or leaked, by listing libvirt directly (tests/chaos/bed.py).

- `bed`: a `ChaosBed` in the test's namespace with its own API client; after the test it
  removes what is left (machines and cluster through the API while a manager runs, then a
  direct libvirt sweep of anything of the namespace).
- `chaos_seed`: the seed of the test's random choices: `$CAPL_CHAOS_SEED` to replay a run,
  else a fresh one; printed in the terminal summary and in failure messages.
- `manager_args(...)`: the `capl manager` flags the chaos tests share.
- The libvirtd restart test runs last in the stage (it restarts the daemon that hosts the
  shared test driver, whose state dies with it).

The tests: test_manager_kill.py (20 rounds of churn, SIGKILLed manager),
test_apiserver_restart.py, test_leader_election.py, test_host_unreachable.py (a host behind a
network namespace whose link goes down, tests/chaos/netns.py), test_libvirtd_restart.py (real
guests; runs last); and two reproductions of bugs the chaos found:
test_delete_racing_finalizer.py and test_remote_connection_drop.py (their docstrings tell).

Measured figures (seconds per round, takeover, recovery) are printed in the terminal summary
section "chaos".
"""

from __future__ import annotations

import os
import secrets
from collections.abc import AsyncIterator
from typing import Any

import pytest

from capl.kube import KubeClient
from capl.testbed import ControlPlane
from tests.chaos.bed import ChaosBed, figures
from tests.controllers.conftest import capi_crds
from tests.fixtures.capl import capl_manager_factory

__all__ = ["capi_crds", "capl_manager_factory"]  # fixtures re-exported for the tests

LAST = "test_libvirtd_restart.py"


def manager_args(*extra: str) -> list[str]:
    """Flags every chaos manager gets besides the fixture's own (ports, log format)."""
    return ["--machine-shutdown-timeout=5s", "--concurrency=10", *extra]


@pytest.fixture
def chaos_seed(request: pytest.FixtureRequest) -> int:
    value = os.environ.get("CAPL_CHAOS_SEED")
    seed = int(value) if value else secrets.randbits(32)
    request.node.user_properties.append(("chaos_seed", seed))
    return seed


@pytest.fixture
async def bed(
    control_plane: ControlPlane, capi_crds: list[str], namespace: str
) -> AsyncIterator[ChaosBed]:
    await control_plane.ensure_running()
    api = await KubeClient.connect(str(control_plane.kubeconfig))
    chaos = ChaosBed(plane=control_plane, api=api, namespace=namespace)
    try:
        yield chaos
    finally:
        try:
            await chaos.sweep()
        finally:
            await api.close()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.nodeid.split("::")[0].endswith(LAST))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call" and report.failed:
        for name, value in report.user_properties:
            if name == "chaos_seed":
                report.sections.append(("chaos", f"seed {value} (CAPL_CHAOS_SEED={value})"))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    lines = figures()
    if lines:
        terminalreporter.section("chaos")
        for line in lines:
            terminalreporter.write_line(line)
