"""Benchmark: how time and memory grow with the number of machines (100 ... 10,000).

For each size, in one control plane (bench/common.py), a fresh namespace, a fresh
`capl manager` process and fresh clusters of `--per-cluster` machines (default 100: 10,000
machines are 100 clusters, as a cluster network holds at most a few hundred nodes) on the
libvirt test driver; N machines to Ready exactly as bench/scaleout.py does. Per size:
seconds from the first create to the last Ready, machines/s, create-to-Ready p50/p99, the
manager's CPU seconds (and ms per machine), its RSS when idle (informers synced, nothing to
do), after the N machines are Ready, and its peak; API writes per machine. Then a
least-squares line through (N, seconds) and (N, RSS) with its R², and the per-machine cost
at each size: both grow linearly when seconds/N and (RSS - idle)/N stay flat.

scaling_curve.json is rewritten after each size (a run cut short keeps the sizes it
measured). With --steady, the steady-state benchmark (bench/steady.py) is measured on the
largest size's Ready machines (and, with --steady-from N, on every size from N on, so that a
run cut short still has one) (10,000 in `make bench`): the curve's top point and the steady state
share that population. Unless --no-raw, the largest size's API-only replay is written as
scaleout.json (`make bench` passes --no-raw: bench/scaleout.py writes scaleout.json). Writes
bench/results/scaling_curve.json (and steady.json).

    .venv/bin/python bench/scaling_curve.py [--sizes 100,300,1000,3000,10000] \
        [--per-cluster 100] [--steady 60] [--no-raw]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import Bed, note, require_parts, write_result
from bench.runs import finish, measure_steady, replay, result, scale_out
from capl.runtime.logging import configure_logging


def linear_fit(xs: list[float], ys: list[float]) -> dict[str, float]:
    """Least-squares y = intercept + slope * x, and R²."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    slope = sxy / sxx if sxx else 0.0
    intercept = my - slope * mx
    ss_res = sum((y - intercept - slope * x) ** 2 for x, y in zip(xs, ys, strict=True))
    ss_tot = sum((y - my) ** 2 for y in ys)
    return {
        "intercept": round(intercept, 4),
        "slope": round(slope, 6),
        "r2": round(1 - ss_res / ss_tot, 4) if ss_tot else 1.0,
    }


def point(numbers: dict[str, Any]) -> dict[str, Any]:
    n = numbers["machines"]
    grown = numbers["manager_rss_after_mb"] - numbers["manager_rss_idle_mb"]
    return {
        key: numbers[key]
        for key in (
            "machines",
            "clusters",
            "seconds_to_all_ready",
            "machines_per_s",
            "create_to_ready_p50_s",
            "create_to_ready_p99_s",
            "api_writes_per_machine",
            "events_dropped_per_machine",
            "manager_cpu_seconds",
            "manager_cpu_ms_per_machine",
            "manager_rss_idle_mb",
            "manager_rss_after_mb",
            "manager_rss_peak_mb",
        )
    } | {
        "cpu_ms_per_machine_by_process": {
            k: round(1000 * v / n, 2) for k, v in numbers["cpu_seconds_by_process"].items()
        },
        "seconds_per_machine": round(numbers["seconds_to_all_ready"] / n, 5),
        "cpu_seconds_per_machine": round(numbers["manager_cpu_seconds"] / n, 5),
        "rss_growth_kb_per_machine": round(grown * 1024 / n, 2),
    }


def curve(points: list[dict[str, Any]]) -> dict[str, Any]:
    xs = [float(p["machines"]) for p in points]
    fits = {
        "seconds_to_all_ready": linear_fit(xs, [p["seconds_to_all_ready"] for p in points]),
        "manager_cpu_seconds": linear_fit(xs, [p["manager_cpu_seconds"] for p in points]),
        "manager_rss_after_mb": linear_fit(xs, [p["manager_rss_after_mb"] for p in points]),
    }
    first, last = points[0], points[-1]
    return {
        "fits": fits,
        # 1.0: the largest size costs per machine what the smallest does (linear growth)
        "per_machine_cost_ratio": round(
            last["seconds_per_machine"] / first["seconds_per_machine"], 3
        ),
        "seconds_per_machine_ratio_largest_to_smallest": round(
            last["seconds_per_machine"] / first["seconds_per_machine"], 3
        ),
        "cpu_per_machine_ratio_largest_to_smallest": round(
            last["cpu_seconds_per_machine"] / max(1e-9, first["cpu_seconds_per_machine"]), 3
        ),
    }


async def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100,300,1000,3000,10000")
    parser.add_argument("--per-cluster", type=int, default=100, help="machines per cluster")
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument(
        "--steady", type=float, default=0.0, help="steady-state window on the largest size (s)"
    )
    parser.add_argument(
        "--steady-from",
        type=int,
        default=10**9,
        help="also measure the steady state on every size from this one (the last one's stays)",
    )
    parser.add_argument(
        "--no-raw", action="store_true", help="skip the raw replay (no scaleout.json)"
    )
    args = parser.parse_args(argv)
    sizes = sorted({int(s) for s in args.sizes.split(",") if s.strip()})
    if len(sizes) < 2:
        parser.error("--sizes needs at least two sizes")
    configure_logging(level="warning", format="console")
    require_parts()
    points: list[dict[str, Any]] = []

    def save() -> dict[str, Any]:
        body = {
            "mode": "capl manager process per size (test+unix:///default, --namespace)",
            "machines_per_cluster": args.per_cluster,
            "concurrency": args.concurrency,
            "sizes_requested": sizes,
            "points": points,
            **(curve(points) if len(points) > 1 else {}),
        }
        write_result("scaling_curve", body)
        return body

    with tempfile.TemporaryDirectory(prefix="capl-bench-") as tmp:
        async with Bed(workdir=Path(tmp)) as bed:
            for n in sizes:
                clusters = max(1, -(-n // args.per_cluster))
                run = await scale_out(bed, n, clusters=clusters, concurrency=args.concurrency)
                points.append(point(run.numbers()))
                if len(points) > 1:
                    save()  # a run cut short keeps the sizes it measured
                if args.steady > 0 and (n == sizes[-1] or n >= args.steady_from):
                    write_result("steady", await measure_steady(bed, run, seconds=args.steady))
                if n == sizes[-1] and not args.no_raw:
                    raw = await replay(bed, run, concurrency=args.concurrency)
                    write_result("scaleout", result(run, raw, concurrency=args.concurrency))
                await finish(bed, run)
    body = save()
    for p in points:
        note(
            f"N={p['machines']}: {p['seconds_to_all_ready']:.1f} s "
            f"({p['seconds_per_machine'] * 1000:.1f} ms/machine), "
            f"RSS {p['manager_rss_after_mb']} MB "
            f"({p['rss_growth_kb_per_machine']} KB/machine over idle)"
        )
    fits = body["fits"]
    note(
        f"time: R² {fits['seconds_to_all_ready']['r2']}, per-machine ratio largest/smallest "
        f"{body['seconds_per_machine_ratio_largest_to_smallest']}; "
        f"RSS: R² {fits['manager_rss_after_mb']['r2']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
