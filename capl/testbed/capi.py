"""The real Cluster API core manager (and the base of the kubeadm managers) beside the test
bed's kube-apiserver.

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

The build (`CapiAssets`, `find_capi`) is `capl.testbed.capibuild`, re-exported here; the
manifest handling `capl.testbed.manifests`; clusterctl `capl.testbed.clusterctl`.

Like the rest of capl.testbed this module uses kubectl and plain HTTP only, no Kubernetes
client library and no other capl layer.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Final, Self

from capl.testbed.capibuild import (
    CAPI_DIR_ENV,
    CORE_COMPONENTS,
    DEFAULT_FEATURE_GATES,
    KUBEADM_BOOTSTRAP_COMPONENTS,
    KUBEADM_CONTROL_PLANE_COMPONENTS,
    CapiAssets,
    CapiError,
    CapiMissing,
    ProviderComponents,
    base_env,
    find_capi,
)
from capl.testbed.controlplane import ControlPlane, ControlPlaneError
from capl.testbed.localmanager import LocalManager
from capl.testbed.manifests import (
    parse_manifests,
    point_provider_webhooks,
    provider_webhook_objects,
    render_kustomization,
)

log = logging.getLogger(__name__)

__all__ = [
    "CAPI_DIR_ENV",
    "KUBEADM_BOOTSTRAP_COMPONENTS",
    "KUBEADM_CONTROL_PLANE_COMPONENTS",
    "CapiAssets",
    "CapiCore",
    "CapiError",
    "CapiMissing",
    "ProviderManager",
    "find_capi",
]

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
        return base_env()

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
        await self.install_crds()
        await self.start_after_install()

    async def install_crds(self) -> None:
        """The first half of `start`: render, then install (or re-point) CRDs and webhooks
        and wait until the CRDs are established. Providers whose managers need each other's
        kinds at start-up (KCP watches KubeadmConfig) all do this before any is launched."""
        t0 = time.monotonic()
        self.prepare()
        await self.manifests()
        t1 = time.monotonic()
        await self.install()
        self.timings = {"render": t1 - t0, "install": time.monotonic() - t1}

    async def start_after_install(self) -> None:
        """The second half of `start`: launch the manager and wait until it is ready."""
        t0 = time.monotonic()
        await self.launch()
        self.timings["manager"] = time.monotonic() - t0
        log.info(
            "%s %s ready in %.1f s (render %.1f s, install %.1f s, manager %.1f s)",
            self.title, self.capi.version, sum(self.timings.values()),
            self.timings["render"], self.timings["install"], self.timings["manager"],
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
