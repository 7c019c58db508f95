"""Benchmark: toy controller reconciles/s vs. raw status patches/s on the same API server.

Starts its own etcd + kube-apiserver (capl.testbed.ControlPlane, binaries from
$KUBEBUILDER_ASSETS), installs a Toy CRD with a status subresource and creates N objects. Then,
for each round:
  raw   - one tight async loop sends one status merge patch per object, sequentially
          (and, for reference, the same patches from `concurrency` loops in parallel);
  toy   - a fresh Manager with the toy controller (`concurrency` workers) lists the objects and
          drives every one to its status value: exactly one status patch per object, plus the
          runtime around it (informer list+watch, queue, predicates, diff, metrics, logs).
Rates are objects per second; the headline ratio is toy / raw (sequential loop), target >= 0.8.
Writes bench/results/runtime.json.

    .venv/bin/python bench/runtime_toy.py [--objects 1000] [--rounds 3] [--concurrency 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from capl.kube import KubeClient
from capl.runtime.informer import FuncHandler
from capl.runtime.logging import configure_logging
from capl.runtime.manager import Manager, ManagerOptions
from capl.runtime.objects import ObjectKey
from capl.runtime.resources import NAMESPACE
from capl.testbed import ControlPlane
from capl.testing.toy import TOY, ToyReconciler, ensure_toy_crd, toy

RESULTS = Path(__file__).resolve().parent / "results" / "runtime.json"


async def raw_sequential(client: KubeClient, keys: list[ObjectKey], value: int) -> float:
    toys = client.resource(TOY)
    started = time.perf_counter()
    for key in keys:
        await toys.patch_status(key, {"status": {"observed": value}})
    return len(keys) / (time.perf_counter() - started)


async def raw_concurrent(
    client: KubeClient, keys: list[ObjectKey], value: int, concurrency: int
) -> float:
    toys = client.resource(TOY)
    it = iter(keys)

    async def loop() -> None:
        for key in it:
            await toys.patch_status(key, {"status": {"observed": value}})

    started = time.perf_counter()
    await asyncio.gather(*(loop() for _ in range(concurrency)))
    return len(keys) / (time.perf_counter() - started)


async def toy_round(client: KubeClient, namespace: str, n: int, concurrency: int) -> dict[str, Any]:
    client.stats.reset()
    manager = Manager(
        ManagerOptions(
            namespace=namespace,
            concurrency=concurrency,
            metrics_bind_address="0",
            health_probe_bind_address="0",
            handle_signals=False,
        ),
        client,
    )
    reconciler = ToyReconciler(manager.cache, client)
    controller = manager.add_controller("toy", for_=TOY, reconciler=reconciler)
    informer = manager.cache.informer(TOY)
    done = asyncio.Event()
    remaining = {"n": n}

    def check(obj: dict[str, Any]) -> None:
        if (obj.get("status") or {}).get("observed") == obj["spec"]["value"]:
            remaining["n"] -= 1
            if remaining["n"] == 0:
                done.set()

    informer.add_handler(FuncHandler(update=lambda old, new: check(new)))
    started = time.perf_counter()
    run = asyncio.create_task(manager.run())
    await asyncio.wait_for(done.wait(), timeout=600)
    elapsed = time.perf_counter() - started
    first = min(s for s, _ in reconciler.intervals)
    last = max(e for _, e in reconciler.intervals)
    manager.stop()
    await run
    assert controller.reconciles == n, controller.reconciles
    return {
        "rate": n / elapsed,
        "reconcile_phase_rate": n / (last - first),
        "seconds": elapsed,
        "writes": client.stats.writes_total(),
        "reconciles": controller.reconciles,
    }


async def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=10)
    args = parser.parse_args(argv)
    configure_logging(level="warning", format="console")
    n = args.objects
    async with ControlPlane() as plane:
        client = await KubeClient.connect(str(plane.kubeconfig), track_objects=False)
        try:
            await ensure_toy_crd(client)
            namespace = "bench"
            await client.resource(NAMESPACE).create({"metadata": {"name": namespace}})
            toys = client.resource(TOY)
            sem = asyncio.Semaphore(16)

            async def create(i: int) -> None:
                async with sem:
                    await toys.create(toy(f"toy-{i:05d}", namespace, i))

            await asyncio.gather(*(create(i) for i in range(n)))
            keys = [ObjectKey(namespace, f"toy-{i:05d}") for i in range(n)]
            await raw_sequential(client, keys, -1)  # warm-up: connections, etcd, caches
            rounds = []
            for r in range(args.rounds):
                conc = await raw_concurrent(client, keys, -100 - r, args.concurrency)
                seq = await raw_sequential(client, keys, -200 - r)  # leaves work for the toy
                result = await toy_round(client, namespace, n, args.concurrency)
                result.update(raw_sequential=seq, raw_concurrent=conc)
                rounds.append(result)
                print(
                    f"round {r + 1}: toy {result['rate']:.0f}/s "
                    f"(reconcile phase {result['reconcile_phase_rate']:.0f}/s, "
                    f"{result['writes']} writes), raw sequential {seq:.0f}/s, "
                    f"raw x{args.concurrency} {conc:.0f}/s"
                )
        finally:
            await client.close()
    toy_rate = statistics.median(r["rate"] for r in rounds)
    seq_rate = statistics.median(r["raw_sequential"] for r in rounds)
    conc_rate = statistics.median(r["raw_concurrent"] for r in rounds)
    summary = {
        "benchmark": "runtime_toy",
        "objects": n,
        "rounds": args.rounds,
        "concurrency": args.concurrency,
        "toy_reconciles_per_s": round(toy_rate, 1),
        "raw_status_patches_per_s_sequential": round(seq_rate, 1),
        "raw_status_patches_per_s_concurrent": round(conc_rate, 1),
        "ratio_toy_vs_raw_sequential": round(toy_rate / seq_rate, 3),
        "ratio_toy_vs_raw_concurrent": round(toy_rate / conc_rate, 3),
        "writes_per_object": rounds[-1]["writes"] / n,
        "per_round": rounds,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(summary, indent=2) + "\n")
    print(
        f"toy {toy_rate:.0f} reconciles/s vs raw {seq_rate:.0f} patches/s (one loop): "
        f"ratio {toy_rate / seq_rate:.2f} (target >= 0.8); vs raw x{args.concurrency} "
        f"{conc_rate:.0f}/s: ratio {toy_rate / conc_rate:.2f}"
    )
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
