"""The kcp stage's cluster: `--flavor offline-kcp` applied, and a client of its workload API
server (see tests/kcp/conftest.py for why the managers resolve through the network).

The workload client connects to the address `api.<dnsDomain>` has in the network's dnsmasq,
with that name as the TLS server name (kubeadm's certificate is for the name): the test
process keeps the machine's resolver.
"""

from __future__ import annotations

import base64
import contextlib
import ipaddress
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from capl.kube import KubeClient
from capl.runtime.errors import NotFound
from capl.runtime.objects import Obj, ObjectKey
from capl.runtime.resources import LIBVIRT_CLUSTER, MACHINE, NODE, SECRET
from tests.e2e.harness import LibvirtView, Management, is_true, resolve_a
from tests.fixtures.common import eventually
from tests.nodes.bed import KUBERNETES_VERSION

FLAVOR = "offline-kcp"
KCP_RESOURCE = "kubeadmcontrolplanes.controlplane.cluster.x-k8s.io"


@dataclass
class KcpCluster:
    namespace: str
    name: str
    management: Management
    view: LibvirtView
    uri: str
    cidr: str
    gateway: str
    applied_at: float
    """monotonic time the manifest was applied"""
    network: str = ""
    pool: str = ""
    endpoint: str = ""
    workload: KubeClient | None = None
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def api(self) -> KubeClient:
        return self.management.api

    @property
    def domain_prefix(self) -> str:
        return f"capl-{self.namespace}-"

    async def machines(self, *, control_plane: bool) -> dict[str, Obj]:
        selector = f"cluster.x-k8s.io/cluster-name={self.name}"
        selector += ",cluster.x-k8s.io/control-plane" if control_plane else ""
        items = await self.api.resource(MACHINE).list(
            namespace=self.namespace, label_selector=selector
        )
        machines = {m["metadata"]["name"]: m for m in items.items}
        if not control_plane:
            cp_label = "cluster.x-k8s.io/control-plane"
            machines = {
                k: m for k, m in machines.items() if cp_label not in m["metadata"].get("labels", {})
            }
        return machines

    async def kubeadm_control_plane(self) -> Obj:
        out = await self.management.plane.kubectl(
            "-n", self.namespace, "get", KCP_RESOURCE, f"{self.name}-control-plane", "-o", "yaml"
        )
        obj: Obj = yaml.safe_load(out)
        return obj

    async def connect_workload(self, *, workdir: Path) -> KubeClient:
        """A client of the workload API server from the `<cluster>-kubeconfig` Secret KCP wrote."""
        if self.workload is not None:
            return self.workload
        secret = await self.api.resource(SECRET).get(
            ObjectKey(self.namespace, f"{self.name}-kubeconfig")
        )
        config: dict[str, Any] = yaml.safe_load(base64.b64decode(secret["data"]["value"]))
        (entry,) = config["clusters"]
        host, port = self.endpoint.rsplit(":", 1)
        (address,) = resolve_a(self.gateway, host)
        assert entry["cluster"]["server"] == f"https://{self.endpoint}"
        entry["cluster"]["server"] = f"https://{address}:{port}"
        entry["cluster"]["tls-server-name"] = host
        path = workdir / "workload.kubeconfig"
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o600)
        self.workload = await KubeClient.connect(str(path))
        return self.workload

    async def nodes(self) -> dict[str, Obj]:
        assert self.workload is not None
        return {n["metadata"]["name"]: n for n in (await self.workload.resource(NODE).list()).items}

    async def close(self) -> None:
        if self.workload is not None:
            await self.workload.close()
            self.workload = None


async def create_kcp_cluster(
    management: Management,
    *,
    namespace: str,
    name: str,
    view: LibvirtView,
    uri: str,
    cidr: str,
    node_image: Path,
) -> KcpCluster:
    """Generate and apply the offline-kcp flavor (1 control-plane machine, 1 worker); return
    once capl made the network (the endpoint is known then)."""
    plane = management.plane
    await plane.kubectl("create", "namespace", namespace)
    manifest = await management.clusterctl.generate_cluster(
        name,
        kubeconfig=plane.kubeconfig,
        flavor=FLAVOR,
        target_namespace=namespace,
        kubernetes_version=KUBERNETES_VERSION,
        control_plane_machine_count=1,
        worker_machine_count=1,
        variables={
            "LIBVIRT_URI": uri,
            "LIBVIRT_NETWORK_CIDR": cidr,
            "LIBVIRT_IMAGE_PATH": str(node_image),
            "LIBVIRT_DOMAIN_TYPE": "qemu",
        },
    )
    await plane.kubectl(
        "apply", "--server-side", "--field-manager=capl-kcp", "-f", "-", stdin=manifest.encode()
    )
    gateway = str(next(ipaddress.ip_network(cidr).hosts()))
    kcp = KcpCluster(
        namespace=namespace,
        name=name,
        management=management,
        view=view,
        uri=uri,
        cidr=cidr,
        gateway=gateway,
        applied_at=time.monotonic(),
    )

    async def network_ready() -> Obj | None:
        with contextlib.suppress(NotFound):
            lc = await kcp.api.resource(LIBVIRT_CLUSTER).get(ObjectKey(namespace, name))
            return lc if is_true(lc, "NetworkReady") else None
        return None

    lcluster = await eventually(network_ready, within=120, what="the cluster network")
    kcp.network = lcluster["spec"]["network"]["name"]
    kcp.pool = lcluster["spec"]["storagePool"]["name"]
    endpoint = lcluster["spec"]["controlPlaneEndpoint"]
    kcp.endpoint = f"{endpoint['host']}:{endpoint['port']}"
    return kcp
