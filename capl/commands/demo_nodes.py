"""`capl demo`'s default mode: a workload cluster of real Kubernetes nodes.

`capl demo` (capl.commands.demo) runs the management side — a local control plane, the
Cluster API core manager, capl's manager in process. This module adds what real nodes need
and the demo wires in:

1. **Cluster API's kubeadm bootstrap provider** (`capl.testbed.kubeadm_providers.
   KubeadmBootstrap`, the Go manager `make capi` builds, with its CRDs and webhooks on
   loopback, `KubeadmBootstrapFormatIgnition` on). It turns each worker's KubeadmConfig into
   the bootstrap data Secret capl delivers: Ignition (fw_cfg) or cloud-config (NoCloud ISO).
   Only the bootstrap provider runs: the demo has no KubeadmControlPlane, so the
   control-plane provider would be one more Go process on a 2-core machine doing nothing.
2. The **workload cluster's control plane on this machine** (`capl.testbed.hostedcp.
   HostedControlPlane`: etcd, kube-apiserver, kube-controller-manager, kube-scheduler as host
   processes, made with kubeadm's own phases), started as soon as capl has created the
   cluster network, with kube-apiserver bound to the network's host address (the first
   address of its CIDR, port 6443) — the `controlPlaneEndpoint` of the Cluster and the
   LibvirtCluster. Why not a control-plane Machine: `kubeadm init` in a TCG guest adds etcd
   and three control-plane components to a boot that alone takes over a minute on a 2-core
   machine (not measured as a whole yet), too slow for a demo;
   the workers are real either way. It is published to Cluster API the way tests/nodes/bed.py
   does it: the `<cluster>-ca` and `<cluster>-kubeconfig` Secrets (owned by the Cluster) and
   the status of the Cluster's `TestbedControlPlane` (the test bed's stand-in kind, whose
   CRD is installed with capl's).
3. The **objects** (`node_objects`): the offline flavor, templates/cluster-template-offline.yaml,
   built in Python with the demo's values — a Cluster with its TestbedControlPlane, an
   isolated LibvirtCluster, one LibvirtMachineTemplate of the node image (`make node-image`,
   imported by capl from its path on the host), the KubeadmConfigTemplates `<name>-md-ignition`
   (format ignition) and `<name>-md-cloud-config` (format cloud-config), and one
   MachineDeployment for each, so the worker pool mixes Ignition and cloud-config nodes.
   They are created in two steps (`RealNodes.create`): the Cluster (paused), its
   TestbedControlPlane and LibvirtCluster first; the templates and MachineDeployments once
   the control plane runs and the Cluster is resumed.
4. The **Node watch** for the live view (`NodeIndex`): the workload cluster's Nodes, read
   with the workload kubeconfig, matched to each machine by its nodeRef, providerID or name.
   A machine is done when its Node is Ready and is its Machine's nodeRef.
5. The **workload kubeconfig** at `<work directory>/workload.kubeconfig` (a system:masters
   client, like the `<cluster>-kubeconfig` Secret), for `kubectl get nodes`.

`RealNodes.stop` stops the bootstrap provider and the hosted control plane; the demo calls it
after the cluster was deleted through the API (Cluster API drains and deletes the Nodes
through the workload API server, so it must still run). A killed demo's processes die with
it (PR_SET_PDEATHSIG); its libvirt objects are removed by the next demo as in the VM-only
mode.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import json
import os
import re
import shutil
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol

from capl.errors import EXIT_USAGE, CliError

if TYPE_CHECKING:
    from capl.commands.demo import DemoPlan
    from capl.commands.status_report import MachineView
    from capl.kube.client import KubeClient
    from capl.runtime.resources import Resource
    from capl.testbed import ControlPlane
    from capl.testbed.capi import CapiAssets
    from capl.testbed.hostedcp import HostedControlPlane
    from capl.testbed.kubeadm_providers import KubeadmBootstrap

__all__ = [
    "NodeIndex",
    "NodeParts",
    "NodeState",
    "RealNodes",
    "find_node_bin",
    "find_node_image",
    "gateway",
    "node_image_for",
    "node_objects",
    "row_node",
    "runs_here",
    "split_workers",
    "testbed_manifests",
]

KUBERNETES_VERSION: Final = "v1.35.4"
"""What hack/node-bin.sh builds (hack/versions.env); `kubeadm version` says it at run time."""
WORKLOAD_KUBECONFIG: Final = "workload.kubeconfig"
NODE_IMAGE_ENV: Final = "CAPL_NODE_IMAGE"
NODE_BIN_ENV: Final = "CAPL_NODE_BIN"
WORKER_CPUS: Final = 2
WORKER_MEMORY_MIB: Final = 1536
"""The offline template's worker size (LIBVIRT_CPUS, LIBVIRT_MEMORY_MIB defaults)."""
POD_CIDR: Final = "10.244.0.0/16"
SERVICE_CIDR: Final = "10.96.0.0/12"
API_PORT: Final = 6443
NETWORK_TIMEOUT: Final = 120.0
_CAPI_GROUP: Final = "cluster.x-k8s.io"
_INFRA_GROUP: Final = "infrastructure.cluster.x-k8s.io"
_BOOTSTRAP_GROUP: Final = "bootstrap.cluster.x-k8s.io"
_TESTBED_CP_GROUP: Final = "controlplane.testbed.capl.dev"
_DEPLOYMENT_NAME_LABEL: Final = "cluster.x-k8s.io/deployment-name"
_CRI_SOCKET: Final = "unix:///var/run/containerd/containerd.sock"


