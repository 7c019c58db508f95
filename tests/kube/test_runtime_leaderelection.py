"""Leader election against the real API server: two managers in one process, and two manager
processes where the leader is killed with SIGKILL."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from capl.kube import KubeClient
from capl.runtime.errors import NotFound
from capl.runtime.manager import Manager, ManagerOptions
from capl.runtime.objects import ObjectKey
from capl.runtime.resources import LEASE
from capl.testbed import ControlPlane
from capl.testbed.process import ManagedProcess
from capl.testing.toy import TOY, ToyReconciler, toy
from tests.fixtures.runtime import eventually

pytestmark = pytest.mark.apiserver

REPO = Path(__file__).resolve().parents[2]


async def holder(kube: KubeClient, namespace: str, name: str) -> str:
    try:
        lease = await kube.resource(LEASE).get(ObjectKey(namespace, name))
    except NotFound:
        return ""
    return str(lease["spec"].get("holderIdentity") or "")


async def wait_for(cond: Any, *, within: float) -> None:
    """Wait for an async condition with a deadline."""
    deadline = time.monotonic() + within
    while not await cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {within}s")
        await asyncio.sleep(0.05)


def disjoint(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> bool:
    return all(e1 <= s2 or e2 <= s1 for s1, e1 in a for s2, e2 in b)


async def test_two_managers_in_one_process(
    kube: KubeClient, namespace: str, control_plane: ControlPlane
) -> None:
    toys = kube.resource(TOY)
    for i in range(5):
        await toys.create(toy(f"t{i}", namespace, i))
    managers: list[Manager] = []
    reconcilers: list[ToyReconciler] = []
    clients: list[KubeClient] = []
    for ident in ("one", "two"):
        client = await KubeClient.connect(str(control_plane.kubeconfig))
        clients.append(client)
        m = Manager(
            ManagerOptions(
                leader_elect=True,
                leader_election_id="pair",
                leader_election_namespace=namespace,
                identity=ident,
                lease_duration=4.0,
                renew_deadline=3.0,
                retry_period=0.5,
                namespace=namespace,
                metrics_bind_address="0",
                health_probe_bind_address="0",
                handle_signals=False,
            ),
            client,
        )
        r = ToyReconciler(m.cache, client, identity=ident)
        m.add_controller("toy", for_=TOY, reconciler=r)
        managers.append(m)
        reconcilers.append(r)
    runs = [asyncio.create_task(managers[0].run())]
    try:
        await eventually(lambda: managers[0].leading.is_set(), within=30)
        runs.append(asyncio.create_task(managers[1].run()))
        await eventually(lambda: reconcilers[0].calls >= 5, within=30)
        for v in range(3):  # keep the leader busy while the standby polls
            await toys.patch(ObjectKey(namespace, "t0"), {"spec": {"value": 100 + v}})
            await asyncio.sleep(0.5)
        assert reconcilers[1].calls == 0
        assert not managers[1].leading.is_set()
        assert await holder(kube, namespace, "pair") == "one"
        managers[0].stop()  # graceful: releases the lease
        await runs[0]
        t0 = time.monotonic()
        await toys.patch(ObjectKey(namespace, "t1"), {"spec": {"value": 500}})
        await eventually(lambda: managers[1].leading.is_set(), within=30)

        async def two_reconciled_it() -> bool:
            status = (await toys.get(ObjectKey(namespace, "t1"))).get("status") or {}
            return status.get("observed") == 500 and status.get("by") == "two"

        await wait_for(two_reconciled_it, within=30)
        assert time.monotonic() - t0 < 4.0  # released: no wait for the lease to expire
        assert disjoint(reconcilers[0].intervals, reconcilers[1].intervals)
    finally:
        for m in managers:
            m.stop()
        await asyncio.gather(*runs, return_exceptions=True)
        for c in clients:
            await c.close()


def intervals(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


async def test_two_processes_leader_killed(
    kube: KubeClient, namespace: str, control_plane: ControlPlane, tmp_path: Path
) -> None:
    toys = kube.resource(TOY)
    for i in range(5):
        await toys.create(toy(f"t{i}", namespace, i))
    procs: dict[str, ManagedProcess] = {}
    files = {ident: tmp_path / f"{ident}.jsonl" for ident in ("a", "b")}

    def spawn(ident: str) -> ManagedProcess:
        proc = ManagedProcess(
            name=f"manager-{ident}",
            argv=[
                sys.executable,
                "-m",
                "tests.kube.runtime_manager_proc",
                "--kubeconfig",
                str(control_plane.kubeconfig),
                "--namespace",
                namespace,
                "--identity",
                ident,
                "--intervals",
                str(files[ident]),
                "--lease-duration",
                "10",
                "--renew-deadline",
                "7",
                "--retry-period",
                "1.5",
            ],
            log_path=tmp_path / f"{ident}.log",
            cwd=REPO,
        )
        proc.start()
        procs[ident] = proc
        return proc

    try:
        spawn("a")
        await wait_for(lambda: _is(holder(kube, namespace, "toy-leader"), "a"), within=60)
        await eventually(lambda: len(intervals(files["a"])) >= 5, within=60)
        spawn("b")
        await eventually(
            lambda: "waiting for leadership" in (tmp_path / "b.log").read_text(), within=60
        )
        for v in range(3):
            await toys.patch(ObjectKey(namespace, "t0"), {"spec": {"value": 100 + v}})
            await asyncio.sleep(1.0)
        assert intervals(files["b"]) == []  # the standby never reconciles
        procs["a"].kill()  # SIGKILL: no release, the lease must expire
        killed = time.monotonic()
        await toys.patch(ObjectKey(namespace, "t1"), {"spec": {"value": 777}})

        async def b_reconciled_it() -> bool:
            status = (await toys.get(ObjectKey(namespace, "t1"))).get("status") or {}
            return status.get("observed") == 777 and status.get("by") == "b"

        await wait_for(b_reconciled_it, within=40)
        takeover = time.monotonic() - killed
        print(f"standby took over {takeover:.1f} s after SIGKILL of the leader")
        assert takeover < 20.0, f"standby took {takeover:.1f}s"
        # b appends its interval after its status patch returned: it may land just after
        await eventually(lambda: len(intervals(files["b"])) >= 1, within=10)
        a_runs = [(r["start"], r["end"]) for r in intervals(files["a"])]
        b_runs = [(r["start"], r["end"]) for r in intervals(files["b"])]
        assert max(e for _, e in a_runs) <= min(s for s, _ in b_runs)  # one at a time
        # SIGTERM on the new leader releases the lease for the next one
        await procs["b"].stop(grace=20)
        assert await holder(kube, namespace, "toy-leader") == ""
    finally:
        for proc in procs.values():
            if proc.running:
                proc.kill()


async def _is(value: Any, expected: str) -> bool:
    return bool(await value == expected)
