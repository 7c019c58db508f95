"""`capl demo`'s pure parts: the network it picks, the objects it creates, the live view's
rows and lines, the one `N/N machines Ready` line, the commands it suggests, its flags, and
how it recognises the work directories of demos that were killed."""

from __future__ import annotations

import base64
import ipaddress
import json
import os
from pathlib import Path
from typing import Any

import pytest

from capl.api.capi import Cluster, Machine
from capl.api.cluster import LibvirtCluster
from capl.api.machine import LibvirtMachine
from capl.api.templates import LibvirtMachineTemplate
from capl.cli import main
from capl.commands.demo import cli, workdirs
from capl.commands.demo.image_server import synthetic_qcow2
from capl.commands.demo.network import local_routes, pick_cidr
from capl.commands.demo.objects import demo_objects, layout_names, resource_of
from capl.commands.demo.plan import DemoPlan, is_local_uri, is_test_driver
from capl.commands.demo.view import (
    MachineRow,
    Tracker,
    next_steps,
    ready_line,
    render_table,
    row_line,
)
from capl.commands.status_report import build_report
from capl.errors import CliError
from capl.ports.bootstrap import validate_ignition
from capl.ports.virt import VolumeFormat
from capl.virt.images import sniff_format

NET = ipaddress.IPv4Network


def plan(**changes: Any) -> DemoPlan:
    values: dict[str, Any] = {
        "uri": "qemu:///system",
        "image_url": "http://127.0.0.1:8000/capl-demo-base.qcow2",
        "image_sha256": "ab" * 32,
        "cidr": "10.213.0.0/24",
        "pool_path": "/tmp/capl-demo-x/pool",
    }
    values.update(changes)
    return DemoPlan(**values)


def by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


# --- the network ---------------------------------------------------------------------------


def test_the_first_free_slash_24_is_picked() -> None:
    taken = [NET("10.213.0.0/24"), NET("10.213.1.0/25"), NET("192.168.122.0/24")]
    assert pick_cidr(taken) == "10.213.2.0/24"


def test_a_route_covering_the_whole_search_space_moves_on_to_the_next_one() -> None:
    assert pick_cidr([NET("10.213.0.0/16")]) == "10.0.0.0/24"


def test_no_free_network_is_a_clear_error() -> None:
    with pytest.raises(CliError, match="--network-cidr"):
        pick_cidr([NET("10.0.0.0/8")], search=[NET("10.213.0.0/23")])


def test_local_routes_are_read_from_proc_net_route() -> None:
    text = (
        "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"
        "eth0\t00000000\t0101A8C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n"
        "eth0\t0001A8C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n"
        "virbr0\t00D5000A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n"
        "garbage\n"
    )
    assert local_routes(text) == [NET("192.168.1.0/24"), NET("10.0.213.0/24")]


@pytest.mark.parametrize(
    ("uri", "local", "test"),
    [
        ("qemu:///system", True, False),
        ("qemu:///session", True, False),
        ("test:///default", True, True),
        ("test+unix:///default", False, True),
        ("qemu+ssh://root@kvm1/system", False, False),
        ("qemu+tls://kvm1/system", False, False),
    ],
)
def test_uri_kinds(uri: str, local: bool, test: bool) -> None:
    assert is_local_uri(uri) is local
    assert is_test_driver(uri) is test


# --- the image -----------------------------------------------------------------------------


def test_the_synthetic_image_passes_capls_format_sniffing() -> None:
    data = synthetic_qcow2(5 << 30)
    assert sniff_format(data) == (VolumeFormat.QCOW2, 5 << 30)


# --- the objects ---------------------------------------------------------------------------


