"""The real Cluster API beside the test bed's kube-apiserver: its core manager and clusterctl.

Both are the unmodified Go programs that `make capi` builds (hack/capi.sh) into
`$CAPL_CACHE/capi/<version>/`: `bin/cluster-api-manager`, `bin/clusterctl` and `config/`, the
module's own kustomize tree (CRDs, webhook manifests, RBAC, the manager Deployment); beside
them the kubeadm bootstrap and control-plane managers with their trees
(`bootstrap/kubeadm/config/`, `controlplane/kubeadm/config/`), which
`capl.testbed.kubeadm_providers` runs the same way (`ProviderComponents` says where each
provider of the release lives).

`CapiCore` runs the core manager as a local process against a `ControlPlane`, the way envtest
runs webhooks for controller tests (`ProviderManager`, its base, is shared with the kubeadm
managers): there is no kubelet, no Service routing and no cert-manager here, so

- the CRDs and the mutating/validating webhook configurations are taken from
  `kubectl kustomize config/default` (exactly what clusterctl would install, same names),
  and every `clientConfig` is rewritten from a Service reference to
  `url: https://127.0.0.1:<webhook-port><path>` with the bundle of a CA made for this
  instance; objects that already exist (installed by `clusterctl init`, or by an earlier
  start) keep everything else and only get their clientConfig replaced;
- the manager serves its webhooks with a certificate for 127.0.0.1 from a private
  `--webhook-cert-dir`, health on `--health-addr`, metrics on `--diagnostics-address` with
  `--insecure-diagnostics` (plain HTTP), all on free loopback ports, `--leader-elect=false`;
- it is ready when its `/readyz` passes *and* kube-apiserver can call its webhooks: a
  server-side dry-run create of a v1beta2 Cluster (mutating + validating admission) and of a
  v1beta1 MachineDrainRule (conversion) must both succeed.

The manager has no flag for its webhook listen address, so its webhook port listens on every
interface (health and metrics are bound to 127.0.0.1).

Ports and the CA survive `restart()`, so the installed objects stay valid; a lost port race on
the first start is retried with fresh ports. The process is a `ManagedProcess` (own process
group, dies with its parent); failures carry the tail of its log.

`Clusterctl` runs clusterctl with a private HOME / XDG config / cache (never ~/.cluster-api),
`CLUSTERCTL_DISABLE_VERSIONCHECK=true`, and a local repository it writes itself:
`<workdir>/repository/cluster-api/<version>/{core-components.yaml,metadata.yaml}` (the core
components are the same kustomize output), likewise `bootstrap-kubeadm/<version>/` and
`control-plane-kubeadm/<version>/` (provider name `kubeadm`, when the build has their trees;
the release's one metadata.yaml for each), plus the providers given to it (capl's
`out/infrastructure-libvirt/<version>/` from `make release-manifests`), all registered in a
`clusterctl.yaml` under `providers:`.

Decisions for `clusterctl init` on a kubelet-less test bed:
- cert-manager: `clusterctl init` first tries to create cert-manager's test resources (an
  Issuer and a Certificate in namespace cert-manager-test); when that succeeds it considers
  cert-manager installed and skips installing it. `install_cert_manager_crds` pre-installs
  stand-in CRDs of the cert-manager.io/v1 kinds (schemaless, no controller), which also lets
  the providers' Certificate/Issuer objects be created. They carry no
  `clusterctl.cluster.x-k8s.io/core: cert-manager` label, so clusterctl treats cert-manager as
  externally managed and never tries to upgrade it. With no namespace controller the deleted
  cert-manager-test namespace would stay Terminating and break the next `init`: `init`
  finalizes it (clusterctl has already deleted the two objects it created in it).
- bootstrap and control-plane providers: clusterctl adds kubeadm ones on the first `init`
  unless told otherwise; `init` passes `--bootstrap - --control-plane -` by default, the
  documented opt-out ("-" is clusterctl's no-op provider name): most workload clusters of the
  test bed take bootstrap data from Secrets they create (`bootstrap.dataSecretName`).
  `init(bootstrap=("kubeadm",), control_plane=("kubeadm",))` installs the kubeadm providers
  from the local repository instead.
- the providers' Deployments never run (no kubelet): run the managers as local processes and
  point their webhooks at loopback afterwards (`point_provider_webhooks`; `CapiCore.start`
  does it for the core provider, `KubeadmProviders.start` for the kubeadm ones). Run
  `clusterctl init` *before* starting them on the same control plane: clusterctl
  merge-patches existing CRDs, which would leave a CRD with both a Service and a URL in its
  conversion clientConfig (kube-apiserver rejects that, clusterctl retries for minutes);
  `init` refuses at once when it finds CRDs it did not install of a provider it installs.

Like the rest of capl.testbed this module uses kubectl and plain HTTP only, no Kubernetes
client library and no other capl layer.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Final, Self
from urllib.parse import urlsplit

import yaml

from capl.testbed.controlplane import ControlPlane, ControlPlaneError
from capl.testbed.localmanager import LocalManager
from capl.testbed.process import run_captured

log = logging.getLogger(__name__)

CAPI_DIR_ENV: Final = "CAPL_CAPI_DIR"
PROVIDER_LABEL: Final = "cluster.x-k8s.io/provider"
CORE_PROVIDER: Final = "cluster-api"
KUBEADM: Final = "kubeadm"
NOOP_PROVIDER: Final = "-"
CERT_MANAGER_TEST_NAMESPACE: Final = "cert-manager-test"
STAND_IN_LABEL: Final = "testbed.capl.dev/stand-in"

# Upstream defaults of v1.13 (config/manager/manager.yaml with no variables set), spelled
# out so a test run does not change behaviour when upstream flips a default.
DEFAULT_FEATURE_GATES: Final[Mapping[str, bool]] = {
    "MachinePool": True,
    "ClusterTopology": False,
    "RuntimeSDK": False,
    "MachineSetPreflightChecks": True,
}

_CRD = "customresourcedefinitions.apiextensions.k8s.io"
_MUTATING = "mutatingwebhookconfigurations.admissionregistration.k8s.io"
_VALIDATING = "validatingwebhookconfigurations.admissionregistration.k8s.io"
_RESOURCE_OF_KIND: Final = {
    "CustomResourceDefinition": _CRD,
    "MutatingWebhookConfiguration": _MUTATING,
    "ValidatingWebhookConfiguration": _VALIDATING,
}
_CA_INJECTION = "cert-manager.io/inject-ca-from"
_CLUSTERCTL_LABEL = "clusterctl.cluster.x-k8s.io"
_CONFLICT = re.compile(r"the object has been modified|AlreadyExists|already exists", re.I)
_VERSION_DIR = re.compile(r"^v\d+\.\d+\.\d+$")
_YAML_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class CapiError(RuntimeError):
    """Cluster API could not be installed, started or driven."""


class CapiMissing(CapiError):
    """The Cluster API binaries are not where CAPL_CAPI_DIR (or the caller) says."""


class ClusterctlFailed(CapiError):
    """clusterctl exited with an error (the message carries its output)."""


# ------------------------------------------------------------------------------ the build


@dataclass(frozen=True)
class ProviderComponents:
    """One provider of the Cluster API release: where its kustomize tree is in the module and
    where it goes in a clusterctl local repository."""

    name: str
    """clusterctl's provider name (`cluster-api`, `kubeadm`)."""
    type: str
    """clusterctl's provider type (CoreProvider, BootstrapProvider, ControlPlaneProvider)."""
    provider_id: str
    """`<type prefix>-<name>` (the core: `cluster-api`): the `cluster.x-k8s.io/provider` label
    of its objects and its directory in a local repository."""
    components_file: str
    config: str
    """Its `config/default` kustomization, relative to the module root (`CapiAssets.directory`)."""
    crd: str
    """One CRD it installs (tells whether it is installed, and by whom)."""
    manager: str
    """Its manager's binary in `<build>/bin/` (also the name of its local process)."""


