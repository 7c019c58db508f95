"""capl.api models: wire form, parsing tolerance, validation, defaults, helpers."""

from __future__ import annotations

import datetime
import re
from pathlib import Path
from typing import Any

import pydantic
import pytest
import yaml

from capl import api
from capl.api import (
    Cluster,
    LibvirtCluster,
    LibvirtClusterTemplate,
    LibvirtMachine,
    LibvirtMachineSpec,
    LibvirtMachineTemplate,
    Machine,
    ObjectMeta,
)
from capl.api.conditions import get_condition, is_true, remove_condition, set_condition
from capl.api.defaults import (
    default_dhcp_range,
    default_libvirt_cluster,
    default_libvirt_machine,
    derived_dns_domain,
    derived_name,
    gateway_address,
)
from capl.api.kinds import KINDS, KINDS_BY_NAME

REPO = Path(__file__).resolve().parents[3]
SAMPLES = REPO / "config" / "samples"
T0 = datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)


def sample(kind: str) -> dict[str, Any]:
    data = yaml.safe_load((SAMPLES / f"infrastructure_v1alpha1_{kind.lower()}.yaml").read_text())
    assert isinstance(data, dict)
    return data


def machine_dict(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": api.API_VERSION,
        "kind": "LibvirtMachine",
        "metadata": {"name": "m", "namespace": "ns"},
        "spec": {"image": {"url": "https://example.invalid/i.qcow2"}, **spec},
    }


def cluster_dict(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": api.API_VERSION,
        "kind": "LibvirtCluster",
        "metadata": {"name": "c", "namespace": "ns"},
        "spec": {
            "hosts": [{"name": "h0", "uri": "qemu:///system"}],
            "network": {"cidr": "192.168.150.0/24"},
            **spec,
        },
    }


# --- constants -------------------------------------------------------------------------------


def test_api_version_constants_agree() -> None:
    assert f"{api.GROUP}/{api.VERSION}" == api.API_VERSION
    assert api.CAPI_API_VERSION == "cluster.x-k8s.io/v1beta2"
    assert api.CONTRACT_LABEL == "cluster.x-k8s.io/v1beta2"
    assert api.MACHINE_FINALIZER == "libvirtmachine.infrastructure.cluster.x-k8s.io"
    assert api.CLUSTER_FINALIZER == "libvirtcluster.infrastructure.cluster.x-k8s.io"
    assert api.PROVIDER_LABEL == "cluster.x-k8s.io/provider"
    assert api.PROVIDER_NAME == "infrastructure-libvirt"


def test_reasons_and_condition_types_are_valid_condition_values() -> None:
    reason = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
    for r in api.Reason:
        assert reason.match(r.value), r
    for t in api.ConditionType:
        assert re.match(r"^[A-Z][A-Za-z]+$", t.value), t


# --- round trips -----------------------------------------------------------------------------


@pytest.mark.parametrize("info", KINDS, ids=lambda i: i.kind.value)
def test_samples_round_trip_through_models(info: Any) -> None:
    raw = sample(info.kind.value)
    obj = info.model.model_validate(raw)
    wire = obj.wire()
    assert wire == obj.model_dump(by_alias=True, exclude_none=True)
    # Everything the sample says survives; the only additions are schema defaults.
    assert _is_subset(raw, wire), (raw, wire)
    again = info.model.model_validate(wire)
    assert again == obj
    assert again.wire() == wire


def _is_subset(small: Any, big: Any) -> bool:
    if isinstance(small, dict):
        return isinstance(big, dict) and all(
            k in big and _is_subset(v, big[k]) for k, v in small.items()
        )
    if isinstance(small, list):
        return (
            isinstance(big, list)
            and len(small) == len(big)
            and all(_is_subset(a, b) for a, b in zip(small, big, strict=True))
        )
    return bool(small == big)


