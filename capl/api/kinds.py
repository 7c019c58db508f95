"""The registry of capl's kinds: model classes plus what a CRD says about them.

One `KindInfo` per kind ties together the pydantic model, its list model, the resource names
and the presentation (`kubectl get` columns). crdgen renders CRDs from it; the kube layer can
use it to build URLs and to parse objects generically (`KINDS_BY_NAME[kind].model`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from capl.api.base import K8sModel
from capl.api.cluster import LibvirtCluster, LibvirtClusterList
from capl.api.constants import GROUP, VERSION, Kind, Plural
from capl.api.machine import LibvirtMachine, LibvirtMachineList
from capl.api.migration import LibvirtMachineMigration, LibvirtMachineMigrationList
from capl.api.templates import (
    LibvirtClusterTemplate,
    LibvirtClusterTemplateList,
    LibvirtMachineTemplate,
    LibvirtMachineTemplateList,
)

CATEGORIES: tuple[str, ...] = ("cluster-api",)

_CLUSTER_NAME_PATH = r".metadata.labels['cluster\.x-k8s\.io/cluster-name']"
_READY_PATH = '.status.conditions[?(@.type=="Ready")].status'


@dataclass(frozen=True, kw_only=True)
class PrinterColumn:
    """One `additionalPrinterColumns` entry."""

    name: str
    json_path: str
    type: Literal["string", "integer", "number", "boolean", "date"] = "string"
    description: str = ""
    priority: int = 0

    def to_crd(self) -> dict[str, object]:
        column: dict[str, object] = {
            "name": self.name,
            "jsonPath": self.json_path,
            "type": self.type,
        }
        if self.description:
            column["description"] = self.description
        if self.priority:
            column["priority"] = self.priority
        return column


_AGE = PrinterColumn(
    name="Age",
    json_path=".metadata.creationTimestamp",
    type="date",
    description="Time since creation",
)


@dataclass(frozen=True, kw_only=True)
class KindInfo:
    kind: Kind
    plural: Plural
    model: type[K8sModel]
    list_model: type[K8sModel]
    short_names: tuple[str, ...]
    status_subresource: bool
    printer_columns: tuple[PrinterColumn, ...] = field(default=())
    group: str = GROUP
    version: str = VERSION

    @property
    def singular(self) -> str:
        return self.kind.lower()

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"

    @property
    def crd_name(self) -> str:
        return f"{self.plural}.{self.group}"

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"


LIBVIRT_CLUSTER = KindInfo(
    kind=Kind.LIBVIRT_CLUSTER,
    plural=Plural.LIBVIRT_CLUSTERS,
    model=LibvirtCluster,
    list_model=LibvirtClusterList,
    short_names=("lvc",),
    status_subresource=True,
    printer_columns=(
        PrinterColumn(name="Cluster", json_path=_CLUSTER_NAME_PATH, description="Cluster"),
        PrinterColumn(
            name="Endpoint",
            json_path=".spec.controlPlaneEndpoint.host",
            description="Control-plane endpoint",
        ),
        PrinterColumn(name="Network", json_path=".spec.network.cidr", description="Network"),
        PrinterColumn(
            name="Provisioned",
            json_path=".status.initialization.provisioned",
            type="boolean",
            description="Infrastructure provisioned",
        ),
        PrinterColumn(name="Ready", json_path=_READY_PATH, description="Ready condition"),
        _AGE,
    ),
)

LIBVIRT_MACHINE = KindInfo(
    kind=Kind.LIBVIRT_MACHINE,
    plural=Plural.LIBVIRT_MACHINES,
    model=LibvirtMachine,
    list_model=LibvirtMachineList,
    short_names=("lvm",),
    status_subresource=True,
    printer_columns=(
        PrinterColumn(name="Cluster", json_path=_CLUSTER_NAME_PATH, description="Cluster"),
        PrinterColumn(name="Host", json_path=".status.host", description="Host"),
        PrinterColumn(name="State", json_path=".status.domainState", description="Domain state"),
        PrinterColumn(name="Ready", json_path=_READY_PATH, description="Ready condition"),
        PrinterColumn(name="ProviderID", json_path=".spec.providerID", description="Provider ID"),
        PrinterColumn(
            name="Address",
            json_path='.status.addresses[?(@.type=="InternalIP")].address',
            description="Internal IP address",
        ),
        _AGE,
        PrinterColumn(
            name="CPUs", json_path=".spec.cpus", type="integer", description="vCPUs", priority=1
        ),
        PrinterColumn(
            name="MemoryMiB",
            json_path=".spec.memoryMiB",
            type="integer",
            description="Memory (MiB)",
            priority=1,
        ),
    ),
)

LIBVIRT_MACHINE_TEMPLATE = KindInfo(
    kind=Kind.LIBVIRT_MACHINE_TEMPLATE,
    plural=Plural.LIBVIRT_MACHINE_TEMPLATES,
    model=LibvirtMachineTemplate,
    list_model=LibvirtMachineTemplateList,
    short_names=("lvmt",),
    status_subresource=True,
    printer_columns=(
        PrinterColumn(
            name="CPUs", json_path=".spec.template.spec.cpus", type="integer", description="vCPUs"
        ),
        PrinterColumn(
            name="MemoryMiB",
            json_path=".spec.template.spec.memoryMiB",
            type="integer",
            description="Memory (MiB)",
        ),
        _AGE,
    ),
)

LIBVIRT_CLUSTER_TEMPLATE = KindInfo(
    kind=Kind.LIBVIRT_CLUSTER_TEMPLATE,
    plural=Plural.LIBVIRT_CLUSTER_TEMPLATES,
    model=LibvirtClusterTemplate,
    list_model=LibvirtClusterTemplateList,
    short_names=("lvct",),
    status_subresource=False,
    printer_columns=(_AGE,),
)

LIBVIRT_MACHINE_MIGRATION = KindInfo(
    kind=Kind.LIBVIRT_MACHINE_MIGRATION,
    plural=Plural.LIBVIRT_MACHINE_MIGRATIONS,
    model=LibvirtMachineMigration,
    list_model=LibvirtMachineMigrationList,
    short_names=("lvmm",),
    status_subresource=True,
    printer_columns=(
        PrinterColumn(name="Machine", json_path=".spec.machineName", description="Machine"),
        PrinterColumn(name="Phase", json_path=".status.phase", description="Phase"),
        PrinterColumn(name="Source", json_path=".status.sourceHost", description="Source host"),
        PrinterColumn(name="Target", json_path=".status.targetHost", description="Target host"),
        PrinterColumn(
            name="Remaining",
            json_path=".status.state.dataRemainingBytes",
            type="integer",
            description="Bytes left to move",
            priority=1,
        ),
        _AGE,
    ),
)

KINDS: tuple[KindInfo, ...] = (
    LIBVIRT_CLUSTER,
    LIBVIRT_CLUSTER_TEMPLATE,
    LIBVIRT_MACHINE,
    LIBVIRT_MACHINE_TEMPLATE,
    LIBVIRT_MACHINE_MIGRATION,
)
KINDS_BY_NAME: Mapping[str, KindInfo] = {info.kind.value: info for info in KINDS}
