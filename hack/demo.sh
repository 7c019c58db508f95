#!/usr/bin/env bash
# The body of `make demo`: the same set-up as `make test` (each step idempotent and cached:
# control-plane binaries, Cluster API, libvirtd, the test guest image), then `capl demo` on
# the local libvirtd with real TCG guests. Ctrl-C in the live view removes everything.
#
# Extra arguments for `capl demo` come from the command line of this script or from
# DEMO_ARGS (`make demo DEMO_ARGS="--machines 5"`); see `.venv/bin/capl demo --help`.
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=hack/lib.sh
. "$HERE/lib.sh"
cd "$HERE/.."

[ -x .venv/bin/capl ] || die ".venv/bin/capl is missing: run \`make demo\` (it creates .venv) or \`make venv\`"

t0=$SECONDS
step() {
	local name="$1"; shift
	local t=$SECONDS out
	note "$name"
	out="$("$@" | tail -n1)" || die "$name failed (see the messages above)"
	note "$name: $((SECONDS - t)) s"
	printf '%s' "$out"
}

KUBEBUILDER_ASSETS="$(step "control-plane binaries (make envtest; a cold build takes ~6 min)" hack/envtest.sh)"
export KUBEBUILDER_ASSETS
CAPL_CAPI_DIR="$(step "Cluster API core manager (make capi; a cold build takes ~4 min)" hack/capi.sh)"
export CAPL_CAPI_DIR
step "libvirtd and virtlogd (make libvirt-host)" hack/libvirt-host.sh >/dev/null
CAPL_GUEST_IMAGE="$(step "the test guest image (make guest-image)" hack/guest-image.sh)"
export CAPL_GUEST_IMAGE
note "set-up: $((SECONDS - t0)) s; starting the demo"

# shellcheck disable=SC2086 # DEMO_ARGS is a list of words on purpose
exec .venv/bin/capl demo --libvirt-uri "${DEMO_LIBVIRT_URI:-qemu:///system}" \
	--image "$CAPL_GUEST_IMAGE" --domain-type qemu ${DEMO_ARGS:-} "$@"
