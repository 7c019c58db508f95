"""kube-apiserver restarted and etcd compacted in the middle of a churn; the manager stays up.

One `capl manager` process (no leader election: an apiserver outage longer than the renew
deadline would rightly make a leader step down) runs the whole test; its PID never changes.
40 machines are Ready on the shared test driver, then, with the churn running:

1. churn A (create 20, delete 10) while kube-apiserver is stopped and started again: the
   manager's in-flight reconciles fail, its watches break;
2. churn B (create 10, delete 10) as soon as kube-apiserver answers again — possibly before
   the manager's watches are back;
3. one more write elsewhere moves etcd's revision past anything the manager has seen, etcd is
   compacted to it, and kube-apiserver is restarted again: every informer must resume from a
   resourceVersion that no longer exists (410 Gone; the watch cache is off in the test
   control plane, so this is deterministic) and re-list;
4. churn C (create 10, delete 5).

Then, without any manager restart: the same PID, one start, the log shows the informers
re-listing after 410; every machine converges; the manager's view as written into status
(Ready, observedGeneration = generation, host) agrees with a fresh list; libvirt, listed
directly, holds exactly the live machines (tests/fixtures/bed.py `audit`). The outage and the
time to converge afterwards are printed in the terminal summary.
"""

from __future__ import annotations

import asyncio
import random
import time

import pytest

from capl.api import constants as c
from capl.runtime.objects import ObjectKey
from capl.runtime.resources import CONFIG_MAP
from capl.testbed import ControlPlane
from capl.testing.objects import condition_of
from tests.chaos.bed import ChaosBed, record
from tests.chaos.conftest import ChaosManager
from tests.fixtures.bed import BedCluster, Host, api_call

pytestmark = [pytest.mark.apiserver, pytest.mark.libvirtd]

INITIAL = 40


async def churn(
    bed: ChaosBed,
    cluster: BedCluster,
    rng: random.Random,
    prefix: str,
    *,
    create: int,
    delete: int,
) -> None:
    victims = rng.sample(sorted(bed.live), k=min(delete, len(bed.live)))
    jobs = [bed.create_machine(cluster, f"{prefix}{i}") for i in range(create)]
    jobs += [bed.delete_machine(name) for name in victims]
    rng.shuffle(jobs)
    await bed.many(jobs)


@pytest.mark.timeout(600)
async def test_apiserver_restart_and_compaction_mid_churn_lose_nothing(
    bed: ChaosBed,
    control_plane: ControlPlane,
    chaos_manager: ChaosManager,
    shared_test_driver: str,
    chaos_seed: int,
) -> None:
    rng = random.Random(chaos_seed)
    manager = await chaos_manager("capl-apiserver")
    pid = manager.pid
    try:
        cluster = await bed.create_cluster(
            "apiserver", hosts=[Host(name="h1", uri=shared_test_driver)]
        )
        await bed.many(bed.create_machine(cluster, f"a{i}") for i in range(INITIAL))
        await bed.wait_converged(within=120)

        t0 = time.monotonic()
        churn_a = asyncio.create_task(churn(bed, cluster, rng, "b", create=20, delete=10))
        await asyncio.sleep(rng.uniform(0.0, 1.0))  # a random moment of the churn
        await control_plane.restart_apiserver(grace=2.0)
        first_outage = time.monotonic() - t0
        await churn_a
        await churn(bed, cluster, rng, "c", create=10, delete=10)

        marker = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "chaos-revision-bump", "namespace": bed.namespace},
            "data": {"at": str(time.time())},
        }
        await bed.create(CONFIG_MAP, marker)
        revision = await control_plane.compact()
        t1 = time.monotonic()
        churn_c = asyncio.create_task(churn(bed, cluster, rng, "d", create=10, delete=5))
        await control_plane.restart_apiserver(grace=2.0)
        second_outage = time.monotonic() - t1
        await churn_c
        t2 = time.monotonic()
        _, machines = await bed.wait_converged(within=180)
        after = time.monotonic() - t2

        survived = (manager.running, manager.pid, manager.starts)
        assert survived == (True, pid, 1), (
            f"the manager was restarted or died (running, pid, starts: {survived}; pid was "
            f"{pid})\n{manager.log_text()[-4000:]}"
        )
        relists = [
            r for r in manager.log_records() if r.get("event") == "watch expired, re-listing"
        ]
        assert relists, "no informer re-listed after the compaction (no 410 seen)"

        for obj in machines:
            name = obj["metadata"]["name"]
            status = obj.get("status") or {}
            assert status.get("observedGeneration") == obj["metadata"]["generation"], name
            assert condition_of(obj, c.ConditionType.READY).get("status") == "True", name
            assert status.get("host") == obj["spec"]["hostName"] == "h1", name
        problems = await bed.audit(cluster, machines)
        assert not problems, "libvirt does not match the API:\n  " + "\n  ".join(problems[:40])

        await api_call(
            lambda: bed.api.resource(CONFIG_MAP).delete(
                ObjectKey(bed.namespace, "chaos-revision-bump")
            )
        )
        await bed.delete_cluster(cluster)
        record(
            f"kube-apiserver restart + etcd compaction (revision {revision}): outages "
            f"{first_outage:.1f} s and {second_outage:.1f} s, {len(relists)} informer re-list(s) "
            f"after 410, all {len(machines)} machines converged {after:.1f} s after the second "
            f"restart, same manager PID {pid}"
        )
    finally:
        await manager.stop()
        await control_plane.ensure_running()