CORE_COMPONENTS: Final = ProviderComponents(
    CORE_PROVIDER, "CoreProvider", CORE_PROVIDER, "core-components.yaml",
    "config/default", "clusters.cluster.x-k8s.io", "cluster-api-manager",
)  # fmt: skip
KUBEADM_BOOTSTRAP_COMPONENTS: Final = ProviderComponents(
    KUBEADM, "BootstrapProvider", "bootstrap-kubeadm", "bootstrap-components.yaml",
    "bootstrap/kubeadm/config/default", "kubeadmconfigs.bootstrap.cluster.x-k8s.io",
    "kubeadm-bootstrap-manager",
)  # fmt: skip
KUBEADM_CONTROL_PLANE_COMPONENTS: Final = ProviderComponents(
    KUBEADM, "ControlPlaneProvider", "control-plane-kubeadm", "control-plane-components.yaml",
    "controlplane/kubeadm/config/default", "kubeadmcontrolplanes.controlplane.cluster.x-k8s.io",
    "kubeadm-control-plane-manager",
)  # fmt: skip
CAPI_COMPONENTS: Final = (
    CORE_COMPONENTS,
    KUBEADM_BOOTSTRAP_COMPONENTS,
    KUBEADM_CONTROL_PLANE_COMPONENTS,
)


@dataclass(frozen=True, kw_only=True)
class CapiAssets:
    """What `make capi` builds: the binaries and the module's config trees."""

    directory: Path
    manager: Path
    clusterctl: Path
    config: Path
    version: str

    def binary(self, components: ProviderComponents) -> Path:
        """The manager of one provider of the release."""
        return self.directory / "bin" / components.manager

    def kustomization(self, components: ProviderComponents) -> Path:
        """The `config/default` directory of one provider of the release."""
        return self.directory / components.config

    def has(self, components: ProviderComponents) -> bool:
        """Whether the build carries that provider's kustomize tree."""
        return (self.kustomization(components) / "kustomization.yaml").is_file()


