"""The chaos test bed: objects in, the truth out (not a test module).

`ChaosBed` is tests/fixtures/bed.py `ManagerBed` — one test's namespace on the session control
plane while real `capl manager` processes (tests/fixtures/capl.py) do the work: clusters
provisioned by capl's own LibvirtCluster controller, machines created and deleted with the
test's bookkeeping of what should exist (`bed.live`, `bed.deleted`), API calls that survive a
kube-apiserver restart, `wait_converged`, and `audit`, which compares libvirt, listed
directly, with a fresh list of the API objects. Chaos clusters get the DNS domain
``chaos.example``, so the audit checks the DNS records too.

Timings measured by the chaos tests are kept with `record(...)` and printed in the pytest
terminal summary (tests/chaos/conftest.py).
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

from tests.fixtures.bed import ManagerBed

_figures: list[str] = []


def record(line: str) -> None:
    """One line for the "chaos" section of the pytest terminal summary."""
    _figures.append(line)


def figures() -> list[str]:
    return list(_figures)


@dataclass
class ChaosBed(ManagerBed):
    """See the module docstring."""

    dns_domain: str | None = "chaos.example"


def parse_log_time(value: str) -> float:
    """Seconds since the epoch of a structlog ISO timestamp."""
    return datetime.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
