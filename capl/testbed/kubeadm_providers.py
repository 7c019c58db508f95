"""The kubeadm bootstrap provider (CABPK) and KubeadmControlPlane provider (KCP) of Cluster API
as local processes beside the test bed's kube-apiserver.

Both are the unmodified Go programs `make capi` builds (hack/capi.sh) from the same module as
the core manager, into `$CAPL_CACHE/capi/<version>/bin/kubeadm-bootstrap-manager` and
`bin/kubeadm-control-plane-manager`; their kustomize trees are the module's
`bootstrap/kubeadm/config/` and `controlplane/kubeadm/config/`, copied beside `config/`.

They run exactly like the core manager (`capl.testbed.capi.ProviderManager`, whose module
docstring tells the details): CRDs and admission webhook configurations from
`kubectl kustomize <tree>/default` (labelled `cluster.x-k8s.io/provider=bootstrap-kubeadm` /
`control-plane-kubeadm`), every clientConfig pointed at the manager's loopback webhook port
with a CA made for it; objects `clusterctl init --bootstrap kubeadm --control-plane kubeadm`
installed are re-pointed in place. Health and metrics on loopback, `--leader-elect=false`.

Feature gates: upstream's defaults of v1.13 (config/manager/manager.yaml with no variables
set) spelled out, plus `KubeadmBootstrapFormatIgnition=true` in both managers: CABPK only
renders `format: ignition` with it, and KCP's webhook validates the KubeadmConfigSpec it
embeds with the same gate (without it, a KubeadmControlPlane with `format: ignition` is
rejected).

Ready when `/readyz` passes and kube-apiserver reaches the webhooks: server-side dry-run
creates of a v1beta2 KubeadmConfig with `format: ignition` (CABPK's mutating and validating
admission, and the gate) and of a v1beta1 KubeadmConfigTemplate (conversion); for KCP a v1beta2
KubeadmControlPlane with `format: ignition` (admission) and a v1beta1 one (conversion).

`KubeadmProviders` is the pair, started side by side (and stopped together on failure).

There is no kubelet and no workload API server here: what they do that needs one (KCP's etcd
and control-plane health checks, CABPK's join tokens) waits or retries; what the test bed gets
from them is real: cluster certificates, the `<cluster>-kubeconfig` Secret, control-plane
Machines with their KubeadmConfig and infrastructure machine, and the bootstrap data Secret.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Self

from capl.testbed.capi import (
    KUBEADM_BOOTSTRAP_COMPONENTS,
    KUBEADM_CONTROL_PLANE_COMPONENTS,
    CapiAssets,
    CapiMissing,
    ProviderManager,
)
from capl.testbed.controlplane import ControlPlane

BOOTSTRAP_GROUP: Final = "bootstrap.cluster.x-k8s.io"
CONTROL_PLANE_GROUP: Final = "controlplane.cluster.x-k8s.io"
IGNITION_GATE: Final = "KubeadmBootstrapFormatIgnition"

# Upstream defaults of v1.13 (each manager's config/manager/manager.yaml), Ignition on.
BOOTSTRAP_FEATURE_GATES: Final[Mapping[str, bool]] = {
    "MachinePool": True,
    IGNITION_GATE: True,
    "PriorityQueue": True,
    "ReconcilerRateLimiting": True,
}
CONTROL_PLANE_FEATURE_GATES: Final[Mapping[str, bool]] = {
    "MachinePool": True,
    "ClusterTopology": False,
    IGNITION_GATE: True,
    "PriorityQueue": True,
    "ReconcilerRateLimiting": True,
    "InPlaceUpdates": False,
    "MachineTaintPropagation": False,
}

_PROBE_META: Final = {"name": "capl-testbed-probe", "namespace": "default"}
_IGNITION: Final = {"format": "ignition"}

_BOOTSTRAP_PROBES: Final = (
    (
        "admission webhooks (format: ignition)",
        {
            "apiVersion": f"{BOOTSTRAP_GROUP}/v1beta2",
            "kind": "KubeadmConfig",
            "metadata": _PROBE_META,
            "spec": _IGNITION,
        },
    ),
    (
        "conversion webhook",
        {
            "apiVersion": f"{BOOTSTRAP_GROUP}/v1beta1",
            "kind": "KubeadmConfigTemplate",
            "metadata": _PROBE_META,
            "spec": {"template": {"spec": _IGNITION}},
        },
    ),
)
_CONTROL_PLANE_PROBES: Final = (
    (
        "admission webhooks (format: ignition)",
        {
            "apiVersion": f"{CONTROL_PLANE_GROUP}/v1beta2",
            "kind": "KubeadmControlPlane",
            "metadata": _PROBE_META,
            "spec": {
                "version": "v1.35.0",
                "machineTemplate": {
                    "spec": {
                        "infrastructureRef": {
                            "apiGroup": "infrastructure.cluster.x-k8s.io",
                            "kind": "ProbeMachineTemplate",
                            "name": "probe",
                        }
                    }
                },
                "kubeadmConfigSpec": _IGNITION,
            },
        },
    ),
    # A v1beta1 KubeadmControlPlane: KubeadmControlPlaneTemplate would do without references,
    # but its webhook refuses every one unless ClusterTopology is on. Converting the reference
    # back to v1beta1 looks up the referenced kind's CRD for its contract version: a kind KCP
    # installs itself keeps the probe independent of any infrastructure provider.
    (
        "conversion webhook",
        {
            "apiVersion": f"{CONTROL_PLANE_GROUP}/v1beta1",
            "kind": "KubeadmControlPlane",
            "metadata": _PROBE_META,
            "spec": {
                "version": "v1.35.0",
                "machineTemplate": {
                    "infrastructureRef": {
                        "apiVersion": f"{CONTROL_PLANE_GROUP}/v1beta2",
                        "kind": "KubeadmControlPlaneTemplate",
                        "name": "probe",
                    }
                },
                "kubeadmConfigSpec": _IGNITION,
            },
        },
    ),
)


def require_kubeadm_providers(capi: CapiAssets) -> CapiAssets:
    """`capi`, if the build has both kubeadm managers and their trees; else CapiMissing."""
    kubeadm = (KUBEADM_BOOTSTRAP_COMPONENTS, KUBEADM_CONTROL_PLANE_COMPONENTS)
    missing = [str(capi.binary(c)) for c in kubeadm if not os.access(capi.binary(c), os.X_OK)]
    missing += [str(capi.kustomization(c)) for c in kubeadm if not capi.has(c)]
    if missing:
        raise CapiMissing(
            f"{', '.join(missing)} not found in {capi.directory}: run `make capi` to build "
            "the kubeadm bootstrap and control-plane managers"
        )
    return capi


class KubeadmBootstrap(ProviderManager):
    """The kubeadm bootstrap provider's manager (CABPK) as a local process."""

    components = KUBEADM_BOOTSTRAP_COMPONENTS
    title = "Cluster API kubeadm bootstrap provider"
    workdir_name = "capi-kubeadm-bootstrap"
    default_feature_gates = BOOTSTRAP_FEATURE_GATES
    probes = _BOOTSTRAP_PROBES