def test_objects_are_valid_capl_and_cluster_api_objects() -> None:
    objects = demo_objects(plan(machines=4))
    assert [o["kind"] for o in objects] == [
        "Secret",
        "Secret",
        "LibvirtCluster",
        "Cluster",
        "LibvirtMachine",
        "Machine",
        "LibvirtMachineTemplate",
        "MachineDeployment",
    ]
    assert {o["metadata"]["namespace"] for o in objects} == {"default"}
    (lc_raw,) = by_kind(objects, "LibvirtCluster")
    lc = LibvirtCluster.model_validate(lc_raw)
    assert [(h.name, h.uri) for h in lc.spec.hosts] == [("local", "qemu:///system")]
    assert (lc.spec.network.cidr, lc.spec.network.mode) == ("10.213.0.0/24", "isolated")
    assert lc.spec.storage_pool is not None
    assert lc.spec.storage_pool.path == "/tmp/capl-demo-x/pool"
    assert lc.spec.control_plane_endpoint is None  # capl publishes api.<dnsDomain>:6443

    (cluster_raw,) = by_kind(objects, "Cluster")
    cluster = Cluster.model_validate(cluster_raw)
    assert cluster.spec.infrastructure_ref is not None
    assert cluster.spec.infrastructure_ref.kind == "LibvirtCluster"
    assert cluster.spec.infrastructure_ref.name == "demo"

    (lm_raw,) = by_kind(objects, "LibvirtMachine")
    lm = LibvirtMachine.model_validate(lm_raw)
    assert lm.spec.image.url == "http://127.0.0.1:8000/capl-demo-base.qcow2"
    assert lm.spec.image.checksum == "sha256:" + "ab" * 32
    assert (lm.spec.domain_type, lm.spec.cpus, lm.spec.memory_mib) == ("qemu", 1, 256)
    (template_raw,) = by_kind(objects, "LibvirtMachineTemplate")
    template = LibvirtMachineTemplate.model_validate(template_raw)
    assert template.spec.template.spec == lm.spec

    (machine_raw,) = by_kind(objects, "Machine")
    machine = Machine.model_validate(machine_raw)
    assert machine.metadata.name == lm.metadata.name == "demo-control-plane-0"
    for labels in (machine_raw["metadata"]["labels"], lm_raw["metadata"]["labels"]):
        assert labels == {
            "cluster.x-k8s.io/cluster-name": "demo",
            "cluster.x-k8s.io/control-plane": "",
        }
    assert machine_raw["spec"]["infrastructureRef"] == {
        "apiGroup": "infrastructure.cluster.x-k8s.io",
        "kind": "LibvirtMachine",
        "name": "demo-control-plane-0",
    }

    (md,) = by_kind(objects, "MachineDeployment")
    assert md["spec"]["replicas"] == 3
    assert md["spec"]["clusterName"] == "demo"
    selector = md["spec"]["selector"]["matchLabels"]
    assert md["spec"]["template"]["metadata"]["labels"] == selector
    assert md["spec"]["template"]["spec"]["infrastructureRef"]["name"] == "demo-workers"
    secrets = {s["metadata"]["name"]: s for s in by_kind(objects, "Secret")}
    assert set(secrets) == {
        machine_raw["spec"]["bootstrap"]["dataSecretName"],
        md["spec"]["template"]["spec"]["bootstrap"]["dataSecretName"],
    }


def _secret_data(secret: dict[str, Any]) -> dict[str, str]:
    return {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}


def test_the_control_plane_machine_gets_ignition_the_workers_cloud_config() -> None:
    objects = demo_objects(plan())
    secrets = {s["metadata"]["name"]: _secret_data(s) for s in by_kind(objects, "Secret")}
    ignition = secrets["demo-control-plane-0-bootstrap"]
    assert ignition["format"] == "ignition"
    config = validate_ignition(ignition["value"].encode())
    files = config["storage"]["files"]
    assert files[0]["path"] == "/etc/hostname"
    assert files[0]["contents"]["source"] == "data:,demo-control-plane-0"
    cloud = secrets["demo-workers-bootstrap"]
    assert cloud["format"] == "cloud-config"
    assert cloud["value"].startswith("#cloud-config\n")
    for secret in by_kind(objects, "Secret"):
        assert secret["type"] == "cluster.x-k8s.io/secret"


def test_one_machine_means_no_workers_and_no_checksum_without_a_digest() -> None:
    objects = demo_objects(plan(machines=1, image_sha256=None, name="lab"))
    (md,) = by_kind(objects, "MachineDeployment")
    assert md["spec"]["replicas"] == 0
    assert md["metadata"]["name"] == "lab-workers"
    (lm,) = by_kind(objects, "LibvirtMachine")
    assert "checksum" not in lm["spec"]["image"]
    assert lm["metadata"]["name"] == "lab-control-plane-0"


