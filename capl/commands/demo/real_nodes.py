"""`capl demo`'s default mode: the processes a workload cluster of real nodes needs.

The demo runs the management side (``capl.commands.demo.lifecycle``); ``RealNodes`` adds:

1. **Cluster API's kubeadm bootstrap provider** (``capl.testbed.kubeadm_providers.
   KubeadmBootstrap``, the Go manager ``make capi`` builds, with its CRDs and webhooks on
   loopback, ``KubeadmBootstrapFormatIgnition`` on). It turns each worker's KubeadmConfig into
   the bootstrap data Secret capl delivers: Ignition (fw_cfg) or cloud-config (NoCloud ISO).
   Only the bootstrap provider runs: the demo has no KubeadmControlPlane, so the
   control-plane provider would be one more Go process on a 2-core machine doing nothing.
2. The **workload cluster's control plane on this machine** (``capl.testbed.hostedcp.
   HostedControlPlane``: etcd, kube-apiserver, kube-controller-manager, kube-scheduler as host
   processes, made with kubeadm's own phases), started as soon as capl has created the
   cluster network, with kube-apiserver bound to the network's host address (the first
   address of its CIDR, port 6443) — the ``controlPlaneEndpoint`` of the Cluster and the
   LibvirtCluster. Why not a control-plane Machine: ``kubeadm init`` in a TCG guest adds etcd
   and three control-plane components to a boot that alone takes over a minute on a 2-core
   machine (not measured as a whole yet), too slow for a demo;
   the workers are real either way. It is published to Cluster API the way tests/nodes/bed.py
   does it: the ``<cluster>-ca`` and ``<cluster>-kubeconfig`` Secrets (owned by the Cluster)
   and the status of the Cluster's ``TestbedControlPlane``.
3. The objects (``capl.commands.demo.node_objects``), created in two steps (``create``).
4. The Nodes for the live view (``nodes``, a ``capl.commands.demo.node_view.NodeIndex``).
5. The **workload kubeconfig** at ``<work directory>/workload.kubeconfig`` (a system:masters
   client, like the ``<cluster>-kubeconfig`` Secret), for ``kubectl get nodes``.

``RealNodes.stop`` stops the bootstrap provider and the hosted control plane; the demo calls
it after the cluster was deleted through the API (Cluster API drains and deletes the Nodes
through the workload API server, so it must still run). A killed demo's processes die with
it (PR_SET_PDEATHSIG); its libvirt objects are removed by the next demo as in the VM-only
mode.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol

from capl.commands.demo.assets import NodeParts
from capl.commands.demo.node_objects import cluster_objects, extra_resources, worker_objects
from capl.commands.demo.node_view import NodeIndex
from capl.commands.demo.objects import resource_of
from capl.commands.demo.plan import (
    API_PORT,
    POD_CIDR,
    SERVICE_CIDR,
    DemoPlan,
    gateway,
    split_workers,
)
from capl.errors import (
    CliError,
)

if TYPE_CHECKING:
    from capl.kube.client import KubeClient
    from capl.testbed import ControlPlane
    from capl.testbed.hostedcp import HostedControlPlane
    from capl.testbed.kubeadm_providers import KubeadmBootstrap

__all__ = ["RealNodes", "Steps"]

WORKLOAD_KUBECONFIG: Final = "workload.kubeconfig"
NETWORK_TIMEOUT: Final = 120.0


class Steps(Protocol):
    """The demo's output (capl.commands.demo.ui.Ui): a step with its duration, a line."""

    def step(self, text: str) -> contextlib.AbstractContextManager[Callable[[str], None]]: ...

    def say(self, text: str = "") -> None: ...


Run = Callable[[Awaitable[Any]], Awaitable[Any]]
"""The demo's way to run a step: cancelled (and Interrupted raised) on Ctrl-C."""


