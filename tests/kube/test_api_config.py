"""The shipped manifests against the test bed's kubectl and kube-apiserver.

- `kubectl apply --server-side -k config/default` succeeds. cert-manager is not part of the
  test bed, so the test first installs two stand-in CRDs for its Issuer and Certificate kinds
  (schema-less): that way the *shipped* kustomization is applied unmodified, instead of a
  test-only overlay that could drift from it. The Deployment stays unscheduled (no kubelet).
  Everything cluster-scoped the apply created (the webhook configurations above all: they
  point at a Service without endpoints and would fail every later request) is deleted
  again, also when an assertion fails.
- `make release-manifests` output is a clusterctl local repository: its structure is checked
  here, clusterctl itself parses it (when the Cluster API part of the test bed is built),
  and the cluster templates, rendered with clusterctl's variable rules, are accepted by the
  API server in a server-side dry run.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from capl import __version__, api
from capl.api.kinds import KINDS, KINDS_BY_NAME
from capl.api.rbac import MANAGER_RULES
from capl.testbed import ControlPlane, ControlPlaneError
from tests.fixtures.common import require_part

pytestmark = pytest.mark.apiserver

REPO = Path(__file__).resolve().parents[2]

CERT_MANAGER_STUB_CRDS = [
    {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.cert-manager.io"},
        "spec": {
            "group": "cert-manager.io",
            "scope": "Namespaced",
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
            },
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "x-kubernetes-preserve-unknown-fields": True,
                        }
                    },
                }
            ],
        },
    }
    for kind, plural in (("Issuer", "issuers"), ("Certificate", "certificates"))
]


def kustomize_default(control_plane: ControlPlane) -> list[dict[str, Any]]:
    out = subprocess.run(
        [str(control_plane.assets.kubectl), "kustomize", str(REPO / "config" / "default")],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return [d for d in yaml.safe_load_all(out) if d]


@pytest.fixture
async def cert_manager_stubs(control_plane: ControlPlane) -> AsyncIterator[None]:
    manifest = yaml.safe_dump_all(CERT_MANAGER_STUB_CRDS).encode()
    await control_plane.kubectl("apply", "--server-side", "-f", "-", stdin=manifest)
    await control_plane.kubectl(
        "wait", "--for=condition=Established", "--timeout=60s",
        "crd/issuers.cert-manager.io", "crd/certificates.cert-manager.io",
    )  # fmt: skip
    yield
    await control_plane.kubectl(
        "delete", "--ignore-not-found", "--wait=false",
        "crd/issuers.cert-manager.io", "crd/certificates.cert-manager.io",
    )  # fmt: skip


def test_kustomize_output_is_what_clusterctl_expects(control_plane: ControlPlane) -> None:
    docs = kustomize_default(control_plane)
    kinds = [d["kind"] for d in docs]
    assert kinds.count("Namespace") == 1
    (ns,) = [d for d in docs if d["kind"] == "Namespace"]
    assert ns["metadata"]["name"] == "capl-system"
    for doc in docs:
        assert doc["metadata"]["labels"][api.PROVIDER_LABEL] == api.PROVIDER_NAME, doc["kind"]
        if doc["kind"] not in (
            "Namespace",
            "CustomResourceDefinition",
            "ClusterRole",
            "ClusterRoleBinding",
            "MutatingWebhookConfiguration",
            "ValidatingWebhookConfiguration",
        ):
            assert doc["metadata"]["namespace"] == "capl-system", doc["kind"]
        assert (
            doc["metadata"]["name"].startswith("capl-") or doc["kind"] == "CustomResourceDefinition"
        )
    crds = [d for d in docs if d["kind"] == "CustomResourceDefinition"]
    assert sorted(c["metadata"]["name"] for c in crds) == sorted(i.crd_name for i in KINDS)
    for crd in crds:
        assert crd["metadata"]["labels"][api.CONTRACT_LABEL] == "v1alpha1"
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["name"] == "manager"
    assert container["command"] == ["capl", "manager"]
    assert set(container["args"]) == {
        "--leader-elect",
        "--metrics-bind-address=:8080",
        "--health-probe-bind-address=:9440",
        "--webhook-port=9443",
        "--webhook-cert-dir=/tmp/k8s-webhook-server/serving-certs",
    }
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["livenessProbe"]
    assert container["readinessProbe"]
    assert container["resources"]
    assert pod["serviceAccountName"] == "capl-controller-manager"
    (certificate,) = [d for d in docs if d["kind"] == "Certificate"]
    assert certificate["spec"]["dnsNames"] == [
        "capl-webhook-service.capl-system.svc",
        "capl-webhook-service.capl-system.svc.cluster.local",
    ]
    assert certificate["spec"]["issuerRef"]["name"] == "capl-selfsigned-issuer"
    secret_volumes = [v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v]
    assert secret_volumes == [certificate["spec"]["secretName"]]
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        (config,) = [d for d in docs if d["kind"] == kind]
        annotation = config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
        assert annotation == "capl-system/capl-serving-cert"
        for hook in config["webhooks"]:
            service = hook["clientConfig"]["service"]
            assert (service["name"], service["namespace"]) == (
                "capl-webhook-service",
                "capl-system",
            )
    (role,) = [d for d in docs if d["kind"] == "ClusterRole"]
    assert len(role["rules"]) == len(MANAGER_RULES)


async def test_default_kustomization_applies_server_side(
    control_plane: ControlPlane, cert_manager_stubs: None
) -> None:
    docs = kustomize_default(control_plane)
    cluster_scoped = [
        f"{d['kind'].lower()}/{d['metadata']['name']}"
        for d in docs
        if d["kind"]
        in (
            "MutatingWebhookConfiguration",
            "ValidatingWebhookConfiguration",
            "ClusterRole",
            "ClusterRoleBinding",
        )
    ]
    try:
        out = await control_plane.kubectl(
            "apply", "--server-side", "-k", str(REPO / "config" / "default"), "-o", "name"
        )
        applied = out.split()
        assert len(applied) == len(docs)
        deployment = json.loads(
            await control_plane.kubectl(
                "get", "-n", "capl-system", "deployment/capl-controller-manager", "-o", "json"
            )
        )
        assert deployment["spec"]["template"]["spec"]["containers"][0]["name"] == "manager"
        role = json.loads(
            await control_plane.kubectl("get", "clusterrole/capl-manager-role", "-o", "json")
        )
        assert len(role["rules"]) == len(MANAGER_RULES)
        certificate = json.loads(
            await control_plane.kubectl(
                "get",
                "-n",
                "capl-system",
                "certificates.cert-manager.io/capl-serving-cert",
                "-o",
                "json",
            )
        )
        assert certificate["spec"]["secretName"] == "capl-webhook-server-cert"
        # Applying again is a no-op, as it must be for `clusterctl upgrade`-style re-applies.
        again = await control_plane.kubectl(
            "apply", "--server-side", "-k", str(REPO / "config" / "default")
        )
        assert "serverside-applied" in again
    finally:
        await control_plane.kubectl("delete", "--ignore-not-found", "--wait=false", *cluster_scoped)
        await control_plane.kubectl(
            "delete", "--ignore-not-found", "--wait=false", "namespace/capl-system"
        )
        await _until_webhooks_are_gone(control_plane)


async def _until_webhooks_are_gone(control_plane: ControlPlane) -> None:
    """kube-apiserver drops deleted webhook configurations from its informer asynchronously:
    wait until a request of our kinds no longer reaches the (unreachable) shipped webhooks,
    so the next test does not fail on a stale one."""
    probe = yaml.safe_dump(
        {
            "apiVersion": api.API_VERSION,
            "kind": "LibvirtCluster",
            "metadata": {"name": "webhook-probe", "namespace": "default"},
            "spec": {
                "hosts": [{"name": "h", "uri": "test:///default"}],
                "network": {"name": "probe-net"},
            },
        }
    ).encode()
    async with asyncio.timeout(60):
        while True:
            try:
                await control_plane.kubectl("create", "--dry-run=server", "-f", "-", stdin=probe)
                return
            except ControlPlaneError as e:
                if "webhook" not in str(e):
                    raise
                await asyncio.sleep(0.1)


# --- release manifests -----------------------------------------------------------------------

CLUSTERCTL_VARIABLE = re.compile(r"\$\{\s*([A-Z0-9_]+)\s*(?::=([^}]*))?\}")

REQUIRED_VARIABLES = {
    "CLUSTER_NAME",
    "NAMESPACE",
    "KUBERNETES_VERSION",
    "CONTROL_PLANE_MACHINE_COUNT",
    "WORKER_MACHINE_COUNT",
    "LIBVIRT_URI",
    "LIBVIRT_IMAGE_URL",
    "LIBVIRT_NETWORK_CIDR",
}


def render(text: str, values: dict[str, str]) -> str:
    """clusterctl's substitution: `${VAR}` from values, `${VAR:=default}` falls back."""

    def one(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if name in values:
            return values[name]
        if default is not None:
            return default
        raise KeyError(f"variable {name} has no value and no default")

    return CLUSTERCTL_VARIABLE.sub(one, text)


@pytest.fixture(scope="module")
def release_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    if not assets:
        require_part("kubectl of the test bed", "set KUBEBUILDER_ASSETS (make envtest)")
    out = tmp_path_factory.mktemp("release")
    result = subprocess.run(
        [str(REPO / "hack" / "release-manifests.sh")],
        env={**os.environ, "CAPL_RELEASE_DIR": str(out), "KUBEBUILDER_ASSETS": str(assets)},
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    version_dir = out / "infrastructure-libvirt" / f"v{__version__}"
    assert result.stdout.strip().endswith(f"infrastructure-libvirt/v{__version__}")
    return version_dir


def test_release_repository_layout(release_dir: Path) -> None:
    assert sorted(p.name for p in release_dir.iterdir()) == [
        "cluster-template-cloudinit.yaml",
        "cluster-template-offline-kcp.yaml",
        "cluster-template-offline.yaml",
        "cluster-template-testbed.yaml",
        "cluster-template-topology.yaml",
        "cluster-template.yaml",
        "clusterclass-libvirt.yaml",
        "infrastructure-components.yaml",
        "metadata.yaml",
    ]
    metadata = yaml.safe_load((release_dir / "metadata.yaml").read_text())
    assert metadata["apiVersion"] == "clusterctl.cluster.x-k8s.io/v1alpha3"
    assert metadata["kind"] == "Metadata"
    major, minor, _ = (int(x) for x in __version__.split("."))
    assert {"major": major, "minor": minor, "contract": "v1beta2"} in metadata["releaseSeries"]
    components = (release_dir / "infrastructure-components.yaml").read_text()
    docs = [d for d in yaml.safe_load_all(components) if d]
    assert [d["kind"] for d in docs].count("Namespace") == 1
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["name"] == "manager"
    assert container["image"] == f"ghcr.io/capl-dev/capl:v{__version__}"
    assert "capl-manager:dev" not in components


def test_release_repository_carries_the_next_minor_made_from_the_same_tree(
    release_dir: Path,
) -> None:
    """The second release series (for `clusterctl upgrade`, tests/e2e/test_clusterctl_upgrade.py):
    vX.(Y+1).0 beside vX.Y.Z, the same files, the components identical but for the image tag,
    and a metadata.yaml that declares both series (clusterctl plans from the newest one's)."""
    major, minor, _ = (int(x) for x in __version__.split("."))
    following = f"{major}.{minor + 1}.0"
    next_dir = release_dir.parent / f"v{following}"
    assert sorted(release_dir.parent.iterdir()) == sorted([release_dir, next_dir])
    assert sorted(p.name for p in next_dir.iterdir()) == sorted(
        p.name for p in release_dir.iterdir()
    )
    current = (release_dir / "infrastructure-components.yaml").read_text()
    upgraded = (next_dir / "infrastructure-components.yaml").read_text()
    assert f"ghcr.io/capl-dev/capl:v{following}" in upgraded
    assert upgraded.replace(f"capl:v{following}", f"capl:v{__version__}") == current
    for template in release_dir.glob("cluster-template*.yaml"):
        assert (next_dir / template.name).read_text() == template.read_text()
    metadata = yaml.safe_load((next_dir / "metadata.yaml").read_text())
    assert metadata["apiVersion"] == "clusterctl.cluster.x-k8s.io/v1alpha3"
    series = [(s["major"], s["minor"], s["contract"]) for s in metadata["releaseSeries"]]
    assert series == [(major, minor, "v1beta2"), (major, minor + 1, "v1beta2")]


@pytest.mark.parametrize("flavor", ["cluster-template.yaml", "cluster-template-cloudinit.yaml"])
def test_cluster_templates_use_the_clusterctl_variables(release_dir: Path, flavor: str) -> None:
    text = (release_dir / flavor).read_text()
    assert text == (REPO / "templates" / flavor).read_text()  # placeholders intact
    used = {m.group(1) for m in CLUSTERCTL_VARIABLE.finditer(text)}
    assert used >= REQUIRED_VARIABLES
    docs = [d for d in yaml.safe_load_all(render(text, SAMPLE_VALUES)) if d]
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == sorted(
        [
            "Cluster",
            "LibvirtCluster",
            "KubeadmControlPlane",
            "LibvirtMachineTemplate",
            "LibvirtMachineTemplate",
            "MachineDeployment",
            "KubeadmConfigTemplate",
        ]
    )
    for doc in docs:
        assert doc["metadata"]["namespace"] == "demo-ns"
        if doc["kind"] in KINDS_BY_NAME:
            KINDS_BY_NAME[doc["kind"]].model.model_validate(doc)
    (kcp,) = [d for d in docs if d["kind"] == "KubeadmControlPlane"]
    assert kcp["spec"]["replicas"] == 3
    ignition = "ignition" in kcp["spec"]["kubeadmConfigSpec"]
    assert ignition == (flavor == "cluster-template.yaml")


SAMPLE_VALUES = {
    "CLUSTER_NAME": "demo",
    "NAMESPACE": "demo-ns",
    "KUBERNETES_VERSION": "v1.35.4",
    "CONTROL_PLANE_MACHINE_COUNT": "3",
    "WORKER_MACHINE_COUNT": "2",
    "LIBVIRT_IMAGE_URL": "https://images.example.invalid/node.qcow2",
}


@pytest.mark.parametrize("flavor", ["cluster-template.yaml", "cluster-template-cloudinit.yaml"])
async def test_rendered_templates_pass_the_api_server(
    control_plane: ControlPlane, namespace: str, release_dir: Path, flavor: str
) -> None:
    """Our kinds always; Cluster API's kinds when the test bed has their CRDs (CAPL_CAPI_DIR)."""
    values = {**SAMPLE_VALUES, "NAMESPACE": namespace}
    docs = [d for d in yaml.safe_load_all(render((release_dir / flavor).read_text(), values)) if d]
    capi_dir = os.environ.get("CAPL_CAPI_DIR")
    check = [d for d in docs if d["apiVersion"] == api.API_VERSION]
    if capi_dir:
        bases = Path(capi_dir) / "config" / "crd" / "bases"
        await _install_crds(
            control_plane,
            [bases / f"cluster.x-k8s.io_{p}.yaml" for p in ("clusters", "machinedeployments")],
        )
        check += [d for d in docs if d["kind"] in ("Cluster", "MachineDeployment")]
    out = await control_plane.kubectl(
        "create", "--dry-run=server", "-o", "name", "-f", "-",
        stdin=yaml.safe_dump_all(check).encode(),
    )  # fmt: skip
    assert len(out.split()) == len(check)


async def _install_crds(control_plane: ControlPlane, files: list[Path]) -> None:
    """Cluster API's CRDs as the test bed installs CRDs (same field manager, idempotent)."""
    args = [a for f in files for a in ("-f", str(f))]
    out = await control_plane.kubectl(
        "apply", "--server-side", "--force-conflicts", "--field-manager=capl-testbed",
        "-o", "name", *args,
    )  # fmt: skip
    await control_plane.kubectl(
        "wait", "--for=condition=Established", "--timeout=60s", *out.split()
    )


def test_clusterctl_parses_the_repository(release_dir: Path, tmp_path: Path) -> None:
    capi_dir = os.environ.get("CAPL_CAPI_DIR")
    if not capi_dir:
        require_part("clusterctl", "set CAPL_CAPI_DIR (make capi)")
    clusterctl = Path(str(capi_dir)) / "bin" / "clusterctl"
    config = tmp_path / "clusterctl.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "providers": [
                    {
                        "name": "libvirt",
                        "type": "InfrastructureProvider",
                        "url": str(release_dir / "infrastructure-components.yaml"),
                    }
                ]
            }
        )
    )
    env = {
        **os.environ,
        "HOME": str(tmp_path),
        "CLUSTERCTL_DISABLE_VERSIONCHECK": "true",
        **SAMPLE_VALUES,
    }
    provider = f"libvirt:v{__version__}"

    def run(*args: str) -> str:
        result = subprocess.run(
            [str(clusterctl), *args, "--config", str(config)],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        assert result.returncode == 0, f"clusterctl {' '.join(args)}: {result.stderr}"
        return result.stdout

    described = run("generate", "provider", "--infrastructure", provider, "--describe")
    assert "TargetNamespace:    capl-system" in described
    components = [
        d
        for d in yaml.safe_load_all(run("generate", "provider", "--infrastructure", provider))
        if d
    ]
    assert sum(d["kind"] == "Namespace" for d in components) == 1
    for flavor in ("", "cloudinit"):
        args = [
            "generate",
            "cluster",
            "demo",
            "--infrastructure",
            provider,
            "--target-namespace",
            "demo-ns",
        ]
        args += ["--kubernetes-version", "v1.35.4", "--control-plane-machine-count", "1"]
        args += ["--worker-machine-count", "2"]
        if flavor:
            args += ["--flavor", flavor]
        docs = [d for d in yaml.safe_load_all(run(*args)) if d]
        assert {d["metadata"]["namespace"] for d in docs} == {"demo-ns"}
        (lvc,) = [d for d in docs if d["kind"] == "LibvirtCluster"]
        assert lvc["spec"]["hosts"][0]["uri"] == "qemu:///system"
        assert lvc["spec"]["network"]["cidr"] == "192.168.150.0/24"
        listed = run(
            "generate", "cluster", "demo", "--infrastructure", provider,
            "--target-namespace", "demo-ns", "--list-variables",
            *(["--flavor", flavor] if flavor else []),
        )  # fmt: skip
        assert "LIBVIRT_IMAGE_URL" in listed