# --- the plan ------------------------------------------------------------------------------------


def runs_here(uri: str) -> bool:
    """A libvirt URI of this machine (no host, local socket): real nodes need their control
    plane on the host of their network, which is where the demo runs it."""
    scheme, _, rest = uri.partition("://")
    transport = scheme.partition("+")[2]
    return transport in ("", "unix") and not rest.split("/", 1)[0]


def gateway(cidr: str) -> str:
    """The host's address on the cluster network (its first address): the control plane's."""
    return str(next(ipaddress.IPv4Network(cidr, strict=False).hosts()))


def split_workers(machines: int) -> tuple[int, int]:
    """(Ignition workers, cloud-config workers): half each, the odd one with Ignition."""
    return machines - machines // 2, machines // 2


def node_objects(plan: DemoPlan) -> list[dict[str, Any]]:
    """Every API object of the real-node cluster, in creation order.

    Keep in step with templates/cluster-template-offline.yaml (the same objects, specs and
    names). The demo differs only where it must: the host is called `local`, the pool is a
    directory in the work directory, objects carry the cluster-name label, and the values
    are the demo's (CIDR, endpoint, image path, worker counts and size).
    """
    ns, name = plan.namespace, plan.name
    endpoint = {"host": gateway(plan.cidr), "port": API_PORT}
    labels = {"cluster.x-k8s.io/cluster-name": name}
    ignition_workers, cloud_config_workers = split_workers(plan.machines)
    worker_template = f"{name}-worker"

    def meta(object_name: str) -> dict[str, Any]:
        return {"name": object_name, "namespace": ns, "labels": dict(labels)}

    def ref(group: str, kind: str, object_name: str) -> dict[str, str]:
        return {"apiGroup": group, "kind": kind, "name": object_name}

    def kubeadm_config_template(object_name: str, fmt: str) -> dict[str, Any]:
        return {
            "apiVersion": f"{_BOOTSTRAP_GROUP}/v1beta2",
            "kind": "KubeadmConfigTemplate",
            "metadata": meta(object_name),
            "spec": {
                "template": {
                    "spec": {
                        "format": fmt,
                        "joinConfiguration": {
                            "nodeRegistration": {
                                "criSocket": _CRI_SOCKET,
                                "imagePullPolicy": "Never",
                            },
                            "timeouts": {
                                "tlsBootstrapSeconds": 600,
                                "kubeletHealthCheckSeconds": 600,
                            },
                        },
                    }
                }
            },
        }

    def machine_deployment(object_name: str, replicas: int) -> dict[str, Any]:
        selector = {_DEPLOYMENT_NAME_LABEL: object_name}
        return {
            "apiVersion": f"{_CAPI_GROUP}/v1beta2",
            "kind": "MachineDeployment",
            "metadata": meta(object_name),
            "spec": {
                "clusterName": name,
                "replicas": replicas,
                "selector": {"matchLabels": selector},
                "template": {
                    "metadata": {"labels": dict(selector)},
                    "spec": {
                        "clusterName": name,
                        "version": plan.kubernetes_version,
                        "bootstrap": {
                            "configRef": ref(_BOOTSTRAP_GROUP, "KubeadmConfigTemplate", object_name)
                        },
                        "infrastructureRef": ref(
                            _INFRA_GROUP, "LibvirtMachineTemplate", worker_template
                        ),
                    },
                },
            },
        }

    return [
        {
            "apiVersion": f"{_TESTBED_CP_GROUP}/v1alpha1",
            "kind": "TestbedControlPlane",
            "metadata": meta(plan.control_plane),
            "spec": {"version": plan.kubernetes_version, "controlPlaneEndpoint": endpoint},
        },
        {
            "apiVersion": f"{_INFRA_GROUP}/v1alpha1",
            "kind": "LibvirtCluster",
            "metadata": meta(name),
            "spec": {
                "hosts": [{"name": "local", "uri": plan.uri}],
                "network": {"cidr": plan.cidr, "mode": "isolated"},
                "controlPlaneEndpoint": endpoint,
                "storagePool": {"path": plan.pool_path},
            },
        },
        {
            "apiVersion": f"{_CAPI_GROUP}/v1beta2",
            "kind": "Cluster",
            "metadata": meta(name),
            "spec": {
                "clusterNetwork": {
                    "pods": {"cidrBlocks": [POD_CIDR]},
                    "services": {"cidrBlocks": [SERVICE_CIDR]},
                },
                "controlPlaneEndpoint": endpoint,
                "controlPlaneRef": ref(
                    _TESTBED_CP_GROUP, "TestbedControlPlane", plan.control_plane
                ),
                "infrastructureRef": ref(_INFRA_GROUP, "LibvirtCluster", name),
            },
        },
        {
            "apiVersion": f"{_INFRA_GROUP}/v1alpha1",
            "kind": "LibvirtMachineTemplate",
            "metadata": meta(worker_template),
            "spec": {
                "template": {
                    "spec": {
                        "cpus": plan.cpus,
                        "memoryMiB": plan.memory_mib,
                        "image": {"path": plan.image_path, "format": "qcow2"},
                        "domainType": plan.domain_type,
                    }
                }
            },
        },
        kubeadm_config_template(plan.md_ignition, "ignition"),
        kubeadm_config_template(plan.md_cloud_config, "cloud-config"),
        machine_deployment(plan.md_ignition, ignition_workers),
        machine_deployment(plan.md_cloud_config, cloud_config_workers),
    ]


