#!/usr/bin/env bash
# Builds Cluster API from Go modules into $CAPL_CACHE/capi/<version>/: the core manager and
# clusterctl (bin/cluster-api-manager, bin/clusterctl) and the kubeadm bootstrap and
# control-plane managers (bin/kubeadm-bootstrap-manager, bin/kubeadm-control-plane-manager;
# same module, both `package main` named kubeadm), and prints that directory as the last line.
# config/, bootstrap/kubeadm/config/ and controlplane/kubeadm/config/ are the module's own
# config trees (CRDs, webhook manifests, kustomizations) for the test bed and the clusterctl
# repository. A directory with the core binaries but not the kubeadm ones gets only those.
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=hack/lib.sh
. "$HERE/lib.sh"
# shellcheck source=hack/versions.env
. "$HERE/versions.env"

OUT="$CAPL_CACHE/capi/$CAPI_VERSION"
# What the test bed reads from the module besides the binaries: the core config tree, the
# release metadata, and the kubeadm providers' config trees (CRDs, webhooks; capl's templates
# reference their kinds).
EXTRAS=(config metadata.yaml bootstrap/kubeadm/config controlplane/kubeadm/config)
CORE_BINARIES=(cluster-api-manager clusterctl)
# binary name in bin/ -> package of the module
declare -A KUBEADM_MANAGERS=(
	[kubeadm-bootstrap-manager]=sigs.k8s.io/cluster-api/bootstrap/kubeadm
	[kubeadm-control-plane-manager]=sigs.k8s.io/cluster-api/controlplane/kubeadm
)

have_binaries() {
	local target="$1" b
	shift
	for b in "$@"; do [ -x "$target/bin/$b" ] || return 1; done
}

complete() {
	local e
	have_binaries "$OUT" "${CORE_BINARIES[@]}" "${!KUBEADM_MANAGERS[@]}" || return 1
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

date_now="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
minor="${CAPI_VERSION#v1.}"; minor="${minor%%.*}"
pkg=sigs.k8s.io/cluster-api/version
ldflags="-s -w -X $pkg.gitVersion=$CAPI_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$date_now -X $pkg.gitCommit=module-$CAPI_VERSION"

# build_kubeadm_managers TARGET: the kubeadm managers missing from TARGET/bin. Both packages
# build a binary named kubeadm, so each goes through its own GOBIN and is renamed; a binary
# lands in TARGET/bin only once it is complete.
build_kubeadm_managers() {
	local target="$1" name gobin help t0
	for name in "${!KUBEADM_MANAGERS[@]}"; do
		[ -x "$target/bin/$name" ] && continue
		gobin="$target/bin/.$name.tmp"
		rm -rf "$gobin" && mkdir -p "$gobin"
		note "building $name $CAPI_VERSION (${KUBEADM_MANAGERS[$name]}; <1 min after the core, ~5 min cold)"
		t0=$SECONDS
		GOBIN="$gobin" go install -trimpath -ldflags "$ldflags" \
			"${KUBEADM_MANAGERS[$name]}@$CAPI_VERSION" >>"$LOG" 2>&1 ||
			{ tail -n 30 "$LOG" >&2; die "go install of ${KUBEADM_MANAGERS[$name]} failed (log: $LOG)"; }
		help="$("$gobin/kubeadm" --help 2>&1 || true)"
		[[ $help == *--feature-gates* ]] ||
			die "$gobin/kubeadm --help does not list --feature-gates: not a Cluster API manager?"
		mv "$gobin/kubeadm" "$target/bin/$name"
		rm -rf "$gobin"
		note "$name: $((SECONDS - t0)) s"
	done
}

if have_binaries "$OUT" "${CORE_BINARIES[@]}"; then
	# the core from an earlier run of this script: build only what is missing
	build_kubeadm_managers "$OUT"
	copy_extras "$OUT"
	echo "$OUT"
	exit 0
fi
rm -rf "$OUT.tmp" && mkdir -p "$OUT.tmp/bin"

note "building the Cluster API core manager and clusterctl $CAPI_VERSION (5-15 min cold)"
GOBIN="$OUT.tmp/bin" go install -trimpath -ldflags "$ldflags" \
	"sigs.k8s.io/cluster-api@$CAPI_VERSION" "sigs.k8s.io/cluster-api/cmd/clusterctl@$CAPI_VERSION" >>"$LOG" 2>&1 ||
	{ tail -n 30 "$LOG" >&2; die "go install of Cluster API failed (log: $LOG)"; }
mv "$OUT.tmp/bin/cluster-api" "$OUT.tmp/bin/cluster-api-manager"
build_kubeadm_managers "$OUT.tmp"
copy_extras "$OUT.tmp"
"$OUT.tmp/bin/clusterctl" version -o short 2>/dev/null | grep -q "$CAPI_VERSION" ||
	die "clusterctl reports '$("$OUT.tmp/bin/clusterctl" version -o short 2>&1)', expected $CAPI_VERSION"
rm -rf "$OUT"
mv "$OUT.tmp" "$OUT"
echo "$OUT"
