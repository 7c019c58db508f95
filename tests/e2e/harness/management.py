"""The e2e management clusters.

Management cluster (`Management`, `start_management`)
    One empty control plane (`control_plane_factory`), `clusterctl init --infrastructure
    libvirt` from the local repositories (core + capl's release), the Cluster API core
    manager as a local process with its webhooks re-pointed at loopback (`CapiCore`), and
    `capl manager` as a process (`capl.testbed.caplmanager.CaplManager`) with capl's webhook
    configurations pointed at it. Exactly what a user gets from `clusterctl init`, except that
    the managers run as processes instead of Deployments (there is no kubelet); capl's runs
    as the ServiceAccount clusterctl installed (a token in a kubeconfig), under the shipped
    ClusterRole and Role.

    `ManagementParts` bundles what a management cluster is made from (the fixtures
    tests/e2e/conftest.py `management_parts` collects): `async with parts.running(name)`
    starts one for a test module and closes it afterwards.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from capl.kube import KubeClient
from capl.testbed import ControlPlane
from capl.testbed.capi import CapiAssets, CapiCore
from capl.testbed.caplmanager import CaplManager
from capl.testbed.clusterctl import Clusterctl, LocalProvider
from capl.testbed.identities import manager_identity
from tests.e2e.harness.common import CAPL_E2E_ARGS
from tests.fixtures.capi import new_clusterctl, record_timing
from tests.fixtures.capl import CaplManagerFactory

# --- the management cluster ------------------------------------------------------------------


CAPL_SERVICE_ACCOUNT = ("capl-system", "capl-controller-manager")
"""What `clusterctl init` installs for capl's manager (config/default's namePrefix capl-)."""


@dataclass
class Management:
    """A management cluster: control plane, clusterctl, Cluster API core, capl manager."""

    name: str
    plane: ControlPlane
    clusterctl: Clusterctl
    core: CapiCore
    capl: CaplManager
    api: KubeClient
    workdir: Path
    timings: dict[str, float] = field(default_factory=dict)

    async def close(self) -> None:
        await self.api.close()
        await self.capl.stop()
        await self.core.stop()


async def start_management(
    *,
    name: str,
    plane_factory: Callable[[], Awaitable[ControlPlane]],
    capi: CapiAssets,
    provider: LocalProvider,
    capl_factory: CaplManagerFactory,
    workdir: Path,
    capl_args: Sequence[str] = CAPL_E2E_ARGS,
    resolv_conf: Path | None = None,
    core_feature_gates: Mapping[str, bool] | None = None,
) -> Management:
    """Control plane + `clusterctl init --infrastructure libvirt` + the Cluster API core
    manager + `capl manager` with its webhooks, all ready. Wall times in `.timings` and in
    the terminal summary. resolv_conf: the resolver of the core manager and of capl's (both
    connect to workload clusters by their endpoint's name). core_feature_gates: merged over the
    core manager's defaults (e.g. RuntimeSDK and InPlaceUpdates)."""
    timings: dict[str, float] = {}
    t0 = time.monotonic()
    plane = await plane_factory()  # stopped by the factory
    t1 = time.monotonic()
    clusterctl = new_clusterctl(
        capi=capi, plane=plane, workdir=workdir / "clusterctl", providers=[provider]
    )
    await clusterctl.init(plane)
    t2 = time.monotonic()
    core = CapiCore(
        plane=plane, capi=capi, workdir=workdir / "capi-core", feature_gates=core_feature_gates
    )
    core.resolv_conf = resolv_conf
    try:
        await core.start()
        t3 = time.monotonic()
        capl = await capl_factory(plane, name=f"capl-{name}", extra_args=list(capl_args))
        capl.resolv_conf = resolv_conf  # it sets the workload Nodes' providerIDs
        await capl.install_webhooks()
        await capl.start()  # stopped by its factory
        # as deployed: the ServiceAccount `clusterctl init` installed, bound by its bindings
        identity = await manager_identity(plane)
        assert identity.service_account == CAPL_SERVICE_ACCOUNT, identity
        t4 = time.monotonic()
        api = await KubeClient.connect(str(plane.kubeconfig))
    except BaseException:
        await core.stop()
        raise
    timings.update(
        {
            "control plane": t1 - t0,
            "clusterctl init": t2 - t1,
            "CAPI core": t3 - t2,
            "capl manager": t4 - t3,
        }
    )
    for stage, seconds in timings.items():
        record_timing(f"management {name}: {stage}", seconds)
    return Management(
        name=name,
        plane=plane,
        clusterctl=clusterctl,
        core=core,
        capl=capl,
        api=api,
        workdir=workdir,
        timings=timings,
    )


@dataclass(frozen=True)
class ManagementParts:
    """What a management cluster is made from: the session's and the module's fixtures
    (tests/e2e/conftest.py `management_parts`)."""

    plane_factory: Callable[[], Awaitable[ControlPlane]]
    capi: CapiAssets
    provider: LocalProvider
    capl_factory: CaplManagerFactory
    tmp_path_factory: pytest.TempPathFactory

    @contextlib.asynccontextmanager
    async def running(
        self,
        name: str,
        *,
        capl_args: Sequence[str] = CAPL_E2E_ARGS,
        resolv_conf: Path | None = None,
        core_feature_gates: Mapping[str, bool] | None = None,
    ) -> AsyncIterator[Management]:
        """`start_management` on entry (see there), `Management.close` on exit."""
        mgmt = await start_management(
            name=name,
            plane_factory=self.plane_factory,
            capi=self.capi,
            provider=self.provider,
            capl_factory=self.capl_factory,
            workdir=self.tmp_path_factory.mktemp(f"management-{name}"),
            capl_args=capl_args,
            resolv_conf=resolv_conf,
            core_feature_gates=core_feature_gates,
        )
        try:
            yield mgmt
        finally:
            await mgmt.close()
