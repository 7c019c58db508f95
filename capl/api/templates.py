"""LibvirtMachineTemplate and LibvirtClusterTemplate.

MachineSets/MachineDeployments clone LibvirtMachines from a LibvirtMachineTemplate;
ClusterClass clones LibvirtClusters from a LibvirtClusterTemplate. Templates are immutable,
except for the topology controller's dry runs: a CEL rule cannot see whether a request is a
dry run, so immutability is enforced by the validating webhook (capl.webhooks), and the spec
models embedded here carry no transition rules.

A LibvirtMachineTemplate's `status` is the Cluster API autoscaler's view of a machine of the
template (the "autoscaling from zero" part of the InfraMachineTemplate contract):
`status.capacity` (`cpu`, `memory` as Kubernetes quantities) and `status.nodeInfo`
(`architecture`, `operatingSystem`), derived from the spec by `machine_template_status` and
kept in sync by the manager (capl.controllers.machine_template). The cluster-autoscaler's
clusterapi provider reads them to build a node of a MachineDeployment at 0 replicas.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field

from capl.api.base import K8sModel
from capl.api.cluster import LibvirtClusterSpec
from capl.api.constants import API_VERSION, Kind
from capl.api.machine import LibvirtMachineSpec
from capl.api.meta import ObjectMeta, TemplateObjectMeta


class LibvirtMachineTemplateResource(K8sModel):
    """What a LibvirtMachine created from the template looks like."""

    metadata: TemplateObjectMeta | None = None
    """Labels and annotations of the created LibvirtMachines."""
    spec: LibvirtMachineSpec
    """Spec of the created LibvirtMachines."""


class LibvirtMachineTemplateSpec(K8sModel):
    template: LibvirtMachineTemplateResource
    """The LibvirtMachine template."""


#: A Kubernetes resource quantity (the pattern Kubernetes' own OpenAPI gives `Quantity`).
QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]"
    r"|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
Architecture = Literal["amd64", "arm64", "s390x", "ppc64le"]
Quantity = Annotated[str, Field(min_length=1, max_length=64, pattern=QUANTITY_PATTERN)]


class NodeInfo(K8sModel):
    """The architecture and operating system of a node made from the template."""

    architecture: Architecture | None = None
    """CPU architecture of the node: amd64, arm64, s390x or ppc64le."""
    operating_system: str | None = Field(default=None, min_length=1, max_length=32)
    """Operating system of the node, e.g. linux."""


class LibvirtMachineTemplateStatus(K8sModel):
    """What a machine of the template offers, for the Cluster API autoscaler (scale from zero).
    Written by the manager from the spec; not for users."""

    capacity: dict[str, Quantity] | None = None
    """Resources of a machine of the template as Kubernetes quantities: `cpu` (the vCPUs),
    `memory` (e.g. `4096Mi`); extended resources (devices) once capl attaches any."""
    node_info: NodeInfo | None = None
    """Architecture and operating system of a node made from the template."""


class LibvirtMachineTemplate(K8sModel):
    """A template of LibvirtMachines for MachineDeployments, MachineSets and ClusterClass."""

    KIND: ClassVar[str] = Kind.LIBVIRT_MACHINE_TEMPLATE

    api_version: Literal["infrastructure.cluster.x-k8s.io/v1alpha1"] = API_VERSION
    kind: Literal["LibvirtMachineTemplate"] = "LibvirtMachineTemplate"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: LibvirtMachineTemplateSpec
    status: LibvirtMachineTemplateStatus | None = None


#: The operating system of every capl machine: capl boots Linux images (Ignition, cloud-init).
OPERATING_SYSTEM = "linux"
#: The architecture reported for every template. A domain takes its host's architecture, and
#: a template does not say which host (or kind of host) its machines land on; capl's images,
#: firmware choices and test bed are x86_64. The autoscaler's own default is amd64 as well.
ARCHITECTURE: Architecture = "amd64"


def machine_template_status(spec: LibvirtMachineSpec) -> dict[str, Any]:
    """`status` of a LibvirtMachineTemplate whose `spec.template.spec` is `spec` (wire form):
    cpus 2 and memoryMiB 4096 give `capacity: {cpu: "2", memory: 4096Mi}` and
    `nodeInfo: {architecture: amd64, operatingSystem: linux}`."""
    capacity = {"cpu": str(spec.cpus), "memory": f"{spec.memory_mib}Mi"}
    counts: dict[str, int] = {}
    for device in [*(spec.host_devices or ()), *(spec.mediated_devices or ())]:
        if device.resource_name:  # extended resources: each device's resourceName, counted
            counts[device.resource_name] = counts.get(device.resource_name, 0) + 1
    if spec.hugepages is not None:  # as the kubelet names them: hugepages-2Mi
        capacity[f"hugepages-{spec.hugepages.page_size}"] = f"{spec.memory_mib}Mi"
    capacity.update({name: str(n) for name, n in sorted(counts.items())})
    return {
        "capacity": capacity,
        "nodeInfo": {"architecture": ARCHITECTURE, "operatingSystem": OPERATING_SYSTEM},
    }


class LibvirtMachineTemplateList(K8sModel):
    api_version: str = API_VERSION
    kind: Literal["LibvirtMachineTemplateList"] = "LibvirtMachineTemplateList"
    items: list[LibvirtMachineTemplate] = Field(default_factory=list)


class LibvirtClusterTemplateResource(K8sModel):
    """What a LibvirtCluster created from the template looks like."""

    metadata: TemplateObjectMeta | None = None
    """Labels and annotations of the created LibvirtClusters."""
    spec: LibvirtClusterSpec
    """Spec of the created LibvirtClusters."""


class LibvirtClusterTemplateSpec(K8sModel):
    template: LibvirtClusterTemplateResource
    """The LibvirtCluster template."""


class LibvirtClusterTemplate(K8sModel):
    """A template of LibvirtClusters for ClusterClass."""

    KIND: ClassVar[str] = Kind.LIBVIRT_CLUSTER_TEMPLATE

    api_version: Literal["infrastructure.cluster.x-k8s.io/v1alpha1"] = API_VERSION
    kind: Literal["LibvirtClusterTemplate"] = "LibvirtClusterTemplate"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: LibvirtClusterTemplateSpec


class LibvirtClusterTemplateList(K8sModel):
    api_version: str = API_VERSION
    kind: Literal["LibvirtClusterTemplateList"] = "LibvirtClusterTemplateList"
    items: list[LibvirtClusterTemplate] = Field(default_factory=list)
