"""Benchmark: N LibvirtMachines on the libvirt test driver, created at once, to Ready.

Starts its own etcd + kube-apiserver (capl.testbed.ControlPlane, binaries from
$KUBEBUILDER_ASSETS), installs capl's CRDs and the Cluster API Cluster/Machine CRDs
($CAPL_CAPI_DIR, reduced to v1beta2 like tests/controllers do), and prepares one cluster on
`test:///default` (network /22, pool, base volume) through the Hosts port. Then:

  raw      the API server's raw merge-patch rate on the same server, measured exactly as
           bench/runtime_toy.py does (its functions: one loop, and `concurrency` loops);
  machines the LibvirtMachine controller (capl.runtime Manager, KubeClient, LibvirtHosts;
           nothing faked) runs; N bootstrap Secrets + Machines exist; the N LibvirtMachines
           are created as fast as the API server takes them; each one's create-to-Ready time
           is taken from a watch (an informer of this process on its own client).

Reported: machines/s (N over first create to last Ready), p50/p99 create-to-Ready, API
writes per machine (patches of LibvirtMachines by the manager; events separately), libvirt
calls per machine, and the ratio machines/s : raw patches/s. Writes
bench/results/machines_testdriver.json.

    .venv/bin/python bench/machines_testdriver.py [--machines 500] [--concurrency 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.runtime_toy import raw_concurrent, raw_sequential
from capl.controllers import libvirtmachine
from capl.kube import KubeClient
from capl.runtime.informer import Cache, FuncHandler
from capl.runtime.logging import configure_logging
from capl.runtime.manager import ManagerOptions
from capl.runtime.objects import Obj, ObjectKey
from capl.runtime.resources import LIBVIRT_MACHINE, MACHINE, NAMESPACE, SECRET
from capl.testbed import ControlPlane
from capl.virt import LibvirtHosts
from tests.controllers.conftest import (
    ControllerHarness,
    bootstrap_secret_obj,
    capi_crd_dir,
    gather_limited,
    is_ready,
    libvirt_machine_obj,
    libvirt_machine_spec,
    machine_obj,
    write_reduced_crds,
)
from tests.fixtures.controlplane import CRD_DIR
from tests.fixtures.runtime import TOY, ensure_toy_crd, toy

RESULTS = Path(__file__).resolve().parent / "results" / "machines_testdriver.json"
NAMESPACE_NAME = "bench"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


async def measure_raw(client: KubeClient, n: int, concurrency: int) -> dict[str, float]:
    await ensure_toy_crd(client)
    toys = client.resource(TOY)
    await gather_limited([toys.create(toy(f"toy-{i:05d}", NAMESPACE_NAME, i)) for i in range(n)])
    keys = [ObjectKey(NAMESPACE_NAME, f"toy-{i:05d}") for i in range(n)]
    await raw_sequential(client, keys, -1)  # warm-up
    return {
        "sequential": await raw_sequential(client, keys, -2),
        "concurrent": await raw_concurrent(client, keys, -3, concurrency),
    }


async def run_machines(plane: ControlPlane, n: int, concurrency: int) -> dict[str, Any]:
    client = await KubeClient.connect(str(plane.kubeconfig), track_objects=True)
    api = await KubeClient.connect(str(plane.kubeconfig))
    watcher = await KubeClient.connect(str(plane.kubeconfig))
    hosts = LibvirtHosts()
    harness = ControllerHarness(
        client=client,
        api=api,
        hosts=hosts,
        namespace=NAMESPACE_NAME,
        options=ManagerOptions(
            namespace=NAMESPACE_NAME,
            metrics_bind_address="0",
            health_probe_bind_address="0",
            handle_signals=False,
            concurrency=concurrency,
        ),
    )
    created: dict[str, float] = {}
    ready: dict[str, float] = {}
    all_ready = asyncio.Event()
    cache = Cache(watcher, namespace=NAMESPACE_NAME)

    def observe(obj: Obj) -> None:
        name = obj["metadata"]["name"]
        if name not in ready and is_ready(obj):
            ready[name] = time.perf_counter()
            if len(ready) == n:
                all_ready.set()

    informer = cache.informer(LIBVIRT_MACHINE)
    informer.add_handler(FuncHandler(add=observe, update=lambda _old, new: observe(new)))
    try:
        cluster = await harness.make_cluster("bench", cidr="10.240.0.0/20")
        await gather_limited(
            [
                harness.create(
                    SECRET,
                    bootstrap_secret_obj(
                        f"m{i:04d}-bootstrap",
                        NAMESPACE_NAME,
                        data=b"#cloud-config\n",
                        cluster=cluster.name,
                    ),
                )
                for i in range(n)
            ]
        )
        machines = await gather_limited(
            [
                harness.create(
                    MACHINE,
                    machine_obj(
                        f"m{i:04d}",
                        NAMESPACE_NAME,
                        cluster=cluster.name,
                        infra_name=f"m{i:04d}",
                        bootstrap_secret=f"m{i:04d}-bootstrap",
                    ),
                )
                for i in range(n)
            ]
        )
        cache.start([LIBVIRT_MACHINE])
        await cache.wait_synced([LIBVIRT_MACHINE])
        hosts.calls.reset()
        client.stats.reset()
        await harness.start(libvirtmachine.setup)

        async def create(machine: Obj) -> None:
            name = machine["metadata"]["name"]
            obj = libvirt_machine_obj(
                name,
                NAMESPACE_NAME,
                cluster=cluster.name,
                machine=machine,
                spec=libvirt_machine_spec(),
            )
            started = time.perf_counter()
            await harness.create(LIBVIRT_MACHINE, obj)
            created[name] = started

        t0 = time.perf_counter()
        await gather_limited([create(m) for m in machines], limit=32)
        t_created = time.perf_counter()
        await asyncio.wait_for(all_ready.wait(), timeout=900)
        t_ready = time.perf_counter()
        await harness.manager.recorder.flush()
        latencies = [ready[name] - created[name] for name in created]
        stats = client.stats
        lm_patches = sum(
            count
            for record, count in stats.object_counts(resource=LIBVIRT_MACHINE).items()
            if record.method == "PATCH"
        )
        lm_status = sum(
            count
            for record, count in stats.object_counts(resource=LIBVIRT_MACHINE).items()
            if record.method == "PATCH" and record.subresource == "status"
        )
        controller = harness.controller(libvirtmachine.CONTROLLER_NAME)
        calls = hosts.calls.snapshot()
        per_method: dict[str, int] = {}
        for methods in calls.values():
            for method, count in methods.items():
                per_method[method] = per_method.get(method, 0) + count
        domains = await harness.host().list_domains(cluster=cluster.name)
        return {
            "machines": n,
            "seconds_create_phase": t_created - t0,
            "seconds_to_all_ready": t_ready - t0,
            "machines_per_s": n / (t_ready - t0),
            "create_to_ready_p50_s": percentile(latencies, 0.5),
            "create_to_ready_p99_s": percentile(latencies, 0.99),
            "create_to_ready_max_s": max(latencies),
            "api_writes_per_machine": lm_patches / n,
            "api_status_writes_per_machine": lm_status / n,
            "api_spec_writes_per_machine": (lm_patches - lm_status) / n,
            "events_written_per_machine": stats.total(method="POST") / n,
            "all_api_writes_per_machine": stats.writes_total() / n,
            "api_requests_total": stats.total(),
            "libvirt_calls_per_machine": hosts.calls.total() / n,
            "libvirt_calls_by_method_per_machine": {
                k: round(v / n, 2) for k, v in sorted(per_method.items(), key=lambda kv: -kv[1])
            },
            "reconciles_per_machine": controller.reconciles / n,
            "reconcile_failures": controller.failures,
            "domains_running": sum(1 for d in domains if d.state.value == "running"),
        }
    finally:
        await cache.stop()
        await harness.close()
        await hosts.close()
        for c in (client, api, watcher):
            await c.close()


async def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--machines", type=int, default=500)
    parser.add_argument("--concurrency", type=int, default=10)
    args = parser.parse_args(argv)
    configure_logging(level="warning", format="console")
    n = args.machines
    async with ControlPlane() as plane:
        await plane.install_crds(CRD_DIR)
        with tempfile.TemporaryDirectory() as tmp:
            write_reduced_crds(capi_crd_dir(), Path(tmp))
            await plane.install_crds(Path(tmp))
        admin = await KubeClient.connect(str(plane.kubeconfig))
        try:
            await admin.resource(NAMESPACE).create({"metadata": {"name": NAMESPACE_NAME}})
            raw = await measure_raw(admin, n, args.concurrency)
        finally:
            await admin.close()
        result = await run_machines(plane, n, args.concurrency)
    summary = {
        "benchmark": "machines_testdriver",
        **{k: (round(v, 3) if isinstance(v, float) else v) for k, v in result.items()},
        "raw_patches_per_s_sequential": round(raw["sequential"], 1),
        "raw_patches_per_s_concurrent": round(raw["concurrent"], 1),
        "ratio_machines_vs_raw_sequential": round(result["machines_per_s"] / raw["sequential"], 3),
        "ratio_machines_vs_raw_concurrent": round(result["machines_per_s"] / raw["concurrent"], 3),
        "ratio_lm_writes_vs_raw_concurrent": round(
            result["machines_per_s"] * result["api_writes_per_machine"] / raw["concurrent"], 3
        ),
        "concurrency": args.concurrency,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(summary, indent=2) + "\n")
    print(
        f"{n} machines Ready in {result['seconds_to_all_ready']:.1f} s: "
        f"{result['machines_per_s']:.1f} machines/s; create-to-Ready p50 "
        f"{result['create_to_ready_p50_s']:.2f} s, p99 {result['create_to_ready_p99_s']:.2f} s; "
        f"{result['api_writes_per_machine']:.2f} API writes/machine "
        f"(+{result['events_written_per_machine']:.2f} events), "
        f"{result['libvirt_calls_per_machine']:.1f} libvirt calls/machine; raw patches "
        f"{raw['sequential']:.0f}/s (one loop), {raw['concurrent']:.0f}/s "
        f"(x{args.concurrency}); ratio machines/s : raw "
        f"{summary['ratio_machines_vs_raw_sequential']}"
    )
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
