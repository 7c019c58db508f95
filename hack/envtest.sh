#!/usr/bin/env bash
# Builds kube-apiserver, etcd and kubectl from Go modules into
#   $CAPL_CACHE/envtest/<kubernetes version>/   (KUBEBUILDER_ASSETS layout)
# and prints that directory as the last line of output.
#
# k8s.io/kubernetes cannot be `go install`ed: the build module comes from k8s_build_module
# (hack/lib.sh). etcd is built in the same module from go.etcd.io/etcd/server/v3 at the
# version kubernetes itself requires.
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=hack/lib.sh
. "$HERE/lib.sh"
# shellcheck source=hack/versions.env
. "$HERE/versions.env"

BINARIES=(kube-apiserver etcd kubectl)

have_all() {
	local dir="$1" b
	for b in "${BINARIES[@]}"; do [ -x "$dir/$b" ] || return 1; done
}

if [ -n "${KUBEBUILDER_ASSETS:-}" ] && have_all "$KUBEBUILDER_ASSETS"; then
	echo "$KUBEBUILDER_ASSETS"
	exit 0
fi

OUT="$CAPL_CACHE/envtest/$KUBERNETES_VERSION"
if have_all "$OUT"; then
	echo "$OUT"
	exit 0
fi

need_cmd go "install Go (https://go.dev/dl) >= the version k8s.io/kubernetes $KUBERNETES_VERSION requires"
export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0

BUILD="$CAPL_CACHE/envtest-build/$KUBERNETES_VERSION"
mkdir -p "$OUT.tmp"
note "fetching k8s.io/kubernetes@$KUBERNETES_VERSION go.mod"
k8s_build_module "$BUILD" "go.etcd.io/etcd/server/v3@$ETCD_VERSION"
cd "$BUILD"

note "resolving modules (first run downloads ~1 GB into the Go module cache)"
go get "k8s.io/kubernetes/cmd/kube-apiserver@$KUBERNETES_VERSION" \
	"k8s.io/kubernetes/cmd/kubectl@$KUBERNETES_VERSION" \
	"go.etcd.io/etcd/server/v3@$ETCD_VERSION" >build.log 2>&1 ||
	{ tail -n 30 build.log >&2; die "go get failed (log: $BUILD/build.log)"; }

ldflags="$(k8s_version_ldflags "$KUBERNETES_VERSION")"

note "building kube-apiserver, kubectl (10-30 min cold on 2 cores)"
go build -trimpath -ldflags "-s -w $ldflags" -o "$OUT.tmp/" \
	k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kubectl >>build.log 2>&1 ||
	{ tail -n 30 build.log >&2; die "building kube-apiserver/kubectl failed (log: $BUILD/build.log)"; }
note "building etcd $ETCD_VERSION"
go build -trimpath -ldflags "-s -w" -o "$OUT.tmp/etcd" go.etcd.io/etcd/server/v3 >>build.log 2>&1 ||
	{ tail -n 30 build.log >&2; die "building etcd failed (log: $BUILD/build.log)"; }

"$OUT.tmp/kube-apiserver" --version | grep -q "$KUBERNETES_VERSION" ||
	die "kube-apiserver reports $("$OUT.tmp/kube-apiserver" --version), expected $KUBERNETES_VERSION"
rm -rf "$OUT"
mv "$OUT.tmp" "$OUT"
echo "$OUT"
