"""Fixtures of the chaos stage (tests/chaos): real `capl manager` processes, broken on purpose.

Every test here runs the product's entry point (`capl manager`, through
tests/fixtures/capl.py `CaplManager`) against the session's kube-apiserver and libvirt, then
breaks something — the manager (SIGKILL), kube-apiserver (restart) and etcd (compaction), the
leader of two managers, a libvirt host's network link, libvirtd itself — and checks that
nothing is lost or leaked, by listing libvirt directly (tests/fixtures/bed.py `audit`).

- `bed`: a `ChaosBed` in the test's namespace with its own API client; after the test a
  direct libvirt sweep removes anything of the namespace the manager left
  (tests/fixtures/bed.py `bed_fixture`).
- `chaos_seed`: the seed of the test's random choices: `$CAPL_CHAOS_SEED` to replay a run,
  else a fresh one; printed in the terminal summary and in failure messages.
- `chaos_manager(name, *flags, **options)`: a started `capl manager` (tests/fixtures/capl.py
  `CaplManager`, fixture `capl_manager_factory`) in the test's namespace, without webhooks,
  with the flags the chaos tests share plus `flags`.
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
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from capl.testbed import ControlPlane
from capl.testbed.caplmanager import CaplManager
from tests.chaos.bed import ChaosBed, figures
from tests.fixtures.bed import bed_fixture
from tests.fixtures.capl import CaplManagerFactory

LAST = "test_libvirtd_restart.py"

ChaosManager = Callable[..., Awaitable[CaplManager]]


def manager_args(*extra: str) -> list[str]:
    """Flags every chaos manager gets besides the fixture's own (ports, log format)."""
    return ["--machine-shutdown-timeout=5s", "--concurrency=10", *extra]


@pytest.fixture
def chaos_seed(request: pytest.FixtureRequest) -> int:
    value = os.environ.get("CAPL_CHAOS_SEED")
    seed = int(value) if value else secrets.randbits(32)
    request.node.user_properties.append(("chaos_seed", seed))
    return seed


bed = bed_fixture(ChaosBed)


@pytest.fixture
def chaos_manager(
    capl_manager_factory: CaplManagerFactory, control_plane: ControlPlane, bed: ChaosBed
) -> ChaosManager:
    """`await chaos_manager(name, *flags, start=True, **CaplManager options)`."""

    async def make(name: str, *flags: str, start: bool = True, **options: Any) -> CaplManager:
        options.setdefault("webhooks", False)
        options.setdefault("namespace", bed.namespace)
        manager = await capl_manager_factory(
            control_plane, name=name, extra_args=manager_args(*flags), **options
        )
        if start:
            await manager.start()
        return manager

    return make


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
