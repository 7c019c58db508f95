"""Machine hardware fields: the admission checks (each error names its field), the CEL rules
in the generated CRD, the domain hardware a spec asks for, and the template's capacity."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from capl.api import LibvirtMachine, LibvirtMachineTemplate
from capl.api.templates import machine_template_status
from capl.controllers.machine.plan_hardware import domain_hardware, pending_selectors
from capl.ports.virt import CpuSpec, MdevSelector, NumaCellSpec, PciSelector, XmlPatchSpec
from capl.webhooks.validation import validate_libvirt_machine, validate_libvirt_machine_template

GPU = {"name": "gpu", "vendor": "0x10de", "product": "0x2236", "resourceName": "nvidia.com/A10"}


def machine(**spec: Any) -> LibvirtMachine:
    return LibvirtMachine.model_validate(
        {
            "metadata": {"name": "m", "namespace": "ns"},
            "spec": {"image": {"url": "https://example.invalid/base.qcow2"}, **spec},
        }
    )


GOOD: dict[str, Any] = {
    "cpus": 4,
    "memoryMiB": 2048,
    "firmware": "uefi",
    "cpu": {
        "model": "Skylake-Server",
        "topology": {"sockets": 1, "cores": 2, "threads": 2},
        "dedicatedCPUs": [4, 5, 6, 7],
        "numaCells": [{"cpus": "0-1", "memoryMiB": 1024}, {"cpus": "2,3", "memoryMiB": 1024}],
    },
    "hugepages": {"pageSize": "2Mi"},
    "hostDevices": [GPU, {"name": "nic", "pciAddress": "0000:3b:00.1"}],
    "mediatedDevices": [{"name": "vgpu", "type": "nvidia-558"}],
    "tpm": {},
    "secureBoot": True,
    "xmlPatches": [
        {"op": "add", "path": "devices", "xml": "<watchdog model='i6300esb'/>"},
        {"op": "set", "path": "clock", "attribute": "offset", "value": "localtime"},
    ],
}


def test_a_full_hardware_spec_is_accepted_and_mapped() -> None:
    m = machine(**GOOD)
    assert validate_libvirt_machine(m).errors == []
    hw = domain_hardware(m.spec)
    assert hw.cpu == CpuSpec(
        model="Skylake-Server",
        sockets=1,
        cores=2,
        threads=2,
        pins=(4, 5, 6, 7),
        numa=(NumaCellSpec(cpus="0-1", memory_mib=1024), NumaCellSpec(cpus="2,3", memory_mib=1024)),
    )
    assert hw.hugepage_kib == 2048
    assert hw.pci == (
        PciSelector(name="gpu", vendor="0x10de", product="0x2236"),
        PciSelector(name="nic", address="0000:3b:00.1"),
    )
    assert hw.mdevs == (MdevSelector(name="vgpu", type="nvidia-558"),)
    assert (hw.tpm, hw.secure_boot, hw.wants_host_check) == (True, True, True)
    assert hw.patches[1] == XmlPatchSpec(
        op="set", path="clock", attribute="offset", value="localtime"
    )
    assert not domain_hardware(machine().spec).wants_host_check


@pytest.mark.parametrize(
    ("change", "path", "message"),
    [
        (
            {"cpu": {"topology": {"sockets": 2, "cores": 2, "threads": 2}}},
            "spec.cpu.topology",
            "= 8, must equal cpus (4)",
        ),
        ({"cpu": {"dedicatedCPUs": [1, 2]}}, "spec.cpu.dedicatedCPUs", "2 host CPUs for 4 vCPUs"),
        ({"cpu": {"dedicatedCPUs": [1, 1, 2, 3]}}, "spec.cpu.dedicatedCPUs", "given twice"),
        (
            {"cpu": {"numaCells": [{"cpus": "0-2", "memoryMiB": 2048}]}},
            "spec.cpu.numaCells",
            "each vCPU 0..3 exactly once",
        ),
        (
            {"cpu": {"numaCells": [{"cpus": "0-3", "memoryMiB": 1024}]}},
            "spec.cpu.numaCells",
            "add up to 1024, not memoryMiB (2048)",
        ),
        (
            {"memoryMiB": 2049, "hugepages": {"pageSize": "2Mi"}},
            "spec.hugepages.pageSize",
            "not a multiple of 2Mi",
        ),
        (
            {"hostDevices": [GPU], "mediatedDevices": [{"name": "gpu", "type": "t"}]},
            "spec.mediatedDevices[0].name",
            "used twice",
        ),
        ({"secureBoot": True}, "spec.secureBoot", "needs firmware: uefi"),
        (
            {"xmlPatches": [{"op": "set", "path": "uuid", "value": "x"}]},
            "spec.xmlPatches[0].path",
            "'uuid' is owned by capl",
        ),
        (
            {"xmlPatches": [{"op": "set", "path": "metadata/x", "value": "x"}]},
            "spec.xmlPatches[0].path",
            "'metadata' is owned by capl",
        ),
        (
            {
                "xmlPatches": [
                    {
                        "op": "set",
                        "path": "devices/interface/mac",
                        "attribute": "address",
                        "value": "52:54:00:00:00:01",
                    }
                ]
            },
            "spec.xmlPatches[0].path",
            "'interface' is owned by capl",
        ),
        (
            {"xmlPatches": [{"op": "set", "path": ".//disk", "value": "x"}]},
            "spec.xmlPatches[0].path",
            "no '/', '//' or '..'",
        ),
        (
            {"xmlPatches": [{"op": "add", "path": "devices", "xml": "<disk type='file'/>"}]},
            "spec.xmlPatches[0].xml",
            "'disk' is owned by capl",
        ),
        (
            {"xmlPatches": [{"op": "add", "path": "devices", "xml": "<a>"}]},
            "spec.xmlPatches[0].xml",
            "not one well-formed XML element",
        ),
        (
            {"xmlPatches": [{"op": "add", "path": "devices"}]},
            "spec.xmlPatches[0].xml",
            "op add needs xml",
        ),
        (
            {"xmlPatches": [{"op": "set", "path": "clock"}]},
            "spec.xmlPatches[0].value",
            "op set needs value",
        ),
    ],
)
def test_bad_hardware_is_refused_naming_the_field(
    change: dict[str, Any], path: str, message: str
) -> None:
    bad = machine(**{"cpus": 4, "memoryMiB": 2048, **change})
    verdict = validate_libvirt_machine(bad)
    assert [e.path for e in verdict.errors] == [path], verdict.errors
    assert message in verdict.errors[0].message
    template = LibvirtMachineTemplate.model_validate(
        {
            "metadata": {"name": "t", "namespace": "ns"},
            "spec": {"template": {"spec": bad.spec.wire()}},
        }
    )
    errors = validate_libvirt_machine_template(template).errors
    assert [e.path for e in errors] == [path.replace("spec.", "spec.template.spec.", 1)]


def test_crd_carries_the_rules_the_api_server_enforces() -> None:
    with open("config/crd/bases/infrastructure.cluster.x-k8s.io_libvirtmachines.yaml") as f:
        crd = yaml.safe_load(f)
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    rules = {r.get("fieldPath"): r["rule"] for r in spec["x-kubernetes-validations"]}
    assert "self.cpu.topology.threads == self.cpus" in rules[".cpu.topology"]
    devices = spec["properties"]["hostDevices"]
    assert devices["x-kubernetes-list-map-keys"] == ["name"]
    assert "pciAddress" in devices["items"]["x-kubernetes-validations"][0]["rule"]


def test_template_capacity_counts_devices_by_resource_name() -> None:
    spec = machine(
        cpus=4,
        memoryMiB=2048,
        hugepages={"pageSize": "2Mi"},
        hostDevices=[GPU, {**GPU, "name": "gpu2"}, {"name": "nic", "pciAddress": "0000:3b:00.1"}],
        mediatedDevices=[{"name": "v", "type": "nvidia-558", "resourceName": "nvidia.com/vgpu"}],
    ).spec
    assert machine_template_status(spec)["capacity"] == {
        "cpu": "4",
        "memory": "2048Mi",
        "hugepages-2Mi": "2048Mi",
        "nvidia.com/A10": "2",
        "nvidia.com/vgpu": "1",
    }


def test_pending_machines_claim_their_devices_until_their_domain_is_defined() -> None:
    others = [
        {"metadata": {"uid": "me"}, "spec": {"hostDevices": [GPU]}},
        {"metadata": {"uid": "a"}, "spec": {"domainUUID": "U1", "hostDevices": [GPU]}},
        {
            "metadata": {"uid": "b"},
            "spec": {
                "domainUUID": "u2",
                "mediatedDevices": [{"name": "v", "uuid": "b1ae8bf6-38b0-4c81-9d44-78ce3f520496"}],
            },
        },
    ]
    pci, mdevs = pending_selectors(others, skip_uid="me", defined=frozenset({"u1"}))
    assert (pci, [m.uuid for m in mdevs]) == ([], ["b1ae8bf6-38b0-4c81-9d44-78ce3f520496"])


def test_a_template_naming_one_device_is_warned_about() -> None:
    template = LibvirtMachineTemplate.model_validate(
        {
            "metadata": {"name": "t", "namespace": "ns"},
            "spec": {"template": {"spec": machine(**GOOD).spec.wire()}},
        }
    )
    verdict = validate_libvirt_machine_template(template)
    assert verdict.errors == []
    assert [w.split(":")[0] for w in verdict.warnings] == [
        "spec.template.spec.hostDevices[1].pciAddress"
    ]