def test_the_network_and_pool_names_are_capls_derived_names() -> None:
    assert layout_names(plan()) == ("capl-default.demo", "capl-default.demo")
    assert layout_names(plan(name="lab")) == ("capl-default.lab", "capl-default.lab")


def test_every_object_has_a_rest_resource() -> None:
    for obj in demo_objects(plan()):
        resource = resource_of(obj)
        assert resource.kind == obj["kind"]
        assert resource.api_version == obj["apiVersion"]


# --- the live view -------------------------------------------------------------------------


def _lm(name: str, *, ready: str | None, created: str, **status: Any) -> dict[str, Any]:
    conditions = [] if ready is None else [{"type": "Ready", "status": ready, "reason": "R"}]
    if ready == "False":
        conditions.append(
            {
                "type": "AddressAssigned",
                "status": "False",
                "reason": "WaitingForAddress",
                "message": "no lease yet",
            }
        )
    return {
        "kind": "LibvirtMachine",
        "metadata": {
            "name": name,
            "namespace": "default",
            "creationTimestamp": created,
            "labels": {"cluster.x-k8s.io/cluster-name": "demo"},
        },
        "spec": {},
        "status": {"conditions": conditions, **status},
    }


def _report(*machines: dict[str, Any]) -> Any:
    return build_report(
        namespace="default",
        libvirt_clusters=[],
        libvirt_machines=list(machines),
        clusters=[],
        machines=[],
    )


T0 = 1_800_000_000.0  # 2027-01-15T08:00:00Z
T0_TEXT = "2027-01-15T08:00:00Z"


def test_rows_show_host_state_address_readiness_and_what_a_machine_waits_for() -> None:
    tracker = Tracker(cluster="demo", expected=2)
    running = {"host": "local", "domainState": "Running"}
    addresses = {"addresses": [{"type": "InternalIP", "address": "10.213.0.5"}]}
    report = _report(
        _lm("a", ready="True", created=T0_TEXT, **running, **addresses),
        _lm("b", ready="False", created=T0_TEXT, **running),
    )
    rows = tracker.update(report, now=T0 + 7)
    assert rows[0] == MachineRow(
        name="a",
        host="local",
        state="Running",
        address="10.213.0.5",
        ready="True",
        elapsed=7.0,
        detail="",
    )
    assert rows[1].detail == "AddressAssigned: WaitingForAddress (no lease yet)"
    assert (tracker.ready, tracker.all_ready) == (1, False)

    # a Ready machine's elapsed time stops at the moment it was first seen Ready
    later = tracker.update(report, now=T0 + 30)
    assert later[0].elapsed == 7.0
    assert later[1].elapsed == 30.0


def test_all_ready_needs_the_expected_number_of_machines() -> None:
    tracker = Tracker(cluster="demo", expected=2)
    tracker.update(_report(_lm("a", ready="True", created=T0_TEXT)), now=T0)
    assert not tracker.all_ready
    tracker.update(
        _report(_lm("a", ready="True", created=T0_TEXT), _lm("b", ready="True", created=T0_TEXT)),
        now=T0,
    )
    assert tracker.all_ready


def test_machines_of_other_clusters_are_not_shown() -> None:
    other = _lm("x", ready="True", created=T0_TEXT)
    other["metadata"]["labels"] = {"cluster.x-k8s.io/cluster-name": "other"}
    tracker = Tracker(cluster="demo", expected=1)
    assert tracker.update(_report(other), now=T0) == []


def test_the_ready_line_and_change_lines() -> None:
    assert ready_line(3, 3) == "3/3 machines Ready"
    row = MachineRow(
        name="m",
        host="local",
        state="Running",
        address="-",
        ready="False",
        elapsed=150,
        detail="AddressAssigned: WaitingForAddress",
    )
    line = row_line(row, since_start=42)
    assert line == (
        "[   42s] m: host=local state=Running address=- ready=False elapsed=2m30s"
        " - AddressAssigned: WaitingForAddress"
    )
    assert "machines Ready" not in line  # only the summary says that


