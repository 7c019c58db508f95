"""Benchmark: N LibvirtMachines (default 1,000) to Ready through the real `capl manager`
process, against the API server's raw rate for the same writes.

Set-up (bench/common.py): a control plane of its own with an audit log of the manager's and
the raw writer's requests; the libvirt test driver hosted by libvirtd (`test+unix:///default`);
one `capl manager` process (`--namespace` of this run, `--concurrency` workers, webhooks off);
a cluster whose network and pool the manager's LibvirtCluster controller creates; N bootstrap
Secrets and Machines made beforehand (not timed).

Measured:
- capl: the N LibvirtMachines created at once (32 creates in flight); machines/s = N / (first
  create -> last Ready, Ready as seen by a watch in this process); create-to-Ready p50/p99 per
  machine; the manager's API writes from the audit log (every create/patch/update/delete of
  its user until it went quiet after the last Ready: LibvirtMachine spec and status patches,
  Events, anything else), per machine and by resource; its CPU seconds and RSS.
- the limit, afterwards, on the same API server: exactly the manager's writes for those
  machines (each one's metadata/spec merge patch with its resourceVersion precondition, its
  status patch, its Event) replayed without capl on fresh copies of the objects, by one
  tight loop and by `concurrency` loops (bench/machines_testdriver.py's `raw_api_writes`).
- the ratio: capl's machines/s / the one-loop replay's machines/s, i.e. the time a tight
  loop needs for the same writes divided by capl's time (as bench/machines_testdriver.py and
  bench/runtime_toy.py define it). Target >= 0.7. The ratio against `concurrency` loops is
  reported beside it.

Writes bench/results/scaleout.json (with --steady, first bench/results/steady.json: see
bench/steady.py, measured on the same N Ready machines before the replay).

    .venv/bin/python bench/scaleout.py [--machines 1000] [--concurrency 10] [--steady 60]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import (
    MANAGER_USER,
    AuditWindow,
    Bed,
    BenchCluster,
    ProcStat,
    ScaleOut,
    cpu_seconds_of,
    metric_sum,
    note,
    parse_metrics,
    percentile,
    require_parts,
    write_result,
)
from capl.runtime.logging import configure_logging
from tests.fixtures.capl import CaplManager

MIB = 1024 * 1024


@dataclass
class Run:
    """One scale-out: the manager that did it (still running), its cluster and numbers."""

    n: int
    namespace: str
    manager: CaplManager
    cluster: BenchCluster
    scale: ScaleOut
    audit: AuditWindow
    started_offset: int
    """Audit-log offset right after the manager became ready (its start-up LISTs before)."""
    idle: ProcStat
    before: ProcStat
    after: ProcStat
    reconciles: dict[str, float]
    cpu: dict[str, float]
    """CPU seconds per process over the scale-out (manager, kube-apiserver, etcd, libvirtd,
    this benchmark)."""

    def numbers(self) -> dict[str, Any]:
        s = self.scale
        writes = self.audit.writes
        return {
            "machines": self.n,
            "seconds_create_phase": round(s.last_create - s.first_create, 3),
            "seconds_to_all_ready": round(s.seconds, 3),
            "machines_per_s": round(s.machines_per_s, 2),
            "create_to_ready_p50_s": round(percentile(s.latencies, 0.5), 3),
            "create_to_ready_p99_s": round(percentile(s.latencies, 0.99), 3),
            "create_to_ready_max_s": round(max(s.latencies), 3),
            "api_writes": writes,
            "api_writes_per_machine": round(writes / self.n, 3),
            "api_writes_per_machine_libvirtmachines": round(
                (
                    self.audit.writes_to("libvirtmachines")
                    + self.audit.writes_to("libvirtmachines/status")
                )
                / self.n,
                3,
            ),
            "api_writes_per_machine_events": round(self.audit.writes_to("events") / self.n, 3),
            "api_requests": self.audit.summary(),
            "reconciles_per_machine": {
                k: round(v / self.n, 3) for k, v in sorted(self.reconciles.items())
            },
            "manager_cpu_seconds": round(self.after.cpu_seconds - self.before.cpu_seconds, 2),
            "cpu_seconds_by_process": {k: round(v, 2) for k, v in self.cpu.items()},
            "manager_rss_idle_mb": round(self.idle.rss_bytes / MIB, 1),
            "manager_rss_after_mb": round(self.after.rss_bytes / MIB, 1),
            "manager_rss_peak_mb": round(self.after.peak_rss_bytes / MIB, 1),
        }


async def settle(bed: Bed, *, quiet: float = 3.0) -> int:
    """Wait until the manager made no API request but watches for `quiet` seconds (events
    flushed, no requeue in flight); returns the audit-log offset at that point."""
    deadline = time.monotonic() + 120
    last_size, last_change = bed.plane.audit_offset(), time.monotonic()
    while True:
        await asyncio.sleep(0.25)
        size = bed.plane.audit_offset()
        now = time.monotonic()
        if size != last_size:
            window = AuditWindow.read(bed.audit_log, user=MANAGER_USER, start=last_size)
            last_size = size
            if sum(n for verb, n in window.verbs.items() if verb != "watch"):
                last_change = now
        if now - last_change >= quiet:
            return size
        if now > deadline:
            note("the manager did not go quiet within 120 s; measuring anyway")
            return size


def reconcile_counts(metrics_text: str) -> dict[str, float]:
    samples = parse_metrics(metrics_text)
    return {
        controller: metric_sum(samples, "controller_runtime_reconcile_total", controller=controller)
        for controller in ("libvirtcluster", "libvirtmachine")
    }


async def scale_out(bed: Bed, n: int, *, concurrency: int = 10) -> Run:
    """A fresh namespace and manager; N machines to Ready; the manager keeps running."""
    namespace = await bed.namespace(f"scale{n}")
    manager = await bed.start_manager(namespace, concurrency=concurrency)
    assert manager.pid is not None
    started_offset = bed.plane.audit_offset()
    idle = ProcStat.read(manager.pid)
    cluster = await bed.cluster(namespace)
    offset = await settle(bed, quiet=1.0)
    counts_before = reconcile_counts(await manager.metrics())
    processes = bed.processes(manager)
    cpu_before = cpu_seconds_of(processes)
    before = ProcStat.read(manager.pid)
    note(f"{n} machines: creating (manager pid {manager.pid}, RSS {idle.rss_bytes / MIB:.0f} MB)")
    scale = await bed.machines(cluster, n)
    end = await settle(bed)
    after = ProcStat.read(manager.pid)
    cpu_after = cpu_seconds_of(processes)
    counts_after = reconcile_counts(await manager.metrics())
    audit = AuditWindow.read(bed.audit_log, user=MANAGER_USER, start=offset, end=end)
    run = Run(
        n=n,
        namespace=namespace,
        manager=manager,
        cluster=cluster,
        scale=scale,
        audit=audit,
        started_offset=started_offset,
        idle=idle,
        before=before,
        after=after,
        reconciles={k: counts_after[k] - counts_before.get(k, 0.0) for k in counts_after},
        cpu={k: cpu_after[k] - cpu_before[k] for k in cpu_after if k in cpu_before},
    )
    numbers = run.numbers()
    note(
        f"{n} machines Ready in {numbers['seconds_to_all_ready']:.1f} s "
        f"({numbers['machines_per_s']:.1f}/s), p50 {numbers['create_to_ready_p50_s']:.2f} s, "
        f"p99 {numbers['create_to_ready_p99_s']:.2f} s, "
        f"{numbers['api_writes_per_machine']:.2f} API writes/machine, "
        f"RSS {numbers['manager_rss_after_mb']:.0f} MB; CPU s: "
        + ", ".join(f"{k} {v:.1f}" for k, v in numbers["cpu_seconds_by_process"].items())
    )
    return run


async def finish(bed: Bed, run: Run) -> None:
    """Stop the run's manager and remove its machines from the test driver."""
    await run.manager.stop()
    started = time.monotonic()
    removed = await bed.sweep(run.cluster)
    note(f"removed {removed} domains of {run.namespace} in {time.monotonic() - started:.1f} s")


