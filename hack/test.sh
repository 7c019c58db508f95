#!/usr/bin/env bash
# The body of `make test`: brings up every part of the test bed (each step idempotent and
# cached), then runs the suite stage by stage so a failure says which layer broke.
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

PYTEST=(.venv/bin/pytest -p no:cacheprovider)
# CAPL_TEST_STAGES narrows the run to some stages (e.g. "controllers chaos") when iterating.
for stage in ${CAPL_TEST_STAGES:-unit virt kube controllers chaos libvirtd security e2e multihost nodes}; do
	# a stage with no test files yet is skipped (pytest would exit 5, "no tests collected")
	compgen -G "tests/$stage/test_*.py" >/dev/null || continue
	run=("${PYTEST[@]}")
	# the multihost bed has fixed names (one per machine): runs that use it take turns
	[ "$stage" = multihost ] && run=(flock /tmp/capl-multihost.lock "${run[@]}")
	timed "tests/$stage" "${run[@]}" "tests/$stage" ${PYTEST_ARGS:-}
done
note "make test: $((SECONDS - stage_start)) s"
