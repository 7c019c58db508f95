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
# tests and benchmarks: KUBEBUILDER_ASSETS, CAPL_GUEST_IMAGE, CAPL_CAPI_DIR, CAPL_IPAM_DIR;
# libvirtd running.
bed_up() {
	KUBEBUILDER_ASSETS="$(timed envtest hack/envtest.sh | tail -n1)"
	export KUBEBUILDER_ASSETS
	timed libvirt-host hack/libvirt-host.sh
	CAPL_GUEST_IMAGE="$(timed guest-image hack/guest-image.sh | tail -n1)"
	export CAPL_GUEST_IMAGE
	CAPL_CAPI_DIR="$(timed capi hack/capi.sh | tail -n1)"
	export CAPL_CAPI_DIR
	CAPL_IPAM_DIR="$(timed ipam hack/ipam.sh | tail -n1)"
	export CAPL_IPAM_DIR
}

# bench_extra: the bench extra of the package (matplotlib, for the plots) in .venv, once.
bench_extra() {
	if ! .venv/bin/python -c 'import matplotlib' 2>/dev/null; then
		note "installing the bench extra (matplotlib) into .venv"
		.venv/bin/pip install -q --disable-pip-version-check -c constraints.txt -e '.[bench]' ||
			die "pip install of the bench extra failed"
	fi
}

# nodes_up: what real nodes need (each step cached), exported for the tests and the demo:
# CAPL_NODE_BIN (kubelet, kubeadm, containerd, Ignition...), CAPL_NODE_IMAGE (the qcow2).
nodes_up() {
	CAPL_NODE_BIN="$(timed node-bin hack/node-bin.sh | tail -n1)"
	export CAPL_NODE_BIN
	CAPL_NODE_IMAGE="$(timed node-image hack/node-image.sh | tail -n1)"
	export CAPL_NODE_IMAGE
}

# k8s_build_module DIR [MODULE@VERSION...]: write DIR/go.mod for building k8s.io/kubernetes
# $KUBERNETES_VERSION commands (and the extra modules named). k8s.io/kubernetes cannot be
# `go install`ed: its go.mod requires its staging modules at v0.0.0 with
# `replace => ./staging/...`; this module requires it and replaces each staging module (the
# list is read from that version's .mod file, never typed by hand) with the published v0.X.Y.
k8s_build_module() {
	local dir="$1" kmod go_directive staging m minor patch
	shift
	minor="${KUBERNETES_VERSION#v1.}"; minor="${minor%%.*}"
	patch="${KUBERNETES_VERSION##*.}"
	mkdir -p "$dir"
	kmod="$(cd "$dir" && GOFLAGS=-mod=mod go mod download -json "k8s.io/kubernetes@$KUBERNETES_VERSION" 2>/dev/null |
		sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')" || true
	[ -n "$kmod" ] && [ -f "$kmod" ] ||
		die "cannot download k8s.io/kubernetes@$KUBERNETES_VERSION from the Go module proxy ($(go env GOPROXY))"
	go_directive="$(sed -n 's/^go \([0-9.]*\)$/\1/p' "$kmod" | head -n1)"
	staging=$(sed -n 's#^[[:space:]]*\(k8s.io/[^ ]*\) => ./staging/.*#\1#p' "$kmod" | sort -u)
	[ -n "$staging" ] || die "no staging replace lines found in $kmod"
	[ -f "$dir/go.mod" ] && grep -q "k8s.io/kubernetes $KUBERNETES_VERSION" "$dir/go.mod" && return 0
	{
		echo "module capl.local/k8s-build"
		echo
		echo "go ${go_directive}"
		echo
		sed -n 's/^godebug .*/&/p' "$kmod"
		echo
		echo "require ("
		echo "	k8s.io/kubernetes $KUBERNETES_VERSION"
		for m in "$@"; do echo "	${m%@*} ${m#*@}"; done
		echo ")"
		echo
		echo "replace ("
		for m in $staging; do echo "	$m => $m v0.${minor}.${patch}"; done
		echo ")"
	} >"$dir/go.mod"
	printf '//go:build tools\n\npackage tools\n' >"$dir/tools.go"
}

# k8s_version_ldflags VERSION: the -X flags that make a Kubernetes binary report VERSION
# (without them /version says v0.0.0 and Cluster API refuses to talk to it).
k8s_version_ldflags() {
	local v="$1" minor pkg out=""
	minor="${v#v1.}"; minor="${minor%%.*}"
	for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		out+=" -X $pkg.gitVersion=$v -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
		out+=" -X $pkg.gitCommit=module-$v -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
	done
	echo "$out"
}
