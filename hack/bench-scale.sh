#!/usr/bin/env bash
# The body of `make bench-scale`: the scaling curve up to 10,000 machines (in clusters of
# 100) and the steady window on the 10,000 Ready machines, then bench/report.py — the last
# benchmark of `make bench` on its own, to measure it again without the others. It replaces
# only scaling_curve.json and steady.json in bench/results/.
# Knobs: CAPL_BENCH_SCALE_SIZES (default 100,1000,3000,10000), CAPL_BENCH_STEADY (60).
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=hack/lib.sh
. "$HERE/lib.sh"
cd "$HERE/.."

started=$SECONDS
# the load before this run's own work (set-up and benchmarks): what marks its figures as
# measured under load (bench/report_floor.py), not the decay of its previous benchmark
CAPL_BENCH_RUN_LOADAVG="${CAPL_BENCH_RUN_LOADAVG:-$(cut -d' ' -f1-3 /proc/loadavg)}"
export CAPL_BENCH_RUN_LOADAVG
bed_up
PY=.venv/bin/python
bench_extra
mkdir -p bench/results
rm -f bench/results/scaling_curve.json bench/results/steady.json
status=0
"$PY" bench/scaling_curve.py --no-raw --sizes "${CAPL_BENCH_SCALE_SIZES:-100,1000,3000,10000}" \
	--steady "${CAPL_BENCH_STEADY:-60}" || status=$?
note "scaling curve: $((SECONDS - started)) s"
"$PY" bench/report.py --require scaling,steady || status=$?
note "make bench-scale: $((SECONDS - started)) s"
exit "$status"
