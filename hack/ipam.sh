#!/usr/bin/env bash
# Builds the Cluster API in-cluster IPAM provider (sigs.k8s.io/cluster-api-ipam-provider-in-cluster)
# from its Go module into $CAPL_CACHE/ipam/<version>/: bin/ipam-in-cluster-manager and the
# module's config/ tree (the pool CRDs InClusterIPPool, GlobalInClusterIPPool and the prefix
# pools in config/crd/bases, webhook manifests, RBAC) for the test bed
# (capl.testbed.ipam), and prints that directory as the last line. Idempotent: a complete
# directory is printed at once. Build log: $CAPL_CACHE/ipam-build-<version>.log.
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=hack/lib.sh
. "$HERE/lib.sh"
# shellcheck source=hack/versions.env
. "$HERE/versions.env"

MODULE=sigs.k8s.io/cluster-api-ipam-provider-in-cluster
OUT="$CAPL_CACHE/ipam/$IPAM_VERSION"
BINARY=ipam-in-cluster-manager

if [ -x "$OUT/bin/$BINARY" ] && [ -d "$OUT/config/crd/bases" ]; then
	echo "$OUT"
	exit 0
fi

need_cmd go "install Go (https://go.dev/dl) to build the in-cluster IPAM provider $IPAM_VERSION"
export GOTOOLCHAIN=local CGO_ENABLED=0
LOG="$CAPL_CACHE/ipam-build-$IPAM_VERSION.log"
mkdir -p "$CAPL_CACHE" && : >"$LOG"

note "downloading $MODULE@$IPAM_VERSION"
dir="$(go mod download -json "$MODULE@$IPAM_VERSION" 2>>"$LOG" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')" || true
[ -n "$dir" ] && [ -d "$dir" ] ||
	{ tail -n 20 "$LOG" >&2; die "cannot download $MODULE@$IPAM_VERSION from $(go env GOPROXY)"; }

rm -rf "$OUT.tmp" && mkdir -p "$OUT.tmp/bin"
note "building the in-cluster IPAM provider $IPAM_VERSION (~1 min with a warm Go build cache, 5-10 min cold)"
t0=$SECONDS
# Not `go install MODULE@VERSION`: that looks up the module's deprecation in the proxy's
# version list (@v/list), which the proxy here refuses (403). A build module of our own that
# requires exactly this version (its own go.mod decides the rest, by MVS) builds the same
# main package.
BUILD="$CAPL_CACHE/ipam-build/$IPAM_VERSION"
mkdir -p "$BUILD"
go_directive="$(sed -n 's/^go \([0-9.]*\)$/\1/p' "$dir/go.mod" | head -n1)"
printf 'module capl.local/ipam-build\n\ngo %s\n\nrequire %s %s\n' \
	"$go_directive" "$MODULE" "$IPAM_VERSION" >"$BUILD/go.mod"
(cd "$BUILD" && GOFLAGS=-mod=mod go build -trimpath -ldflags "-s -w" -o "$OUT.tmp/bin/$BINARY" "$MODULE") \
	>>"$LOG" 2>&1 || { tail -n 30 "$LOG" >&2; die "go build of $MODULE@$IPAM_VERSION failed (log: $LOG)"; }
help="$("$OUT.tmp/bin/$BINARY" --help 2>&1 || true)"
[[ $help == *--webhook-port* ]] || die "$OUT.tmp/bin/$BINARY --help does not list --webhook-port"
cp -r "$dir/config" "$OUT.tmp/config"
chmod -R u+w "$OUT.tmp"
rm -rf "$OUT"
mv "$OUT.tmp" "$OUT"
note "in-cluster IPAM provider: $((SECONDS - t0)) s"
echo "$OUT"
