"""`capl demo`'s real-node mode, its pure parts: the objects (in step with the offline
template), the mode and its defaults, the Node column of the live view, the workload commands
it suggests, and the usage errors that come before anything starts."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from capl.api.capi import Cluster
from capl.api.cluster import LibvirtCluster
from capl.api.templates import LibvirtMachineTemplate
from capl.cli import build_parser, main
from capl.commands.demo import assets, cli, node_objects
from capl.commands.demo.node_objects import cluster_objects, worker_objects
from capl.commands.demo.node_view import NodeIndex
from capl.commands.demo.objects import demo_objects, layout_names, resource_of
from capl.commands.demo.plan import DemoOptions, DemoPlan, gateway, runs_here, split_workers
from capl.commands.demo.view import (
    MachineRow,
    Tracker,
    next_steps,
    ready_line,
    render_table,
    row_line,
)
from capl.commands.status_report import build_report

REPO = Path(__file__).resolve().parents[3]
TEMPLATE = REPO / "templates" / "cluster-template-offline.yaml"


def plan(**changes: Any) -> DemoPlan:
    values: dict[str, Any] = {
        "uri": "qemu:///system",
        "machines": 2,
        "cidr": "10.213.4.0/24",
        "pool_path": "/tmp/capl-demo-x/pool",
        "real_nodes": True,
        "image_path": "/cache/node-image/abc/capl-node.qcow2",
        "cpus": 2,
        "memory_mib": 1536,
    }
    values.update(changes)
    return DemoPlan(**values)


def by_name(objects: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(o["kind"], o["metadata"]["name"]): o for o in objects}


# --- the plan ------------------------------------------------------------------------------


def test_the_control_plane_listens_on_the_networks_first_address() -> None:
    assert gateway("10.213.4.0/24") == "10.213.4.1"
    assert gateway("192.168.7.128/25") == "192.168.7.129"


@pytest.mark.parametrize(
    ("machines", "split"), [(1, (1, 0)), (2, (1, 1)), (3, (2, 1)), (6, (3, 3))]
)
def test_workers_are_split_between_ignition_and_cloud_config(
    machines: int, split: tuple[int, int]
) -> None:
    assert split_workers(machines) == split


@pytest.mark.parametrize(
    ("uri", "here"),
    [
        ("qemu:///system", True),
        ("qemu+unix:///system?socket=/run/x.sock", True),
        ("qemu+ssh://root@kvm1/system", False),
        ("qemu+tls://kvm1/system", False),
        ("qemu://kvm1/system", False),
    ],
)
def test_real_nodes_need_this_machine(uri: str, here: bool) -> None:
    assert runs_here(uri) is here


def _render(template: str, variables: dict[str, str]) -> list[dict[str, Any]]:
    """clusterctl's variable syntax: ${VAR} and ${VAR:=default}."""

    def value(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(3)
        if name in variables:
            return variables[name]
        assert default is not None, f"no value for {name}"
        return default

    text = re.sub(r"\$\{([A-Z0-9_]+)(:=([^}]*))?\}", value, template)
    return [doc for doc in yaml.safe_load_all(text) if doc]


def test_the_objects_are_the_offline_templates_with_the_demos_values() -> None:
    p = plan(machines=3)
    ours = by_name(demo_objects(p))
    theirs = by_name(
        _render(
            TEMPLATE.read_text(),
            {
                "CLUSTER_NAME": "demo",
                "NAMESPACE": "default",
                "KUBERNETES_VERSION": p.kubernetes_version,
                "WORKER_MACHINE_COUNT": "2",
                "LIBVIRT_CLOUD_CONFIG_WORKER_MACHINE_COUNT": "1",
                "LIBVIRT_NETWORK_CIDR": "10.213.4.0/24",
                "CONTROL_PLANE_ENDPOINT_HOST": "10.213.4.1",
                "LIBVIRT_IMAGE_PATH": "/cache/node-image/abc/capl-node.qcow2",
                "LIBVIRT_URI": "qemu:///system",
            },
        )
    )
    assert sorted(ours) == sorted(theirs)
    for key, obj in ours.items():
        expected = theirs[key]
        assert obj["apiVersion"] == expected["apiVersion"], key
        assert obj["metadata"]["namespace"] == "default"
        assert obj["metadata"]["labels"] == {"cluster.x-k8s.io/cluster-name": "demo"}
        spec = dict(obj["spec"])
        if key[0] == "LibvirtCluster":  # the demo's deviations (see node_objects)
            assert spec.pop("storagePool") == {"path": "/tmp/capl-demo-x/pool"}
            assert spec["hosts"] == [{"name": "local", "uri": "qemu:///system"}]
            spec["hosts"] = expected["spec"]["hosts"]
        assert spec == expected["spec"], key
    # creation order: what a reference points at exists before the referrer
    kinds = [o["kind"] for o in demo_objects(p)]
    assert kinds.index("TestbedControlPlane") < kinds.index("Cluster")
    assert kinds.index("LibvirtCluster") < kinds.index("Cluster")
    assert kinds.index("KubeadmConfigTemplate") < kinds.index("MachineDeployment")


def test_the_objects_are_valid_for_capls_models_and_cluster_api() -> None:
    objects = by_name(demo_objects(plan()))
    lc = LibvirtCluster.model_validate(objects[("LibvirtCluster", "demo")])
    assert lc.spec.control_plane_endpoint is not None
    assert (lc.spec.control_plane_endpoint.host, lc.spec.control_plane_endpoint.port) == (
        "10.213.4.1",
        6443,
    )
    assert lc.spec.network.mode == "isolated"
    Cluster.model_validate(objects[("Cluster", "demo")])
    template = LibvirtMachineTemplate.model_validate(
        objects[("LibvirtMachineTemplate", "demo-worker")]
    )
    image = template.spec.template.spec.image
    assert (image.path, image.url) == ("/cache/node-image/abc/capl-node.qcow2", None)
    assert template.spec.template.spec.cpus == 2
    formats = {
        name: o["spec"]["template"]["spec"]["format"]
        for (kind, name), o in objects.items()
        if kind == "KubeadmConfigTemplate"
    }
    assert formats == {"demo-md-ignition": "ignition", "demo-md-cloud-config": "cloud-config"}
    replicas = {
        name: o["spec"]["replicas"]
        for (kind, name), o in objects.items()
        if kind == "MachineDeployment"
    }
    assert replicas == {"demo-md-ignition": 1, "demo-md-cloud-config": 1}
    for obj in objects.values():
        resource = resource_of(obj)
        assert (resource.kind, resource.api_version) == (obj["kind"], obj["apiVersion"])


def test_the_network_and_pool_names_are_the_same_as_in_the_vm_only_mode() -> None:
    assert layout_names(plan()) == ("capl-default.demo", "capl-default.demo")


def test_the_testbed_control_plane_crd_is_installed_with_capls() -> None:
    kinds = [m["kind"] for m in node_objects.testbed_manifests()]
    assert kinds == ["CustomResourceDefinition", "ClusterRole"]
    crd = node_objects.testbed_manifests()[0]
    assert crd["spec"]["names"]["kind"] == "TestbedControlPlane"


def test_the_plan_names_what_is_scaled_and_deleted() -> None:
    p = plan()
    assert p.deployments == ("demo-md-ignition", "demo-md-cloud-config")
    assert (p.deployment, p.workers) == ("demo-md-cloud-config", 1)
    assert p.control_plane == "demo-control-plane"


# --- the mode and its defaults --------------------------------------------------------------


def _options(*argv: str) -> DemoOptions:
    args: argparse.Namespace = build_parser().parse_args(["demo", *argv])
    return cli.options_from_args(args)


def test_real_nodes_are_the_default_with_their_own_defaults() -> None:
    options = _options()
    assert options.real_nodes
    assert (options.machines, options.memory_mib, options.ready_timeout) == (2, 1536, 1200.0)


def test_vm_only_keeps_the_fast_demos_defaults() -> None:
    options = _options("--vm-only")
    assert not options.real_nodes
    assert (options.machines, options.memory_mib, options.ready_timeout) == (3, 256, 600.0)


def test_the_test_driver_implies_vm_only() -> None:
    options = _options("--libvirt-uri", "test:///default")
    assert not options.real_nodes
    assert not options.vm_only  # implied, not given: the demo says so
    assert options.machines == 3


def test_given_values_win_over_the_modes_defaults() -> None:
    options = _options("--machines", "4", "--memory-mib", "2048", "--ready-timeout", "0")
    assert (options.machines, options.memory_mib, options.ready_timeout) == (4, 2048, 0.0)


def test_image_without_vm_only_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--image", "/some/guest.qcow2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("capl: error: --image is the base image of the VM-only mode")
    assert "--vm-only" in err


def test_real_nodes_on_a_remote_host_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--libvirt-uri", "qemu+ssh://root@kvm1/system"]) == 2
    assert "pass --vm-only" in capsys.readouterr().err


def test_no_node_image_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("CAPL_NODE_IMAGE", raising=False)
    monkeypatch.setenv("CAPL_CACHE", "/nonexistent/capl-cache")
    assert main(["demo"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("capl: error: no node image: run `make node-image`")
    assert "--vm-only" in err


def test_a_missing_node_image_file_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["demo", "--node-image", str(tmp_path / "nope.qcow2")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_node_binaries_and_image_are_found_in_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CAPL_NODE_IMAGE", raising=False)
    monkeypatch.delenv("CAPL_NODE_BIN", raising=False)
    image = tmp_path / "node-image" / "h1" / "capl-node.qcow2"
    kubeadm = tmp_path / "node-bin" / "k8s-v1.35.4-x" / "bin" / "kubeadm"
    for path in (image, kubeadm):
        path.parent.mkdir(parents=True)
        path.write_text("")
    assert assets.find_node_image(None, cache=tmp_path) == image.resolve()
    assert assets.find_node_bin(cache=tmp_path) == kubeadm.parent.parent
    monkeypatch.setenv("CAPL_NODE_BIN", "/elsewhere")
    assert assets.find_node_bin(cache=tmp_path) == Path("/elsewhere")


# --- the live view ---------------------------------------------------------------------------

T0 = 1_800_000_000.0
T0_TEXT = "2027-01-15T08:00:00Z"


def _lm(name: str, *, ready: str, provider_id: str, **extra: Any) -> dict[str, Any]:
    conditions = [{"type": "Ready", "status": ready, "reason": "R"}, *extra.pop("conditions", [])]
    return {
        "kind": "LibvirtMachine",
        "metadata": {
            "name": name,
            "namespace": "default",
            "creationTimestamp": T0_TEXT,
            "labels": {"cluster.x-k8s.io/cluster-name": "demo"},
        },
        "spec": {"providerID": provider_id},
        "status": {"conditions": conditions, "host": "local", "domainState": "Running"},
    }


def _node(name: str, *, ready: str, provider_id: str = "", **condition: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {"providerID": provider_id} if provider_id else {},
        "status": {"conditions": [{"type": "Ready", "status": ready, **condition}]},
    }


def _machine(name: str, *, node_ref: str | None) -> dict[str, Any]:
    """The Cluster API Machine of LibvirtMachine ``name`` (with its nodeRef, if linked)."""
    return {
        "kind": "Machine",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "clusterName": "demo",
            "infrastructureRef": {"kind": "LibvirtMachine", "name": name},
        },
        "status": {"nodeRef": {"name": node_ref}} if node_ref else {},
    }


def _report(*machines: dict[str, Any], node_refs: dict[str, str] | None = None) -> Any:
    refs = node_refs or {}
    return build_report(
        namespace="default",
        libvirt_clusters=[],
        libvirt_machines=list(machines),
        clusters=[],
        machines=[
            _machine(m["metadata"]["name"], node_ref=refs.get(m["metadata"]["name"]))
            for m in machines
        ],
    )


def test_rows_show_each_machines_node_and_only_ready_nodes_count() -> None:
    waiting = {
        "type": "BootstrapSucceeded",
        "status": "False",
        "reason": "WaitingForBootstrap",
    }
    report = _report(
        _lm("a", ready="True", provider_id="libvirt:///1"),
        _lm("b", ready="True", provider_id="libvirt:///2"),
        _lm("c", ready="True", provider_id="libvirt:///3", conditions=[waiting]),
        _lm("d", ready="False", provider_id="libvirt:///4"),
        node_refs={"a": "a", "b": "node-b"},
    )
    nodes = NodeIndex(
        [
            _node("a", ready="True", provider_id="libvirt:///1"),
            _node(
                "node-b",
                ready="False",
                provider_id="libvirt:///2",
                reason="KubeletNotReady",
                message="container runtime network not ready",
            ),
        ]
    )
    tracker = Tracker(cluster="demo", expected=4, nodes=True)
    rows = {r.name: r for r in tracker.update(report, now=T0 + 9, nodes=nodes)}
    assert (rows["a"].node, rows["a"].node_ready, rows["a"].detail) == ("a Ready", True, "")
    assert rows["b"].node == "node-b NotReady"  # found by its providerID
    assert (
        rows["b"].detail == "Node NotReady: KubeletNotReady (container runtime network not ready)"
    )
    assert (rows["c"].node, rows["c"].detail) == ("-", "BootstrapSucceeded: WaitingForBootstrap")
    assert rows["d"].node == "-"
    assert tracker.ready == 1
    assert not tracker.all_ready
    # the elapsed time stops when the Node became Ready, not the machine
    later = {r.name: r for r in tracker.update(report, now=T0 + 30, nodes=nodes)}
    assert (later["a"].elapsed, later["b"].elapsed) == (9.0, 30.0)


def test_a_ready_node_counts_once_cluster_api_linked_it_to_its_machine() -> None:
    lm = _lm("a", ready="True", provider_id="libvirt:///1")
    nodes = NodeIndex([_node("a", ready="True")])  # capl has not set its providerID yet
    tracker = Tracker(cluster="demo", expected=1, nodes=True)
    (row,) = tracker.update(_report(lm), now=T0, nodes=nodes)
    assert (row.node, row.node_ready) == ("a Ready", False)
    assert "nodeRef" in row.detail
    (row,) = tracker.update(_report(lm, node_refs={"a": "a"}), now=T0 + 3, nodes=nodes)
    assert (row.node_ready, row.detail) == (True, "")
    assert tracker.all_ready


def test_a_ready_machine_without_a_node_waits_for_kubeadm_join() -> None:
    report = _report(_lm("a", ready="True", provider_id="libvirt:///1"))
    tracker = Tracker(cluster="demo", expected=1, nodes=True)
    (row,) = tracker.update(report, now=T0, nodes=NodeIndex())
    assert (row.node, row.detail) == ("-", "kubeadm join: no Node yet")
    assert tracker.ready == 0


def test_the_ready_line_counts_nodes() -> None:
    assert ready_line(2, 2, nodes=True) == "2/2 Nodes Ready"
    assert ready_line(3, 3) == "3/3 machines Ready"


def test_the_node_column_and_change_lines() -> None:
    from rich.console import Console

    row = MachineRow(
        name="demo-md-ignition-a", host="local", state="Running", address="10.213.4.2",
        ready="True", elapsed=75, detail="", node="demo-md-ignition-a Ready", node_ready=True,
    )  # fmt: skip
    console = Console(width=200, record=True)
    console.print(render_table([row], title="t", caption="1/1 Nodes Ready", nodes=True))
    text = console.export_text()
    assert "NODE" in text
    assert "demo-md-ignition-a Ready" in text
    console = Console(width=200, record=True)
    console.print(render_table([row], title="t", caption=""))
    assert "NODE" not in console.export_text()
    line = row_line(row, since_start=80)
    assert " node=demo-md-ignition-a/Ready elapsed=75s" in line


def test_next_steps_start_with_the_workload_cluster() -> None:
    text = next_steps(
        plan=plan(),
        kubeconfig="/tmp/d/kubeconfig",
        kubectl="/cache/envtest/kubectl",
        capl="capl",
        metrics_url=None,
        workload_kubeconfig="/tmp/d/workload.kubeconfig",
        console_machine="demo-md-ignition-abc-def",
    )
    commands = [line.strip() for line in text.splitlines() if line.startswith("  ")]
    assert (
        commands[0]
        == "/cache/envtest/kubectl --kubeconfig /tmp/d/workload.kubeconfig get nodes -o wide"
    )
    assert any("run hello --image capl.local/busybox:1" in c for c in commands)
    assert any("scale machinedeployment demo-md-cloud-config --replicas 2" in c for c in commands)
    assert any(c.startswith("capl console demo-md-ignition-abc-def --kubeconfig") for c in commands)


def test_the_cluster_comes_first_and_the_workers_once_its_control_plane_runs() -> None:
    first = cluster_objects(plan())
    assert sorted(o["kind"] for o in first) == ["Cluster", "LibvirtCluster", "TestbedControlPlane"]
    workers = worker_objects(plan())
    assert [o["kind"] for o in workers] == [
        "LibvirtMachineTemplate",
        "KubeadmConfigTemplate",
        "KubeadmConfigTemplate",
        "MachineDeployment",
        "MachineDeployment",
    ]
    assert len(first) + len(workers) == len(demo_objects(plan()))
