"""The pure parts of `capl hosts`, `capl maintenance` and `capl migrate`: the host join (with
Cluster API objects, which the API-server tests do not install), the maintenance decision, the
progress lines (no API server)."""

from __future__ import annotations

from typing import Any

import pytest

from capl.commands.follow import format_bytes
from capl.commands.hosts import render_plain
from capl.commands.hosts_report import build_hosts, combine, maintenance_phase
from capl.commands.maintenance import _decide
from capl.commands.migrate import progress_line


def obj(kind: str, name: str, ns: str = "default", **parts: Any) -> dict[str, Any]:
    metadata = {"name": name, "namespace": ns, **parts.pop("metadata", {})}
    return {"kind": kind, "metadata": metadata, **parts}


def test_combine_one_value_when_clusters_agree_else_each() -> None:
    assert combine([]) is None
    assert combine([("a", "True"), ("b", "True")]) == "True"
    assert combine([("a", "True"), ("b", None)]) == "a:True,b:-"


@pytest.mark.parametrize(
    ("spec", "status", "phase"),
    [
        ({}, None, None),
        ({"maintenance": {}}, None, "Pending"),
        ({"maintenance": {"reason": "x"}}, {"maintenance": {"phase": "Blocked"}}, "Blocked"),
        ({}, {"maintenance": {"phase": "Evacuated"}}, "Ending"),
    ],
)
def test_maintenance_phase(
    spec: dict[str, Any], status: dict[str, Any] | None, phase: str | None
) -> None:
    assert maintenance_phase({"name": "h", **spec}, status) == phase


def test_hosts_join_through_cluster_api_objects() -> None:
    """The Cluster's infrastructureRef pins a LibvirtCluster of another name; a Machine's
    control-plane label counts for its LibvirtMachine; a host of the same name and another
    URI in another cluster is another row."""
    lcs = [
        obj(
            "LibvirtCluster",
            "lab-infra",
            spec={"hosts": [{"name": "kvm1", "uri": "qemu:///system"}]},
            status={"hosts": [{"name": "kvm1", "reachable": True, "libvirtVersion": "10.0.0"}]},
        ),
        obj("LibvirtCluster", "other", spec={"hosts": [{"name": "kvm1", "uri": "qemu+tls://x/s"}]}),
    ]
    cluster = obj(
        "Cluster",
        "lab",
        spec={"infrastructureRef": {"kind": "LibvirtCluster", "name": "lab-infra"}},
    )
    labels = {"cluster.x-k8s.io/cluster-name": "lab"}
    lm = obj("LibvirtMachine", "lab-cp-x", metadata={"labels": labels}, spec={"hostName": "kvm1"})
    machine = obj(
        "Machine",
        "lab-cp-x",
        metadata={"labels": {**labels, "cluster.x-k8s.io/control-plane": ""}},
        spec={
            "clusterName": "lab",
            "infrastructureRef": {"kind": "LibvirtMachine", "name": "lab-cp-x"},
        },
    )
    report = build_hosts(
        namespace="default",
        libvirt_clusters=lcs,
        libvirt_machines=[lm],
        clusters=[cluster],
        machines=[machine],
    )
    assert [(h.name, h.uri, h.clusters) for h in report.hosts] == [
        ("kvm1", "qemu+tls://x/s", ["default/other"]),
        ("kvm1", "qemu:///system", ["default/lab-infra"]),
    ]
    lab = report.hosts[1]
    assert (lab.machines, lab.control_plane_machines, lab.reachable) == (1, 1, "True")
    assert report.hosts[0].machines == 0
    only = build_hosts(
        namespace="default",
        libvirt_clusters=lcs,
        libvirt_machines=[lm],
        clusters=[cluster],
        cluster="lab",
    )
    assert [h.clusters for h in only.hosts] == [["default/lab-infra"]]
    assert render_plain(only).splitlines()[1].split()[-1] == "lab-infra"


@pytest.mark.parametrize(
    ("current", "start", "reason", "desired", "said"),
    [
        (None, True, None, {}, "host h put into maintenance"),
        (None, True, "r", {"reason": "r"}, "host h put into maintenance (reason: r)"),
        (
            {"reason": "r"},
            True,
            None,
            {"reason": "r"},
            "host h already in maintenance (reason: r): unchanged",
        ),
        (
            {"reason": "r"},
            True,
            "r",
            {"reason": "r"},
            "host h already in maintenance (reason: r): unchanged",
        ),
        (
            {"reason": "r", "future": 1},
            True,
            "s",
            {"reason": "s", "future": 1},
            "host h already in maintenance; reason changed from 'r' to 's'",
        ),
        ({}, False, None, None, "host h taken out of maintenance"),
        ({"reason": "r"}, False, None, None, "host h taken out of maintenance (it was: r)"),
        (None, False, None, None, "host h is not in maintenance: unchanged"),
    ],
)
def test_maintenance_decision(
    current: Any, start: bool, reason: str | None, desired: Any, said: str
) -> None:
    assert _decide(current, host="h", start=start, reason=reason) == (desired, said)


def test_progress_lines() -> None:
    assert progress_line(obj("LibvirtMachineMigration", "m")) == "Pending"
    running = {
        "phase": "Running",
        "sourceHost": "a",
        "targetHost": "b",
        "state": {"dataTotalBytes": 3 * 1024**3, "dataRemainingBytes": 1536 * 1024},
    }
    assert progress_line(obj("LibvirtMachineMigration", "m", status=running)) == (
        "Running (a -> b), 1.5 MiB of 3.0 GiB left"
    )
    aborting = obj(
        "LibvirtMachineMigration",
        "m",
        metadata={"deletionTimestamp": "2026-01-01T00:00:00Z"},
        status={"phase": "Scheduling", "message": "choosing\n  a host"},
    )
    assert progress_line(aborting) == "Scheduling, being aborted: choosing a host"


def test_format_bytes() -> None:
    assert [format_bytes(v) for v in (None, 0, 1023, 1024, 5 * 1024**4)] == [
        "-",
        "0 B",
        "1023 B",
        "1.0 KiB",
        "5120.0 GiB",
    ]
