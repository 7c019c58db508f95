"""Read views of the Cluster API objects capl's controllers look at (cluster.x-k8s.io/v1beta2).

Only the fields capl uses are modelled; everything else is ignored on parse. These models
have no constraints beyond types: they describe objects another controller owns and
validates, and capl must be able to read whatever that controller accepted.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from capl.api.base import K8sModel
from capl.api.constants import CAPI_API_VERSION, PAUSED_ANNOTATION
from capl.api.meta import APIEndpoint, Condition, MachineAddress, ObjectMeta


class ContractVersionedObjectReference(K8sModel):
    """A reference whose version is looked up from the CRD's contract label (v1beta2)."""

    api_group: str = ""
    kind: str = ""
    name: str = ""


class ClusterSpec(K8sModel):
    paused: bool | None = None
    control_plane_endpoint: APIEndpoint | None = None
    control_plane_ref: ContractVersionedObjectReference | None = None
    infrastructure_ref: ContractVersionedObjectReference | None = None


class ClusterInitializationStatus(K8sModel):
    infrastructure_provisioned: bool | None = None
    control_plane_initialized: bool | None = None


class ClusterStatus(K8sModel):
    initialization: ClusterInitializationStatus | None = None
    conditions: list[Condition] | None = None
    phase: str | None = None


class Cluster(K8sModel):
    """cluster.x-k8s.io/v1beta2 Cluster (read view)."""

    api_version: str = CAPI_API_VERSION
    kind: Literal["Cluster"] = "Cluster"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: ClusterSpec = Field(default_factory=ClusterSpec)
    status: ClusterStatus = Field(default_factory=ClusterStatus)

    @property
    def infrastructure_provisioned(self) -> bool:
        init = self.status.initialization
        return bool(init and init.infrastructure_provisioned)


class Bootstrap(K8sModel):
    config_ref: ContractVersionedObjectReference | None = None
    data_secret_name: str | None = None
    """Secret with the bootstrap data (key `value`, optional key `format`)."""


class MachineSpec(K8sModel):
    cluster_name: str = ""
    bootstrap: Bootstrap = Field(default_factory=Bootstrap)
    infrastructure_ref: ContractVersionedObjectReference | None = None
    version: str | None = None
    provider_id: str | None = Field(default=None, alias="providerID")
    failure_domain: str | None = None


class MachineNodeReference(K8sModel):
    name: str = ""


class MachineInitializationStatus(K8sModel):
    infrastructure_provisioned: bool | None = None
    bootstrap_data_secret_created: bool | None = None


class MachineStatus(K8sModel):
    node_ref: MachineNodeReference | None = None
    initialization: MachineInitializationStatus | None = None
    addresses: list[MachineAddress] | None = None
    failure_domain: str | None = None
    phase: str | None = None
    conditions: list[Condition] | None = None


class Machine(K8sModel):
    """cluster.x-k8s.io/v1beta2 Machine (read view)."""

    api_version: str = CAPI_API_VERSION
    kind: Literal["Machine"] = "Machine"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: MachineSpec = Field(default_factory=MachineSpec)
    status: MachineStatus = Field(default_factory=MachineStatus)


def is_paused(*, cluster: Cluster | None, obj: ObjectMeta) -> bool:
    """Cluster API pause: `Cluster.spec.paused` or the paused annotation on the object."""
    if obj.has_annotation(PAUSED_ANNOTATION):
        return True
    return bool(cluster is not None and cluster.spec.paused)
