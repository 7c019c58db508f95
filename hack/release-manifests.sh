#!/usr/bin/env bash
# Writes the clusterctl local repository: two release series of capl's infrastructure
# provider, the current one and the next minor,
#   out/infrastructure-libvirt/v<version>/{infrastructure-components.yaml,metadata.yaml,cluster-template*.yaml}
#   out/infrastructure-libvirt/v<next minor>/  (same files)
# <version> is capl.__version__ (X.Y.Z); the next minor is X.(Y+1).0. Both are made from this
# same tree: the next minor differs only in its version (image tag, and a metadata.yaml that
# declares its release series besides the current one, with the current series' contract).
# It exists so that `clusterctl upgrade plan/apply` has somewhere to go (the e2e
# tests/e2e/test_clusterctl_upgrade.py rehearses an upgrade with it); it is no release of
# other code.
# The components are `kubectl kustomize config/default` with the development image name
# replaced by the release image ($CAPL_IMAGE for both, default ghcr.io/capl-dev/capl:v<its
# version>); `${VAR}` placeholders pass through untouched.
# kubectl is the test bed's ($KUBEBUILDER_ASSETS/kubectl, else built by hack/envtest.sh).
# $CAPL_RELEASE_DIR replaces out/ (the tests write into a temporary directory).
# The last line of output is the current version's directory. Use it in clusterctl.yaml:
#   providers:
#     - name: libvirt
#       type: InfrastructureProvider
#       url: <repo>/out/infrastructure-libvirt/v<version>/infrastructure-components.yaml
# (clusterctl installs the version the URL names and finds the other one beside it.)
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
major="${version%%.*}"
minor="${version#*.}"; minor="${minor%%.*}"
next="$major.$((minor + 1)).0"

if [ -n "${KUBEBUILDER_ASSETS:-}" ] && [ -x "$KUBEBUILDER_ASSETS/kubectl" ]; then
	KUBECTL="$KUBEBUILDER_ASSETS/kubectl"
else
	KUBECTL="$("$HERE/envtest.sh" | tail -n1)/kubectl"
fi
[ -x "$KUBECTL" ] || die "kubectl not found at $KUBECTL (run make envtest)"
PY=".venv/bin/python"
[ -x "$PY" ] || PY=python3

repo="${CAPL_RELEASE_DIR:-out}/infrastructure-libvirt"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# metadata.yaml must declare the current release series, or clusterctl refuses the version;
# the next minor's metadata.yaml adds its series (clusterctl reads the newest release's
# metadata.yaml to plan an upgrade: it must cover both versions).
"$PY" - metadata.yaml "$major" "$minor" "$tmp/next-metadata.yaml" <<'PYTHON' || die "metadata.yaml: see above"
import sys, yaml
path, major, minor, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
metadata = yaml.safe_load(open(path))
series = metadata.get("releaseSeries") or []
current = [s for s in series if (s.get("major"), s.get("minor")) == (major, minor)]
if not current:
    sys.exit(f"error: {path} has no releaseSeries entry for {major}.{minor}")
if not any((s.get("major"), s.get("minor")) == (major, minor + 1) for s in series):
    series.append({"major": major, "minor": minor + 1, "contract": current[0]["contract"]})
metadata["releaseSeries"] = series
with open(out, "w") as f:
    f.write(f"# metadata.yaml of this tree with the {major}.{minor + 1} series added "
            "(hack/release-manifests.sh)\n")
    yaml.safe_dump(metadata, f, sort_keys=False)
PYTHON

"$KUBECTL" kustomize config/default >"$tmp/raw.yaml" || die "kubectl kustomize config/default failed"

# write_release VERSION METADATA: out/infrastructure-libvirt/vVERSION/
write_release() {
	local v="$1" metadata="$2" image out
	image="${CAPL_IMAGE:-ghcr.io/capl-dev/capl:v$v}"
	out="$repo/v$v"
	sed "s#image: capl-manager:dev\$#image: $image#" "$tmp/raw.yaml" >"$tmp/infrastructure-components.yaml"
	# clusterctl's expectations of a components file.
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
	cp "$metadata" "$out/metadata.yaml"
	cp templates/cluster-template*.yaml templates/clusterclass-*.yaml "$out/"
	note "wrote $out ($(ls "$out" | tr '\n' ' '))"
}

write_release "$next" "$tmp/next-metadata.yaml"
write_release "$version" metadata.yaml
echo "$repo/v$version"
