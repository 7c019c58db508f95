"""Two `capl manager` processes with leader election during a churn; the leader is SIGKILLed.

Both managers run `--leader-elect` on one Lease in the test's namespace, once with the
default timings (lease 15 s, renew deadline 10 s, retry 2 s) and once with short ones given
as flags (4 s / 3 s / 1 s). The first one started leads. While 60 machines are being created
(and 10 of them deleted again), at a random moment once a third of them is under way:

- the standby's Prometheus metrics show zero reconciles (it has not reconciled anything while
  the leader lived), then the leader is killed with SIGKILL (no lease release);
- takeover time = the standby's "became leader" log record minus the moment of the kill; it
  must be below `takeover_limit()`: the standby sees the last renewal up to one jittered
  retry period (retry x 2.2) after it happened, which can be after the kill, takes the lease
  at its first poll once the record stayed unchanged for the lease duration, up to another
  jittered retry period later: lease + 2 x 2.2 x retry (23.8 s with the defaults, 8.4 s
  with the short variant), plus 2 s for the requests and the log line on a busy machine (a
  flat 20 s failed once at 20.4 s with the defaults, within this bound);
- the churn continues (20 more machines, 10 deletions) under the new leader.

Then: every machine converges; libvirt, listed directly, has exactly one domain per machine
and no duplicate DHCP entry or any other leftover (tests/fixtures/bed.py `audit`); and the logs
show the two never reconciled at the same time: every record the old leader logged from a
reconcile (records carrying the `controller` key) is older than the kill, and every such
record of the new leader is younger than its "became leader". The takeover time of both
variants is printed in the terminal summary.
"""

from __future__ import annotations

import asyncio
import random
import re
import time

import pytest

from capl.api import constants as c
from capl.runtime.resources import LEASE, LIBVIRT_MACHINE
from capl.testbed.caplmanager import CaplManager
from capl.testing.objects import condition_of
from tests.chaos.bed import ChaosBed, parse_log_time, record
from tests.chaos.conftest import ChaosManager
from tests.fixtures.bed import Host

pytestmark = [pytest.mark.apiserver, pytest.mark.libvirtd]

LEASE_NAME = "controller-leader-election-capl"
# capl.runtime.leaderelection polls every retry_period * (1 + random() * 1.2)
RETRY_JITTER = 1.2
REQUEST_ALLOWANCE = 2.0


def takeover_limit(lease: float, retry: float) -> float:
    """The longest a standby can take to lead after the leader died (module docstring)."""
    return lease + 2 * retry * (1 + RETRY_JITTER) + REQUEST_ALLOWANCE


_RECONCILES = re.compile(r"^controller_runtime_reconcile_total\{[^}]*\}\s+([0-9.e+]+)$", re.M)


def became_leader_at(manager: CaplManager) -> list[float]:
    return [
        parse_log_time(str(r["timestamp"]))
        for r in manager.log_records()
        if r.get("event") == "became leader"
    ]


def reconcile_times(manager: CaplManager) -> list[float]:
    """Timestamps of the records logged from inside reconciles or controllers."""
    return [
        parse_log_time(str(r["timestamp"]))
        for r in manager.log_records()
        if r.get("controller") and "timestamp" in r
    ]


async def reconciles(manager: CaplManager) -> float:
    return sum(float(v) for v in _RECONCILES.findall(await manager.metrics()))


async def wait_leader(manager: CaplManager, *, within: float) -> float:
    deadline = time.monotonic() + within
    while True:
        times = became_leader_at(manager)
        if times:
            return times[-1]
        if not manager.running:
            raise AssertionError(f"{manager.name} died:\n{manager.log_text()[-3000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{manager.name} did not become leader within {within:.0f}s")
        await asyncio.sleep(0.1)


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    ("lease", "renew", "retry"),
    [pytest.param(15, 10, 2, id="defaults-15s-10s-2s"), pytest.param(4, 3, 1, id="short-4s-3s-1s")],
)
async def test_leader_killed_standby_takes_over_without_double_provisioning(
    bed: ChaosBed,
    chaos_manager: ChaosManager,
    shared_test_driver: str,
    chaos_seed: int,
    lease: int,
    renew: int,
    retry: int,
) -> None:
    rng = random.Random(chaos_seed)
    flags = (
        []
        if (lease, renew, retry) == (15, 10, 2)
        else [
            f"--leader-elect-lease-duration={lease}s",
            f"--leader-elect-renew-deadline={renew}s",
            f"--leader-elect-retry-period={retry}s",
        ]
    )
    managers = [
        await chaos_manager(
            f"capl-le-{which}",
            *flags,
            start=False,
            leader_elect=True,
            leader_election_namespace=bed.namespace,
        )
        for which in ("a", "b")
    ]
    leader, standby = managers
    try:
        await leader.start()
        await wait_leader(leader, within=60)
        await standby.start()
        cluster = await bed.create_cluster("le", hosts=[Host(name="h1", uri=shared_test_driver)])

        first = [f"m{i}" for i in range(60)]
        doomed = rng.sample(first, k=10)

        under_way = asyncio.Event()

        async def churn_one(name: str) -> None:
            await bed.create_machine(cluster, name)
            if len(bed.live) >= len(first) // 3:
                under_way.set()
            if name in doomed:
                await asyncio.sleep(rng.uniform(0.5, 3.0))  # a random moment
                await bed.delete_machine(name, once_finalized=True)

        churn = asyncio.create_task(bed.many((churn_one(n) for n in first), limit=8))
        # a random moment once a third of the machines is under way: work is in flight
        await asyncio.wait_for(under_way.wait(), timeout=120)
        await asyncio.sleep(rng.uniform(0.0, 0.5))
        assert await reconciles(standby) == 0, "the standby reconciled while the leader lived"
        assert not became_leader_at(standby)
        killed_at = time.time()
        leader.kill()
        ready = sum(
            condition_of(m, c.ConditionType.READY).get("status") == "True"
            for m in await bed.list_objects(LIBVIRT_MACHINE)
        )
        in_flight = len(first) - ready
        took_over = await wait_leader(standby, within=60)
        takeover = took_over - killed_at
        await churn
        more = [f"n{i}" for i in range(20)]
        victims = rng.sample(sorted(bed.live), k=10)
        await bed.many(
            [bed.create_machine(cluster, n) for n in more]
            + [bed.delete_machine(n, once_finalized=True) for n in victims]
        )
        _, machines = await bed.wait_converged(within=180)
        problems = await bed.audit(cluster, machines)
        assert not problems, "libvirt does not match the API:\n  " + "\n  ".join(problems[:40])

        old = reconcile_times(leader)
        new = reconcile_times(standby)
        assert old
        assert new
        assert max(old) <= killed_at, "the old leader logged a reconcile after it was killed"
        assert min(new) >= took_over, "the new leader reconciled before it led"
        lease_obj = await bed.get(LEASE, LEASE_NAME)
        assert lease_obj is not None
        holder = str(lease_obj["spec"].get("holderIdentity") or "")
        assert holder, lease_obj
        record(
            f"leader election (lease {lease} s / renew {renew} s / retry {retry} s): takeover "
            f"{takeover:.1f} s after SIGKILL of the leader ({in_flight} machines in flight); "
            f"{len(machines)} machines converged, no double provisioning"
        )
        limit = takeover_limit(lease, retry)
        assert takeover < limit, f"takeover took {takeover:.1f} s (limit {limit:.1f} s)"
        await bed.delete_cluster(cluster)
    finally:
        for manager in managers:
            await manager.stop()
