# shellcheck shell=bash
# Shared helpers for the hack/ scripts: clear one-line errors, root/sudo detection,
# and the cache directory that holds everything built outside the repository.

set -euo pipefail

CAPL_CACHE="${CAPL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/capl}"
export CAPL_CACHE

die() {
	echo "error: $*" >&2
	exit 1
}

note() {
	echo "==> $*" >&2
}

# SUDO is empty when we are root, "sudo" when passwordless sudo works; otherwise we stop
# with a message instead of failing half-way through an install.
if [ "$(id -u)" -eq 0 ]; then
	SUDO=""
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
	SUDO="sudo"
else
	SUDO="__none__"
fi

need_root() {
	if [ "$SUDO" = "__none__" ]; then
		die "$1 needs root: run as root or give this user passwordless sudo"
	fi
}

need_cmd() {
	command -v "$1" >/dev/null 2>&1 || die "$1 not found: $2"
}

# timed NAME CMD...: run CMD and note how long it took.
timed() {
	local name="$1"; shift
	local t0=$SECONDS
	"$@"
	note "$name: $((SECONDS - t0)) s"
}

# bed_up: every part of the test bed (each step idempotent and cached), exported for the
# tests and benchmarks: KUBEBUILDER_ASSETS, CAPL_GUEST_IMAGE, CAPL_CAPI_DIR; libvirtd running.
bed_up() {
	KUBEBUILDER_ASSETS="$(timed envtest hack/envtest.sh | tail -n1)"
	export KUBEBUILDER_ASSETS
	timed libvirt-host hack/libvirt-host.sh
	CAPL_GUEST_IMAGE="$(timed guest-image hack/guest-image.sh | tail -n1)"
	export CAPL_GUEST_IMAGE
	CAPL_CAPI_DIR="$(timed capi hack/capi.sh | tail -n1)"
	export CAPL_CAPI_DIR
}
