#!/usr/bin/env bash
# Builds the Cluster API core manager and clusterctl from Go modules into
#   $CAPL_CACHE/capi/<version>/{bin/cluster-api-manager, bin/clusterctl, config/...}
# and prints that directory as the last line. config/ is the module's own config tree
# (CRDs, webhook manifests, kustomizations) for the e2e fixture and the clusterctl repository.
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=hack/lib.sh
. "$HERE/lib.sh"
# shellcheck source=hack/versions.env
. "$HERE/versions.env"

OUT="$CAPL_CACHE/capi/$CAPI_VERSION"
if [ -x "$OUT/bin/cluster-api-manager" ] && [ -x "$OUT/bin/clusterctl" ] && [ -d "$OUT/config/crd/bases" ]; then
	echo "$OUT"
	exit 0
fi

need_cmd go "install Go (https://go.dev/dl) to build Cluster API $CAPI_VERSION"
export GOTOOLCHAIN=local CGO_ENABLED=0
LOG="$CAPL_CACHE/capi-build-$CAPI_VERSION.log"
mkdir -p "$CAPL_CACHE" && : >"$LOG"
rm -rf "$OUT.tmp" && mkdir -p "$OUT.tmp/bin"

note "downloading sigs.k8s.io/cluster-api@$CAPI_VERSION"
dir="$(go mod download -json "sigs.k8s.io/cluster-api@$CAPI_VERSION" 2>>"$LOG" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')" || true
[ -n "$dir" ] && [ -d "$dir" ] ||
	{ tail -n 20 "$LOG" >&2; die "cannot download sigs.k8s.io/cluster-api@$CAPI_VERSION from $(go env GOPROXY)"; }

date_now="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
minor="${CAPI_VERSION#v1.}"; minor="${minor%%.*}"
pkg=sigs.k8s.io/cluster-api/version
ldflags="-s -w -X $pkg.gitVersion=$CAPI_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$date_now -X $pkg.gitCommit=module-$CAPI_VERSION"

note "building the Cluster API core manager and clusterctl $CAPI_VERSION (5-15 min cold)"
GOBIN="$OUT.tmp/bin" go install -trimpath -ldflags "$ldflags" \
	"sigs.k8s.io/cluster-api@$CAPI_VERSION" "sigs.k8s.io/cluster-api/cmd/clusterctl@$CAPI_VERSION" >>"$LOG" 2>&1 ||
	{ tail -n 30 "$LOG" >&2; die "go install of Cluster API failed (log: $LOG)"; }
mv "$OUT.tmp/bin/cluster-api" "$OUT.tmp/bin/cluster-api-manager"
cp -r "$dir/config" "$OUT.tmp/config"
chmod -R u+w "$OUT.tmp/config"
"$OUT.tmp/bin/clusterctl" version -o short 2>/dev/null | grep -q "$CAPI_VERSION" ||
	die "clusterctl reports '$("$OUT.tmp/bin/clusterctl" version -o short 2>&1)', expected $CAPI_VERSION"
rm -rf "$OUT"
mv "$OUT.tmp" "$OUT"
echo "$OUT"
