#!/usr/bin/env bash
# The body of `make test`: brings up every part of the test bed (each step idempotent and
# cached), then runs the suite stage by stage so a failure says which layer broke.
#
# Stages run in phases; inside a phase two lanes run side by side, each a pytest process per
# stage with its own session control plane and temporary directory. The pairing keeps
# apart what stages share on this machine:
# - chaos restarts the system libvirtd (and with it the shared test driver): it runs alone;
# - the multihost stage checks that the root namespace's libvirtd was never restarted and
#   that /etc/libvirt holds nothing but `capl-` objects of other stages: it runs beside e2e,
#   which names everything `capl-`, never beside chaos;
# - the shared test driver (test+unix:///default) is used by one lane at a time;
# - stages beside each other on the system libvirtd (libvirtd and nodes; e2e) only look at
#   what they made themselves (random CIDRs, names of their own);
# - the lanes are balanced by measured stage times (2026-12-03, quiet: the light stages plus
#   libvirtd ~17 min beside nodes ~15 min; e2e ~12 min beside multihost ~7 min).
# CAPL_TEST_STAGES="a b" runs just those stages, one after another (when iterating);
# CAPL_TEST_SERIAL=1 runs every stage one after another.
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=hack/lib.sh
. "$HERE/lib.sh"
cd "$HERE/.."

stage_start=$SECONDS
bed_up
nodes_up
# The clusterctl local repository the e2e tests install capl from (out/infrastructure-libvirt).
timed release-manifests hack/release-manifests.sh >/dev/null
# Every fixture must find its part: a missing part fails the run instead of skipping tests.
export CAPL_REQUIRE_ALL=1
note "set-up: $((SECONDS - stage_start)) s"

ALL_STAGES="unit virt kube controllers chaos libvirtd security e2e multihost nodes"
PHASES=(
	"unit virt kube controllers security libvirtd | nodes"
	"chaos"
	"e2e | multihost"
)
LOGS="$(mktemp -d /tmp/capl-test.XXXXXX)"
PRINT_LOCK="$LOGS/print.lock"

# run_stage STAGE: one pytest process; its output is kept and printed in one piece when the
# stage ends (two lanes never interleave their lines). Returns pytest's status.
run_stage() {
	local stage="$1" t0=$SECONDS status=0
	# a stage with no test files yet is skipped (pytest would exit 5, "no tests collected")
	compgen -G "tests/$stage/test_*.py" >/dev/null || return 0
	local run=(.venv/bin/pytest -p no:cacheprovider --basetemp="$LOGS/$stage")
	# the multihost bed has fixed names (one per machine): runs that use it take turns
	[ "$stage" = multihost ] && run=(flock /tmp/capl-multihost.lock "${run[@]}")
	note "tests/$stage: started"
	# shellcheck disable=SC2086 # PYTEST_ARGS is a list of words
	"${run[@]}" "tests/$stage" ${PYTEST_ARGS:-} >"$LOGS/$stage.log" 2>&1 || status=$?
	{
		flock 9
		cat "$LOGS/$stage.log"
		note "tests/$stage: $((SECONDS - t0)) s$([ "$status" -eq 0 ] || echo " (FAILED, exit $status)")"
	} 9>"$PRINT_LOCK"
	return "$status"
}

# run_lane STAGE...: the stages one after another, each whatever the one before did (a red
# run still tells every stage's result); fails when one failed.
run_lane() {
	local stage status=0
	for stage in "$@"; do
		run_stage "$stage" || status=1
	done
	return "$status"
}

failed=0
if [ -n "${CAPL_TEST_STAGES:-}" ] || [ -n "${CAPL_TEST_SERIAL:-}" ]; then
	# shellcheck disable=SC2086 # a list of words
	run_lane ${CAPL_TEST_STAGES:-$ALL_STAGES} || failed=1
else
	for phase in "${PHASES[@]}"; do
		pids=()
		IFS='|' read -r -a lanes <<<"$phase"
		for lane in "${lanes[@]}"; do
			# shellcheck disable=SC2086 # a list of words
			run_lane $lane &
			pids+=($!)
		done
		# a failed lane does not stop the others: every phase runs, the verdict comes at the end
		for pid in "${pids[@]}"; do
			wait "$pid" || failed=1
		done
	done
fi
note "make test: $((SECONDS - stage_start)) s"
[ "$failed" -eq 0 ] || die "a test stage failed (its output is above; logs in $LOGS)"
rm -rf "$LOGS"
