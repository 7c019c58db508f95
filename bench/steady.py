"""Benchmark: the manager's steady state with N Ready machines (default 1,000, 60 s).

After a scale-out (bench/scaleout.py: the real `capl manager` process, N machines on the
libvirt test driver, all Ready) and once the manager went quiet, nothing changes for
`--seconds`. Measured over that window:

- CPU of the manager process, from /proc/<pid>/stat (utime + stime), in percent of one core
  (target < 2 %);
- its resident memory, /proc/<pid>/status VmRSS at the end of the window (target < 250 MB),
  and the peak (VmHWM) of its whole life;
- its API requests during the window, by verb, from the API server's audit log (the
  manager's own user): target zero LIST — `list_calls_after_start` counts every LIST from
  the moment the manager became ready (its informers' initial LISTs come before) to the end
  of the window, i.e. through the scale-out and the steady window; watches re-established
  by the informers (server-side watch timeouts) are reported separately;
- reconciles during the window per controller, from the manager's own Prometheus metrics
  (controller_runtime_reconcile_total). libvirt is called only from reconciles, so these
  count the manager's libvirt work: a settled LibvirtMachine costs no libvirt call, and the
  only periodic libvirt polling is the LibvirtCluster health check every
  `--cluster-health-interval` (60 s by default: about one cluster reconcile per window),
  with `--sync-period` (a full resync) off by default. The manager does not export a libvirt
  call counter; in-process benchmarks read `LibvirtHosts.calls` (bench/machines_testdriver.py).

Writes bench/results/steady.json (and the scale-out before it, with the raw replay of its
writes afterwards, to bench/results/scaleout.json).

    .venv/bin/python bench/steady.py [--machines 1000] [--seconds 60]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import Bed, require_parts, write_result
from bench.runs import finish, measure_steady, replay, result, scale_out
from capl.runtime.logging import configure_logging


async def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--machines", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--clusters", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument(
        "--profile", type=Path, help="py-spy the manager over the window (collapsed stacks)"
    )
    parser.add_argument(
        "--no-raw", action="store_true", help="skip the raw replay (no scaleout.json)"
    )
    args = parser.parse_args(argv)
    configure_logging(level="warning", format="console")
    require_parts()
    with tempfile.TemporaryDirectory(prefix="capl-bench-") as tmp:
        async with Bed(workdir=Path(tmp)) as bed:
            run = await scale_out(
                bed, args.machines, clusters=args.clusters, concurrency=args.concurrency
            )
            steady = await measure_steady(bed, run, seconds=args.seconds, profile=args.profile)
            write_result("steady", steady)
            if not args.no_raw:
                raw = await replay(bed, run, concurrency=args.concurrency)
                write_result("scaleout", result(run, raw, concurrency=args.concurrency))
            await finish(bed, run)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