def testbed_manifests() -> list[dict[str, Any]]:
    """The TestbedControlPlane CRD and the aggregated ClusterRole Cluster API needs on it."""
    from capl.testbed import hostedcp

    return [hostedcp.control_plane_crd(), hostedcp.control_plane_rbac()]


def write_testbed_manifests(directory: Path) -> None:
    """Into the directory of capl's CRDs (installed together); JSON is YAML."""
    directory.mkdir(parents=True, exist_ok=True)
    for obj in testbed_manifests():
        (directory / f"testbed-{obj['kind'].lower()}.yaml").write_text(json.dumps(obj, indent=1))


@functools.cache
def extra_resources() -> dict[str, Resource]:
    """REST resources of the kinds of this mode capl's runtime does not know."""
    from capl.runtime.resources import Resource
    from capl.testbed import hostedcp

    return {
        "TestbedControlPlane": Resource(
            hostedcp.CP_GROUP, hostedcp.CP_VERSION, hostedcp.CP_KIND, hostedcp.CP_PLURAL
        ),
        "KubeadmConfigTemplate": Resource(
            _BOOTSTRAP_GROUP, "v1beta2", "KubeadmConfigTemplate", "kubeadmconfigtemplates"
        ),
        "MachineDeployment": Resource(
            _CAPI_GROUP, "v1beta2", "MachineDeployment", "machinedeployments"
        ),
    }


# --- the parts on disk ---------------------------------------------------------------------------