class KubeadmControlPlane(ProviderManager):
    """The KubeadmControlPlane provider's manager (KCP) as a local process."""

    components = KUBEADM_CONTROL_PLANE_COMPONENTS
    title = "Cluster API kubeadm control-plane provider"
    workdir_name = "capi-kubeadm-control-plane"
    default_feature_gates = CONTROL_PLANE_FEATURE_GATES
    probes = _CONTROL_PLANE_PROBES


@dataclass
class KubeadmProviders:
    """Both kubeadm managers against one control plane, started and stopped together."""

    bootstrap: KubeadmBootstrap
    control_plane: KubeadmControlPlane

    @classmethod
    def for_plane(
        cls, *, plane: ControlPlane, capi: CapiAssets, workdir: Path | None = None, **options: Any
    ) -> KubeadmProviders:
        """Configure both (nothing starts). workdir: the parent of their workdirs (default
        the plane's); options: `ProviderManager` options given to both."""
        require_kubeadm_providers(capi)

        def where(kind: type[ProviderManager]) -> Path | None:
            return None if workdir is None else workdir / kind.workdir_name

        return cls(
            bootstrap=KubeadmBootstrap(
                plane=plane, capi=capi, workdir=where(KubeadmBootstrap), **options
            ),
            control_plane=KubeadmControlPlane(
                plane=plane, capi=capi, workdir=where(KubeadmControlPlane), **options
            ),
        )

    @property
    def managers(self) -> tuple[KubeadmBootstrap, KubeadmControlPlane]:
        return self.bootstrap, self.control_plane

    @property
    def timings(self) -> dict[str, float]:
        return {
            f"{m.name} {stage}": seconds
            for m in self.managers
            for stage, seconds in m.timings.items()
        }

    async def start(self) -> None:
        """Install (or re-point) both providers' CRDs and webhooks, then start both managers
        side by side; if either fails, both are stopped and the first error is raised.

        Both installs finish before either manager starts: KCP resolves KubeadmConfig (the
        bootstrap provider's CRD) when it starts and exits if that kind is not served yet."""
        for phase in (ProviderManager.install_crds, ProviderManager.start_after_install):
            results = await asyncio.gather(
                *(phase(m) for m in self.managers), return_exceptions=True
            )
            errors = [r for r in results if isinstance(r, BaseException)]
            if errors:
                await self.stop()
                raise errors[0]

    async def ensure_running(self) -> None:
        """Start again whichever manager is not running (same ports and certificates)."""
        await asyncio.gather(*(m.start_manager() for m in self.managers if not m.running))

    async def stop(self) -> None:
        await asyncio.gather(*(m.stop() for m in self.managers))

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
