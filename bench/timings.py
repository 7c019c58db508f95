"""Where `make bench`'s time goes: hack/bench.sh pipes one line per benchmark
(`NAME SECONDS ok|failed`) and passes the whole run's seconds (set-up included); writes
bench/results/timings.json (with the load average at the end) and prints the table.

    printf 'runtime_toy 50 ok\\n' | .venv/bin/python bench/timings.py TOTAL_SECONDS
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "timings.json"
BUDGET_SECONDS = 1800  # `make bench` stays under 30 minutes (docs/benchmarks.md)


def main(argv: list[str]) -> int:
    total = int(argv[0])
    walls: dict[str, dict[str, object]] = {}
    for line in sys.stdin:
        if line.strip():
            name, seconds, status = line.split()
            walls[name] = {"seconds": int(seconds), "status": status}
    body = {
        "benchmark": "timings",
        "total_seconds": total,
        "budget_seconds": BUDGET_SECONDS,
        "within_budget": total <= BUDGET_SECONDS,
        "benchmarks": walls,
        "loadavg_at_end": [round(x, 2) for x in os.getloadavg()],
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(body, indent=2) + "\n")
    for name, wall in walls.items():
        print(f"  {name:20} {wall['seconds']:6d} s  {wall['status']}")
    print(f"  {'total':20} {total:6d} s  (budget {BUDGET_SECONDS} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
