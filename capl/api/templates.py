"""LibvirtMachineTemplate and LibvirtClusterTemplate.

MachineSets/MachineDeployments clone LibvirtMachines from a LibvirtMachineTemplate;
ClusterClass clones LibvirtClusters from a LibvirtClusterTemplate. Templates are immutable,
except for the topology controller's dry runs: a CEL rule cannot see whether a request is a
dry run, so immutability is enforced by the validating webhook (capl.webhooks), and the spec
models embedded here carry no transition rules.
"""

from __future__ import annotations

from typing import ClassVar, Literal

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


class LibvirtMachineTemplate(K8sModel):
    """A template of LibvirtMachines for MachineDeployments, MachineSets and ClusterClass."""

    KIND: ClassVar[str] = Kind.LIBVIRT_MACHINE_TEMPLATE

    api_version: Literal["infrastructure.cluster.x-k8s.io/v1alpha1"] = API_VERSION
    kind: Literal["LibvirtMachineTemplate"] = "LibvirtMachineTemplate"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: LibvirtMachineTemplateSpec


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
