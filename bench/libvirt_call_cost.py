"""What libvirt's event loop adds to the CPU of an RPC call, in this process.

The manager registers libvirt's default event loop and runs it on a thread of its own
(`capl.virt.events`): domain lifecycle events, close callbacks and keepalive need it. With a
loop registered, every connection's socket is watched by it, and libvirt's RPC client stops
and restarts that watch around each call it makes itself, which wakes the loop's thread (and
keepalive re-arms its timer on every answer). A process that registers no loop (bench/floor.py's
replay) pays none of that. This measures the difference on the same calls, in one process
each (a loop cannot be unregistered): `calls` cheap calls (`getVersion`) on `test+unix:///default`
from one thread, process CPU (all threads) per call, and the voluntary context switches of the
loop's thread.

    .venv/bin/python bench/libvirt_call_cost.py [--calls 3000]

Not part of `make bench` (a few seconds; docs/benchmarks.md, Profile, cites its output).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

URI = "test+unix:///default"
MODES = ("no-loop", "loop", "loop+keepalive")


def _switches(tid: int) -> int:
    for row in Path(f"/proc/self/task/{tid}/status").read_text().splitlines():
        if row.startswith("voluntary_ctxt_switches"):
            return int(row.split(":")[1])
    return 0


def measure(mode: str, calls: int) -> dict[str, float]:
    """One mode, in this process (see the module docstring)."""
    import libvirt

    loop_tid = 0
    if mode != "no-loop":
        libvirt.virEventRegisterDefaultImpl()
        started = threading.Event()

        def run() -> None:
            nonlocal loop_tid
            loop_tid = threading.get_native_id()
            started.set()
            while True:
                libvirt.virEventRunDefaultImpl()

        threading.Thread(target=run, daemon=True).start()
        started.wait(10)
    conn = libvirt.open(URI)
    if mode == "loop+keepalive":
        conn.setKeepAlive(5, 3)
    for _ in range(100):  # warm up
        conn.getVersion()
    before = _switches(loop_tid) if loop_tid else 0
    cpu = time.process_time()
    for _ in range(calls):
        conn.getVersion()
    cpu = time.process_time() - cpu
    after = _switches(loop_tid) if loop_tid else 0
    return {
        "cpu_us_per_call": round(1e6 * cpu / calls, 1),
        "loop_thread_wakeups_per_call": round((after - before) / calls, 2),
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.mode:
        print(json.dumps(measure(args.mode, args.calls)))
        return 0
    results = {}
    for mode in MODES:
        done = subprocess.run(
            [sys.executable, __file__, "--mode", mode, "--calls", str(args.calls)],
            check=True,
            capture_output=True,
            text=True,
        )
        results[mode] = json.loads(done.stdout)
    base = results["no-loop"]["cpu_us_per_call"]
    for mode, figures in results.items():
        ratio = figures["cpu_us_per_call"] / base if base else float("nan")
        print(
            f"{mode:15s} {figures['cpu_us_per_call']:6.1f} µs CPU per call ({ratio:.2f} x), "
            f"{figures['loop_thread_wakeups_per_call']:.2f} wake-ups of the loop's thread"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
