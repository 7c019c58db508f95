"""A scale-out and its steady window, as the benchmarks bench/scaleout.py, bench/steady.py and
bench/scaling_curve.py run them (their docstrings say what is measured): the shared layer under
the three command lines, so that none of them imports another.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import (
    MANAGER_USER,
    AuditWindow,
    Bed,
    BenchCluster,
    ProcStat,
    ScaleOut,
    cpu_percent,
    cpu_seconds_of,
    metric_sum,
    note,
    parse_metrics,
    percentile,
)
from capl.testbed.caplmanager import CaplManager
from capl.testing.harness import gather_limited

MIB = 1024 * 1024


@dataclass
class Run:
    """One scale-out: the manager that did it (still running), its cluster and numbers."""

    n: int
    namespace: str
    manager: CaplManager
    clusters: list[BenchCluster]
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
    trace: TraceWindow | None = None
    """Where the manager's libvirt calls were recorded (bench/floor.py), when they were."""
    events_dropped: float = 0.0
    """Events the manager's recorder dropped over the scale-out (its queue full)."""

    @property
    def cluster(self) -> BenchCluster:
        return self.clusters[0]

    def numbers(self) -> dict[str, Any]:
        s = self.scale
        writes = self.audit.writes
        return {
            "machines": self.n,
            "clusters": len(self.clusters),
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
            "events_dropped_per_machine": round(self.events_dropped / self.n, 3),
            "api_requests": self.audit.summary(),
            "reconciles_per_machine": {
                k: round(v / self.n, 3) for k, v in sorted(self.reconciles.items())
            },
            "manager_cpu_seconds": round(self.after.cpu_seconds - self.before.cpu_seconds, 2),
            "manager_cpu_ms_per_machine": round(
                1000 * (self.after.cpu_seconds - self.before.cpu_seconds) / self.n, 2
            ),
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


def events_dropped(metrics_text: str) -> float:
    """Events the manager's recorder dropped so far because its queue was full
    (`capl_events_total{result="dropped"}`)."""
    return metric_sum(parse_metrics(metrics_text), "capl_events_total", result="dropped")


def reconcile_counts(metrics_text: str) -> dict[str, float]:
    samples = parse_metrics(metrics_text)
    return {
        controller: metric_sum(samples, "controller_runtime_reconcile_total", controller=controller)
        for controller in ("libvirtcluster", "libvirtmachine")
    }


@dataclass
class TraceWindow:
    """The manager's libvirt call trace: the file and the byte offsets of its phases."""

    path: Path
    start: int
    """Where the calls before the machines (the clusters' networks and pools) begin."""
    machines: int
    """Where the calls from the machines' creation begin."""
    end: int


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


async def scale_out(
    bed: Bed,
    n: int,
    *,
    clusters: int = 1,
    concurrency: int = 10,
    trace: Path | None = None,
    manager_env: Mapping[str, str] | None = None,
) -> Run:
    """A fresh namespace and manager; `clusters` clusters; N machines (spread evenly over
    them) to Ready; the manager keeps running. With `trace`, the manager records its libvirt
    calls there (``CAPL_LIBVIRT_TRACE``, for bench/floor.py); `manager_env` is added to its
    environment (e.g. an earlier commit's package on PYTHONPATH, bench/baseline.py)."""
    namespace = await bed.namespace(f"scale{n}")
    env = {"CAPL_LIBVIRT_TRACE": str(trace)} if trace is not None else {}
    extra = os.environ.get("CAPL_BENCH_MANAGER_ENV", "")  # K=V,K=V: e.g. to compare a knob
    env.update(dict(kv.split("=", 1) for kv in extra.split(",") if "=" in kv))
    env.update(manager_env or {})  # the run's own (an earlier package) over the knob
    trace_start = _size(trace) if trace is not None else 0
    manager = await bed.start_manager(namespace, concurrency=concurrency, env=env)
    assert manager.pid is not None
    started_offset = bed.plane.audit_offset()
    idle = ProcStat.read(manager.pid)
    made = await gather_limited(
        [bed.cluster(namespace, name=f"bench{i:03d}") for i in range(clusters)], limit=10
    )
    offset = await settle(bed, quiet=1.0)
    trace_machines = _size(trace) if trace is not None else 0
    metrics_before = await manager.metrics()
    counts_before = reconcile_counts(metrics_before)
    processes = bed.processes(manager)
    cpu_before = cpu_seconds_of(processes)
    before = ProcStat.read(manager.pid)
    note(
        f"{n} machines in {clusters} cluster(s): creating (manager pid {manager.pid}, "
        f"RSS {idle.rss_bytes / MIB:.0f} MB)"
    )
    scale = await bed.machines(made, n, within=max(900.0, n * 0.3))
    end = await settle(bed)
    after = ProcStat.read(manager.pid)
    cpu_after = cpu_seconds_of(processes)
    metrics_after = await manager.metrics()
    counts_after = reconcile_counts(metrics_after)
    audit = AuditWindow.read(bed.audit_log, user=MANAGER_USER, start=offset, end=end)
    window = None
    if trace is not None:
        window = TraceWindow(trace, trace_start, trace_machines, _size(trace))
    run = Run(
        n=n,
        namespace=namespace,
        manager=manager,
        clusters=list(made),
        scale=scale,
        audit=audit,
        started_offset=started_offset,
        idle=idle,
        before=before,
        after=after,
        reconciles={k: counts_after[k] - counts_before.get(k, 0.0) for k in counts_after},
        cpu={k: cpu_after[k] - cpu_before[k] for k in cpu_after if k in cpu_before},
        trace=window,
        events_dropped=events_dropped(metrics_after) - events_dropped(metrics_before),
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
    removed = 0
    for cluster in run.clusters:
        removed += await bed.sweep(cluster)
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


CLUSTER_HEALTH_INTERVAL = 60.0  # the manager's default, which these runs keep


@dataclass
class Drained:
    """How the manager reached its steady state after a scale-out (`wait_drained`)."""

    seconds: float
    """From the API going quiet to the work queues drained."""
    reconciles: dict[str, float]
    """Reconciles per controller meanwhile (the backlog a steady window must not see)."""
    drained: bool
    """False: the deadline passed first (the window is then measured anyway, and says so)."""


def _queue_state(text: str) -> tuple[float, float, float]:
    """(ready items in every work queue, busy workers, LibvirtMachine reconciles so far)."""
    samples = parse_metrics(text)
    return (
        metric_sum(samples, "workqueue_depth"),
        metric_sum(samples, "controller_runtime_active_workers"),
        metric_sum(samples, "controller_runtime_reconcile_total", controller="libvirtmachine"),
    )


async def wait_drained(
    manager: CaplManager, *, quiet: float = 10.0, deadline: float = 600.0
) -> Drained:
    """Until the manager's work queues hold no ready item, no worker is busy, and no
    LibvirtMachine was reconciled for `quiet` seconds (read from its Prometheus metrics each
    second), or `deadline` seconds passed. A scale-out leaves a backlog of no-op reconciles
    (each machine's own updates and its secondary objects' events queued behind the creates)
    that the API does not see; a steady window measured before it drained measures the
    backlog. The LibvirtCluster health checks are periodic by design: they are not waited
    for (delayed requeues are not in the queue depth)."""
    started = time.monotonic()
    first = reconcile_counts(await manager.metrics())
    last_count, last_change = -1.0, started
    drained = False
    while not drained:
        depth, busy, count = _queue_state(await manager.metrics())
        now = time.monotonic()
        if count != last_count or depth or busy:
            last_count, last_change = count, now
        drained = now - last_change >= quiet
        if drained:
            break
        if now - started > deadline:
            note(f"the work queues did not drain within {deadline:.0f} s; measuring anyway")
            break
        await asyncio.sleep(1.0)
    counts = reconcile_counts(await manager.metrics())
    return Drained(
        seconds=round(last_change - started, 1),
        reconciles={k: counts[k] - first.get(k, 0.0) for k in sorted(counts)},
        drained=drained,
    )


async def _profile(pid: int, seconds: float, out: Path) -> asyncio.subprocess.Process:
    """py-spy (the `dev` extra) sampling the manager for the window: collapsed stacks, GIL
    holder only (the process's Python work, not threads waiting in libvirt or epoll)."""
    spy = Path(sys.executable).parent / "py-spy"
    return await asyncio.create_subprocess_exec(
        str(spy), "record", "--pid", str(pid), "--duration", str(int(seconds)),
        "--rate", "50", "--nonblocking", "--gil", "--format", "raw", "--output", str(out),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip


async def measure_steady(
    bed: Bed, run: Run, *, seconds: float, profile: Path | None = None
) -> dict[str, Any]:
    """The steady window on a finished scale-out (its manager still running), from the
    moment its API requests stopped and its work queues drained (`wait_drained`)."""
    manager = run.manager
    assert manager.pid is not None
    await settle(bed)
    drained = await wait_drained(manager, deadline=max(300.0, run.n * 0.1))
    note(
        f"work queues drained {drained.seconds:.0f} s after the API went quiet "
        f"(reconciles meanwhile: {drained.reconciles})"
    )
    start = await settle(bed)
    counts_before = reconcile_counts(await manager.metrics())
    before = ProcStat.read(manager.pid)
    note(f"steady state: {run.n} Ready machines, measuring for {seconds:.0f} s")
    spy = await _profile(manager.pid, seconds, profile) if profile is not None else None
    await asyncio.sleep(seconds)  # the window itself: nothing to wait for, by definition
    after = ProcStat.read(manager.pid)
    end = bed.plane.audit_offset()
    counts_after = reconcile_counts(await manager.metrics())
    if spy is not None:
        await spy.wait()
    window = AuditWindow.read(bed.audit_log, user=MANAGER_USER, start=start, end=end)
    since_ready = AuditWindow.read(
        bed.audit_log, user=MANAGER_USER, start=run.started_offset, end=end
    )
    body = {
        "machines": run.n,
        "seconds": round(after.at - before.at, 2),
        "cpu_percent_of_core": round(cpu_percent(before, after), 3),
        "cpu_seconds": round(after.cpu_seconds - before.cpu_seconds, 3),
        "rss_mb": round(after.rss_bytes / MIB, 1),
        "rss_peak_mb": round(after.peak_rss_bytes / MIB, 1),
        "api_requests_in_window": sum(window.verbs.values()),
        "api_requests_in_window_by_verb": dict(sorted(window.verbs.items())),
        "list_calls_in_window": window.verbs.get("list", 0),
        "list_calls_after_start": since_ready.verbs.get("list", 0),
        "watch_calls_in_window": window.verbs.get("watch", 0),
        "api_writes_in_window": window.writes,
        "reconciles_in_window": {
            k: counts_after[k] - counts_before.get(k, 0.0) for k in sorted(counts_after)
        },
        "drain_seconds_before_window": drained.seconds,
        "drained_before_window": drained.drained,
        "reconciles_while_draining": drained.reconciles,
        "cluster_health_interval_s": CLUSTER_HEALTH_INTERVAL,
        "sync_period": "off",
        "clusters": len(run.clusters),
        "targets": {"cpu_percent_of_core": "< 2", "rss_mb": "< 400", "list_calls": "0"},
    }
    note(
        f"steady: CPU {body['cpu_percent_of_core']:.2f} % of a core, RSS {body['rss_mb']:.0f} MB, "
        f"{body['api_requests_in_window']} API requests ({body['list_calls_in_window']} LIST), "
        f"reconciles {body['reconciles_in_window']}"
    )
    return body
