"""Machine hardware beyond vCPUs and memory (issue 17): CPU model and topology, pinning,
NUMA cells and hugepages, PCI host devices and mediated devices (vGPU), an emulated TPM 2.0,
UEFI secure boot, and XML patches (the escape hatch).

- `cpu.mode`: host-passthrough, host-model or custom (a named `cpu.model`, e.g. Skylake-Server;
  a model alone means custom). `cpu.topology`: sockets x cores x threads must equal `cpus`.
  `cpu.dedicatedCPUs`: the host CPU each vCPU is pinned to, in vCPU order (one per vCPU).
  `cpu.numaCells`: guest NUMA cells; each vCPU in exactly one cell, the cells' memory adds
  up to `memoryMiB`. `hugepages.pageSize`: the guest memory is backed by hugepages of that
  size (memoryMiB a multiple of it).
- `hostDevices`: PCI devices of the host passed through, by `pciAddress` or by
  `vendor`+`product` (any free matching device of the host); `mediatedDevices`: mediated
  devices (vGPU) by `uuid` (an existing mdev) or by `type` (any free mdev of that type).
  Placement only chooses a host with free matching devices and never gives one device to two
  machines (`capl.controllers.machine.placement_hardware`). `resourceName` names the
  extended resource a device counts as in the template's `status.capacity`.
- `tpm` (emulated TPM 2.0, swtpm on the host) and `secureBoot` (OVMF with the secure-boot
  variables; needs `firmware: uefi`).
- `xmlPatches`: a restricted list of patches applied to the generated domain XML for what
  capl has no field for (see `XMLPatch`); they may not touch what capl owns.

Checks the schema cannot express are pure functions here (`hardware_errors`), called by the
admission webhook; the host-side checks are done at placement.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from typing import Annotated, Literal

from pydantic import Field

from capl.api.base import K8sModel, cel, schema_extra

__all__ = [
    "CPU",
    "PROTECTED_XML_ELEMENTS",
    "TOPOLOGY_RULE",
    "TPM",
    "CPUTopology",
    "HostDevice",
    "Hugepages",
    "MediatedDevice",
    "NUMACell",
    "XMLPatch",
    "cpuset",
    "hardware_errors",
    "xml_patch_path_error",
]

CPUMode = Literal["host-passthrough", "host-model", "custom"]
CPUModel = Annotated[
    str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
]
CPUSet = Annotated[
    str, Field(min_length=1, max_length=256, pattern=r"^[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*$")
]
PCIAddress = Annotated[
    str, Field(pattern=r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-1][0-9a-f]\.[0-7]$", max_length=12)
]
PCIId = Annotated[str, Field(pattern=r"^0x[0-9a-f]{4}$", max_length=6)]
DeviceName = Annotated[
    str, Field(min_length=1, max_length=32, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
]
ResourceName = Annotated[
    str,
    Field(
        max_length=253,
        pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$",
    ),
]
MdevUUID = Annotated[
    str,
    Field(
        max_length=36,
        pattern=r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$",
    ),
]
MdevType = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")]


class CPUTopology(K8sModel):
    """Guest CPU topology; sockets x cores x threads must equal the machine's cpus."""

    sockets: int = Field(ge=1, le=64)
    cores: int = Field(ge=1, le=512)
    threads: int = Field(ge=1, le=8)


class NUMACell(K8sModel):
    """A guest NUMA cell: its vCPUs and memory."""

    cpus: CPUSet
    """The vCPUs of the cell, e.g. `0-1` or `0,2`."""
    memory_mib: int = Field(ge=64, le=4194304, alias="memoryMiB")
    """Memory of the cell in MiB."""


_CUSTOM_NEEDS_MODEL = cel(
    "!has(self.mode) || self.mode != 'custom' || has(self.model)",
    "cpu.model must be set when cpu.mode is custom",
    field_path=".model",
)
_MODEL_ONLY_CUSTOM = cel(
    "!has(self.model) || !has(self.mode) || self.mode == 'custom'",
    "cpu.model is only for cpu.mode custom",
    field_path=".model",
)


class CPU(K8sModel):
    """Guest CPU: model/mode, topology, pinning and NUMA cells."""

    model_config = {
        "json_schema_extra": schema_extra(rules=[_CUSTOM_NEEDS_MODEL, _MODEL_ONLY_CUSTOM])
    }

    mode: CPUMode | None = None
    """host-passthrough, host-model, or custom (with model). Default: custom when model is
    set, else libvirt's default for the domain type."""
    model: CPUModel | None = None
    """A named CPU model (e.g. Skylake-Server, qemu64) the host must be able to provide."""
    topology: CPUTopology | None = None
    """Sockets, cores and threads; their product must equal cpus."""
    dedicated_cpus: list[Annotated[int, Field(ge=0, le=65535)]] | None = Field(
        default=None, max_length=512, alias="dedicatedCPUs"
    )
    """Pinning: the host CPU (id) each vCPU runs on, in vCPU order; one per vCPU, distinct."""
    numa_cells: list[NUMACell] | None = Field(default=None, max_length=16, alias="numaCells")
    """Guest NUMA cells (cell i on host cell i when the host has it); every vCPU in exactly
    one cell, memory adding up to memoryMiB."""


