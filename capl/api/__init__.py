"""capl's API: infrastructure.cluster.x-k8s.io/v1alpha1, implementing the Cluster API v1beta2
contract for libvirt.

The pydantic models here are the single source of the CRD schemas (`capl.api.crdgen`
renders config/crd/bases from them). Layout:

- `constants`  group/version, finalizers, Cluster API labels/annotations, condition types
- `base`       `K8sModel` (camelCase wire form, unknown fields ignored), constrained types
- `meta`       ObjectMeta, Condition, APIEndpoint, MachineAddress, FailureDomain
- `cluster`, `machine`, `templates`   the four Cluster API kinds and their list kinds
- `migration`  LibvirtMachineMigration (a live migration request)
- `capi`       read views of Cluster API Cluster and Machine (v1beta2)
- `kinds`      registry: model, plural, short names, printer columns per kind
- `defaults`   defaults derived from other fields (webhook and controllers)
- `conditions` set/get helpers for condition lists
- `rbac`, `admission`   the manager's permissions and the webhooks it serves

capl.api imports nothing else of capl; everything else may import it.
"""

from capl.api.base import K8sModel, Time, format_time
from capl.api.capi import (
    Bootstrap,
    Cluster,
    ContractVersionedObjectReference,
    Machine,
    is_paused,
)
from capl.api.cluster import (
    DHCPRange,
    HostMaintenance,
    HostMaintenanceStatus,
    HostStatus,
    LibvirtCluster,
    LibvirtClusterList,
    LibvirtClusterSpec,
    LibvirtClusterStatus,
    LibvirtHost,
    NetworkSpec,
    StoragePoolSpec,
)
from capl.api.constants import (
    API_VERSION,
    CAPI_API_VERSION,
    CLUSTER_FINALIZER,
    CLUSTER_NAME_LABEL,
    CONTRACT_LABEL,
    CONTROL_PLANE_LABEL,
    GROUP,
    MACHINE_FINALIZER,
    MANAGED_BY_ANNOTATION,
    MIGRATION_FINALIZER,
    PAUSED_ANNOTATION,
    PROVIDER_ID_PREFIX,
    PROVIDER_LABEL,
    PROVIDER_NAME,
    TOPOLOGY_DRY_RUN_ANNOTATION,
    VERSION,
    WATCH_FILTER_LABEL,
    AddressType,
    BootstrapFormat,
    ConditionStatus,
    ConditionType,
    Kind,
    Plural,
    Reason,
)
from capl.api.machine import (
    DEFAULT_EVICTION_STRATEGY,
    Disk,
    EvictionStrategy,
    ImageSource,
    LibvirtMachine,
    LibvirtMachineList,
    LibvirtMachineSpec,
    LibvirtMachineStatus,
    NetworkInterface,
    RootVolume,
)
from capl.api.meta import (
    APIEndpoint,
    Condition,
    FailureDomain,
    InitializationStatus,
    LocalObjectReference,
    MachineAddress,
    ObjectMeta,
    OwnerReference,
    TemplateObjectMeta,
)
from capl.api.migration import (
    LibvirtMachineMigration,
    LibvirtMachineMigrationList,
    LibvirtMachineMigrationSpec,
    LibvirtMachineMigrationStatus,
    MigrationState,
)
from capl.api.templates import (
    LibvirtClusterTemplate,
    LibvirtClusterTemplateList,
    LibvirtClusterTemplateResource,
    LibvirtClusterTemplateSpec,
    LibvirtMachineTemplate,
    LibvirtMachineTemplateList,
    LibvirtMachineTemplateResource,
    LibvirtMachineTemplateSpec,
)

__all__ = [
    "API_VERSION",
    "CAPI_API_VERSION",
    "CLUSTER_FINALIZER",
    "CLUSTER_NAME_LABEL",
    "CONTRACT_LABEL",
    "CONTROL_PLANE_LABEL",
    "DEFAULT_EVICTION_STRATEGY",
    "GROUP",
    "MACHINE_FINALIZER",
    "MANAGED_BY_ANNOTATION",
    "MIGRATION_FINALIZER",
    "PAUSED_ANNOTATION",
    "PROVIDER_ID_PREFIX",
    "PROVIDER_LABEL",
    "PROVIDER_NAME",
    "TOPOLOGY_DRY_RUN_ANNOTATION",
    "VERSION",
    "WATCH_FILTER_LABEL",
    "APIEndpoint",
    "AddressType",
    "Bootstrap",
    "BootstrapFormat",
    "Cluster",
    "Condition",
    "ConditionStatus",
    "ConditionType",
    "ContractVersionedObjectReference",
    "DHCPRange",
    "Disk",
    "EvictionStrategy",
    "FailureDomain",
    "HostMaintenance",
    "HostMaintenanceStatus",
    "HostStatus",
    "ImageSource",
    "InitializationStatus",
    "K8sModel",
    "Kind",
    "LibvirtCluster",
    "LibvirtClusterList",
    "LibvirtClusterSpec",
    "LibvirtClusterStatus",
    "LibvirtClusterTemplate",
    "LibvirtClusterTemplateList",
    "LibvirtClusterTemplateResource",
    "LibvirtClusterTemplateSpec",
    "LibvirtHost",
    "LibvirtMachine",
    "LibvirtMachineList",
    "LibvirtMachineMigration",
    "LibvirtMachineMigrationList",
    "LibvirtMachineMigrationSpec",
    "LibvirtMachineMigrationStatus",
    "LibvirtMachineSpec",
    "LibvirtMachineStatus",
    "LibvirtMachineTemplate",
    "LibvirtMachineTemplateList",
    "LibvirtMachineTemplateResource",
    "LibvirtMachineTemplateSpec",
    "LocalObjectReference",
    "Machine",
    "MachineAddress",
    "MigrationState",
    "NetworkInterface",
    "NetworkSpec",
    "ObjectMeta",
    "OwnerReference",
    "Plural",
    "Reason",
    "RootVolume",
    "StoragePoolSpec",
    "TemplateObjectMeta",
    "Time",
    "format_time",
    "is_paused",
]
