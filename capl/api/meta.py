"""Kubernetes and Cluster API shapes shared by several kinds.

`ObjectMeta` is a read view of metav1.ObjectMeta with the fields controllers use; the CRD
schema of `metadata` itself is owned by the API server (crdgen writes `type: object` there).
`Condition` is metav1.Condition with the API server's own bounds, so the generated schema
accepts exactly what `meta.SetStatusCondition` would write in Go.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from capl.api.base import K8sModel, ObjectName, StringMap, Time

_CONDITION_TYPE_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
)
_CONDITION_REASON_PATTERN = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"


class OwnerReference(K8sModel):
    """metav1.OwnerReference."""

    api_version: str
    kind: str
    name: str
    uid: str
    controller: bool | None = None
    block_owner_deletion: bool | None = None


class ObjectMeta(K8sModel):
    """The parts of metav1.ObjectMeta capl reads and writes."""

    name: str | None = None
    generate_name: str | None = None
    namespace: str | None = None
    uid: str | None = None
    resource_version: str | None = None
    generation: int | None = None
    creation_timestamp: Time | None = None
    deletion_timestamp: Time | None = None
    deletion_grace_period_seconds: int | None = None
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None
    owner_references: list[OwnerReference] | None = None
    finalizers: list[str] | None = None

    def label(self, key: str) -> str | None:
        return (self.labels or {}).get(key)

    def annotation(self, key: str) -> str | None:
        return (self.annotations or {}).get(key)

    def has_annotation(self, key: str) -> bool:
        return key in (self.annotations or {})

    def has_finalizer(self, finalizer: str) -> bool:
        return finalizer in (self.finalizers or [])

    def owner(self, *, kind: str, group: str) -> OwnerReference | None:
        """The first owner reference of `kind` in API group `group` (any version)."""
        for ref in self.owner_references or []:
            if ref.kind == kind and ref.api_version.split("/", 1)[0] == group:
                return ref
        return None


class TemplateObjectMeta(K8sModel):
    """Cluster API ObjectMeta of a template: only labels and annotations."""

    labels: StringMap | None = None
    """Labels copied to the objects created from the template."""
    annotations: StringMap | None = None
    """Annotations copied to the objects created from the template."""


class Condition(K8sModel):
    """metav1.Condition: one aspect of the object's current state."""

    type: str = Field(min_length=1, max_length=316, pattern=_CONDITION_TYPE_PATTERN)
    """Type of the condition, CamelCase (e.g. Ready)."""
    status: Literal["True", "False", "Unknown"]
    """Status of the condition: True, False or Unknown."""
    observed_generation: int | None = Field(default=None, ge=0)
    """The metadata.generation the condition was computed from."""
    last_transition_time: Time
    """When the status last changed."""
    reason: str = Field(min_length=1, max_length=1024, pattern=_CONDITION_REASON_PATTERN)
    """Programmatic identifier of the cause of the last transition, CamelCase."""
    message: str = Field(default="", max_length=32768)
    """Human-readable details; may be empty."""

    @property
    def is_true(self) -> bool:
        return self.status == "True"


class LocalObjectReference(K8sModel):
    """A reference to an object in the same namespace."""

    name: ObjectName
    """Name of the referenced object."""


class APIEndpoint(K8sModel):
    """A reachable Kubernetes API endpoint."""

    host: str | None = Field(default=None, min_length=1, max_length=512)
    """Host name or IP address the API server is serving on."""
    port: int | None = Field(default=None, ge=1, le=65535)
    """Port the API server is serving on."""

    @property
    def is_set(self) -> bool:
        return bool(self.host) and bool(self.port)


MachineAddressType = Literal["Hostname", "InternalIP", "ExternalIP", "InternalDNS", "ExternalDNS"]


class MachineAddress(K8sModel):
    """An address of a machine (Cluster API MachineAddress)."""

    type: MachineAddressType
    """Hostname, InternalIP, ExternalIP, InternalDNS or ExternalDNS."""
    address: str = Field(min_length=1, max_length=256)
    """The address."""


class FailureDomain(K8sModel):
    """A failure domain as the v1beta2 contract lists it (one per host for capl)."""

    name: str = Field(min_length=1, max_length=256)
    """Name of the failure domain (the host's name in spec.hosts)."""
    control_plane: bool | None = None
    """Whether control-plane machines may be placed in this failure domain."""
    attributes: dict[str, Annotated[str, Field(max_length=256)]] | None = Field(
        default=None, max_length=64
    )
    """Free-form attributes (capl publishes cpus, memoryMiB and the libvirt version)."""


class InitializationStatus(K8sModel):
    """Observations of the initial provisioning, as the v1beta2 contract defines them."""

    provisioned: bool | None = None
    """True once the infrastructure is fully provisioned; never set back to false."""


__all__ = [
    "APIEndpoint",
    "Condition",
    "FailureDomain",
    "InitializationStatus",
    "LocalObjectReference",
    "MachineAddress",
    "MachineAddressType",
    "ObjectMeta",
    "OwnerReference",
    "TemplateObjectMeta",
]
