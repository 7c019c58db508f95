"""Benchmark: 1,000 LibvirtMachines to Ready through the real `capl manager` process, as 10
clusters x 100 machines (the headline) and on one network (1 x 1,000, reported beside it),
against the work floor: the same libvirt calls and API writes by a tight script.

Set-up (bench/common.py): a control plane of its own with an audit log of the manager's and
the raw writer's requests; the libvirt test driver hosted by libvirtd (`test+unix:///default`);
per layout one `capl manager` process (`--namespace` of the run, `--concurrency` workers,
webhooks off); the clusters, whose networks and pools the manager's LibvirtCluster controller
creates; N bootstrap Secrets and Machines made beforehand (not timed).

Measured, per layout:
- capl: the N LibvirtMachines created at once (32 creates in flight); machines/s = N / (first
  create -> last Ready, Ready as seen by a watch in this process); create-to-Ready p50/p99;
  the manager's API writes from the audit log (per machine and by resource); its CPU from
  /proc/<pid>/stat over the scale-out (ms per machine) and RSS; the CPU of kube-apiserver,
  etcd, libvirtd and this process meanwhile.
- the API-only limit, afterwards, on the same API server: exactly the manager's writes for
  those machines replayed on fresh copies by one tight loop and by `concurrency` loops
  (`ratio_to_apiserver`, as issue 9 measured it).
- headline layout only: the work floor (bench/floor.py, bench/floor_run.py): the manager
  records every libvirt call it makes (CAPL_LIBVIRT_TRACE); after the run, with the manager
  stopped and its machines removed from libvirt, a tight script replays those calls and the
  manager's API writes per machine, by one loop and by `concurrency` loops.
  `ratio_to_floor` = capl machines/s / the floor's machines/s (one loop), and against
  `concurrency` loops beside it; libvirt calls per machine = every libvirt call the manager
  made between the first create and the moment it went quiet, / N.
- headline layout only, afterwards: the same layout scaled out by the manager of the commit
  issue 9 measured (`--baseline`, default 31af542) and by this checkout's, both untraced, twice
  each, alternating (bench/baseline.py): `baseline.manager_cpu_ratio`, the manager's own cost
  per machine against issue 9's in the same run (issue 16: <= 0.5).

Writes bench/results/scaleout.json and floor.json (with --steady, steady.json first, measured
on the headline layout's Ready machines).

    .venv/bin/python bench/scaleout.py [--layouts 10x100,1x1000] [--concurrency 10]
        [--baseline REF|'']
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.baseline import ISSUE9_REF, BaselineMissing, compare
from bench.common import Bed, note, require_parts, write_result
from bench.floor import read_trace
from bench.floor_run import measure_floor
from bench.runs import Run, finish, measure_steady, replay, result, scale_out
from capl.runtime.logging import configure_logging

TARGETS = {
    "manager_cpu_ms_per_machine": 7.0,
    "libvirt_calls_per_machine": 15.0,
    "api_writes_per_machine": 3.0,
}


def parse_layout(text: str) -> tuple[int, int]:
    clusters, per = text.lower().split("x")
    return int(clusters), int(per)


def own_cost(run: Run, body: dict[str, Any]) -> dict[str, Any]:
    """The manager's own cost per machine with its targets (issue 16)."""
    out: dict[str, Any] = {}
    if run.trace is not None:
        calls = read_trace(run.trace.path, run.trace.machines, run.trace.end)
        out["libvirt_calls_per_machine"] = round(len(calls.calls) / run.n, 2)
        out["libvirt_calls_by_method"] = calls.by_method()
        out["trace_cpu_ms_per_machine"] = round(1000 * calls.trace_cpu_seconds / run.n, 3)
        out["manager_cpu_ms_per_machine_without_trace"] = round(
            body["manager_cpu_ms_per_machine"] - out["trace_cpu_ms_per_machine"], 2
        )
    figures = {**body, **out}
    out["targets"] = {k: f"<= {v:g}" for k, v in TARGETS.items()}
    out["targets_met"] = {
        k: figures[k] <= v for k, v in TARGETS.items() if isinstance(figures.get(k), int | float)
    }
    return out


async def _baseline(
    bed: Bed, clusters: int, per: int, concurrency: int, ref: str, tmp: str
) -> dict[str, Any]:
    """The same-run comparison with an earlier manager (bench/baseline.py)."""
    try:
        return await compare(
            bed, clusters=clusters, per=per, concurrency=concurrency, ref=ref, workdir=Path(tmp)
        )
    except BaselineMissing as exc:
        note(f"no same-run comparison with {ref}: {exc}")
        return {"ref": ref, "missing": str(exc)}


async def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layouts", default="10x100,1x1000", help="CLUSTERSxMACHINES,...")
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--steady", type=float, default=0.0, help="steady window (s)")
    parser.add_argument("--no-floor", action="store_true")
    parser.add_argument(
        "--baseline",
        default=ISSUE9_REF,
        help="commit whose manager the headline layout is compared with ('' to skip)",
    )
    args = parser.parse_args(argv)
    layouts = [parse_layout(x) for x in args.layouts.split(",") if x.strip()]
    configure_logging(level="warning", format="console")
    require_parts()
    c = args.concurrency
    with tempfile.TemporaryDirectory(prefix="capl-bench-") as tmp:
        async with Bed(workdir=Path(tmp)) as bed:
            bodies = []
            for index, (k, per) in enumerate(layouts):
                headline = index == 0
                trace = Path(tmp) / f"trace-{k}x{per}.jsonl"
                run = await scale_out(bed, k * per, clusters=k, concurrency=c, trace=trace)
                if headline and args.steady > 0:
                    write_result("steady", await measure_steady(bed, run, seconds=args.steady))
                raw = await replay(bed, run, concurrency=c)
                body = result(run, raw, concurrency=c)
                body |= own_cost(run, body)
                if headline and not args.no_floor:
                    floor = await measure_floor(bed, run, concurrency=c)
                    write_result("floor", floor)
                    body["floor_machines_per_s_sequential"] = floor["sequential"]["machines_per_s"]
                    body["floor_machines_per_s_concurrent"] = floor["concurrent"]["machines_per_s"]
                    body["ratio_to_floor"] = round(
                        body["machines_per_s"] / floor["sequential"]["machines_per_s"], 3
                    )
                    body["ratio_to_floor_concurrent"] = round(
                        body["machines_per_s"] / floor["concurrent"]["machines_per_s"], 3
                    )
                    note(
                        f"ratio to the floor {body['ratio_to_floor']} (against x{c} loops: "
                        f"{body['ratio_to_floor_concurrent']}); to the API-only replay "
                        f"{body['ratio_to_apiserver']}"
                    )
                bodies.append(body)
                await finish(bed, run)
                if headline and args.baseline:
                    body["baseline"] = await _baseline(bed, k, per, c, args.baseline, tmp)
    head, others = bodies[0], bodies[1:]
    write_result("scaleout", {**head, "other_layouts": others})
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
