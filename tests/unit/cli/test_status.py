"""`capl status`'s report: how objects are joined, which conditions are listed, rendering,
and the kubeconfig namespace default (pure functions, no API server)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from capl.commands.shared import default_namespace
from capl.commands.status import format_age, render_json, render_plain, render_rich
from capl.commands.status_report import build_report

T = "2026-01-02T03:04:05Z"
NOW = datetime(2026, 1, 2, 4, 4, 5, tzinfo=UTC)  # one hour after T


def cond(type_: str, status: str, reason: str = "R", message: str = "") -> dict[str, str]:
    return {"type": type_, "status": status, "reason": reason, "message": message}


def obj(kind: str, name: str, ns: str = "default", **parts: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": ns, "creationTimestamp": T}
    meta.update(parts.pop("metadata", {}))
    return {"kind": kind, "metadata": meta, **parts}


def libvirt_cluster(name: str, ns: str = "default", **parts: Any) -> dict[str, Any]:
    spec = {"hosts": [{"name": "h1", "uri": "qemu:///system"}]}
    return obj("LibvirtCluster", name, ns, spec=spec, **parts)


def test_cluster_api_objects_are_joined_by_their_references() -> None:
    report = build_report(
        namespace="default",
        libvirt_clusters=[
            libvirt_cluster(
                "demo-infra",
                status={
                    "hosts": [{"name": "h1", "reachable": True}],
                    "conditions": [cond("Ready", "True")],
                },
            )
        ],
        clusters=[
            obj(
                "Cluster",
                "demo",
                spec={
                    "infrastructureRef": {"kind": "LibvirtCluster", "name": "demo-infra"},
                    "controlPlaneEndpoint": {"host": "10.0.0.2", "port": 6443},
                },
                status={"phase": "Provisioned"},
            )
        ],
        libvirt_machines=[
            obj(
                "LibvirtMachine",
                "demo-md-abc",
                metadata={"ownerReferences": [{"kind": "Machine", "name": "demo-md-xyz"}]},
                spec={"hostName": "h1", "providerID": "libvirt:///u1"},
                status={
                    "host": "h1",
                    "domainState": "Running",
                    "addresses": [
                        {"type": "Hostname", "address": "n1"},
                        {"type": "InternalIP", "address": "10.0.0.5"},
                        {"type": "ExternalIP", "address": "192.0.2.5"},
                    ],
                    "conditions": [cond("Ready", "True")],
                },
            )
        ],
        machines=[
            obj(
                "Machine",
                "demo-md-xyz",
                spec={"clusterName": "demo"},
                status={"phase": "Running", "nodeRef": {"name": "n1"}},
            ),
            # a Machine whose LibvirtMachine is not created yet still shows up
            obj(
                "Machine",
                "demo-md-new",
                spec={
                    "clusterName": "demo",
                    "infrastructureRef": {"kind": "LibvirtMachine", "name": "demo-md-new-lm"},
                },
                status={"phase": "Pending", "conditions": [cond("Ready", "False", "Waiting")]},
            ),
        ],
    )
    assert report.capi_installed
    assert report.notes == []
    (cluster,) = report.clusters
    assert (cluster.name, cluster.libvirt_cluster, cluster.phase) == (
        "demo",
        "demo-infra",
        "Provisioned",
    )
    assert cluster.endpoint == "10.0.0.2:6443"  # from the Cluster when the LibvirtCluster has none
    assert (cluster.hosts_reachable, cluster.hosts_total) == (1, 1)
    assert (cluster.machines_ready, cluster.machines_total) == (1, 2)
    joined, pending = report.machines
    assert joined.name == "demo-md-abc"
    assert (joined.machine, joined.cluster, joined.phase, joined.node) == (
        "demo-md-xyz",
        "demo",
        "Running",
        "n1",
    )
    assert joined.addresses == ["10.0.0.5", "192.0.2.5"]
    assert (pending.name, pending.libvirt_machine, pending.state) == ("demo-md-new", None, None)
    assert pending.ready == "False"
    assert [(c.kind, c.name, c.type, c.reason) for c in report.conditions] == [
        ("Machine", "demo-md-new", "Ready", "Waiting")
    ]


def test_negative_polarity_conditions_are_listed_when_true() -> None:
    report = build_report(
        namespace="default",
        libvirt_clusters=[
            libvirt_cluster(
                "c",
                status={
                    "conditions": [
                        cond("Ready", "True"),
                        cond("Paused", "False"),
                        cond("Deleting", "True", "Deleting", "waiting for 2 machines"),
                    ]
                },
            )
        ],
        libvirt_machines=[
            obj(
                "LibvirtMachine",
                "m",
                metadata={"labels": {"cluster.x-k8s.io/cluster-name": "c"}},
                status={"conditions": [cond("Paused", "True", "Paused"), cond("Ready", "Unknown")]},
            )
        ],
        clusters=None,
        machines=None,
    )
    assert [(c.name, c.type, c.status) for c in report.conditions] == [
        ("c", "Deleting", "True"),
        ("m", "Paused", "True"),
        ("m", "Ready", "Unknown"),
    ]
    assert not report.capi_installed
    assert report.notes == ["the Cluster API CRDs are not installed: showing capl's objects only"]
    text = render_plain(report, now=NOW)
    assert "LibvirtCluster c: Deleting=True Deleting: waiting for 2 machines" in text
    assert "LibvirtMachine m: Paused=True Paused" in text
    assert "PHASE" not in text
    assert "NODE" not in text


def test_filter_by_cluster_name_or_libvirt_cluster_name() -> None:
    def machine(name: str, cluster: str) -> dict[str, Any]:
        return obj(
            "LibvirtMachine", name, metadata={"labels": {"cluster.x-k8s.io/cluster-name": cluster}}
        )

    lcs = [
        libvirt_cluster("a", metadata={"labels": {"cluster.x-k8s.io/cluster-name": "alpha"}}),
        libvirt_cluster("b"),
    ]
    lms = [machine("a-0", "alpha"), machine("b-0", "b"), machine("b-1", "b")]
    everything = build_report(
        namespace="default", libvirt_clusters=lcs, libvirt_machines=lms, clusters=[], machines=[]
    )
    assert [c.name for c in everything.clusters] == ["alpha", "b"]
    for name in ("alpha", "a"):  # the Cluster API name, or the LibvirtCluster's own name
        only = build_report(
            namespace="default",
            libvirt_clusters=lcs,
            libvirt_machines=lms,
            clusters=[],
            machines=[],
            cluster=name,
        )
        assert [c.name for c in only.clusters] == ["alpha"]
        assert [m.name for m in only.machines] == ["a-0"]
    nothing = build_report(
        namespace="default",
        libvirt_clusters=lcs,
        libvirt_machines=lms,
        clusters=[],
        machines=[],
        cluster="zeta",
    )
    assert nothing.empty


def test_missing_capl_crds_are_noted() -> None:
    report = build_report(
        namespace=None, libvirt_clusters=None, libvirt_machines=None, clusters=[], machines=[]
    )
    assert report.empty
    assert report.notes[0].startswith("capl's CRDs (LibvirtCluster, LibvirtMachine) are not")


def test_plain_rendering_aligns_columns_and_adds_namespaces_for_all() -> None:
    report = build_report(
        namespace=None,
        libvirt_clusters=[libvirt_cluster("short"), libvirt_cluster("a-much-longer-name", "ns2")],
        libvirt_machines=[],
        clusters=None,
        machines=None,
    )
    lines = render_plain(report, now=NOW).splitlines()
    assert lines[0].split() == [
        "NAMESPACE",
        "CLUSTER",
        "READY",
        "ENDPOINT",
        "HOSTS",
        "MACHINES",
        "AGE",
    ]
    column = lines[0].index("READY")
    assert all(line[column - 1] == " " and line[column] != " " for line in lines)
    assert lines[1].split() == ["default", "short", "-", "-", "0/1", "0/0", "1h"]


def test_rich_and_json_rendering() -> None:
    report = build_report(
        namespace="default",
        libvirt_clusters=[libvirt_cluster("c", status={"conditions": [cond("Ready", "False")]})],
        libvirt_machines=[],
        clusters=[],
        machines=[],
    )
    console = Console(record=True, width=120, force_terminal=True)
    render_rich(report, console, now=NOW)
    text = console.export_text()
    assert "Clusters" in text
    assert "Conditions not in their good state" in text
    assert "Ready=False" in text
    data = json.loads(render_json(report, now=NOW))
    assert data["clusters"][0]["name"] == "c"
    assert data["clusters"][0]["age"] == "1h"
    assert data["conditions"][0]["type"] == "Ready"


@pytest.mark.parametrize(
    ("seconds", "age"),
    [(5, "5s"), (119, "119s"), (600, "10m"), (3 * 3600 + 1200, "3h20m"), (30 * 3600, "1d6h")],
)
def test_format_age(seconds: int, age: str) -> None:
    created = datetime.fromtimestamp(NOW.timestamp() - seconds, UTC).isoformat()
    assert format_age(created, now=NOW) == age
    assert format_age(None) == "-"
    assert format_age("garbage") == "-"


def test_default_namespace_follows_the_kubeconfig_context(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = tmp_path / "a"
    first.write_text(
        "current-context: one\n"
        "contexts:\n"
        "- {name: one, context: {cluster: c, user: u, namespace: team-a}}\n"
        "- {name: two, context: {cluster: c, user: u}}\n"
    )
    second = tmp_path / "b"
    second.write_text("contexts:\n- {name: three, context: {namespace: team-c}}\n")
    assert default_namespace(str(first)) == "team-a"
    assert default_namespace(str(first), context="two") == "default"
    monkeypatch.setenv("KUBECONFIG", f"{first}:{second}")
    assert default_namespace(None) == "team-a"
    assert default_namespace(None, context="three") == "team-c"
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    assert default_namespace(None) == "default"