class RealNodes:
    """The kubeadm bootstrap provider and the hosted control plane of one demo, the workload
    client and kubeconfig file; see the module docstring."""

    def __init__(
        self, *, plan: DemoPlan, workdir: Path, parts: NodeParts, plane: ControlPlane
    ) -> None:
        self.plan = plan
        self.workdir = workdir
        self.parts = parts
        self.plane = plane
        self.bootstrap: KubeadmBootstrap | None = None
        self.control_plane: HostedControlPlane | None = None
        self.workload: KubeClient | None = None
        self.pids: dict[str, int] = {}
        """Every process started here, by the name the demo prints."""

    @property
    def kubeconfig(self) -> Path:
        return self.workdir / WORKLOAD_KUBECONFIG

    @property
    def endpoint(self) -> str:
        return f"{gateway(self.plan.cidr)}:{API_PORT}"

    async def start_bootstrap_provider(self, ui: Steps, *, run: Run) -> None:
        from capl.testbed.kubeadm_providers import KubeadmBootstrap

        capi = self.parts.capi
        self.bootstrap = KubeadmBootstrap(plane=self.plane, capi=capi)
        try:
            with ui.step(
                f"Starting the Cluster API kubeadm bootstrap provider {capi.version} (Ignition on)"
            ):
                await run(self.bootstrap.start())
        finally:
            if self.bootstrap.process is not None and self.bootstrap.process.pid is not None:
                self.pids[self.bootstrap.process.name] = self.bootstrap.process.pid

    async def create(self, client: KubeClient, ui: Steps, *, run: Run) -> None:
        """The cluster, its control plane on this machine, then the workers.

        Cluster API connects to a workload cluster as soon as the Cluster's infrastructure is
        provisioned and, when that fails, tries again only 30 s later (the ClusterCache's
        ConnectionCreationRetryInterval, not a flag); a MachineSet whose control plane is not
        up yet holds its scale-up for 15 s. This control plane can only start once capl has
        made the network, which is when the infrastructure becomes provisioned. So the Cluster
        is created paused (the `cluster.x-k8s.io/paused` annotation: Cluster API's Cluster
        controller stops; capl honours `spec.paused` and its own objects' annotation, so it
        makes the network) and the LibvirtCluster gets its owner reference here (what the
        paused controller would do). Once the control plane is published the Cluster is
        resumed and the MachineDeployments created: Cluster API's first connection succeeds
        and the MachineSets scale up at once — about 30 s sooner than all at once.
        """
        ignition, cloud_config = split_workers(self.plan.machines)
        with ui.step(
            f"Creating the demo cluster {self.plan.name!r} on {self.plan.uri} (isolated network "
            f"{self.plan.cidr}; paused for Cluster API until its control plane runs)"
        ):
            await run(self._create_cluster(client))
        with ui.step("Waiting for capl to create the cluster network") as progress:
            await run(self._wait_for_network(client, progress=progress))
        with ui.step(
            f"Starting the workload cluster's control plane on {self.endpoint} (etcd, "
            "kube-apiserver, kube-controller-manager, kube-scheduler on this machine)"
        ):
            await run(self._start_hosted())
        with ui.step(
            "Publishing it to Cluster API (Secrets <cluster>-ca and <cluster>-kubeconfig, "
            "TestbedControlPlane status) and resuming the Cluster"
        ):
            await run(self._publish(client))
        with ui.step(
            f"Creating the workers: {ignition} with Ignition ({self.plan.md_ignition}), "
            f"{cloud_config} with cloud-config ({self.plan.md_cloud_config})"
        ):
            await run(self._create_objects(client, worker_objects(self.plan)))
        ui.say("processes: " + ", ".join(self.workload_processes()))
        ui.say(f"workload kubeconfig: {self.kubeconfig}")

    async def _create_objects(self, client: KubeClient, objects: Iterable[dict[str, Any]]) -> None:
        for obj in objects:
            await client.resource(resource_of(obj)).create(obj)

    async def _create_cluster(self, client: KubeClient) -> None:
        from capl.runtime.resources import CLUSTER

        objects = {o["kind"]: o for o in cluster_objects(self.plan)}
        cluster = objects["Cluster"]
        cluster["metadata"].setdefault("annotations", {})[PAUSED_ANNOTATION] = ""
        await self._create_objects(client, [objects["TestbedControlPlane"]])
        created = await client.resource(CLUSTER).create(cluster)
        lc = objects["LibvirtCluster"]
        lc["metadata"]["ownerReferences"] = [_owner(created)]
        await self._create_objects(client, [lc])

    async def resume(self, client: KubeClient) -> None:
        """Remove the Cluster's paused annotation (also before deleting it: a paused Cluster
        is not deleted by Cluster API)."""
        from capl.runtime.objects import ObjectKey
        from capl.runtime.resources import CLUSTER

        await client.resource(CLUSTER).patch(
            ObjectKey(self.plan.namespace, self.plan.name),
            {"metadata": {"annotations": {PAUSED_ANNOTATION: None}}},
        )

    async def _wait_for_network(
        self, client: KubeClient, *, progress: Callable[[str], None], poll: float = 1.0
    ) -> None:
        """Until capl reports NetworkReady on the LibvirtCluster: the host address exists."""
        from capl.commands.status_report import condition_status
        from capl.runtime.errors import NotFound
        from capl.runtime.objects import ObjectKey
        from capl.runtime.resources import LIBVIRT_CLUSTER

        key = ObjectKey(self.plan.namespace, self.plan.name)
        deadline = time.monotonic() + NETWORK_TIMEOUT
        last = ""
        while True:
            with contextlib.suppress(NotFound):
                lc = await client.resource(LIBVIRT_CLUSTER).get(key)
                if condition_status(lc, "NetworkReady") == "True":
                    return
                last = _condition_text(lc, "NetworkReady")
                progress(last)
            if time.monotonic() > deadline:
                raise CliError(
                    f"capl did not create the cluster network within {NETWORK_TIMEOUT:.0f} s"
                    + (f": {last}" if last else "")
                )
            await asyncio.sleep(poll)

    async def _start_hosted(self) -> None:
        from capl.testbed.hostedcp import HostedControlPlane, find_node_assets

        assets = find_node_assets(self.parts.node_bin, self.parts.envtest)
        self.control_plane = HostedControlPlane(
            cluster=self.plan.name,
            address=gateway(self.plan.cidr),
            workdir=self.workdir / "workload",
            assets=assets,
            kubernetes_version=self.plan.kubernetes_version,
            pod_cidr=POD_CIDR,
            service_cidr=SERVICE_CIDR,
        )
        try:
            await self.control_plane.start()
        finally:
            # HostedControlPlane keeps its processes by their short names; record the pids
            # for the demo's "processes:" line and its final check (even of a failed start).
            for name, proc in self.control_plane._procs.items():
                if proc.pid is not None:
                    self.pids[f"workload-{name}"] = proc.pid

    async def _publish(self, client: KubeClient) -> None:
        """The `<cluster>-ca` and `<cluster>-kubeconfig` Secrets (owned by the Cluster) and
        the TestbedControlPlane's status; then the workload client and kubeconfig file."""
        from capl.kube.client import KubeClient
        from capl.runtime.objects import ObjectKey
        from capl.runtime.resources import CLUSTER, SECRET

        assert self.control_plane is not None
        ns = self.plan.namespace
        cluster = await client.resource(CLUSTER).get(ObjectKey(ns, self.plan.name))
        for secret in self.control_plane.management_objects(ns):
            secret["metadata"]["ownerReferences"] = [_owner(cluster)]
            await client.resource(SECRET).create(secret)
        await client.resource(extra_resources()["TestbedControlPlane"]).patch_status(
            ObjectKey(ns, self.plan.control_plane),
            {"status": self.control_plane.control_plane_status()},
        )
        await self.resume(client)
        shutil.copyfile(self.control_plane.admin_kubeconfig, self.kubeconfig)
        self.kubeconfig.chmod(0o600)
        self.workload = await KubeClient.connect(
            str(self.kubeconfig), user_agent="capl-demo", request_timeout=5.0
        )

    def check_running(self) -> None:
        """Raise CliError when a process of the workload control plane died."""
        if self.control_plane is not None:
            try:
                self.control_plane.check_running()
            except Exception as exc:
                first = str(exc).splitlines()[0]
                raise CliError(
                    f"the workload control plane stopped: {first} (see workload/logs/)"
                ) from None
        if self.bootstrap is not None and not self.bootstrap.running:
            raise CliError(
                "the kubeadm bootstrap provider stopped (see "
                "control-plane/capi-kubeadm-bootstrap/logs/)"
            )

    async def nodes(self) -> NodeIndex:
        """The Nodes now; empty while the workload API server does not answer."""
        if self.workload is None:
            return NodeIndex()
        from capl.runtime.resources import NODE

        try:
            async with asyncio.timeout(5.0):
                listed = await self.workload.resource(NODE).list()
        except Exception:  # not answering: the view shows no Node yet
            return NodeIndex()
        return NodeIndex(listed.items)

    def processes(self) -> list[str]:
        return [f"{name} pid {pid}" for name, pid in self.pids.items()]

    def workload_processes(self) -> list[str]:
        return [p for p in self.processes() if p.startswith("workload-")]

    async def stop(self) -> list[str]:
        """Stop everything started here, side by side; what failed (never raises)."""
        if self.workload is not None:
            with contextlib.suppress(Exception):
                await self.workload.close()
            self.workload = None

        async def stop(what: str, work: Awaitable[Any]) -> str | None:
            try:
                await work
            except Exception as exc:
                return f"stopping {what}: {exc}"
            return None

        stops = []
        if self.bootstrap is not None:
            stops.append(stop("the kubeadm bootstrap provider", self.bootstrap.stop()))
        if self.control_plane is not None:
            # A short grace: its cluster is gone, and so is the address it listens on (capl
            # removed the network), which kube-apiserver's own shutdown waits for until killed.
            stops.append(stop("the workload control plane", self.control_plane.stop(grace=2.0)))
        results = await asyncio.gather(*stops)
        return [r for r in results if r is not None]


PAUSED_ANNOTATION: Final = "cluster.x-k8s.io/paused"


def _owner(cluster: Mapping[str, Any]) -> dict[str, Any]:
    """An owner reference to the Cluster, as Cluster API's controllers set it."""
    return {
        "apiVersion": cluster["apiVersion"],
        "kind": "Cluster",
        "name": cluster["metadata"]["name"],
        "uid": cluster["metadata"]["uid"],
    }


def _condition_text(obj: Mapping[str, Any], type_: str) -> str:
    for condition in (obj.get("status") or {}).get("conditions") or ():
        if isinstance(condition, Mapping) and condition.get("type") == type_:
            reason = str(condition.get("reason") or "")
            message = " ".join(str(condition.get("message") or "").split())
            return f"{type_}: {reason}" + (f" ({message})" if message else "")
    return f"{type_}: not reported yet"
