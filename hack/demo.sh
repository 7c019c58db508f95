#!/usr/bin/env bash
# The body of `make demo`: the same set-up as `make test` (each step idempotent and cached:
# control-plane binaries, Cluster API with its kubeadm providers, libvirtd, the test guest
# image, the node binaries and the node image), then `capl demo` on the local libvirtd: real
# Kubernetes nodes in TCG guests (`--vm-only`: VMs of the test guest, which `capl demo`
# finds through CAPL_GUEST_IMAGE). Ctrl-C in the live view removes everything.
#
# Extra arguments for `capl demo` come from the command line of this script or from
# DEMO_ARGS (`make demo DEMO_ARGS="--vm-only --machines 5"`); see `.venv/bin/capl demo --help`.
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
CAPL_NODE_BIN="$(step "node binaries (make node-bin; a cold build takes ~4.5 min after make envtest)" hack/node-bin.sh)"
export CAPL_NODE_BIN
CAPL_NODE_IMAGE="$(step "the node image (make node-image; a cold build takes ~2.5 min)" hack/node-image.sh)"
export CAPL_NODE_IMAGE
note "set-up: $((SECONDS - t0)) s; starting the demo"

# The node image is for the default mode; --vm-only takes the test guest from
# CAPL_GUEST_IMAGE (or --image in DEMO_ARGS).
# shellcheck disable=SC2086 # DEMO_ARGS is a list of words on purpose
exec .venv/bin/capl demo --libvirt-uri "${DEMO_LIBVIRT_URI:-qemu:///system}" \
	--node-image "$CAPL_NODE_IMAGE" --domain-type qemu ${DEMO_ARGS:-} "$@"