def test_wire_form_uses_kubernetes_spellings() -> None:
    spec = LibvirtMachineSpec.model_validate(
        {
            "image": {"path": "/var/lib/images/base.qcow2"},
            "memoryMiB": 2048,
            "rootVolume": {"sizeGiB": 10},
            "providerID": "libvirt:///6f1c8c52-1d7a-4c2e-9d4e-0a1b2c3d4e5f",
            "domainUUID": "6f1c8c52-1d7a-4c2e-9d4e-0a1b2c3d4e5f",
            "hostName": "h0",
            "extraDisks": [{"name": "data", "sizeGiB": 5}],
        }
    )
    wire = spec.wire()
    assert wire["memoryMiB"] == 2048
    assert wire["rootVolume"] == {"sizeGiB": 10}
    assert wire["providerID"].startswith("libvirt:///")
    assert "domainUUID" in wire
    assert "hostName" in wire
    assert wire["extraDisks"] == [{"name": "data", "sizeGiB": 5}]
    assert spec.memory_mib == 2048
    assert spec.root_volume is not None
    assert spec.root_volume.size_gib == 10


def test_models_accept_python_names_too() -> None:
    spec = LibvirtMachineSpec(
        image=api.ImageSource(url="https://example.invalid/x.qcow2"),
        memory_mib=1024,
        root_volume=api.RootVolume(size_gib=8),
    )
    assert spec.wire()["memoryMiB"] == 1024
    assert spec.wire()["rootVolume"] == {"sizeGiB": 8}


def test_unknown_fields_are_ignored_everywhere() -> None:
    raw = machine_dict(futureField={"x": 1}, image={"url": "https://e.invalid/i", "newKnob": 3})
    raw["status"] = {"someNewStatus": True, "initialization": {"provisioned": True, "more": 1}}
    raw["metadata"]["managedFields"] = [{"manager": "kubectl"}]
    raw["extraTopLevel"] = "x"
    machine = LibvirtMachine.model_validate(raw)
    assert machine.status.initialization is not None
    assert machine.status.initialization.provisioned is True
    wire = machine.wire()
    assert "futureField" not in wire["spec"]
    assert "newKnob" not in wire["spec"]["image"]
    assert "managedFields" not in wire["metadata"]


def test_minimal_wire_form_has_no_empty_collections() -> None:
    wire = LibvirtMachine.model_validate(machine_dict()).wire()
    assert "extraDisks" not in wire["spec"]
    assert "networkInterfaces" not in wire["spec"]
    assert wire["status"] == {}
    assert wire["spec"]["firmware"] == "bios"
    assert wire["spec"]["domainType"] == "auto"
    assert wire["spec"]["cpus"] == 2


def test_python_mode_dump_is_plain_json_types() -> None:
    machine = LibvirtMachine.model_validate(machine_dict())
    machine.metadata.creation_timestamp = T0
    machine.status.conditions = set_condition(
        None, type_=api.ConditionType.READY, status=True, reason=api.Reason.READY, now=T0
    )
    dumped = machine.model_dump(by_alias=True, exclude_none=True)
    text = yaml.safe_dump(dumped)  # fails on datetimes/enums that are not plain types
    assert "2026-01-02T03:04:05Z" in text
    assert dumped["metadata"]["creationTimestamp"] == "2026-01-02T03:04:05Z"


def test_time_parsing_and_formatting() -> None:
    meta = ObjectMeta.model_validate({"creationTimestamp": "2026-01-02T03:04:05Z"})
    assert meta.creation_timestamp == T0
    offset = ObjectMeta.model_validate({"creationTimestamp": "2026-01-02T05:04:05+02:00"})
    assert offset.creation_timestamp == T0
    assert offset.wire()["creationTimestamp"] == "2026-01-02T03:04:05Z"
    naive = ObjectMeta(creation_timestamp=datetime.datetime(2026, 1, 2, 3, 4, 5))
    assert naive.wire()["creationTimestamp"] == "2026-01-02T03:04:05Z"


# --- validation in Python mirrors the schema -------------------------------------------------