def _newest(candidates: Iterable[Path]) -> Path | None:
    found = sorted(candidates, key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def node_image_for(uri: str, *, image: str | None, node_image: str | None, cache: Path) -> Path:
    """The node image for a demo of real nodes on ``uri``; usage errors for what cannot work
    (a remote host, --image without --vm-only, no node image)."""
    if not runs_here(uri):
        raise CliError(
            f"real nodes need {uri} to be this machine (their control plane runs here, on the "
            "cluster network's host address): pass --vm-only",
            code=EXIT_USAGE,
        )
    if image is not None:
        raise CliError(
            "--image is the base image of the VM-only mode: add --vm-only (real nodes boot the "
            "node image, --node-image)",
            code=EXIT_USAGE,
        )
    return find_node_image(node_image, cache=cache)


def find_node_image(explicit: str | None, *, cache: Path) -> Path:
    """--node-image, else $CAPL_NODE_IMAGE, else the newest `make node-image` in the cache."""
    given = explicit or os.environ.get(NODE_IMAGE_ENV) or None
    path = Path(given) if given else _newest(cache.glob("node-image/*/capl-node.qcow2"))
    if path is None:
        raise CliError(
            "no node image: run `make node-image` (it prints the path; `make demo` builds it and "
            "passes it for you) and pass --node-image PATH, or run with --vm-only",
            code=EXIT_USAGE,
        )
    if re.match(r"^https?://", str(given or "")):
        raise CliError("--node-image takes a file on this machine, not a URL", code=EXIT_USAGE)
    path = path.expanduser().resolve()
    if not path.is_file():
        raise CliError(f"--node-image {path}: no such file", code=EXIT_USAGE)
    return path


def find_node_bin(*, cache: Path) -> Path:
    """$CAPL_NODE_BIN, else the newest `make node-bin` build in the cache (kubeadm,
    kube-controller-manager, kube-scheduler for the hosted control plane)."""
    given = os.environ.get(NODE_BIN_ENV)
    if given:
        return Path(given)
    found = _newest(p.parent.parent for p in cache.glob("node-bin/*/bin/kubeadm"))
    if found is None:
        raise CliError(
            "kubeadm, kube-controller-manager and kube-scheduler not found: run `make node-bin` "
            f"(or `make demo`, which builds everything) and set {NODE_BIN_ENV} to the directory "
            "it prints, or run with --vm-only"
        )
    return found


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeParts:
    """What real nodes need on this machine, found before anything starts."""

    image: Path
    node_bin: Path
    envtest: Path
    capi: CapiAssets

    @classmethod
    def find(cls, *, image: Path, envtest: Path, capi: CapiAssets, cache: Path) -> NodeParts:
        """The parts; CliError when a binary is missing (the node binaries, the kubeadm
        bootstrap provider's build)."""
        from capl.testbed.capi import CapiMissing
        from capl.testbed.hostedcp import HostedControlPlaneError, find_node_assets
        from capl.testbed.kubeadm_providers import require_kubeadm_providers

        node_bin = find_node_bin(cache=cache)
        try:
            find_node_assets(node_bin, envtest)
            require_kubeadm_providers(capi)
        except (HostedControlPlaneError, CapiMissing) as exc:
            raise CliError(f"{exc} (`make demo` builds everything), or use --vm-only") from None
        return cls(image=image, node_bin=node_bin, envtest=envtest, capi=capi)

    async def plan_values(self) -> dict[str, Any]:
        """The DemoPlan fields of real nodes."""
        return {
            "real_nodes": True,
            "image_path": str(self.image),
            "cpus": WORKER_CPUS,
            "kubernetes_version": await kubeadm_version(self.node_bin / "bin" / "kubeadm"),
        }


async def kubeadm_version(kubeadm: Path) -> str:
    """`kubeadm version -o short` (the Kubernetes version of the nodes and control plane)."""
    from capl.testbed.process import run_captured

    with contextlib.suppress(Exception):
        status, out, _ = await run_captured(
            [str(kubeadm), "version", "-o", "short"], env=dict(os.environ), within=30.0
        )
        if status == 0 and re.fullmatch(r"v\d+\.\d+\.\d+", out.strip()):
            return out.strip()
    return KUBERNETES_VERSION


# --- the Nodes -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NodeState:
    """A workload cluster Node, as the live view shows it."""

    name: str
    ready: bool
    reason: str = ""
    message: str = ""

    @property
    def text(self) -> str:
        return f"{self.name} {'Ready' if self.ready else 'NotReady'}"

    @property
    def detail(self) -> str:
        text = f"Node NotReady: {self.reason}" if self.reason else "Node NotReady"
        return f"{text} ({self.message})" if self.message else text


def node_state(node: Mapping[str, Any]) -> NodeState:
    name = str((node.get("metadata") or {}).get("name") or "")
    for condition in (node.get("status") or {}).get("conditions") or ():
        if isinstance(condition, Mapping) and condition.get("type") == "Ready":
            message = " ".join(str(condition.get("message") or "").split())
            return NodeState(
                name=name,
                ready=condition.get("status") == "True",
                reason=str(condition.get("reason") or ""),
                message=message[:160],
            )
    return NodeState(name=name, ready=False, reason="NoReadyCondition")


class NodeIndex:
    """The workload cluster's Nodes by name and by providerID."""

    def __init__(self, nodes: Iterable[Mapping[str, Any]] = ()) -> None:
        self.by_name: dict[str, NodeState] = {}
        self.by_provider_id: dict[str, NodeState] = {}
        for node in nodes:
            state = node_state(node)
            self.by_name[state.name] = state
            provider_id = (node.get("spec") or {}).get("providerID")
            if provider_id:
                self.by_provider_id[str(provider_id)] = state

    def find(self, view: MachineView) -> NodeState | None:
        """The Node of a machine: its Machine's nodeRef, else the same providerID (capl sets
        it on the Node before Cluster API sets the nodeRef), else the machine's name (the
        node's hostname)."""
        if view.node and view.node in self.by_name:
            return self.by_name[view.node]
        if view.provider_id and view.provider_id in self.by_provider_id:
            return self.by_provider_id[view.provider_id]
        for name in (view.machine, view.name):
            if name and name in self.by_name:
                return self.by_name[name]
        return None


def row_node(view: MachineView, nodes: NodeIndex, *, machine_detail: str) -> tuple[str, bool, str]:
    """(NODE column, done, WAITING FOR) of one machine in the real-node view: done when its
    Node is Ready and is the Machine's nodeRef."""
    node = nodes.find(view)
    if node is None:
        if view.ready != "True" or machine_detail:
            return "-", False, machine_detail or "waiting for its LibvirtMachine"
        return "-", False, "kubeadm join: no Node yet"
    if not node.ready:
        return node.text, False, node.detail
    if view.node != node.name:  # done only when Cluster API linked them (what users see)
        return node.text, False, "the Machine's nodeRef (capl sets the Node's providerID)"
    return node.text, True, ""


# --- the lifecycle -------------------------------------------------------------------------------


class Steps(Protocol):
    """The demo's output (capl.commands.demo.Ui): a step with its duration, a line."""

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
            await run(self._create_objects(client, self._workers()))
        ui.say("processes: " + ", ".join(self.workload_processes()))
        ui.say(f"workload kubeconfig: {self.kubeconfig}")

    def _objects(self, kinds: Iterable[str], *, include: bool) -> list[dict[str, Any]]:
        wanted = set(kinds)
        return [o for o in node_objects(self.plan) if (o["kind"] in wanted) is include]

    def _workers(self) -> list[dict[str, Any]]:
        return self._objects(_CLUSTER_KINDS, include=False)

    async def _create_objects(self, client: KubeClient, objects: Iterable[dict[str, Any]]) -> None:
        for obj in objects:
            await client.resource(_resource_of(obj)).create(obj)

    async def _create_cluster(self, client: KubeClient) -> None:
        from capl.runtime.resources import CLUSTER

        objects = {o["kind"]: o for o in self._objects(_CLUSTER_KINDS, include=True)}
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


_CLUSTER_KINDS: Final = ("TestbedControlPlane", "Cluster", "LibvirtCluster")
"""Created first (see `RealNodes.create`); the templates and MachineDeployments follow."""
PAUSED_ANNOTATION: Final = "cluster.x-k8s.io/paused"


def _owner(cluster: Mapping[str, Any]) -> dict[str, Any]:
    """An owner reference to the Cluster, as Cluster API's controllers set it."""
    return {
        "apiVersion": cluster["apiVersion"],
        "kind": "Cluster",
        "name": cluster["metadata"]["name"],
        "uid": cluster["metadata"]["uid"],
    }


def _resource_of(obj: Mapping[str, Any]) -> Resource:
    from capl.runtime.resources import lookup

    if obj["kind"] in extra_resources():
        return extra_resources()[obj["kind"]]
    found: Resource = lookup(str(obj["kind"]), group=str(obj["apiVersion"]).split("/", 1)[0])
    return found


def _condition_text(obj: Mapping[str, Any], type_: str) -> str:
    for condition in (obj.get("status") or {}).get("conditions") or ():
        if isinstance(condition, Mapping) and condition.get("type") == type_:
            reason = str(condition.get("reason") or "")
            message = " ".join(str(condition.get("message") or "").split())
            return f"{type_}: {reason}" + (f" ({message})" if message else "")
    return f"{type_}: not reported yet"


def workload_lines(*, kubectl: str, kubeconfig: str) -> list[str]:
    """The commands for the workload cluster (real nodes), for the demo's "Try it" list."""
    kc = f"--kubeconfig {kubeconfig}"
    return [
        f"  {kubectl} {kc} get nodes -o wide",
        f"  {kubectl} {kc} run hello --image capl.local/busybox:1 --image-pull-policy Never "
        "--restart Never --command -- /bin/busybox echo hello from a capl node",
        f"  {kubectl} {kc} logs hello",
    ]
