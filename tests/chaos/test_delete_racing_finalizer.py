"""Regression test: a LibvirtMachine deleted while the controller adds its finalizer must not leak.

kube-apiserver decides whether a DELETE removes an object at once (no finalizers) from the
object it read *before* a concurrent PATCH that adds a finalizer committed, and then deletes
it anyway (kubernetes/kubernetes#77988, open upstream; the watch shows a DELETED event for an
object that carries the finalizer and no deletionTimestamp). The LibvirtMachine controller
got 200 for its identity + finalizer patch, created the domain, volumes, DHCP reservation
and DNS record, and then found the object gone (its status patch answers 404): nothing ever
removed what it made. Found by the SIGKILL churn (test_manager_kill.py), whose "late"
deletes hit the window; this test hits it directly: 40 machines, each deleted 0..300 ms after
it was created, while one `capl manager` runs undisturbed.

Expected: no leftovers in libvirt (listed directly). The controller guards against the race
by rolling back what it created when the object vanished under a create, and by an orphan
sweep by owner UID (capl/controllers/machine/cleanup.py); before that, 7 of 40 machines leaked
here. A failure names the leaked domains.
"""

from __future__ import annotations

import asyncio
import random

import pytest

from tests.chaos.bed import ChaosBed
from tests.chaos.conftest import ChaosManager
from tests.fixtures.bed import Host

pytestmark = [pytest.mark.apiserver, pytest.mark.libvirtd]

MACHINES = 40
JITTER = 0.3


async def test_machine_deleted_while_its_finalizer_is_added_leaves_nothing(
    bed: ChaosBed,
    chaos_manager: ChaosManager,
    shared_test_driver: str,
    chaos_seed: int,
) -> None:
    rng = random.Random(chaos_seed)
    manager = await chaos_manager("capl-race", log_level="info")
    try:
        cluster = await bed.create_cluster("race", hosts=[Host(name="h1", uri=shared_test_driver)])

        async def create_then_delete(name: str) -> None:
            await bed.create_machine(cluster, name)
            # a random moment (the race window is the controller's first patch)
            await asyncio.sleep(rng.uniform(0.0, JITTER))
            await bed.delete_machine(name)

        await bed.many((create_then_delete(f"m{i}") for i in range(MACHINES)), limit=MACHINES)
        await bed.wait_converged(within=120)
        problems = await bed.audit(cluster)
        assert not problems, (
            f"machines deleted while their finalizer was being added leaked (seed {chaos_seed}):"
            "\n  " + "\n  ".join(problems[:20])
        )
        await bed.delete_cluster(cluster)
    finally:
        await manager.stop()
