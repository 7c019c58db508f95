"""The real-node bed: one workload cluster of real Kubernetes nodes, shared by tests/nodes.

Management side: the e2e harness's management cluster (control plane, `clusterctl init
--infrastructure libvirt`, the Cluster API core manager, `capl manager`) plus the kubeadm
bootstrap and control-plane providers as local processes (`capl.testbed.kubeadm_providers`,
Ignition output on). Workload side: `clusterctl generate cluster --flavor offline`
(templates/cluster-template-offline.yaml) on qemu:///system with an isolated network of its
own, workers from the node image (CAPL_NODE_IMAGE, `make node-image`) that join with the
bootstrap provider's data, Ignition (md-ignition) and cloud-config (md-cloud-config), and
the hosted control plane (`capl.testbed.hostedcp`) started on the network's host address
as soon as capl has created the network; it publishes the `<cluster>-ca` and
`<cluster>-kubeconfig` Secrets and its TestbedControlPlane's status.

Inside the guests the tests act only through qemu-guest-agent (`guest_exec`), as a user
without SSH would.
"""

from __future__ import annotations

import base64
import contextlib
import ipaddress
import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import libvirt
import libvirt_qemu  # type: ignore[import-untyped]

from capl.kube import KubeClient
from capl.ports.naming import machine_names
from capl.runtime.errors import NotFound
from capl.runtime.objects import Obj, ObjectKey
from capl.runtime.resources import (
    CLUSTER,
    LIBVIRT_CLUSTER,
    LIBVIRT_MACHINE,
    MACHINE,
    NODE,
)
from capl.testbed import hostedcp
from capl.testbed.hostedcp import HostedControlPlane
from tests.e2e.harness import LibvirtView, Management, is_true, report
from tests.fixtures.common import eventually

KUBERNETES_VERSION = "v1.35.4"
FLAVOR = "offline"
NODE_IMAGE_ENV = "CAPL_NODE_IMAGE"


def node_ready(node: Mapping[str, Any]) -> bool:
    return is_true(node, "Ready")


@dataclass
class RealCluster:
    """One workload cluster of real nodes (see the module docstring)."""

    namespace: str
    name: str
    management: Management
    view: LibvirtView
    uri: str
    cidr: str
    control_plane: HostedControlPlane
    workload: KubeClient | None = None
    network: str = ""
    pool: str = ""

    @property
    def api(self) -> KubeClient:
        return self.management.api

    @property
    def md_ignition(self) -> str:
        return f"{self.name}-md-ignition"

    @property
    def md_cloud_config(self) -> str:
        return f"{self.name}-md-cloud-config"

    @property
    def domain_prefix(self) -> str:
        return f"capl-{self.namespace}-"

    async def machines(self, deployment: str | None = None) -> dict[str, Obj]:
        selector = f"cluster.x-k8s.io/cluster-name={self.name}"
        if deployment:
            selector += f",cluster.x-k8s.io/deployment-name={deployment}"
        items = await self.api.resource(MACHINE).list(
            namespace=self.namespace, label_selector=selector
        )
        return {m["metadata"]["name"]: m for m in items.items}

    async def libvirt_machine(self, name: str) -> Obj | None:
        with contextlib.suppress(NotFound):
            return await self.api.resource(LIBVIRT_MACHINE).get(ObjectKey(self.namespace, name))
        return None

    async def nodes(self) -> dict[str, Obj]:
        assert self.workload is not None
        items = (await self.workload.resource(NODE).list()).items
        return {n["metadata"]["name"]: n for n in items}

    async def wait_ready_nodes(
        self, deployment: str, count: int, *, within: float
    ) -> dict[str, Obj]:
        """Until `deployment` has exactly `count` Machines, each with a Ready Node."""

        async def probe() -> dict[str, Obj] | None:
            machines = await self.machines(deployment)
            if len(machines) != count:
                return None
            nodes = await self.nodes()
            ready: dict[str, Obj] = {}
            for name, m in machines.items():
                ref = (m.get("status") or {}).get("nodeRef") or {}
                node = nodes.get(ref.get("name", ""))
                if node is None or not node_ready(node):
                    return None
                ready[name] = node
            return ready

        return await eventually(probe, within=within, what=f"{count} Ready nodes of {deployment}")

    async def scale(self, deployment: str, replicas: int) -> None:
        await self.management.plane.kubectl(
            "-n", self.namespace, "scale", "machinedeployment", deployment, f"--replicas={replicas}"
        )

    def domain_of(self, machine: str) -> str:
        return machine_names(namespace=self.namespace, name=machine).domain

    async def kubectl_workload(self, *args: str, stdin: bytes | None = None) -> str:
        return await self.control_plane.kubectl(*args, stdin=stdin)


def guest_exec(uri: str, domain: str, argv: list[str], *, within: float = 60.0) -> tuple[int, str]:
    """Run a command in the guest through qemu-guest-agent (guest-exec): (exit code, output)."""
    conn = libvirt.open(uri)
    try:
        dom = conn.lookupByName(domain)
        started = json.loads(
            libvirt_qemu.qemuAgentCommand(
                dom,
                json.dumps(
                    {
                        "execute": "guest-exec",
                        "arguments": {"path": argv[0], "arg": argv[1:], "capture-output": True},
                    }
                ),
                30,
                0,
            )
        )
        pid = started["return"]["pid"]
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            status = json.loads(
                libvirt_qemu.qemuAgentCommand(
                    dom,
                    json.dumps({"execute": "guest-exec-status", "arguments": {"pid": pid}}),
                    30,
                    0,
                )
            )["return"]
            if status.get("exited"):
                out = base64.b64decode(status.get("out-data", "")) + base64.b64decode(
                    status.get("err-data", "")
                )
                return int(status.get("exitcode", -1)), out.decode(errors="replace")
            time.sleep(0.2)
        raise TimeoutError(f"{argv} in {domain}: no exit within {within:g} s")
    finally:
        conn.close()