class Hugepages(K8sModel):
    """Back the guest memory with hugepages of the host."""

    page_size: Literal["2Mi", "1Gi"]
    """Page size; the host must have enough free pages of it."""


_ONE_PCI_SELECTOR = cel(
    "has(self.pciAddress) != (has(self.vendor) && has(self.product))"
    " && (has(self.vendor) == has(self.product))",
    "hostDevices: set pciAddress, or vendor and product",
)


class HostDevice(K8sModel):
    """A PCI device of the host passed through to the guest (VFIO)."""

    model_config = {"json_schema_extra": schema_extra(rules=[_ONE_PCI_SELECTOR])}

    name: DeviceName
    """Name of the device, unique within the machine."""
    pci_address: PCIAddress | None = Field(default=None, alias="pciAddress")
    """The host PCI address, `0000:65:00.0`."""
    vendor: PCIId | None = None
    """PCI vendor id, `0x10de`: any free device of the host with this vendor and product."""
    product: PCIId | None = None
    """PCI product id, `0x2236`."""
    resource_name: ResourceName | None = None
    """Extended resource the device counts as in a template's status.capacity
    (e.g. `nvidia.com/A10`)."""


_ONE_MDEV_SELECTOR = cel(
    "has(self.uuid) != has(self.type)",
    "mediatedDevices: set exactly one of uuid or type",
)


class MediatedDevice(K8sModel):
    """A mediated device (e.g. a vGPU) of the host given to the guest."""

    model_config = {"json_schema_extra": schema_extra(rules=[_ONE_MDEV_SELECTOR])}

    name: DeviceName
    """Name of the device, unique within the machine."""
    uuid: MdevUUID | None = None
    """UUID of an existing mediated device of the host."""
    type: MdevType | None = None
    """mdev type (e.g. `nvidia-558`): any free mediated device of that type on the host."""
    resource_name: ResourceName | None = None
    """Extended resource the device counts as in a template's status.capacity."""


class TPM(K8sModel):
    """An emulated TPM (swtpm on the host)."""

    version: Literal["2.0"] = "2.0"
    """TPM version; 2.0."""


#: Elements capl owns: no XML patch may select, add or change them (or anything inside).
PROTECTED_XML_ELEMENTS = ("name", "uuid", "metadata", "sysinfo", "disk", "interface", "hostdev")

_STEP = re.compile(r"^(\*|[A-Za-z][A-Za-z0-9_.-]*)(\[[^\]/]+\])*$")
_ATTRIBUTE = r"^[A-Za-z_][A-Za-z0-9_.:-]*$"


class XMLPatch(K8sModel):
    """One change of the generated domain XML.

    `path` is an ElementTree path relative to `<domain>` (child steps with optional
    `[@attr='v']` or `[n]` predicates, e.g. `devices/video/model` or
    `features`). `op: add` appends the element `xml` to each element the path selects;
    `op: set` sets `attribute` (or the text, without attribute) of each selected element to
    `value`. The path must select at least one element. Never allowed: `..`, `//`, the
    domain element itself (`.`), or a step naming an element capl owns (name, uuid,
    metadata, sysinfo, disk, interface, hostdev); an added element may not be or contain one.
    """

    op: Literal["add", "set"]
    """add: append the `xml` element; set: set an attribute or the text."""
    path: Annotated[str, Field(min_length=1, max_length=256)]
    """ElementTree path of the target element(s), relative to the domain element."""
    xml: Annotated[str, Field(min_length=1, max_length=8192)] | None = None
    """For add: one XML element."""
    attribute: Annotated[str, Field(max_length=64, pattern=_ATTRIBUTE)] | None = None
    """For set: the attribute to set (unset: the element's text)."""
    value: Annotated[str, Field(max_length=1024)] | None = None
    """For set: the new value."""


def xml_patch_path_error(path: str) -> str | None:
    """Why `path` is not an allowed XML patch path (None: allowed)."""
    if path.startswith("/") or "//" in path or ".." in path:
        return "must be a relative path of child steps (no '/', '//' or '..')"
    steps = path.removeprefix("./").split("/")
    for step in steps:
        if not _STEP.match(step):
            return f"step {step!r} is not an element name with optional [...] predicates"
        tag = step.split("[", 1)[0]
        if tag in PROTECTED_XML_ELEMENTS:
            return f"element {tag!r} is owned by capl and cannot be patched"
    return None


