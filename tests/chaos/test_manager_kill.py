"""Churn of 100 LibvirtMachines while `capl manager` is killed with SIGKILL and restarted.

The manager is the real `capl manager` process; the machines live on the libvirt test driver
hosted by libvirtd (`test+unix:///default`), which both the manager and this test reach by
URI, so the state survives the manager's death and this test lists it directly.

Each round (seeded RNG, the seed is printed; `CAPL_CHAOS_SEED` replays a run):
- scale: a new target population between 60 and 100 (the first round: 0 -> 100), reached by
  deleting 5..20 random live machines and creating the difference, in random order;
- the manager is SIGKILLed 1 or 2 times at random moments while that churn is being applied
  and worked on, and restarted each time (the next start waits for /readyz);
- a few machines created in the round are deleted again right after the last restart, most
  of them half provisioned (each once the controller has put its finalizer on it: a DELETE
  racing that very patch loses the machine to kube-apiserver's finalizer race,
  kubernetes/kubernetes#77988 — test_delete_racing_finalizer.py reproduces that on its own);
- then: every live machine Ready, every deleted one gone, and libvirt, listed directly,
  holds exactly one running domain per live machine (by spec.domainUUID and by name), its
  volumes, one DHCP host and one DNS record, and nothing else (tests/fixtures/bed.py `audit`).
At the end the cluster is deleted and nothing of it is left on the host.

`CAPL_CHAOS_ROUNDS` overrides the number of rounds (default 20). The time of every round is
printed in the terminal summary.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import time

import pytest

from tests.chaos.bed import ChaosBed, record
from tests.chaos.conftest import ChaosManager
from tests.fixtures.bed import Host
from tests.fixtures.libvirt_direct import take_inventory

pytestmark = [pytest.mark.apiserver, pytest.mark.libvirtd]

ROUNDS = int(os.environ.get("CAPL_CHAOS_ROUNDS", "20"))
POPULATION = 100
LOW = 60
CONVERGE_WITHIN = 180.0


@pytest.mark.timeout(1800)
async def test_churn_with_sigkilled_manager_loses_and_leaks_nothing(
    bed: ChaosBed,
    chaos_manager: ChaosManager,
    shared_test_driver: str,
    chaos_seed: int,
) -> None:
    rng = random.Random(chaos_seed)
    record(f"manager SIGKILL churn: seed {chaos_seed} (replay: CAPL_CHAOS_SEED={chaos_seed})")
    manager = await chaos_manager(
        "capl-churn", log_level=os.environ.get("CAPL_CHAOS_LOG_LEVEL", "info")
    )
    numbers = itertools.count()
    kills = 0
    started = time.monotonic()
    per_round: list[float] = []
    try:
        cluster = await bed.create_cluster("churn", hosts=[Host(name="h1", uri=shared_test_driver)])
        for round_no in range(ROUNDS):
            t0 = time.monotonic()
            target = POPULATION if round_no == 0 else rng.randint(LOW, POPULATION)
            live = sorted(bed.live)
            deletes = rng.sample(live, k=min(len(live), rng.randint(5, 20))) if live else []
            creates = [f"m{next(numbers)}" for _ in range(target - len(live) + len(deletes))]
            ops = [("create", n) for n in creates] + [("delete", n) for n in deletes]
            rng.shuffle(ops)

            async def apply(ops: list[tuple[str, str]] = ops) -> None:
                await bed.many(
                    bed.create_machine(cluster, n) if op == "create" else bed.delete_machine(n)
                    for op, n in ops
                )

            churn = asyncio.create_task(apply())
            round_kills = rng.choice((1, 1, 2))
            try:
                for _ in range(round_kills):
                    # a random moment (chaos schedule, not synchronisation): during the churn
                    # or while the fresh process works off its backlog
                    await asyncio.sleep(rng.uniform(0.0, 2.5))
                    manager.kill()
                    kills += 1
                    await manager.start()
            finally:
                await churn
            late = rng.sample(creates, k=min(len(creates), rng.randint(0, 4)))
            await bed.many(bed.delete_machine(n, once_finalized=True) for n in late)
            converge_s, machines = await bed.wait_converged(within=CONVERGE_WITHIN)
            problems = await bed.audit(cluster, machines)
            assert not problems, (
                f"round {round_no} (seed {chaos_seed}): libvirt does not match the API:\n  "
                + "\n  ".join(problems[:40])
            )
            seconds = time.monotonic() - t0
            per_round.append(seconds)
            record(
                f"  round {round_no:2d}: {len(bed.live):3d} live, +{len(creates)} "
                f"-{len(deletes) + len(late)}, {round_kills} kill(s): {seconds:5.1f} s "
                f"(converged {converge_s:4.1f} s after the churn)"
            )
        await bed.delete_cluster(cluster)
        inv = await take_inventory(
            shared_test_driver, namespace=bed.namespace, network=cluster.network, pool=cluster.pool
        )
        assert (inv.domains, inv.volumes, inv.dhcp, inv.dns) == ([], [], [], []), inv
        assert manager.running, manager.log_text()[-4000:]
    finally:
        await manager.stop()
    total = time.monotonic() - started
    rounds = len(per_round)
    record(
        f"manager SIGKILL churn: {rounds} rounds, {kills} kills, {len(bed.deleted)} machines "
        f"deleted, {total:.1f} s total, {sum(per_round) / max(1, rounds):.1f} s per round "
        f"(max {max(per_round, default=0):.1f} s)"
    )
