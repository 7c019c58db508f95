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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import Bed, note, require_parts, write_result
from bench.runs import finish, measure_steady, replay, result, scale_out
from capl.runtime.logging import configure_logging


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

    with tempfile.TemporaryDirectory(prefix="capl-bench-") as tmp:
        async with Bed(workdir=Path(tmp)) as bed:
            run = await scale_out(bed, args.machines, concurrency=args.concurrency)
            if args.steady > 0:
                write_result("steady", await measure_steady(bed, run, seconds=args.steady))
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
