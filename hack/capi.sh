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
# What the e2e fixtures read from the module besides the binaries: the core config tree, the
# release metadata, and the kubeadm providers' CRDs (capl's templates reference their kinds).
EXTRAS=(config metadata.yaml bootstrap/kubeadm/config controlplane/kubeadm/config)

complete() {
	local e
	[ -x "$OUT/bin/cluster-api-manager" ] && [ -x "$OUT/bin/clusterctl" ] || return 1
	for e in "${EXTRAS[@]}"; do [ -e "$OUT/$e" ] || return 1; done
}

copy_extras() {
	local target="$1" e
	for e in "${EXTRAS[@]}"; do
		mkdir -p "$target/$(dirname "$e")"
		rm -rf "${target:?}/$e"
		cp -r "$dir/$e" "$target/$e"
	done
	chmod -R u+w "$target"
}

if complete; then
	echo "$OUT"
	exit 0
fi

need_cmd go "install Go (https://go.dev/dl) to build Cluster API $CAPI_VERSION"
export GOTOOLCHAIN=local CGO_ENABLED=0
LOG="$CAPL_CACHE/capi-build-$CAPI_VERSION.log"
mkdir -p "$CAPL_CACHE" && : >"$LOG"

note "downloading sigs.k8s.io/cluster-api@$CAPI_VERSION"
dir="$(go mod download -json "sigs.k8s.io/cluster-api@$CAPI_VERSION" 2>>"$LOG" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')" || true
[ -n "$dir" ] && [ -d "$dir" ] ||
	{ tail -n 20 "$LOG" >&2; die "cannot download sigs.k8s.io/cluster-api@$CAPI_VERSION from $(go env GOPROXY)"; }

if [ -x "$OUT/bin/cluster-api-manager" ] && [ -x "$OUT/bin/clusterctl" ]; then
	# binaries from an earlier run of this script: only the module files are missing
	copy_extras "$OUT"
	echo "$OUT"
	exit 0
fi
rm -rf "$OUT.tmp" && mkdir -p "$OUT.tmp/bin"

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
copy_extras "$OUT.tmp"
"$OUT.tmp/bin/clusterctl" version -o short 2>/dev/null | grep -q "$CAPI_VERSION" ||
	die "clusterctl reports '$("$OUT.tmp/bin/clusterctl" version -o short 2>&1)', expected $CAPI_VERSION"
rm -rf "$OUT"
mv "$OUT.tmp" "$OUT"
echo "$OUT"
