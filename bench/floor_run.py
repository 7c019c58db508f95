"""The work floor of one scale-out (bench/floor.py says what is replayed and how): run after
capl's run of the same machines, in the same control plane and libvirtd, with capl's manager
stopped and its domains, volumes, pools and networks removed from the test driver.

Per pass (one loop, then `concurrency` loops): the calls capl made before the machines are
replayed untimed (networks, pools) and the base volume put into each pool, the machines'
LibvirtMachines created untimed in a namespace of their own (bench/machines_testdriver.py's
replay plan: as the user created them), then the clock runs while every machine's spec
patch, libvirt calls, status patch and Event are sent; afterwards the floor's domains,
volumes, pools and networks are removed again. CPU seconds of the processes (kube-apiserver,
etcd, libvirtd, and this process: the floor script) are read over the timed part.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from bench.common import (
    RAW_USER,
    TEST_DRIVER,
    Bed,
    _put_base_volume,
    cpu_seconds_of,
    machine_names,
    note,
)
from bench.floor import Replayer, read_trace, replay_setup, run_floor, split_by_machine
from bench.machines_testdriver import LOAD_IN_FLIGHT, _replay_plan
from bench.runs import Run
from capl.kube import KubeClient
from capl.runtime.objects import Obj, ObjectKey
from capl.runtime.resources import EVENT, LIBVIRT_MACHINE
from capl.runtime.resources import NAMESPACE as NAMESPACES
from capl.testing.harness import gather_limited


class ApiWrites:
    """The manager's API writes for each machine, on fresh copies (bench/machines_testdriver
    .py's replay plan), sent by the floor's loops."""

    def __init__(self, client: KubeClient, namespace: str, plan: dict[str, Any]) -> None:
        self.client = client
        self.namespace = namespace
        self.plan = plan
        self.created: dict[str, Obj] = {}
        self.lms = client.resource(LIBVIRT_MACHINE)
        self.events = client.resource(EVENT)

    @classmethod
    async def prepare(
        cls, client: KubeClient, machines: Sequence[Obj], events: Sequence[Obj], tag: str
    ) -> ApiWrites:
        namespace = f"floor-{tag}-{time.time_ns() % 10**8:x}"
        await client.resource(NAMESPACES).create({"metadata": {"name": namespace}})
        labels = machines[0]["metadata"].get("labels") or {}
        cluster = str(labels.get("cluster.x-k8s.io/cluster-name", "bench"))
        plan = {
            fresh["metadata"]["name"]: (fresh, main, status, event)
            for fresh, main, status, event in _replay_plan(machines, events, namespace, cluster)
        }
        writes = cls(client, namespace, plan)
        created = await gather_limited(
            [writes.lms.create(fresh) for fresh, _, _, _ in plan.values()], limit=LOAD_IN_FLIGHT
        )
        writes.created = {obj["metadata"]["name"]: obj for obj in created}
        return writes

    async def before(self, name: str) -> None:
        obj = self.created.get(name)
        if obj is None:
            return
        _, main, _, _ = self.plan[name]
        key = ObjectKey(self.namespace, name)
        await self.lms.patch(key, main, resource_version=obj["metadata"]["resourceVersion"])

    async def after(self, name: str) -> None:
        if name not in self.created:
            return
        _, _, status, event = self.plan[name]
        await self.lms.patch_status(ObjectKey(self.namespace, name), status)
        if event is not None:
            await self.events.create(event)


async def measure_floor(bed: Bed, run: Run, *, concurrency: int) -> dict[str, Any]:
    """The floor of `run` (see the module docstring); stops its manager and removes capl's
    machines from the test driver first. Returns floor.json's body."""
    assert run.trace is not None, "the run was not traced"
    window = run.trace
    ns = run.namespace
    machines = (await bed.admin.resource(LIBVIRT_MACHINE).list(namespace=ns)).items
    events = (await bed.admin.resource(EVENT).list(namespace=ns)).items
    setup = read_trace(window.path, window.start, window.machines)
    calls = read_trace(window.path, window.machines, window.end)
    names = machine_names(run.n)
    per_machine, rest = split_by_machine(calls.calls, names)
    attributed = sum(len(v) for v in per_machine.values())
    note(
        f"floor: {len(calls.calls)} libvirt calls recorded for {run.n} machines "
        f"({attributed} attributed to a machine, {len(rest)} to none); setup {len(setup.calls)}"
    )
    await run.manager.stop()
    for cluster in run.clusters:
        await bed.sweep(cluster)
    kubeconfig = bed.plane.add_user(RAW_USER, groups=["system:masters"])
    client = await KubeClient.connect(str(kubeconfig))
    passes: dict[str, Any] = {}
    try:
        for tag, loops in (("sequential", 1), ("concurrent", concurrency)):
            passes[tag] = await _one_pass(
                bed, run, client, machines, events, setup.calls, per_machine, rest, tag, loops
            )
    finally:
        await client.close()
    return {
        "machines": run.n,
        "clusters": len(run.clusters),
        "concurrency": concurrency,
        "source": "recorded from capl's run in this benchmark (CAPL_LIBVIRT_TRACE)",
        "libvirt_calls_recorded": len(calls.calls),
        "libvirt_calls_attributed_to_machines": attributed,
        "libvirt_calls_of_no_machine": len(rest),
        "libvirt_calls_setup": len(setup.calls),
        "libvirt_calls_by_method": calls.by_method(),
        "trace_cpu_seconds": round(calls.trace_cpu_seconds, 3),
        "api_writes_per_machine": round(
            sum(2 + (p[3] is not None) for p in _replay_plan(machines, events, ns, "x")) / run.n, 3
        ),
        **passes,
    }


