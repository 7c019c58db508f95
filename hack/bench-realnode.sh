#!/usr/bin/env bash
# The body of `make bench-realnode`: `make bench`'s real-node benchmark on its own (a round
# boots two real Kubernetes nodes under TCG one after the other): a real node through capl
# (a MachineDeployment scaled 0 -> 1) against a hand-run `kubeadm join` of the same node
# image (bench/realnode.py), then bench/report.py. It replaces only realnode.json (and its
# plot) in bench/results/. Knob: CAPL_BENCH_REALNODE_ROUNDS (default 3: TCG boots vary by
# a sixth between rounds, and the median of two straddled the target on 2026-12-04).
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
nodes_up
PY=.venv/bin/python
bench_extra
mkdir -p bench/results
rm -f bench/results/realnode.json
status=0
"$PY" bench/realnode.py --rounds "${CAPL_BENCH_REALNODE_ROUNDS:-3}" || status=$?
note "realnode: $((SECONDS - started)) s"
"$PY" bench/report.py --require realnode || status=$?
note "make bench-realnode: $((SECONDS - started)) s"
exit "$status"