async def create_real_cluster(
    management: Management,
    *,
    namespace: str,
    name: str,
    view: LibvirtView,
    uri: str,
    node_image: Path,
    workdir: Path,
    ignition_workers: int,
    cloud_config_workers: int,
) -> RealCluster:
    """Generate and apply the offline flavor, start the hosted control plane on the cluster
    network's host address once capl made the network, publish it to Cluster API."""
    plane = management.plane
    cidr = view.free_cidr()
    gateway = str(next(ipaddress.ip_network(cidr).hosts()))
    for obj in (hostedcp.control_plane_crd(), hostedcp.control_plane_rbac()):
        await plane.kubectl("apply", "--server-side", "-f", "-", stdin=json.dumps(obj).encode())
    await plane.kubectl(
        "wait", "--for=condition=Established", f"crd/{hostedcp.CP_PLURAL}.{hostedcp.CP_GROUP}"
    )
    await plane.kubectl("create", "namespace", namespace)
    manifest = await management.clusterctl.generate_cluster(
        name,
        kubeconfig=plane.kubeconfig,
        flavor=FLAVOR,
        target_namespace=namespace,
        kubernetes_version=KUBERNETES_VERSION,
        worker_machine_count=ignition_workers,
        variables={
            "LIBVIRT_URI": uri,
            "LIBVIRT_NETWORK_CIDR": cidr,
            "CONTROL_PLANE_ENDPOINT_HOST": gateway,
            "LIBVIRT_IMAGE_PATH": str(node_image),
            "LIBVIRT_DOMAIN_TYPE": "qemu",
            "LIBVIRT_CLOUD_CONFIG_WORKER_MACHINE_COUNT": str(cloud_config_workers),
        },
    )
    await plane.kubectl(
        "apply", "--server-side", "--field-manager=capl-nodes", "-f", "-", stdin=manifest.encode()
    )
    control_plane = HostedControlPlane(
        cluster=name, address=gateway, workdir=workdir / "control-plane"
    )
    real = RealCluster(
        namespace=namespace,
        name=name,
        management=management,
        view=view,
        uri=uri,
        cidr=cidr,
        control_plane=control_plane,
    )
    api = management.api

    async def network_ready() -> Obj | None:
        lc = await api.resource(LIBVIRT_CLUSTER).get(ObjectKey(namespace, name))
        return lc if is_true(lc, "NetworkReady") else None

    lcluster = await eventually(network_ready, within=120, what="the cluster network")
    real.network = lcluster["spec"]["network"]["name"]
    real.pool = lcluster["spec"]["storagePool"]["name"]
    t0 = time.monotonic()
    await control_plane.start()
    report(f"hosted control plane of {name}: ready {time.monotonic() - t0:.1f} s after the network")
    await publish_control_plane(real)
    real.workload = await KubeClient.connect(str(control_plane.admin_kubeconfig))
    return real


async def publish_control_plane(real: RealCluster) -> None:
    """The `<cluster>-ca`/`-kubeconfig` Secrets (owned by the Cluster, so `clusterctl move`
    carries them) and the TestbedControlPlane's status."""
    api, ns = real.api, real.namespace
    cluster = await api.resource(CLUSTER).get(ObjectKey(ns, real.name))
    owner = {
        "apiVersion": cluster["apiVersion"],
        "kind": "Cluster",
        "name": real.name,
        "uid": cluster["metadata"]["uid"],
    }
    for secret in real.control_plane.management_objects(ns):
        secret["metadata"]["ownerReferences"] = [owner]
        await real.management.plane.kubectl(
            "apply", "--server-side", "-f", "-", stdin=json.dumps(secret).encode()
        )
    status = {"status": real.control_plane.control_plane_status()}
    await real.management.plane.kubectl(
        "-n", ns, "patch", f"{hostedcp.CP_PLURAL}.{hostedcp.CP_GROUP}",
        f"{real.name}-control-plane", "--subresource=status", "--type=merge",
        "-p", json.dumps(status),
    )  # fmt: skip


class ClusterRef(Protocol):
    """A workload cluster as `delete_real_cluster` needs it (RealCluster, the kcp stage's)."""

    @property
    def api(self) -> KubeClient: ...

    namespace: str
    name: str


async def delete_real_cluster(real: ClusterRef, *, within: float = 300.0) -> float:
    """Delete the Cluster and wait until it is gone (the control plane keeps running: Cluster
    API drains the nodes through it); seconds taken."""
    t0 = time.monotonic()
    with contextlib.suppress(NotFound):
        await real.api.resource(CLUSTER).delete(ObjectKey(real.namespace, real.name))

    async def gone() -> bool:
        try:
            await real.api.resource(CLUSTER).get(ObjectKey(real.namespace, real.name))
        except NotFound:
            return True
        return False

    await eventually(gone, within=within, what=f"Cluster {real.name} deleted")
    return time.monotonic() - t0


def env_path(name: str) -> Path | None:
    value = os.environ.get(name)
    return Path(value) if value else None
