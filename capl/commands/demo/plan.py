"""What a demo creates, derived from its options: names, network, mode (pure, unit-tested).

``DemoOptions`` are the flags as given (``capl.commands.demo.cli`` resolves the defaults that
depend on the mode); ``DemoPlan`` is what the demo creates, and every name, object and
clean-up step derives from it: the cluster, its control-plane Machine (VM-only) or
TestbedControlPlane (real nodes), the MachineDeployment(s), the workers' split between
Ignition and cloud-config.

The demo network (``capl.commands.demo.network``) is a /24; with real nodes the host's
address on it (``gateway``) is the workload control plane's.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Final

__all__ = [
    "DemoOptions",
    "DemoPlan",
    "gateway",
    "is_local_uri",
    "is_test_driver",
    "runs_here",
    "split_workers",
]

DEFAULT_NAME: Final = "demo"
DEFAULT_NAMESPACE: Final = "default"
HOST_NAME: Final = "local"
CAPI_GROUP: Final = "cluster.x-k8s.io"
INFRA_GROUP: Final = "infrastructure.cluster.x-k8s.io"
CONTROL_PLANE_LABEL: Final = "cluster.x-k8s.io/control-plane"
CLUSTER_NAME_LABEL: Final = "cluster.x-k8s.io/cluster-name"
DEPLOYMENT_NAME_LABEL: Final = "cluster.x-k8s.io/deployment-name"
KUBERNETES_VERSION: Final = "v1.35.4"
"""What hack/node-bin.sh builds (hack/versions.env); `kubeadm version` says it at run time."""
WORKER_CPUS: Final = 2
WORKER_MEMORY_MIB: Final = 1536
"""The offline template's worker size (LIBVIRT_CPUS, LIBVIRT_MEMORY_MIB defaults)."""
POD_CIDR: Final = "10.244.0.0/16"
SERVICE_CIDR: Final = "10.96.0.0/12"
API_PORT: Final = 6443


@dataclass(frozen=True, slots=True, kw_only=True)
class DemoPlan:
    """What the demo creates; everything derives from it (names, objects, clean-up)."""

    name: str = DEFAULT_NAME
    namespace: str = DEFAULT_NAMESPACE
    uri: str
    machines: int = 3
    """VM-only: all machines (one control plane, the rest workers); real nodes: workers."""
    image_url: str = ""
    image_sha256: str | None = None
    cidr: str
    pool_path: str
    domain_type: str = "qemu"
    cpus: int = 1
    memory_mib: int = 256
    real_nodes: bool = False
    """Real Kubernetes nodes (capl.commands.demo.real_nodes) instead of VMs of the test guest."""
    image_path: str | None = None
    """Real nodes: the node image, a file on the host."""
    kubernetes_version: str = KUBERNETES_VERSION

    @property
    def control_plane_machine(self) -> str:
        return f"{self.name}-control-plane-0"

    @property
    def control_plane(self) -> str:
        """Real nodes: the Cluster's TestbedControlPlane (the control plane on this host)."""
        return f"{self.name}-control-plane"

    @property
    def deployment(self) -> str:
        """The MachineDeployment `kubectl scale` is suggested for."""
        return self.md_cloud_config if self.real_nodes else f"{self.name}-workers"

    @property
    def deployments(self) -> tuple[str, ...]:
        if self.real_nodes:
            return (self.md_ignition, self.md_cloud_config)
        return (self.deployment,)

    @property
    def md_ignition(self) -> str:
        return f"{self.name}-md-ignition"

    @property
    def md_cloud_config(self) -> str:
        return f"{self.name}-md-cloud-config"

    @property
    def workers(self) -> int:
        """Replicas of `deployment`."""
        if self.real_nodes:
            return split_workers(self.machines)[1]
        return self.machines - 1

    @property
    def test_driver(self) -> bool:
        return is_test_driver(self.uri)


def is_test_driver(uri: str) -> bool:
    return uri.split(":", 1)[0].split("+", 1)[0] == "test"


def is_local_uri(uri: str) -> bool:
    """A URI whose hypervisor runs on this machine (local routes matter for its networks)."""
    scheme, _, rest = uri.partition("://")
    return "+" not in scheme and not rest.split("/", 1)[0]


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


@dataclass(frozen=True, slots=True, kw_only=True)
class DemoOptions:
    uri: str
    machines: int
    image: str | None
    keep: bool
    name: str
    network_cidr: str | None
    domain_type: str
    memory_mib: int
    ready_timeout: float
    cleanup_timeout: float
    exit_when_ready: bool
    log_level: str
    vm_only: bool = False
    """--vm-only as given (the test driver implies it: see `real_nodes`)."""
    node_image: str | None = None

    @property
    def real_nodes(self) -> bool:
        return not self.vm_only and not is_test_driver(self.uri)
