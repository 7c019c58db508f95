#!/usr/bin/env bash
# `make node-bin`: builds what a real Kubernetes node runs, from Go modules, into
#   $CAPL_CACHE/node-bin/<key>/bin/
# and prints that directory as the last line of output. <key> names every version that goes
# in, so a version bump builds a new set and an unchanged one returns at once.
#
#   kubelet, kubeadm, kube-controller-manager, kube-scheduler   k8s.io/kubernetes $KUBERNETES_VERSION
#       (the same generated build module as hack/envtest.sh: k8s_build_module in lib.sh)
#   containerd, containerd-shim-runc-v2, ctr                    github.com/containerd/containerd/v2
#       $CONTAINERD_VERSION (CGO_ENABLED=0: the btrfs snapshotter drops out; overlayfs stays)
#   ignition                                                    github.com/flatcar/ignition at the
#       version sigs.k8s.io/cluster-api $CAPI_VERSION requires (read from its go.mod): the
#       legacy Ignition that reads spec 2.x, which the kubeadm bootstrap provider emits through
#       the Flatcar Container Linux Config transpiler. Needs cgo and libblkid-dev.
#
# runc and the CNI plugins come from Debian's packages inside the node image (hack/node-image.sh).
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=hack/lib.sh
. "$HERE/lib.sh"
# shellcheck source=hack/versions.env
. "$HERE/versions.env"

K8S_BINARIES=(kubelet kubeadm kube-controller-manager kube-scheduler)
CONTAINERD_BINARIES=(containerd containerd-shim-runc-v2 ctr)

need_cmd go "install Go (https://go.dev/dl) to build the node binaries"
export GOTOOLCHAIN=local GOFLAGS=-mod=mod

ignition_version() {
	local mod
	mod="$(go mod download -json "sigs.k8s.io/cluster-api@$CAPI_VERSION" 2>/dev/null | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')" || true
	[ -n "$mod" ] && [ -f "$mod" ] || die "cannot download sigs.k8s.io/cluster-api@$CAPI_VERSION's go.mod from $(go env GOPROXY)"
	awk '$1 == "github.com/flatcar/ignition" { print $2; exit }' "$mod"
}

# The version is remembered: asking the module proxy costs a round trip on every run.
MEMO="$CAPL_CACHE/node-bin/ignition-version-$CAPI_VERSION"
mkdir -p "$CAPL_CACHE/node-bin"
if [ ! -s "$MEMO" ]; then
	v="$(ignition_version)"
	[ -n "$v" ] || die "sigs.k8s.io/cluster-api@$CAPI_VERSION does not require github.com/flatcar/ignition"
	echo "$v" >"$MEMO"
fi
IGNITION_VERSION="$(cat "$MEMO")"

OUT="$CAPL_CACHE/node-bin/k8s-$KUBERNETES_VERSION-containerd-$CONTAINERD_VERSION-ignition-$IGNITION_VERSION"
have_all() {
	local b
	for b in "${K8S_BINARIES[@]}" "${CONTAINERD_BINARIES[@]}" ignition; do
		[ -x "$OUT/bin/$b" ] || return 1
	done
}
if have_all; then
	echo "$OUT"
	exit 0
fi

exec 9>"$CAPL_CACHE/node-bin/.lock"
flock 9
if have_all; then
	echo "$OUT"
	exit 0
fi
mkdir -p "$OUT/bin"
LOG="$CAPL_CACHE/node-bin/build.log"
: >"$LOG"

build_k8s() {
	local missing=() b
	for b in "${K8S_BINARIES[@]}"; do [ -x "$OUT/bin/$b" ] || missing+=("$b"); done
	[ "${#missing[@]}" -gt 0 ] || return 0
	local dir="$CAPL_CACHE/node-build/k8s-$KUBERNETES_VERSION" pkgs=()
	for b in "${missing[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$b"); done
	k8s_build_module "$dir"
	note "building ${missing[*]} $KUBERNETES_VERSION (a cold build takes 5-15 min on 2 cores)"
	(
		cd "$dir"
		export CGO_ENABLED=0
		for p in "${pkgs[@]}"; do go get "$p@$KUBERNETES_VERSION"; done
		go build -trimpath -ldflags "-s -w $(k8s_version_ldflags "$KUBERNETES_VERSION")" -o "$OUT/bin.tmp/" "${pkgs[@]}"
	) >>"$LOG" 2>&1 || { tail -n 30 "$LOG" >&2; die "building ${missing[*]} failed (log: $LOG)"; }
	for b in "${missing[@]}"; do mv "$OUT/bin.tmp/$b" "$OUT/bin/$b"; done
	rmdir "$OUT/bin.tmp"
	"$OUT/bin/kubelet" --version | grep -q "$KUBERNETES_VERSION" ||
		die "kubelet reports '$("$OUT/bin/kubelet" --version)', expected $KUBERNETES_VERSION"
}

build_containerd() {
	local b missing=0 pkgs=() mod=github.com/containerd/containerd/v2
	for b in "${CONTAINERD_BINARIES[@]}"; do [ -x "$OUT/bin/$b" ] || missing=1; done
	[ "$missing" = 1 ] || return 0
	for b in "${CONTAINERD_BINARIES[@]}"; do pkgs+=("$mod/cmd/$b@$CONTAINERD_VERSION"); done
	note "building containerd $CONTAINERD_VERSION"
	CGO_ENABLED=0 GOBIN="$OUT/bin" go install -trimpath \
		-ldflags "-s -w -X $mod/version.Version=$CONTAINERD_VERSION -X $mod/version.Revision=module" \
		"${pkgs[@]}" >>"$LOG" 2>&1 ||
		{ tail -n 30 "$LOG" >&2; die "building containerd failed (log: $LOG)"; }
}

build_ignition() {
	[ -x "$OUT/bin/ignition" ] && return 0
	pkg-config --exists blkid 2>/dev/null || die "legacy Ignition needs libblkid-dev (make deps)"
	note "building github.com/flatcar/ignition $IGNITION_VERSION (legacy Ignition, spec 2.x)"
	# `go install module/pkg@version` needs the module's version list, which the proxy
	# refuses for this module: build it from a small module that requires it instead.
	# Its main package is github.com/flatcar/ignition/internal.
	local dir="$CAPL_CACHE/node-build/ignition-$IGNITION_VERSION" mod=github.com/flatcar/ignition
	mkdir -p "$dir"
	printf 'module capl.local/ignition-build\n\ngo 1.25\n' >"$dir/go.mod"
	(
		cd "$dir"
		export CGO_ENABLED=1
		go get "$mod@$IGNITION_VERSION"
		go build -trimpath -ldflags "-s -w -X $mod/internal/version.Raw=$IGNITION_VERSION" \
			-o "$OUT/bin/ignition.tmp" "$mod/internal"
	) >>"$LOG" 2>&1 || { tail -n 30 "$LOG" >&2; die "building Ignition failed (log: $LOG)"; }
	mv "$OUT/bin/ignition.tmp" "$OUT/bin/ignition"
}

build_containerd
build_ignition
build_k8s
have_all || die "node binaries incomplete in $OUT/bin"
echo "$OUT"