async def _one_pass(
    bed: Bed,
    run: Run,
    client: KubeClient,
    machines: Sequence[Obj],
    events: Sequence[Obj],
    setup: Sequence[Any],
    per_machine: dict[str, Any],
    rest: Sequence[Any],
    tag: str,
    loops: int,
) -> dict[str, Any]:
    stats = await asyncio.to_thread(replay_setup, TEST_DRIVER, setup)
    for cluster in run.clusters:
        await asyncio.to_thread(_put_base_volume, cluster.pool)
    writes = await ApiWrites.prepare(client, machines, events, tag[:3])
    replayer = Replayer(TEST_DRIVER)
    processes = {k: v for k, v in bed.processes(run.manager).items() if k != "manager"}
    order = [m["metadata"]["name"] for m in machines]
    try:
        cpu_before = cpu_seconds_of(processes)
        seconds = await run_floor(replayer, order, per_machine, rest, writes, loops=loops)
        cpu_after = cpu_seconds_of(processes)
    finally:
        replayer.close()
        for cluster in run.clusters:
            await bed.sweep(cluster)
    replayed = replayer.stats()
    cpu = {
        ("floor script (this process)" if k.startswith("benchmark") else k): round(
            cpu_after[k] - cpu_before[k], 2
        )
        for k in cpu_after
        if k in cpu_before
    }
    body = {
        "loops": loops,
        "seconds": round(seconds, 3),
        "machines_per_s": round(run.n / seconds, 2),
        "cpu_seconds_by_process": cpu,
        "replay": replayed.as_dict(),
        "setup_replay": stats.as_dict(),
    }
    note(
        f"floor ({tag}, {loops} loop(s)): {run.n} machines in {seconds:.1f} s "
        f"({body['machines_per_s']:.1f}/s), {replayed.calls} libvirt calls, "
        f"{replayed.outcome_mismatches} outcome mismatches, {replayed.extra_lookups} extra "
        f"lookups; CPU s: " + ", ".join(f"{k} {v}" for k, v in cpu.items())
    )
    return body
