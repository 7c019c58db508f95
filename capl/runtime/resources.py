"""Descriptors of API resources (group, version, kind, plural, scope) and the kinds capl uses.

`Resource` is pure data shared by the runtime (informers, controllers, events) and the adapter in
capl.kube (which turns it into URLs). The registry is data-driven: a new kind is one line in
`WELL_KNOWN` (or a `Resource(...)` built where it is needed, e.g. a test CRD).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Resource:
    """One REST resource: `/apis/{group}/{version}/[namespaces/{ns}/]{plural}`."""

    group: str
    version: str
    kind: str
    plural: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def __str__(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural


CAPI_GROUP = "cluster.x-k8s.io"
INFRA_GROUP = "infrastructure.cluster.x-k8s.io"

CLUSTER = Resource(CAPI_GROUP, "v1beta2", "Cluster", "clusters")
MACHINE = Resource(CAPI_GROUP, "v1beta2", "Machine", "machines")
LIBVIRT_CLUSTER = Resource(INFRA_GROUP, "v1alpha1", "LibvirtCluster", "libvirtclusters")
LIBVIRT_MACHINE = Resource(INFRA_GROUP, "v1alpha1", "LibvirtMachine", "libvirtmachines")
LIBVIRT_MACHINE_TEMPLATE = Resource(
    INFRA_GROUP, "v1alpha1", "LibvirtMachineTemplate", "libvirtmachinetemplates"
)
LIBVIRT_CLUSTER_TEMPLATE = Resource(
    INFRA_GROUP, "v1alpha1", "LibvirtClusterTemplate", "libvirtclustertemplates"
)
LIBVIRT_MACHINE_MIGRATION = Resource(
    INFRA_GROUP, "v1alpha1", "LibvirtMachineMigration", "libvirtmachinemigrations"
)
SECRET = Resource("", "v1", "Secret", "secrets")
CONFIG_MAP = Resource("", "v1", "ConfigMap", "configmaps")
EVENT = Resource("", "v1", "Event", "events")
NODE = Resource("", "v1", "Node", "nodes", namespaced=False)
NAMESPACE = Resource("", "v1", "Namespace", "namespaces", namespaced=False)
LEASE = Resource("coordination.k8s.io", "v1", "Lease", "leases")
IPAM_GROUP = "ipam.cluster.x-k8s.io"
# Cluster API IPAM (v1beta2 since Cluster API v1.11; v1beta1 still served, converted by core)
IP_ADDRESS_CLAIM = Resource(IPAM_GROUP, "v1beta2", "IPAddressClaim", "ipaddressclaims")
IP_ADDRESS = Resource(IPAM_GROUP, "v1beta2", "IPAddress", "ipaddresses")
CUSTOM_RESOURCE_DEFINITION = Resource(
    "apiextensions.k8s.io", "v1", "CustomResourceDefinition", "customresourcedefinitions", False
)

WELL_KNOWN: tuple[Resource, ...] = (
    CLUSTER,
    MACHINE,
    LIBVIRT_CLUSTER,
    LIBVIRT_MACHINE,
    LIBVIRT_MACHINE_TEMPLATE,
    LIBVIRT_CLUSTER_TEMPLATE,
    LIBVIRT_MACHINE_MIGRATION,
    SECRET,
    CONFIG_MAP,
    EVENT,
    NODE,
    NAMESPACE,
    LEASE,
    IP_ADDRESS_CLAIM,
    IP_ADDRESS,
    CUSTOM_RESOURCE_DEFINITION,
)

_BY_KIND: dict[tuple[str, str], Resource] = {}
_BY_API_VERSION_KIND: dict[tuple[str, str], Resource] = {}


def register(resource: Resource) -> Resource:
    """Make a resource findable by `lookup` (by kind + group, or apiVersion + kind)."""
    _BY_KIND[(resource.group, resource.kind)] = resource
    _BY_API_VERSION_KIND[(resource.api_version, resource.kind)] = resource
    return resource


for _resource in WELL_KNOWN:
    register(_resource)


def lookup(kind: str, *, group: str | None = None, api_version: str | None = None) -> Resource:
    """Find a registered resource by kind and group (or apiVersion); KeyError if unknown."""
    if api_version is not None:
        return _BY_API_VERSION_KIND[(api_version, kind)]
    if group is not None:
        return _BY_KIND[(group, kind)]
    matches = [r for (g, k), r in _BY_KIND.items() if k == kind]
    if len(matches) != 1:
        raise KeyError(kind)
    return matches[0]
