#!/usr/bin/env bash
# The body of `make bench` (not part of `make test`): brings up the test bed like
# hack/test.sh (control-plane binaries, libvirtd, guest image, Cluster API CRDs, the real
# node's binaries and image), runs every
# benchmark in bench/, then bench/report.py: bench/results/*.json, SVG plots,
# bench/results/summary.json and the results section of docs/benchmarks.md.
#
# Every benchmark measures its limit in the same run (docs/benchmarks.md). A failing benchmark
# does not stop the others; the report then names the missing figures and this script exits
# non-zero. Knobs (environment): CAPL_BENCH_LAYOUTS (scale-out, default 10x100,1x1000: the
# first is the headline, with the work floor), CAPL_BENCH_SIZES (default 100,1000,3000,10000),
# CAPL_BENCH_STEADY (seconds, default 60), CAPL_BENCH_REALVM_ROUNDS (default 2),
# CAPL_BENCH_MIGRATION_REPS (default 8), CAPL_BENCH_REALNODE_ROUNDS (default 3),
# CAPL_BENCH_BED_LOCK_WAIT (seconds, default 600).
#
# The migration benchmark runs on the multi-host bed (one per machine, shared with whoever
# runs tests/multihost): under `flock /tmp/capl-multihost.lock`, as every user of the bed
# does; it starts a bed when there is none and stops it afterwards only if it started it and
# no one else uses it (bench/migration_bed.py: the locks beside the bed's state directory).
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
nodes_up # the real-node benchmark's binaries and image (cached; `make test` builds them too)

PY=.venv/bin/python
bench_extra

# results of this run only: a figure missing from it must not be taken from an older run
mkdir -p bench/results
rm -f bench/results/*.json bench/results/*.png bench/results/*.svg

failed=()
walls=()
# bench NAME COMMAND...: run one benchmark; a failure is recorded, not fatal; its wall time
# goes to bench/results/timings.json (where `make bench`'s 30 minutes go)
bench() {
	local name="$1"; shift
	local t0=$SECONDS status=ok
	note "benchmark $name"
	if "$@"; then
		note "$name: $((SECONDS - t0)) s"
	else
		status=failed
		failed+=("$name")
		note "$name FAILED after $((SECONDS - t0)) s"
	fi
	walls+=("$name $((SECONDS - t0)) $status")
}

bench runtime_toy "$PY" bench/runtime_toy.py --objects 1000 --rounds 2
bench machines_testdriver "$PY" bench/machines_testdriver.py --machines 500
# scale-out: 10 clusters x 100 machines (traced, API-only replay, the work floor), then
# 1 x 1,000 on one network (reported beside it)
bench scaleout "$PY" bench/scaleout.py --layouts "${CAPL_BENCH_LAYOUTS:-10x100,1x1000}"
bench machines_realvm "$PY" bench/machines_realvm.py --vms 3 --rounds "${CAPL_BENCH_REALVM_ROUNDS:-2}"
bench migration flock -w "${CAPL_BENCH_BED_LOCK_WAIT:-600}" /tmp/capl-multihost.lock \
	"$PY" bench/migration.py --start-bed --reps "${CAPL_BENCH_MIGRATION_REPS:-8}"
# a real node through capl against a hand-run `kubeadm join`: three rounds of two TCG boots
# (about 5 minutes)
bench realnode "$PY" bench/realnode.py --rounds "${CAPL_BENCH_REALNODE_ROUNDS:-3}"

# last: the longest, so that a run cut short still has the others' figures
# the scaling curve in clusters of 100 to 10,000 (about 6 minutes on a quiet machine), the
# steady state on its largest size's Ready machines
bench scaling_curve "$PY" bench/scaling_curve.py --no-raw \
	--sizes "${CAPL_BENCH_SIZES:-100,1000,3000,10000}" --steady "${CAPL_BENCH_STEADY:-60}"

# the wall time of each benchmark and of the whole run (set-up included), with the load
printf '%s\n' "${walls[@]}" | "$PY" bench/timings.py "$((SECONDS - started))"
report=0
"$PY" bench/report.py --require scaleout,steady,realvm,scaling,migration,realnode || report=$?
note "make bench: $((SECONDS - started)) s"
if [ "${#failed[@]}" -gt 0 ] || [ "$report" -ne 0 ]; then
	die "failed: ${failed[*]:-}${failed[*]:+; }report exit status $report"
fi