def find_capi(directory: str | os.PathLike[str] | None = None) -> CapiAssets:
    """Locate the Cluster API build in `directory`, else in $CAPL_CAPI_DIR."""
    where = os.fspath(directory) if directory is not None else os.environ.get(CAPI_DIR_ENV, "")
    if not where:
        raise CapiMissing(
            f"{CAPI_DIR_ENV} is not set: run `make capi` and set {CAPI_DIR_ENV} to the "
            "directory it prints last"
        )
    root = Path(where)
    manager = root / "bin" / "cluster-api-manager"
    clusterctl = root / "bin" / "clusterctl"
    config = root / "config"
    missing = [str(p) for p in (manager, clusterctl) if not os.access(p, os.X_OK)]
    if not (config / "default" / "kustomization.yaml").is_file():
        missing.append(str(config / "default" / "kustomization.yaml"))
    if missing:
        raise CapiMissing(
            f"{', '.join(missing)} not found ({CAPI_DIR_ENV}={root}): run `make capi` to build "
            "the Cluster API core manager and clusterctl"
        )
    return CapiAssets(
        directory=root,
        manager=manager,
        clusterctl=clusterctl,
        config=config,
        version=_capi_version(root, clusterctl),
    )


def _capi_version(root: Path, clusterctl: Path) -> str:
    if _VERSION_DIR.match(root.name):  # hack/capi.sh keys its output by version
        return root.name
    out = subprocess.run(
        [str(clusterctl), "version", "-o", "short"],
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
        env=_base_env(),
    )
    version = out.stdout.strip()
    if out.returncode != 0 or not _VERSION_DIR.match(version):
        raise CapiMissing(f"cannot tell the version of {clusterctl}: {out.stderr.strip()}")
    return version


def _base_env() -> dict[str, str]:
    """A minimal environment for children: no KUBECONFIG, no stray clusterctl variables."""
    keep = ("PATH", "LANG", "LC_ALL", "TMPDIR", "TZ")
    return {k: os.environ[k] for k in keep if k in os.environ}


# ------------------------------------------------------------------------------ manifests


def parse_manifests(text: str) -> list[dict[str, Any]]:
    """The objects of a multi-document YAML stream (empty documents dropped)."""
    return [d for d in yaml.load_all(text, Loader=_YAML_LOADER) if isinstance(d, dict)]


async def render_kustomization(*, kubectl: Path, directory: Path) -> str:
    """`kubectl kustomize <directory>` (YAML text)."""
    rc, out, err = await run_captured(
        [str(kubectl), "kustomize", str(directory)], env=_base_env(), within=120
    )
    if rc != 0:
        raise CapiError(f"kubectl kustomize {directory} failed: {err.strip()}")
    return out