def result(run: Run, raw: dict[str, float], *, concurrency: int) -> dict[str, Any]:
    """scaleout.json: the run's numbers beside the raw replay of its writes."""
    numbers = run.numbers()
    per_machine = numbers["api_writes_per_machine"]
    return {
        **numbers,
        "mode": "capl manager process (test+unix:///default, --namespace, webhooks off)",
        "concurrency": concurrency,
        "raw_machines_per_s_sequential": round(raw["sequential"], 2),
        "raw_machines_per_s_concurrent": round(raw["concurrent"], 2),
        "raw_writes_per_s_sequential": round(raw["sequential"] * per_machine, 1),
        "raw_writes_per_s_concurrent": round(raw["concurrent"] * per_machine, 1),
        "manager_api_writes_per_s": round(numbers["machines_per_s"] * per_machine, 1),
        "ratio_to_apiserver": round(numbers["machines_per_s"] / raw["sequential"], 3),
        "ratio_to_apiserver_concurrent": round(numbers["machines_per_s"] / raw["concurrent"], 3),
        "ratio_definition": (
            "capl machines/s (first create to last Ready) / machines/s of a tight loop "
            "replaying the manager's writes for the same machines (spec patch with "
            "resourceVersion precondition, status patch, Event) on the same API server"
        ),
        "target_ratio": 0.7,
        "create_to_ready_s": [round(x, 3) for x in sorted(run.scale.latencies)],
    }


async def replay(bed: Bed, run: Run, *, concurrency: int) -> dict[str, float]:
    started = time.monotonic()
    raw = await bed.raw_replay(run.cluster, concurrency=concurrency)
    note(
        f"raw replay of the manager's writes: {raw['sequential']:.1f} machines/s (one loop), "
        f"{raw['concurrent']:.1f}/s (x{concurrency}), in {time.monotonic() - started:.0f} s"
    )
    return raw


async def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--machines", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument(
        "--steady", type=float, default=0.0, help="then measure the steady state for S seconds"
    )
    args = parser.parse_args(argv)
    configure_logging(level="warning", format="console")
    require_parts()
    from bench import steady

    with tempfile.TemporaryDirectory(prefix="capl-bench-") as tmp:
        async with Bed(workdir=Path(tmp)) as bed:
            run = await scale_out(bed, args.machines, concurrency=args.concurrency)
            if args.steady > 0:
                write_result("steady", await steady.measure(bed, run, seconds=args.steady))
            raw = await replay(bed, run, concurrency=args.concurrency)
            body = result(run, raw, concurrency=args.concurrency)
            write_result("scaleout", body)
            note(
                f"ratio to the API server {body['ratio_to_apiserver']} (target >= 0.7; "
                f"against x{args.concurrency} loops: {body['ratio_to_apiserver_concurrent']})"
            )
            await finish(bed, run)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
