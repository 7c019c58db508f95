"""The Cluster API build the test bed runs: where `make capi` put it, which providers it holds.

`make capi` (hack/capi.sh) builds the unmodified Go programs of one Cluster API release into
`$CAPL_CACHE/capi/<version>/`: `bin/cluster-api-manager`, `bin/clusterctl`, the kubeadm
bootstrap and control-plane managers, and each provider's kustomize tree (`config/`,
`bootstrap/kubeadm/config/`, `controlplane/kubeadm/config/`). `ProviderComponents` says where
each provider of the release lives, `CapiAssets` is one build, `find_capi` finds it
($CAPL_CAPI_DIR). The errors of the Cluster API part of the test bed live here too.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

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

CRD_RESOURCE = "customresourcedefinitions.apiextensions.k8s.io"
VERSION_DIR = re.compile(r"^v\d+\.\d+\.\d+$")


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
    if VERSION_DIR.match(root.name):  # hack/capi.sh keys its output by version
        return root.name
    out = subprocess.run(
        [str(clusterctl), "version", "-o", "short"],
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
        env=base_env(),
    )
    version = out.stdout.strip()
    if out.returncode != 0 or not VERSION_DIR.match(version):
        raise CapiMissing(f"cannot tell the version of {clusterctl}: {out.stderr.strip()}")
    return version


def base_env() -> dict[str, str]:
    """A minimal environment for children: no KUBECONFIG, no stray clusterctl variables."""
    keep = ("PATH", "LANG", "LC_ALL", "TMPDIR", "TZ")
    return {k: os.environ[k] for k in keep if k in os.environ}