@pytest.mark.parametrize(
    "image",
    [
        {},
        {"url": "https://e.invalid/a", "path": "/a"},
        {"url": "https://e.invalid/a", "path": "/a", "volume": "v"},
        {"path": "/a", "volume": "v"},
    ],
)
def test_image_needs_exactly_one_source(image: dict[str, str]) -> None:
    with pytest.raises(pydantic.ValidationError, match="exactly one of url, path or volume"):
        api.ImageSource.model_validate(image)


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"cpus": 0}, "cpus"),
        ({"memoryMiB": 63}, "memoryMiB"),
        ({"rootVolume": {"sizeGiB": 0}}, "sizeGiB"),
        ({"networkInterfaces": [{"mac": "52:54:00:zz:00:01"}]}, "mac"),
        ({"networkInterfaces": [{"ip": "10.0.0.256"}]}, "ip"),
        ({"image": {"url": "ftp://x/y"}}, "url"),
        ({"image": {"path": "relative/path"}}, "path"),
        ({"image": {"path": "/a", "checksum": "md5:abc"}}, "checksum"),
        ({"firmware": "coreboot"}, "firmware"),
        ({"domainType": "xen"}, "domainType"),
        ({"providerID": "aws:///i-123"}, "providerID"),
    ],
)
def test_python_validation_names_the_field(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(pydantic.ValidationError) as info:
        LibvirtMachine.model_validate(machine_dict(**spec))
    assert field in str(info.value)


@pytest.mark.parametrize(
    "cidr", ["192.168.1.0/24", "10.0.0.0/8", "172.16.4.0/30", "192.168.150.128/25"]
)
def test_cidr_pattern_accepts(cidr: str) -> None:
    assert api.NetworkSpec(cidr=cidr).cidr == cidr


@pytest.mark.parametrize(
    "cidr", ["192.168.1.0", "192.168.1.0/31", "192.168.1.0/7", "300.1.1.0/24", "fd00::/64"]
)
def test_cidr_pattern_rejects(cidr: str) -> None:
    with pytest.raises(pydantic.ValidationError, match="cidr"):
        api.NetworkSpec(cidr=cidr)


@pytest.mark.parametrize(
    "uri",
    [
        "qemu:///system",
        "qemu:///session",
        "qemu+ssh://root@kvm1.example.internal/system?keyfile=/k",
        "qemu+tls://kvm1:16514/system",
        "test:///default",
        "test+unix:///default",
    ],
)
def test_libvirt_uri_pattern_accepts(uri: str) -> None:
    assert api.LibvirtHost(name="h", uri=uri).uri == uri


@pytest.mark.parametrize("uri", ["system", "qemu://", "/var/run/libvirt", "qemu:/// system"])
def test_libvirt_uri_pattern_rejects(uri: str) -> None:
    with pytest.raises(pydantic.ValidationError, match="uri"):
        api.LibvirtHost(name="h", uri=uri)


def test_hosts_need_at_least_one() -> None:
    with pytest.raises(pydantic.ValidationError, match="hosts"):
        LibvirtCluster.model_validate(cluster_dict(hosts=[]))


# --- Cluster API read views ------------------------------------------------------------------

CAPI_MACHINE = {
    "apiVersion": "cluster.x-k8s.io/v1beta2",
    "kind": "Machine",
    "metadata": {
        "name": "m1",
        "namespace": "ns",
        "labels": {api.CLUSTER_NAME_LABEL: "c1", api.CONTROL_PLANE_LABEL: ""},
        "ownerReferences": [
            {
                "apiVersion": "controlplane.cluster.x-k8s.io/v1beta2",
                "kind": "KubeadmControlPlane",
                "name": "c1-cp",
                "uid": "u1",
                "controller": True,
            }
        ],
    },
    "spec": {
        "clusterName": "c1",
        "bootstrap": {
            "configRef": {
                "apiGroup": "bootstrap.cluster.x-k8s.io",
                "kind": "KubeadmConfig",
                "name": "m1-boot",
            },
            "dataSecretName": "m1-boot",
        },
        "infrastructureRef": {
            "apiGroup": api.GROUP,
            "kind": "LibvirtMachine",
            "name": "m1",
        },
        "version": "v1.35.4",
        "failureDomain": "h0",
        "providerID": "libvirt:///6f1c8c52-1d7a-4c2e-9d4e-0a1b2c3d4e5f",
        "readinessGates": [{"conditionType": "X"}],
    },
    "status": {
        "initialization": {"infrastructureProvisioned": True, "bootstrapDataSecretCreated": True},
        "nodeRef": {"name": "node-1"},
        "phase": "Running",
        "deprecated": {"v1beta1": {"conditions": []}},
    },
}


def test_capi_machine_read_view() -> None:
    machine = Machine.model_validate(CAPI_MACHINE)
    assert machine.spec.bootstrap.data_secret_name == "m1-boot"
    assert machine.spec.failure_domain == "h0"
    assert machine.spec.infrastructure_ref is not None
    assert machine.spec.infrastructure_ref.kind == "LibvirtMachine"
    assert machine.spec.provider_id == "libvirt:///6f1c8c52-1d7a-4c2e-9d4e-0a1b2c3d4e5f"
    assert machine.status.node_ref is not None
    assert machine.status.node_ref.name == "node-1"
    assert machine.metadata.label(api.CONTROL_PLANE_LABEL) == ""
    owner = machine.metadata.owner(
        kind="KubeadmControlPlane", group="controlplane.cluster.x-k8s.io"
    )
    assert owner is not None
    assert owner.controller is True


def test_capi_cluster_read_view_and_pause() -> None:
    cluster = Cluster.model_validate(
        {
            "apiVersion": "cluster.x-k8s.io/v1beta2",
            "kind": "Cluster",
            "metadata": {"name": "c1", "namespace": "ns"},
            "spec": {
                "paused": True,
                "infrastructureRef": {
                    "apiGroup": api.GROUP,
                    "kind": "LibvirtCluster",
                    "name": "c1",
                },
                "topology": {"classRef": {"name": "x"}},
            },
            "status": {"initialization": {"infrastructureProvisioned": True}},
        }
    )
    assert cluster.infrastructure_provisioned
    meta = ObjectMeta(name="x")
    assert api.is_paused(cluster=cluster, obj=meta)
    cluster.spec.paused = False
    assert not api.is_paused(cluster=cluster, obj=meta)
    assert not api.is_paused(cluster=None, obj=meta)
    paused_meta = ObjectMeta(name="x", annotations={api.PAUSED_ANNOTATION: ""})
    assert api.is_paused(cluster=cluster, obj=paused_meta)


# --- conditions ------------------------------------------------------------------------------


def test_set_condition_keeps_transition_time_while_status_is_unchanged() -> None:
    t1 = T0 + datetime.timedelta(minutes=5)
    conds = set_condition(None, type_="Ready", status=False, reason="NotReady", now=T0)
    conds = set_condition(conds, type_="Paused", status=False, reason="NotPaused", now=T0)
    conds = set_condition(conds, type_="Ready", status=False, reason="WaitingForAddress", now=t1)
    ready = get_condition(conds, "Ready")
    assert ready is not None
    assert ready.last_transition_time == T0
    assert ready.reason == "WaitingForAddress"
    assert [c.type for c in conds] == ["Ready", "Paused"]
    conds = set_condition(
        conds, type_="Ready", status=True, reason="Ready", now=t1, observed_generation=3
    )
    ready = get_condition(conds, "Ready")
    assert ready is not None
    assert ready.last_transition_time == t1
    assert ready.observed_generation == 3
    assert is_true(conds, "Ready")
    assert not is_true(conds, "Paused")
    assert [c.type for c in remove_condition(conds, "Paused")] == ["Ready"]
    with pytest.raises(ValueError, match="True, False or Unknown"):
        set_condition(conds, type_="Ready", status="maybe", reason="X", now=t1)


# --- defaults --------------------------------------------------------------------------------


def test_derived_names_are_unique_and_bounded() -> None:
    assert derived_name(namespace="a-b", name="c") != derived_name(namespace="a", name="b-c")
    assert derived_name(namespace="default", name="demo") == "capl-default.demo"
    long = derived_name(namespace="n" * 63, name="x" * 200)
    assert len(long) <= 63
    assert long != derived_name(namespace="n" * 63, name="x" * 199)
    assert re.match(r"^[A-Za-z0-9_][A-Za-z0-9_.+-]*$", long)
    assert derived_dns_domain(namespace="ns", name="demo") == "demo.ns.capl.internal"
    hashed = derived_dns_domain(namespace="ns", name="a" * 64)
    assert hashed.endswith(".capl.internal")
    assert all(len(x) <= 63 for x in hashed.split("."))


def test_network_arithmetic() -> None:
    assert gateway_address("192.168.150.0/24") == "192.168.150.1"
    dhcp = default_dhcp_range("192.168.150.0/24")
    assert (dhcp.start, dhcp.end) == ("192.168.150.2", "192.168.150.254")
    tiny = default_dhcp_range("10.0.0.0/30")
    assert (tiny.start, tiny.end) == ("10.0.0.2", "10.0.0.2")


def test_cluster_defaults_fill_only_unset_fields() -> None:
    cluster = LibvirtCluster.model_validate(cluster_dict())
    defaulted = default_libvirt_cluster(cluster)
    net = defaulted.spec.network
    assert net.name == "capl-ns.c"
    assert net.dns_domain == "c.ns.capl.internal"
    assert net.dhcp is not None
    assert net.dhcp.start == "192.168.150.2"
    pool = defaulted.spec.storage_pool
    assert pool is not None
    assert pool.name == "capl-ns.c"
    assert pool.path == "/var/lib/libvirt/images/capl-ns.c"
    # Idempotent, and user values win.
    assert default_libvirt_cluster(defaulted) == defaulted
    custom = LibvirtCluster.model_validate(
        cluster_dict(
            network={"cidr": "10.1.0.0/24", "name": "mine", "dnsDomain": "x.example"},
            storagePool={"name": "pool"},
        )
    )
    d2 = default_libvirt_cluster(custom)
    assert d2.spec.network.name == "mine"
    assert d2.spec.network.dns_domain == "x.example"
    assert d2.spec.storage_pool is not None
    assert d2.spec.storage_pool.path == "/var/lib/libvirt/images/pool"
    # The original is untouched.
    assert cluster.spec.network.name is None


def test_adopted_network_is_not_defaulted() -> None:
    adopted = LibvirtCluster.model_validate(cluster_dict(network={"name": "default"}))
    net = default_libvirt_cluster(adopted).spec.network
    assert net == adopted.spec.network


def test_defaults_without_a_name_leave_derived_names_unset() -> None:
    raw = cluster_dict()
    raw["metadata"] = {"generateName": "c-", "namespace": "ns"}
    defaulted = default_libvirt_cluster(LibvirtCluster.model_validate(raw))
    assert defaulted.spec.network.name is None
    assert defaulted.spec.storage_pool is None
    assert defaulted.spec.network.dhcp is not None


def test_machine_defaults_lower_case_macs() -> None:
    machine = LibvirtMachine.model_validate(
        machine_dict(networkInterfaces=[{"mac": "52:54:00:AB:CD:EF"}, {}])
    )
    defaulted = default_libvirt_machine(machine)
    nics = defaulted.spec.network_interfaces
    assert nics is not None
    assert nics[0].mac == "52:54:00:ab:cd:ef"
    assert default_libvirt_machine(defaulted) is defaulted


# --- registry --------------------------------------------------------------------------------


def test_kind_registry() -> None:
    assert set(KINDS_BY_NAME) == {k.value for k in api.Kind}
    for info in KINDS:
        assert info.crd_name == f"{info.plural.value}.infrastructure.cluster.x-k8s.io"
        assert info.model.model_fields["kind"].default == info.kind.value
        assert info.list_model.model_fields["kind"].default == info.list_kind


def test_templates_embed_the_spec_models() -> None:
    mt = LibvirtMachineTemplate.model_validate(sample("LibvirtMachineTemplate"))
    assert isinstance(mt.spec.template.spec, LibvirtMachineSpec)
    ct = LibvirtClusterTemplate.model_validate(sample("LibvirtClusterTemplate"))
    assert ct.spec.template.spec.network.mode == "isolated"
