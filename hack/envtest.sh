#!/usr/bin/env bash
# Builds kube-apiserver, etcd and kubectl from Go modules into
#   $CAPL_CACHE/envtest/<kubernetes version>/   (KUBEBUILDER_ASSETS layout)
# and prints that directory as the last line of output.
#
# k8s.io/kubernetes cannot be `go install`ed: its go.mod requires its staging modules at
# v0.0.0 with `replace => ./staging/...`. We generate a small build module that requires
# k8s.io/kubernetes and replaces each staging module (the list is read from that version's
# .mod file, never typed by hand) with the matching published v0.X.Y. etcd is built in the
# same module from go.etcd.io/etcd/server/v3 at the version kubernetes itself requires.
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

minor="${KUBERNETES_VERSION#v1.}"; minor="${minor%%.*}"
patch="${KUBERNETES_VERSION##*.}"
staging_version="v0.${minor}.${patch}"

BUILD="$CAPL_CACHE/envtest-build/$KUBERNETES_VERSION"
mkdir -p "$BUILD" "$OUT.tmp"
cd "$BUILD"

note "fetching k8s.io/kubernetes@$KUBERNETES_VERSION go.mod"
kmod="$(go mod download -json "k8s.io/kubernetes@$KUBERNETES_VERSION" 2>/dev/null | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')" ||
	true
[ -n "$kmod" ] && [ -f "$kmod" ] ||
	die "cannot download k8s.io/kubernetes@$KUBERNETES_VERSION from the Go module proxy ($(go env GOPROXY))"
go_directive="$(sed -n 's/^go \([0-9.]*\)$/\1/p' "$kmod" | head -n1)"
staging=$(sed -n 's#^[[:space:]]*\(k8s.io/[^ ]*\) => ./staging/.*#\1#p' "$kmod" | sort -u)
[ -n "$staging" ] || die "no staging replace lines found in $kmod"

{
	echo "module capl.local/envtest-build"
	echo
	echo "go ${go_directive}"
	echo
	sed -n 's/^godebug .*/&/p' "$kmod"
	echo
	echo "require ("
	echo "	k8s.io/kubernetes $KUBERNETES_VERSION"
	echo "	go.etcd.io/etcd/server/v3 $ETCD_VERSION"
	echo ")"
	echo
	echo "replace ("
	for m in $staging; do echo "	$m => $m $staging_version"; done
	echo ")"
} >go.mod

cat >tools.go <<'GO'
//go:build tools

package tools
GO

note "resolving modules (first run downloads ~1 GB into the Go module cache)"
go get "k8s.io/kubernetes/cmd/kube-apiserver@$KUBERNETES_VERSION" \
	"k8s.io/kubernetes/cmd/kubectl@$KUBERNETES_VERSION" \
	"go.etcd.io/etcd/server/v3@$ETCD_VERSION" >build.log 2>&1 ||
	{ tail -n 30 build.log >&2; die "go get failed (log: $BUILD/build.log)"; }

commit="$(go mod download -json "k8s.io/kubernetes@$KUBERNETES_VERSION" | sed -n 's/.*"Hash": "\(.*\)".*/\1/p' | head -c 12 || true)"
date_now="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
ldflags=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	ldflags+=" -X $pkg.gitVersion=$KUBERNETES_VERSION"
	ldflags+=" -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
	ldflags+=" -X $pkg.gitCommit=${commit:-unknown} -X $pkg.gitTreeState=clean"
	ldflags+=" -X $pkg.buildDate=$date_now"
done

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
