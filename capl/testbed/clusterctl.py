"""clusterctl against the test bed's kube-apiserver, from local repositories.

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

Upgrades (`upgrade_plan`, `upgrade_apply`): `make release-manifests` writes two release series
of capl (the current version and the next minor, `next_minor`; the same code, see
hack/release-manifests.sh) into one local repository; clusterctl installs the version its
URL names and plans upgrades to the others beside it. What `clusterctl upgrade apply` does
(cluster-api@v1.13 cmd/clusterctl/client/cluster/upgrader.go `doUpgrade`): scale the
provider's Deployments to 0 and wait for `status.replicas` 0 (at once here: no Deployment
controller), delete every object of the provider except its CRDs, its Namespace and the
Provider inventory object (webhook configurations included; cluster-scoped RBAC whose name
does not start with `<namespace>-` is left to be merge-patched), create the new components
(existing ones merge-patched: the CRDs, the Namespace, the ClusterRoles), then patch the
Provider inventory object to the new version. The managers being local processes, the
caller stops the old one first and starts the new one after, pointing the re-created webhook
configurations at it again. `stage_capl_source` makes the source tree such a process of the
next version runs from.

Like the rest of capl.testbed this module uses kubectl and plain HTTP only.
"""

from __future__ import annotations

import asyncio
import logging
import re
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from capl.testbed.capibuild import (
    CAPI_COMPONENTS,
    CERT_MANAGER_TEST_NAMESPACE,
    CORE_COMPONENTS,
    CRD_RESOURCE,
    KUBEADM,
    KUBEADM_BOOTSTRAP_COMPONENTS,
    KUBEADM_CONTROL_PLANE_COMPONENTS,
    NOOP_PROVIDER,
    VERSION_DIR,
    CapiAssets,
    CapiError,
    CapiMissing,
    ClusterctlFailed,
    ProviderComponents,
    base_env,
)
from capl.testbed.controlplane import ControlPlane
from capl.testbed.manifests import (
    finalize_namespace,
    install_cert_manager_crds,
    items_of,
    render_kustomization,
)
from capl.testbed.process import run_captured

log = logging.getLogger(__name__)

# ------------------------------------------------------------------------------ clusterctl


CLUSTERCTL_LABEL = "clusterctl.cluster.x-k8s.io"


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
            if VERSION_DIR.match(d.name) and (d / components_file).is_file()
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


def next_minor(version: str) -> str:
    """The next minor release after `version`: v0.1.3 -> v0.2.0 (keeps a leading v)."""
    prefix = "v" if version.startswith("v") else ""
    major, minor = (int(p) for p in version.lstrip("v").split(".")[:2])
    return f"{prefix}{major}.{minor + 1}.0"


def stage_capl_source(source: Path, dest: Path, *, version: str) -> Path:
    """A copy of the `capl` package at `source` (a directory named capl) under `dest`, with
    `__version__` set to `version` (no leading v); returns `dest`, to put first on a
    process's PYTHONPATH. The test bed runs capl's manager as a local process from this
    checkout, not as the release's image: this is how a process of the next release series
    of hack/release-manifests.sh (the same code) runs and reports that version."""
    init = source / "__init__.py"
    text = init.read_text()
    pattern = re.compile(r'^__version__ = "[^"]*"$', re.MULTILINE)
    if not pattern.search(text):
        raise CapiError(f"{init} has no __version__ line to replace")
    target = dest / "capl"
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (target / "__init__.py").write_text(pattern.sub(f'__version__ = "{version}"', text))
    return dest


@dataclass(frozen=True)
class UpgradePlanRow:
    """One provider's line of `clusterctl upgrade plan`."""

    name: str
    namespace: str
    type: str
    current: str
    next: str | None
    """The version it can be upgraded to; None when clusterctl says "Already up to date"."""


_PLAN_ROW = re.compile(
    r"^(?P<name>\S+)\s+(?P<namespace>\S+)\s+(?P<type>\S+Provider)\s+(?P<current>v\S+)\s+"
    r"(?P<next>Already up to date|v\S+)\s*$"
)


def parse_upgrade_plan(text: str) -> dict[str, UpgradePlanRow]:
    """The provider rows of `clusterctl upgrade plan` output, by provider name
    (e.g. infrastructure-libvirt). Raises when there are none."""
    rows: dict[str, UpgradePlanRow] = {}
    for line in text.splitlines():
        match = _PLAN_ROW.match(line.strip())
        if match is None:
            continue
        upgrade = match["next"]
        rows[match["name"]] = UpgradePlanRow(
            name=match["name"],
            namespace=match["namespace"],
            type=match["type"],
            current=match["current"],
            next=None if upgrade == "Already up to date" else upgrade,
        )
    if not rows:
        raise CapiError(f"no provider rows in the output of clusterctl upgrade plan:\n{text}")
    return rows


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
            **base_env(),
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

    async def upgrade_plan(self, plane: ControlPlane) -> dict[str, UpgradePlanRow]:
        """`clusterctl upgrade plan`, parsed (`parse_upgrade_plan`)."""
        t0 = time.monotonic()
        out = await self.run("upgrade", "plan", kubeconfig=plane.kubeconfig, within=120)
        self.timings["upgrade plan"] = time.monotonic() - t0
        return parse_upgrade_plan(out)

    async def upgrade_apply(
        self, plane: ControlPlane, *, infrastructure: Sequence[str], within: float = 300.0
    ) -> str:
        """`clusterctl upgrade apply --infrastructure <name:version,...>` (the provider
        references without a namespace: the namespace/ form is deprecated in v1.13); returns
        clusterctl's log and output. Without `--wait-providers`: the Deployments never run
        here. Stop the provider's local manager before and start the new one after (see the
        module docstring)."""
        t0 = time.monotonic()
        out, err = await self.run_full(
            "upgrade", "apply", f"--infrastructure={','.join(infrastructure)}",
            kubeconfig=plane.kubeconfig, within=within,
        )  # fmt: skip
        self.timings["upgrade apply"] = time.monotonic() - t0
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
            "get", *(f"{CRD_RESOURCE}/{c.crd}" for c in wanted), "--ignore-not-found", "-o", "json"
        )
        installed = {str(crd["metadata"]["name"]): crd for crd in items_of(raw)}
        for components in wanted:
            crd = installed.get(components.crd)
            if crd is None or CLUSTERCTL_LABEL in (crd["metadata"].get("labels") or {}):
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
