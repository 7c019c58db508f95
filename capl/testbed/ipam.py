"""The real Cluster API in-cluster IPAM provider beside the test bed's kube-apiserver.

The unmodified Go program of `sigs.k8s.io/cluster-api-ipam-provider-in-cluster` that
`make ipam` builds (hack/ipam.sh) into `$CAPL_CACHE/ipam/<version>/`: `bin/ipam-in-cluster-manager`
and the module's `config/` tree. `InClusterIpam` runs it as a local process against a
`ControlPlane` the way `capl.testbed.capi.CapiCore` runs the Cluster API core manager:

- its CRDs (InClusterIPPool, GlobalInClusterIPPool and the prefix pools, v1alpha1 and
  v1alpha2 with a conversion webhook) and its mutating/validating webhook configurations come
  from `kubectl kustomize config/default` (what clusterctl would install), every
  `clientConfig` pointed at `https://127.0.0.1:<webhook-port>` with a CA made for this
  instance (`capl.testbed.manifests.point_provider_webhooks`);
- the manager serves its webhooks from a private `--webhook-cert-dir`, health on
  `--health-probe-bind-address`, metrics on `--diagnostics-address` (plain HTTP), all on
  loopback ports; no leader election;
- ready when `/readyz` passes and a server-side dry-run create of an InClusterIPPool goes
  through its admission webhooks.

It allocates for IPAddressClaims of ipam.cluster.x-k8s.io/v1beta2 (the version it is built
against, Cluster API v1.11; the CRDs of IPAddressClaim/IPAddress are Cluster API core's, so
the core's CRDs must be installed: `capi_crds` or a running `CapiCore`).

Like the rest of capl.testbed it uses kubectl and plain HTTP only.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Self

from capl.testbed.capibuild import CapiError, base_env
from capl.testbed.controlplane import ControlPlane, ControlPlaneError
from capl.testbed.localmanager import LocalManager
from capl.testbed.manifests import (
    parse_manifests,
    point_provider_webhooks,
    provider_webhook_objects,
    render_kustomization,
)

__all__ = ["IPAM_DIR_ENV", "InClusterIpam", "IpamAssets", "IpamMissing", "find_ipam"]

IPAM_DIR_ENV: Final = "CAPL_IPAM_DIR"
PROVIDER: Final = "ipam-in-cluster"
BINARY: Final = "ipam-in-cluster-manager"
POOL_API_VERSION: Final = "ipam.cluster.x-k8s.io/v1alpha2"

_PROBE: Final = {
    "apiVersion": POOL_API_VERSION,
    "kind": "InClusterIPPool",
    "metadata": {"name": "capl-testbed-probe", "namespace": "default"},
    "spec": {"addresses": ["10.255.255.1-10.255.255.2"], "prefix": 24},
}
_WEBHOOK_UNREACHABLE = re.compile(r"failed calling webhook|conversion webhook for", re.I)


class IpamMissing(CapiError):
    """The in-cluster IPAM provider build is not where CAPL_IPAM_DIR (or the caller) says."""


@dataclass(frozen=True, kw_only=True)
class IpamAssets:
    directory: Path
    manager: Path
    config: Path


def find_ipam(directory: str | os.PathLike[str] | None = None) -> IpamAssets:
    """Locate the build in `directory`, else in $CAPL_IPAM_DIR."""
    where = os.fspath(directory) if directory is not None else os.environ.get(IPAM_DIR_ENV, "")
    if not where:
        raise IpamMissing(
            f"{IPAM_DIR_ENV} is not set: run `make ipam` and set {IPAM_DIR_ENV} to the "
            "directory it prints last"
        )
    root = Path(where)
    manager, config = root / "bin" / BINARY, root / "config"
    missing = [] if os.access(manager, os.X_OK) else [str(manager)]
    if not (config / "default" / "kustomization.yaml").is_file():
        missing.append(str(config / "default" / "kustomization.yaml"))
    if missing:
        raise IpamMissing(
            f"{', '.join(missing)} not found ({IPAM_DIR_ENV}={root}): run `make ipam`"
        )
    return IpamAssets(directory=root, manager=manager, config=config)


class InClusterIpam(LocalManager):
    """The in-cluster IPAM provider's manager as a local process (see the module docstring)."""

    error = CapiError

    def __init__(
        self,
        *,
        plane: ControlPlane,
        assets: IpamAssets | None = None,
        workdir: Path | None = None,
        ready_timeout: float = 120.0,
        stop_grace: float = 10.0,
    ) -> None:
        super().__init__(
            plane=plane,
            name=BINARY,
            workdir=workdir,
            ca_name="capl-testbed-ipam-in-cluster-webhook-ca",
            ready_timeout=ready_timeout,
            stop_grace=stop_grace,
        )
        self.assets = assets if assets is not None else find_ipam()
        self._manifests: list[dict[str, Any]] | None = None

    @property
    def workdir(self) -> Path:
        if self._workdir is not None:
            return self._workdir
        return self.plane.workdir / "ipam-in-cluster"

    def argv(self) -> list[str]:
        return [
            str(self.assets.manager),
            f"--kubeconfig={self.plane.kubeconfig}",
            "--leader-elect=false",
            f"--webhook-port={self.webhook_port}",
            f"--webhook-cert-dir={self.cert_dir}",
            f"--health-probe-bind-address=127.0.0.1:{self.health_port}",
            f"--diagnostics-address=127.0.0.1:{self.metrics_port}",
            "--insecure-diagnostics",
        ]

    def child_env(self) -> Mapping[str, str]:
        return base_env()

    async def manifests(self) -> list[dict[str, Any]]:
        """The provider's CRDs and webhook configurations (`kustomize config/default`)."""
        if self._manifests is None:
            text = await render_kustomization(
                kubectl=self.plane.assets.kubectl, directory=self.assets.config / "default"
            )
            self._manifests = provider_webhook_objects(parse_manifests(text))
        return self._manifests

    async def install(self) -> list[str]:
        """Create or re-point the provider's CRDs and webhook configurations."""
        self.prepare()
        return await point_provider_webhooks(
            self.plane,
            provider=PROVIDER,
            base_url=self.webhook_url,
            ca_pem=self.ca_pem,
            manifests=await self.manifests(),
        )

    async def _ports_changed(self) -> None:
        await self.install()

    async def start(self) -> None:
        """Install (or re-point) CRDs and webhooks, start the manager, wait until ready."""
        self.prepare()
        await self.install()
        await self.launch()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _ready_beyond_health(self) -> tuple[bool, str]:
        """kube-apiserver reaches the admission webhooks: a dry-run pool create succeeds."""
        try:
            await self.plane.kubectl(
                "create", "--dry-run=server", "-o", "name", "-f", "-",
                stdin=json.dumps(_PROBE).encode(), within=30,
            )  # fmt: skip
        except ControlPlaneError as e:
            if not _WEBHOOK_UNREACHABLE.search(str(e)):
                raise CapiError(f"the InClusterIPPool probe was rejected: {e}") from e
            return False, f"webhooks not reachable yet: {e}"
        return True, "ok"
