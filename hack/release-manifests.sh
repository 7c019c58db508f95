#!/usr/bin/env bash
# Writes the clusterctl local repository of this version:
#   out/infrastructure-libvirt/v<version>/{infrastructure-components.yaml,metadata.yaml,cluster-template*.yaml}
# <version> is capl.__version__. The components are `kubectl kustomize config/default` with the
# development image name replaced by the release image ($CAPL_IMAGE, default
# ghcr.io/capl-dev/capl:v<version>); `${VAR}` placeholders pass through untouched.
# kubectl is the test bed's ($KUBEBUILDER_ASSETS/kubectl, else built by hack/envtest.sh).
# $CAPL_RELEASE_DIR replaces out/ (the tests write into a temporary directory).
# Use it in clusterctl.yaml:
#   providers:
#     - name: libvirt
#       type: InfrastructureProvider
#       url: <repo>/out/infrastructure-libvirt/v<version>/infrastructure-components.yaml
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=hack/lib.sh
. "$HERE/lib.sh"
cd "$HERE/.."

version="$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' capl/__init__.py)"
[ -n "$version" ] || die "cannot read __version__ from capl/__init__.py"
case "$version" in
[0-9]*.[0-9]*.[0-9]*) ;;
*) die "capl/__init__.py: __version__ \"$version\" is not a semantic version" ;;
esac
tag="v$version"
major="${version%%.*}"
minor="${version#*.}"; minor="${minor%%.*}"

if [ -n "${KUBEBUILDER_ASSETS:-}" ] && [ -x "$KUBEBUILDER_ASSETS/kubectl" ]; then
	KUBECTL="$KUBEBUILDER_ASSETS/kubectl"
else
	KUBECTL="$("$HERE/envtest.sh" | tail -n1)/kubectl"
fi
[ -x "$KUBECTL" ] || die "kubectl not found at $KUBECTL (run make envtest)"

# metadata.yaml must declare this release series, or clusterctl refuses the version.
grep -q "major: $major" metadata.yaml && grep -q "minor: $minor" metadata.yaml ||
	die "metadata.yaml has no releaseSeries entry for $major.$minor"

image="${CAPL_IMAGE:-ghcr.io/capl-dev/capl:$tag}"
out="${CAPL_RELEASE_DIR:-out}/infrastructure-libvirt/$tag"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

"$KUBECTL" kustomize config/default >"$tmp/raw.yaml" || die "kubectl kustomize config/default failed"
sed "s#image: capl-manager:dev\$#image: $image#" "$tmp/raw.yaml" >"$tmp/infrastructure-components.yaml"

# clusterctl's expectations of a components file.
PY=".venv/bin/python"
[ -x "$PY" ] || PY=python3
"$PY" - "$tmp/infrastructure-components.yaml" <<'PYTHON' || die "infrastructure-components.yaml is not what clusterctl expects"
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
problems = []
namespaces = [d for d in docs if d["kind"] == "Namespace"]
if len(namespaces) != 1:
    problems.append(f"{len(namespaces)} Namespace objects, exactly one needed")
deployments = [d for d in docs if d["kind"] == "Deployment"]
names = [c["name"] for d in deployments for c in d["spec"]["template"]["spec"]["containers"]]
if "manager" not in names:
    problems.append("no Deployment container named manager")
if "capl-manager:dev" in open(sys.argv[1]).read():
    problems.append("the development image name capl-manager:dev is still there")
for p in problems:
    print(f"error: infrastructure-components.yaml: {p}", file=sys.stderr)
sys.exit(1 if problems else 0)
PYTHON

rm -rf "$out"
mkdir -p "$out"
cp "$tmp/infrastructure-components.yaml" "$out/"
cp metadata.yaml "$out/metadata.yaml"
cp templates/cluster-template*.yaml templates/clusterclass-*.yaml "$out/"
note "wrote $out ($(ls "$out" | tr '\n' ' '))"
echo "$out"