def test_the_table_renders_every_column() -> None:
    from rich.console import Console

    console = Console(width=160, record=True)
    row = MachineRow(
        name="m", host="local", state="Running", address="10.0.0.2", ready="True",
        elapsed=3, detail="",
    )  # fmt: skip
    console.print(render_table([row], title="t", caption="1/1 Ready"))
    text = console.export_text()
    for cell in ("MACHINE", "ELAPSED", "WAITING FOR", "m", "local", "Running", "10.0.0.2", "3s"):
        assert cell in text


def test_next_steps_use_the_demos_kubeconfig_everywhere() -> None:
    text = next_steps(
        plan=plan(),
        kubeconfig="/tmp/d/kubeconfig",
        kubectl="kubectl",
        capl="capl",
        metrics_url="http://127.0.0.1:1234/metrics",
    )
    commands = [line.strip() for line in text.splitlines() if line.startswith("  ")]
    for command in commands:
        if command.startswith(("kubectl", "capl")):
            assert "--kubeconfig /tmp/d/kubeconfig" in command
    assert any(c.startswith("capl console demo-control-plane-0") for c in commands)
    assert any(c.startswith("capl status") for c in commands)
    assert any("scale machinedeployment demo-workers --replicas 3" in c for c in commands)
    assert any("get libvirtmachines" in c or "libvirtmachines" in c for c in commands)
    assert "http://127.0.0.1:1234/metrics" in text
    assert text.splitlines()[-1].startswith("Ctrl-C")


def test_next_steps_on_the_test_driver_explain_why_there_is_no_console() -> None:
    text = next_steps(
        plan=plan(uri="test:///default"),
        kubeconfig="/k",
        kubectl="kubectl",
        capl="capl",
        metrics_url=None,
    )
    assert "capl console demo" not in text
    assert "test driver" in text


# --- flags ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["demo", "--machines", "0"],
        ["demo", "--machines", "many"],
        ["demo", "--network-cidr", "10.1.2.3/33"],
        ["demo", "--name", "Not_A_Label"],
        ["demo", "--ready-timeout", "soon"],
        ["demo", "--domain-type", "xen"],
    ],
)
def test_bad_flags_exit_2_with_one_line(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("capl demo: error:")


@pytest.mark.parametrize(
    ("text", "seconds"), [("90", 90.0), ("90s", 90.0), ("10m", 600.0), ("1h30m", 5400.0)]
)
def test_durations(text: str, seconds: float) -> None:
    assert cli._seconds(text) == seconds


def test_help_lists_the_flags_and_examples(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["demo", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    flags = ("--libvirt-uri", "--machines", "--image", "--node-image", "--vm-only", "--keep")
    for flag in (*flags, "examples:", "exit codes"):
        assert flag in out


def test_a_real_host_without_an_image_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("CAPL_GUEST_IMAGE", raising=False)
    monkeypatch.setenv("CAPL_CACHE", "/nonexistent/capl-cache")
    assert main(["demo", "--vm-only", "--libvirt-uri", "qemu:///system"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == (
        "capl: error: no guest image: pass --image PATH|URL (`make guest-image` builds the "
        "test guest and prints its path; `make demo` passes it for you)"
    )


def test_a_missing_image_file_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["demo", "--vm-only", "--image", str(tmp_path / "nope.qcow2")]) == 2
    assert "no such file" in capsys.readouterr().err


# --- work directories of killed demos --------------------------------------------------------


def test_work_directories_are_told_apart_by_their_owners_liveness(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(workdirs.tempfile, "gettempdir", lambda: str(tmp_path))
    mine = tmp_path / "capl-demo-mine"
    dead = tmp_path / "capl-demo-dead"
    unrelated = tmp_path / "capl-demo-nostate"
    for d in (mine, dead, unrelated):
        d.mkdir()
    me = workdirs.process_identity(os.getpid())
    assert me is not None
    (mine / "demo.json").write_text(json.dumps({"owner": me, "uri": "qemu:///system"}))
    # same pid, another start time: the pid was reused, the owner is gone
    (dead / "demo.json").write_text(json.dumps({"owner": f"{os.getpid()} 1", "uri": "x"}))
    found = {path.name: alive for path, _state, alive in workdirs.other_demos()}
    assert found == {"capl-demo-mine": True, "capl-demo-dead": False}