def cpuset(text: str) -> list[int]:
    """`0-2,5` -> [0, 1, 2, 5] (ranges as written; an empty or reversed range gives none)."""
    out: list[int] = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        out.extend(range(int(low), int(high or low) + 1))
    return out


def hardware_errors(
    *,
    cpus: int,
    memory_mib: int,
    firmware: str,
    cpu: CPU | None,
    hugepages: Hugepages | None,
    host_devices: list[HostDevice] | None,
    mediated_devices: list[MediatedDevice] | None,
    secure_boot: bool | None,
    xml_patches: list[XMLPatch] | None,
) -> Iterator[tuple[str, str]]:
    """(field path relative to the spec, message) for each problem the schema cannot see."""
    yield from _cpu_errors(cpus, memory_mib, cpu)
    if hugepages is not None:
        page_mib = 2 if hugepages.page_size == "2Mi" else 1024
        if memory_mib % page_mib:
            yield (
                "hugepages.pageSize",
                f"memoryMiB {memory_mib} is not a multiple of {hugepages.page_size}",
            )
    names: set[str] = set()
    listed: list[tuple[str, list[str]]] = [
        ("hostDevices", [d.name for d in host_devices or ()]),
        ("mediatedDevices", [d.name for d in mediated_devices or ()]),
    ]
    for kind, device_names in listed:
        for i, name in enumerate(device_names):
            if name in names:
                yield f"{kind}[{i}].name", f"device name {name!r} is used twice"
            names.add(name)
    if secure_boot and firmware != "uefi":
        yield "secureBoot", "secure boot needs firmware: uefi"
    for i, patch in enumerate(xml_patches or ()):
        yield from _patch_errors(f"xmlPatches[{i}]", patch)


def _cpu_errors(cpus: int, memory_mib: int, cpu: CPU | None) -> Iterator[tuple[str, str]]:
    if cpu is None:
        return
    top = cpu.topology
    if top is not None and top.sockets * top.cores * top.threads != cpus:
        yield (
            "cpu.topology",
            f"sockets x cores x threads = {top.sockets * top.cores * top.threads},"
            f" must equal cpus ({cpus})",
        )
    pins = cpu.dedicated_cpus
    if pins is not None:
        if len(pins) != cpus:
            yield "cpu.dedicatedCPUs", f"{len(pins)} host CPUs for {cpus} vCPUs: give one per vCPU"
        if len(set(pins)) != len(pins):
            yield "cpu.dedicatedCPUs", "a host CPU is given twice"
    if cpu.numa_cells:
        seen: list[int] = []
        for cell in cpu.numa_cells:
            seen.extend(cpuset(cell.cpus))
        if sorted(seen) != list(range(cpus)):
            yield "cpu.numaCells", f"the cells' cpus must name each vCPU 0..{cpus - 1} exactly once"
        total = sum(cell.memory_mib for cell in cpu.numa_cells)
        if total != memory_mib:
            yield (
                "cpu.numaCells",
                f"the cells' memoryMiB add up to {total}, not memoryMiB ({memory_mib})",
            )


def _patch_errors(field: str, patch: XMLPatch) -> Iterator[tuple[str, str]]:
    problem = xml_patch_path_error(patch.path)
    if problem is not None:
        yield f"{field}.path", problem
    if patch.op == "add":
        if patch.xml is None:
            yield f"{field}.xml", "op add needs xml"
        else:
            problem = _fragment_error(patch.xml)
            if problem is not None:
                yield f"{field}.xml", problem
        if patch.attribute is not None or patch.value is not None:
            yield f"{field}.value", "op add takes xml only"
    else:
        if patch.value is None:
            yield f"{field}.value", "op set needs value"
        if patch.xml is not None:
            yield f"{field}.xml", "op set takes attribute and value, not xml"


def _fragment_error(fragment: str) -> str | None:
    if "<!" in fragment or "<?" in fragment:
        return "no DOCTYPE, entity or processing instruction"
    try:
        element = ET.fromstring(fragment)
    except ET.ParseError as exc:
        return f"not one well-formed XML element: {exc}"
    for node in element.iter():
        tag = str(node.tag).rsplit("}", 1)[-1]
        if tag in PROTECTED_XML_ELEMENTS:
            return f"element {tag!r} is owned by capl and cannot be added"
    return None


#: On the machine spec: the API server itself refuses a topology that does not give `cpus`.
TOPOLOGY_RULE = cel(
    "!has(self.cpu) || !has(self.cpu.topology) || self.cpu.topology.sockets"
    " * self.cpu.topology.cores * self.cpu.topology.threads == self.cpus",
    "cpu.topology: sockets x cores x threads must equal cpus",
    field_path=".cpu.topology",
)