def provider_webhook_objects(manifests: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The CRDs and admission webhook configurations among a provider's manifests."""
    return [dict(m) for m in manifests if m.get("kind") in _RESOURCE_OF_KIND]


def loopback_client_config(*, base_url: str, path: str, ca_bundle: str) -> dict[str, Any]:
    """A webhook clientConfig calling `base_url + path` and trusting `ca_bundle` (base64)."""
    return {"url": f"{base_url.rstrip('/')}{path}", "caBundle": ca_bundle}


def _client_config_path(config: Mapping[str, Any], default: str) -> str:
    service = config.get("service")
    if isinstance(service, Mapping) and service.get("path"):
        return str(service["path"])
    if config.get("url"):
        return urlsplit(str(config["url"])).path or default
    return default


def point_object_at(obj: dict[str, Any], *, base_url: str, ca_bundle: str) -> bool:
    """Rewrite the clientConfig(s) of a CRD's conversion webhook or of an admission webhook
    configuration to call `base_url` (same paths); in place. Returns whether it changed.

    Objects without webhooks (a CRD with conversion strategy None) are left alone.
    """
    changed = False
    kind = obj.get("kind")
    if kind == "CustomResourceDefinition":
        conversion = obj.get("spec", {}).get("conversion") or {}
        if conversion.get("strategy") != "Webhook":
            return False
        webhook = conversion.setdefault("webhook", {})
        old = webhook.get("clientConfig") or {}
        new = loopback_client_config(
            base_url=base_url, path=_client_config_path(old, "/convert"), ca_bundle=ca_bundle
        )
        if old != new:
            webhook["clientConfig"] = new
            changed = True
    elif kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        for hook in obj.get("webhooks") or []:
            old = hook.get("clientConfig") or {}
            new = loopback_client_config(
                base_url=base_url, path=_client_config_path(old, "/"), ca_bundle=ca_bundle
            )
            if old != new:
                hook["clientConfig"] = new
                changed = True
    return changed


def _as_list(items: Sequence[Mapping[str, Any]]) -> bytes:
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": list(items)}).encode()


def _items(listing: str) -> list[dict[str, Any]]:
    """The objects of `kubectl get -o json` output (a List, one object, or nothing)."""
    if not listing.strip():
        return []
    parsed: dict[str, Any] = json.loads(listing)
    if parsed.get("kind") == "List" or "items" in parsed:
        return list(parsed.get("items") or [])
    return [parsed]


def _key(obj: Mapping[str, Any]) -> tuple[str, str]:
    return str(obj.get("kind")), str(obj.get("metadata", {}).get("name"))


async def point_provider_webhooks(
    plane: ControlPlane,
    *,
    provider: str,
    base_url: str,
    ca_pem: bytes,
    manifests: Sequence[Mapping[str, Any]] = (),
    within: float = 60.0,
    attempts: int = 5,
) -> list[str]:
    """Make a provider's CRD conversion and admission webhooks call `base_url`.

    Every CRD and (mutating/validating) webhook configuration labelled
    `cluster.x-k8s.io/provider=<provider>`, plus those in `manifests` (created when absent),
    gets its clientConfig(s) replaced by a URL on `base_url` with `ca_pem` as CA bundle; all
    other fields of existing objects (clusterctl's labels, annotations) stay as they are.
    Waits until the CRDs are Established and returns their names.
    """
    ca_bundle = base64.b64encode(ca_pem).decode()
    wanted = {_key(m): dict(m) for m in provider_webhook_objects(manifests)}
    for attempt in range(1, attempts + 1):
        existing: dict[tuple[str, str], dict[str, Any]] = {}
        listing = await plane.kubectl(
            "get", f"{_CRD},{_MUTATING},{_VALIDATING}", "-l", f"{PROVIDER_LABEL}={provider}",
            "-o", "json",
        )  # fmt: skip
        for item in _items(listing):
            existing[_key(item)] = item
        named = [f"{_RESOURCE_OF_KIND[k]}/{n}" for k, n in wanted if (k, n) not in existing]
        if named:
            listing = await plane.kubectl("get", *named, "--ignore-not-found", "-o", "json")
            for item in _items(listing):
                existing[_key(item)] = item

        to_create: list[dict[str, Any]] = []
        for key, manifest in wanted.items():
            if key in existing:
                continue
            obj = json.loads(json.dumps(manifest))
            obj.get("metadata", {}).get("annotations", {}).pop(_CA_INJECTION, None)
            point_object_at(obj, base_url=base_url, ca_bundle=ca_bundle)
            to_create.append(obj)
        to_replace: list[dict[str, Any]] = []
        for obj in existing.values():
            obj.get("metadata", {}).pop("managedFields", None)
            if point_object_at(obj, base_url=base_url, ca_bundle=ca_bundle):
                to_replace.append(obj)
        try:
            if to_create:
                await plane.kubectl("create", "-f", "-", "-o", "name", stdin=_as_list(to_create))
            if to_replace:
                await plane.kubectl("replace", "-f", "-", "-o", "name", stdin=_as_list(to_replace))
        except ControlPlaneError as e:
            if attempt < attempts and _CONFLICT.search(str(e)):
                log.info("webhook objects of %s changed meanwhile; retrying", provider)
                continue
            raise
        crds = sorted({n for k, n in [*existing, *wanted] if k == "CustomResourceDefinition"})
        if crds:
            await plane.kubectl(
                "wait", "--for=condition=Established", f"--timeout={within:.0f}s",
                *(f"{_CRD}/{n}" for n in crds), within=within + 30,
            )  # fmt: skip
        log.info(
            "%s webhooks point at %s (%d created, %d re-pointed)",
            provider, base_url, len(to_create), len(to_replace),
        )  # fmt: skip
        return crds
    raise AssertionError("not reached")  # pragma: no cover


async def finalize_namespace(plane: ControlPlane, name: str) -> bool:
    """Finish deleting a Terminating namespace that holds nothing any more.

    The test bed has no namespace controller, so a deleted namespace stays Terminating with
    its `kubernetes` finalizer; this does the controller's last step. Returns whether the
    namespace was finalized (False: absent or not being deleted).
    """
    raw = await plane.kubectl("get", "namespace", name, "--ignore-not-found", "-o", "json")
    if not raw.strip():
        return False
    namespace = json.loads(raw)
    if not namespace.get("metadata", {}).get("deletionTimestamp"):
        return False
    namespace.setdefault("spec", {})["finalizers"] = []
    namespace.get("metadata", {}).pop("managedFields", None)
    await plane.kubectl(
        "replace", "--raw", f"/api/v1/namespaces/{name}/finalize", "-f", "-",
        stdin=json.dumps(namespace).encode(),
    )  # fmt: skip
    return True


# ------------------------------------------------------------------------------ cert-manager


_CERT_MANAGER_KINDS: Final[tuple[tuple[str, str, str, list[str]], ...]] = (
    # kind, plural, scope, short names
    ("Certificate", "certificates", "Namespaced", ["cert", "certs"]),
    ("CertificateRequest", "certificaterequests", "Namespaced", ["cr", "crs"]),
    ("Issuer", "issuers", "Namespaced", []),
    ("ClusterIssuer", "clusterissuers", "Cluster", []),
)


def cert_manager_crds() -> list[dict[str, Any]]:
    """Stand-in CRDs for the cert-manager.io/v1 kinds providers ship (schemaless, no
    controller behind them): enough for clusterctl's cert-manager check and for creating the
    providers' Certificate and Issuer objects, which nothing here acts on."""
    crds = []
    for kind, plural, scope, short in _CERT_MANAGER_KINDS:
        names: dict[str, Any] = {
            "kind": kind,
            "listKind": f"{kind}List",
            "plural": plural,
            "singular": kind.lower(),
            "categories": ["cert-manager"],
        }
        if short:
            names["shortNames"] = short
        crds.append(
            {
                "apiVersion": "apiextensions.k8s.io/v1",
                "kind": "CustomResourceDefinition",
                "metadata": {
                    "name": f"{plural}.cert-manager.io",
                    "labels": {STAND_IN_LABEL: "cert-manager"},
                },
                "spec": {
                    "group": "cert-manager.io",
                    "names": names,
                    "scope": scope,
                    "versions": [
                        {
                            "name": "v1",
                            "served": True,
                            "storage": True,
                            "subresources": {"status": {}},
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
        )
    return crds


async def install_cert_manager_crds(plane: ControlPlane, *, within: float = 60.0) -> list[str]:
    """Install the stand-in cert-manager CRDs (idempotent); returns their names."""
    crds = cert_manager_crds()
    await plane.kubectl(
        "apply", "--server-side", "--force-conflicts", "--field-manager=capl-testbed",
        "-f", "-", stdin=_as_list(crds),
    )  # fmt: skip
    names = [c["metadata"]["name"] for c in crds]
    await plane.kubectl(
        "wait", "--for=condition=Established", f"--timeout={within:.0f}s",
        *(f"{_CRD}/{n}" for n in names), within=within + 30,
    )  # fmt: skip
    return names


# ------------------------------------------------------------------------------ core manager


# Objects for server-side dry-run creates that go through the core webhooks: a v1beta2
# Cluster (mutating and validating admission) and a v1beta1 MachineDrainRule (stored as
# v1beta2, so kube-apiserver calls the conversion webhook; a v1beta1 Cluster would not do,
# its conversion looks up the CRD of the infrastructure kind it references).
_PROBES: Final = (
    (
        "admission webhooks",
        {
            "apiVersion": "cluster.x-k8s.io/v1beta2",
            "kind": "Cluster",
            "metadata": {"name": "capl-testbed-probe", "namespace": "default"},
            "spec": {
                "paused": True,
                "infrastructureRef": {
                    "apiGroup": "infrastructure.cluster.x-k8s.io",
                    "kind": "ProbeCluster",
                    "name": "probe",
                },
            },
        },
    ),
    (
        "conversion webhook",
        {
            "apiVersion": "cluster.x-k8s.io/v1beta1",
            "kind": "MachineDrainRule",
            "metadata": {"name": "capl-testbed-probe", "namespace": "default"},
            "spec": {"drain": {"behavior": "Skip"}},
        },
    ),
)
# Errors that mean kube-apiserver could not (yet) reach a webhook, as opposed to a webhook
# that answered and rejected the probe (a bug in the probe: fail at once).
_WEBHOOK_UNREACHABLE = re.compile(r"failed calling webhook|conversion webhook for", re.I)


class ProviderManager(LocalManager):
    """A Cluster API provider's manager as a local process against one `ControlPlane`: the
    core manager (`CapiCore`) and the kubeadm bootstrap and control-plane managers
    (`capl.testbed.kubeadm_providers`). All three are the same kind of program (one Go module,
    the same manager flags), run the same way (see the module docstring): the provider's
    CRDs and webhook configurations from `kubectl kustomize <its config>/default`, pointed at
    the manager's loopback webhook port; ready when `/readyz` passes and the `probes`
    (server-side dry-run creates) go through its webhooks.

    A subclass names its provider (which says what to run) in class attributes.
    """

    error = CapiError
    components: ClassVar[ProviderComponents]
    title: ClassVar[str]
    workdir_name: ClassVar[str]
    """The default workdir is `<plane.workdir>/<workdir_name>`."""
    default_feature_gates: ClassVar[Mapping[str, bool]]
    probes: ClassVar[Sequence[tuple[str, Mapping[str, Any]]]]
    """(what, object) pairs for the dry-run creates of the readiness check."""

    def __init__(
        self,
        *,
        plane: ControlPlane,
        capi: CapiAssets | None = None,
        workdir: Path | None = None,
        feature_gates: Mapping[str, bool] | None = None,
        extra_args: Sequence[str] = (),
        verbosity: int = 2,
        ready_timeout: float = 180.0,
        stop_grace: float = 10.0,
    ) -> None:
        """Configure (nothing starts until `start`).

        capi: the build; default `find_capi()` ($CAPL_CAPI_DIR).
        workdir: certificates and logs; default `<plane.workdir>/<workdir_name>` (removed
            with the control plane's temporary directory).
        feature_gates: merged over `default_feature_gates`.
        ready_timeout: deadline in seconds for the manager to become ready.
        """
        super().__init__(
            plane=plane,
            name=self.components.manager,
            workdir=workdir,
            ca_name=f"capl-testbed-{self.components.provider_id}-webhook-ca",
            ready_timeout=ready_timeout,
            stop_grace=stop_grace,
        )
        self.capi = capi if capi is not None else find_capi()
        self.feature_gates = {**self.default_feature_gates, **(feature_gates or {})}
        self.extra_args = list(extra_args)
        self.verbosity = verbosity
        self._manifests: list[dict[str, Any]] | None = None
        self.timings: dict[str, float] = {}

    @property
    def binary(self) -> Path:
        return self.capi.binary(self.components)

    @property
    def provider(self) -> str:
        """The `cluster.x-k8s.io/provider` label of its CRDs and webhook configurations."""
        return self.components.provider_id

    @property
    def workdir(self) -> Path:
        if self._workdir is not None:
            return self._workdir
        return self.plane.workdir / self.workdir_name

    def argv(self) -> list[str]:
        gates = ",".join(f"{k}={str(v).lower()}" for k, v in sorted(self.feature_gates.items()))
        return [
            str(self.binary),
            f"--kubeconfig={self.plane.kubeconfig}",
            "--leader-elect=false",
            f"--webhook-port={self.webhook_port}",
            f"--webhook-cert-dir={self.cert_dir}",
            f"--health-addr=127.0.0.1:{self.health_port}",
            f"--diagnostics-address=127.0.0.1:{self.metrics_port}",
            "--insecure-diagnostics",
            f"--feature-gates={gates}",
            f"--v={self.verbosity}",
            *self.extra_args,
        ]

    def child_env(self) -> Mapping[str, str]:
        return _base_env()

    # ---------------------------------------------------------------- lifecycle

    async def manifests(self) -> list[dict[str, Any]]:
        """The provider's CRDs and webhook configurations (`kustomize <config>/default`)."""
        if self._manifests is None:
            text = await render_kustomization(
                kubectl=self.plane.assets.kubectl,
                directory=self.capi.kustomization(self.components),
            )
            self._manifests = provider_webhook_objects(parse_manifests(text))
        return self._manifests

    async def install(self) -> list[str]:
        """Create or re-point the provider's CRDs and webhook configurations at this manager."""
        self.prepare()
        return await point_provider_webhooks(
            self.plane,
            provider=self.provider,
            base_url=self.webhook_url,
            ca_pem=self.ca_pem,
            manifests=await self.manifests(),
        )

    async def _ports_changed(self) -> None:
        await self.install()

    async def start(self) -> None:
        """Install (or re-point) CRDs and webhooks, start the manager, wait until ready."""
        t0 = time.monotonic()
        self.prepare()
        await self.manifests()
        t1 = time.monotonic()
        await self.install()
        t2 = time.monotonic()
        await self.launch()
        t3 = time.monotonic()
        self.timings = {"render": t1 - t0, "install": t2 - t1, "manager": t3 - t2}
        log.info(
            "%s %s ready in %.1f s (render %.1f s, install %.1f s, manager %.1f s)",
            self.title, self.capi.version, t3 - t0, *self.timings.values(),
        )  # fmt: skip

    async def start_manager(self) -> None:
        """Start the manager process (again: same ports and certificates) and wait for it."""
        await self.launch()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # ---------------------------------------------------------------- readiness

    async def _ready_beyond_health(self) -> tuple[bool, str]:
        """kube-apiserver reaches the webhooks: every probe's dry-run create succeeds."""
        for what, probe in self.probes:
            try:
                await self.plane.kubectl(
                    "create", "--dry-run=server", "-o", "name", "-f", "-",
                    stdin=json.dumps(probe).encode(), within=30,
                )  # fmt: skip
            except ControlPlaneError as e:
                if not _WEBHOOK_UNREACHABLE.search(str(e)):
                    raise CapiError(f"the {what} probe was rejected: {e}") from e
                return False, f"{what} not reachable yet: {e}"
        return True, "ok"


class CapiCore(ProviderManager):
    """The Cluster API core manager as a local process against one `ControlPlane`
    (readiness: a v1beta2 Cluster for admission, a v1beta1 MachineDrainRule for conversion)."""

    components = CORE_COMPONENTS
    title = "Cluster API core"
    workdir_name = "capi-core"
    default_feature_gates = DEFAULT_FEATURE_GATES
    probes = _PROBES


# ------------------------------------------------------------------------------ clusterctl


@dataclass(frozen=True, kw_only=True)
class LocalProvider:
    """One provider release in a clusterctl local repository
    (`<dir>/<type>-<name>/<version>/<components file>` beside `metadata.yaml`)."""

    name: str
    type: str
    components: Path

    @property
    def version(self) -> str:
        return self.components.parent.name

    @property
    def directory(self) -> Path:
        return self.components.parent


def _semver_key(path: Path) -> tuple[int, ...]:
    return tuple(int(p) for p in path.name.lstrip("v").split("."))


def find_local_provider(
    repository: Path,
    *,
    name: str = "libvirt",
    provider_type: str = "InfrastructureProvider",
    version: str | None = None,
) -> LocalProvider:
    """A provider release in a local repository such as `make release-manifests`' out/.

    Picks `version`, else the highest version directory that has a components file.
    """
    prefix = {
        "InfrastructureProvider": "infrastructure",
        "BootstrapProvider": "bootstrap",
        "ControlPlaneProvider": "control-plane",
        "IPAMProvider": "ipam",
        "RuntimeExtensionProvider": "runtime-extension",
        "AddonProvider": "addon",
    }[provider_type]
    components_file = f"{prefix}-components.yaml"
    base = repository / f"{prefix}-{name}"
    candidates = sorted(
        (
            d
            for d in (base.iterdir() if base.is_dir() else ())
            if _VERSION_DIR.match(d.name) and (d / components_file).is_file()
        ),
        key=_semver_key,
    )
    if version is not None:
        candidates = [d for d in candidates if d.name == version]
    if not candidates:
        raise CapiMissing(
            f"no {components_file} for {prefix}-{name}"
            f"{' ' + version if version else ''} under {repository} "
            "(run `make release-manifests`)"
        )
    chosen = candidates[-1]
    if not (chosen / "metadata.yaml").is_file():
        raise CapiMissing(f"{chosen / 'metadata.yaml'} is missing (clusterctl needs it)")
    return LocalProvider(name=name, type=provider_type, components=chosen / components_file)


def core_metadata(version: str) -> dict[str, Any]:
    """clusterctl metadata for the core provider release `version` (v1.x: contract v1beta2
    from v1.11 on, as upstream's metadata.yaml says)."""
    major, minor = (int(p) for p in version.lstrip("v").split(".")[:2])
    contract = "v1beta2" if (major, minor) >= (1, 11) else "v1beta1"
    return {
        "apiVersion": "clusterctl.cluster.x-k8s.io/v1alpha3",
        "kind": "Metadata",
        "releaseSeries": [{"major": major, "minor": minor, "contract": contract}],
    }


class Clusterctl:
    """clusterctl with a private configuration and a local repository."""

    def __init__(
        self,
        *,
        capi: CapiAssets,
        kubectl: Path,
        workdir: Path,
        providers: Sequence[LocalProvider] = (),
        variables: Mapping[str, str] | None = None,
        verbosity: int = 0,
    ) -> None:
        """kubectl: used to render the core components (`kubectl kustomize`).
        workdir: repository, configuration, HOME and the log of every run (kept).
        providers: provider releases to register besides the core provider.
        variables: template/components variables, passed as environment to every run.
        """
        self.capi = capi
        self.kubectl = kubectl
        self.workdir = workdir
        self.providers = list(providers)
        self.variables = dict(variables or {})
        self.verbosity = verbosity
        self._prepared = False
        self.timings: dict[str, float] = {}

    @property
    def repository(self) -> Path:
        return self.workdir / "repository"

    @property
    def config_path(self) -> Path:
        return self.workdir / "clusterctl.yaml"

    @property
    def log_path(self) -> Path:
        return self.workdir / "clusterctl.log"

    @property
    def core_components(self) -> Path:
        return self.components_path(CORE_COMPONENTS)

    def components_path(self, components: ProviderComponents) -> Path:
        """Where the local repository holds a Cluster API provider's components."""
        return (
            self.repository / components.provider_id / self.capi.version
        ) / components.components_file

    @property
    def release_components(self) -> list[ProviderComponents]:
        """The providers of the Cluster API release the repository carries: the core, and the
        kubeadm bootstrap and control-plane providers when the build has their trees."""
        return [c for c in CAPI_COMPONENTS if c is CORE_COMPONENTS or self.capi.has(c)]

    async def prepare(self) -> None:
        """Write the local repository and clusterctl.yaml (idempotent)."""
        if self._prepared:
            return
        t0 = time.monotonic()
        release = self.release_components
        texts = await asyncio.gather(
            *(
                render_kustomization(kubectl=self.kubectl, directory=self.capi.kustomization(c))
                for c in release
            )
        )
        entries = []
        for components, text in zip(release, texts, strict=True):
            path = self.components_path(components)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            self._write_metadata(path.parent / "metadata.yaml")
            entries.append({"name": components.name, "type": components.type, "url": str(path)})
        entries += [
            {"name": p.name, "type": p.type, "url": str(p.components)} for p in self.providers
        ]
        config = {"providers": entries, "CLUSTERCTL_DISABLE_VERSIONCHECK": "true"}
        self.config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        for sub in ("home", "config", "cache"):
            (self.workdir / sub).mkdir(exist_ok=True)
        self._prepared = True
        self.timings["prepare"] = time.monotonic() - t0

    def _write_metadata(self, path: Path) -> None:
        """The release's metadata.yaml (one for all its providers, as upstream publishes it)."""
        upstream = self.capi.directory / "metadata.yaml"
        if upstream.is_file():
            shutil.copyfile(upstream, path)
        else:
            path.write_text(yaml.safe_dump(core_metadata(self.capi.version), sort_keys=False))

    def env(self, variables: Mapping[str, str] | None = None) -> dict[str, str]:
        return {
            **_base_env(),
            "HOME": str(self.workdir / "home"),
            "XDG_CONFIG_HOME": str(self.workdir / "config"),
            "XDG_CACHE_HOME": str(self.workdir / "cache"),
            "CLUSTERCTL_DISABLE_VERSIONCHECK": "true",
            **self.variables,
            **(variables or {}),
        }

    async def run(
        self,
        *args: str,
        kubeconfig: Path | None = None,
        variables: Mapping[str, str] | None = None,
        within: float = 300.0,
    ) -> str:
        """Run `clusterctl <args> --config <ours> [--kubeconfig]`; returns stdout.

        clusterctl logs progress on stderr: that goes to `log_path` (and into the error
        message when it fails).
        """
        out, _ = await self.run_full(
            *args, kubeconfig=kubeconfig, variables=variables, within=within
        )
        return out

    async def run_full(
        self,
        *args: str,
        kubeconfig: Path | None = None,
        variables: Mapping[str, str] | None = None,
        within: float = 300.0,
    ) -> tuple[str, str]:
        """`run`, returning stdout and stderr."""
        await self.prepare()
        argv = [str(self.capi.clusterctl), *args, f"--config={self.config_path}"]
        if kubeconfig is not None:
            argv.append(f"--kubeconfig={kubeconfig}")
        if self.verbosity:
            argv.append(f"--v={self.verbosity}")
        t0 = time.monotonic()
        rc, out, err = await run_captured(
            argv, env=self.env(variables), cwd=self.workdir, within=within
        )
        seconds = time.monotonic() - t0
        with self.log_path.open("a") as f:
            f.write(f"==> clusterctl {' '.join(args)} (status {rc}, {seconds:.1f} s)\n{err}")
        if rc != 0:
            raise ClusterctlFailed(
                f"clusterctl {' '.join(args)} failed with status {rc} after {seconds:.1f} s:\n"
                f"{(err + out).strip()[-4000:]}"
            )
        return out, err

    async def init(
        self,
        plane: ControlPlane,
        *,
        infrastructure: Sequence[str] = ("libvirt",),
        bootstrap: Sequence[str] = (NOOP_PROVIDER,),
        control_plane: Sequence[str] = (NOOP_PROVIDER,),
        extra_args: Sequence[str] = (),
        within: float = 300.0,
    ) -> str:
        """`clusterctl init` against `plane` (see the module docstring for what it skips).

        Pre-installs the cert-manager stand-in CRDs, and finalizes the cert-manager-test
        namespace clusterctl leaves Terminating. Returns clusterctl's log (stderr) and output.
        """
        t0 = time.monotonic()
        await self._check_not_preinstalled(plane, bootstrap=bootstrap, control_plane=control_plane)
        await install_cert_manager_crds(plane)
        t1 = time.monotonic()
        args = ["init"]
        for flag, values in (
            ("--infrastructure", infrastructure),
            ("--bootstrap", bootstrap),
            ("--control-plane", control_plane),
        ):
            if values:
                args.append(f"{flag}={','.join(values)}")
        out, err = await self.run_full(
            *args, *extra_args, kubeconfig=plane.kubeconfig, within=within
        )
        t2 = time.monotonic()
        await finalize_namespace(plane, CERT_MANAGER_TEST_NAMESPACE)
        self.timings.update({"cert-manager CRDs": t1 - t0, "init": t2 - t1})
        return err + out

    async def _check_not_preinstalled(
        self, plane: ControlPlane, *, bootstrap: Sequence[str], control_plane: Sequence[str]
    ) -> None:
        """Refuse at once when a Cluster API provider this init installs already has CRDs on
        `plane` that clusterctl did not install (a local manager started first)."""
        wanted = [CORE_COMPONENTS]
        if KUBEADM in bootstrap:
            wanted.append(KUBEADM_BOOTSTRAP_COMPONENTS)
        if KUBEADM in control_plane:
            wanted.append(KUBEADM_CONTROL_PLANE_COMPONENTS)
        raw = await plane.kubectl(
            "get", *(f"{_CRD}/{c.crd}" for c in wanted), "--ignore-not-found", "-o", "json"
        )
        installed = {str(crd["metadata"]["name"]): crd for crd in _items(raw)}
        for components in wanted:
            crd = installed.get(components.crd)
            if crd is None or _CLUSTERCTL_LABEL in (crd["metadata"].get("labels") or {}):
                continue
            which = "core" if components is CORE_COMPONENTS else components.provider_id
            raise CapiError(
                f"the Cluster API {which} CRDs on this control plane were not installed by "
                "clusterctl (CapiCore.start or a kubeadm provider's start ran first?): "
                "clusterctl init would fail to merge its Service-based conversion webhooks "
                "into them. Run Clusterctl.init before CapiCore.start on a fresh control plane."
            )

    async def generate_cluster(
        self,
        name: str,
        *,
        kubeconfig: Path | None = None,
        infrastructure: str | None = "libvirt",
        flavor: str | None = None,
        target_namespace: str = "default",
        kubernetes_version: str | None = None,
        control_plane_machine_count: int | None = None,
        worker_machine_count: int | None = None,
        variables: Mapping[str, str] | None = None,
    ) -> str:
        """`clusterctl generate cluster` from the local repository; returns the YAML."""
        args = ["generate", "cluster", name, f"--target-namespace={target_namespace}"]
        if infrastructure is not None:
            args.append(f"--infrastructure={infrastructure}")
        if flavor is not None:
            args.append(f"--flavor={flavor}")
        if kubernetes_version is not None:
            args.append(f"--kubernetes-version={kubernetes_version}")
        if control_plane_machine_count is not None:
            args.append(f"--control-plane-machine-count={control_plane_machine_count}")
        if worker_machine_count is not None:
            args.append(f"--worker-machine-count={worker_machine_count}")
        return await self.run(*args, kubeconfig=kubeconfig, variables=variables, within=120)
