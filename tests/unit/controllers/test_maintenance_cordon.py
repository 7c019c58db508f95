"""The cordon of a host in maintenance (pure): placement's host exclusion and the failure
domain's controlPlane flag."""

from __future__ import annotations

from typing import Any

from capl.api.cluster import LibvirtHost
from capl.controllers.cluster_hosts import HostPlan, HostReport
from capl.controllers.cluster_status import failure_domains
from capl.controllers.machine.plan_placement import (
    cordoned_message,
    no_placeable_host,
    pinned_refusal,
    placeable_hosts,
)
from capl.ports.virt import ClusterOwner, HostId, HostInfo, NetworkMode, NetworkSpec, PoolSpec

OWNER = ClusterOwner(namespace="ns", name="c1", uid="u1")


def host(name: str, *, control_plane: bool = True, maintenance: Any = None) -> LibvirtHost:
    data: dict[str, Any] = {"name": name, "uri": "test:///default", "controlPlane": control_plane}
    if maintenance is not None:
        data["maintenance"] = maintenance
    return LibvirtHost.model_validate(data)


def names(hosts: list[LibvirtHost]) -> list[str]:
    return [h.name for h in hosts]


def test_placement_skips_hosts_in_maintenance() -> None:
    hosts = [
        host("a", maintenance={"reason": "kernel update"}),
        host("b"),
        host("c", control_plane=False),
        host("d", control_plane=False, maintenance={}),
    ]
    assert names(placeable_hosts(hosts, control_plane=False)) == ["b", "c"]
    assert names(placeable_hosts(hosts, control_plane=True)) == ["b"]
    assert placeable_hosts([hosts[0], hosts[2]], control_plane=True) == []


def test_pinned_machine_waits_with_the_reason() -> None:
    assert pinned_refusal(host("b")) is None
    refusal = pinned_refusal(host("a", maintenance={"reason": "kernel update"}))
    assert refusal == (
        "host a is in maintenance (kernel update): no new machine is placed there; "
        "the machine waits until the maintenance ends"
    )
    assert cordoned_message(host("d", maintenance={})) == (
        "host d is in maintenance: no new machine is placed there"
    )


def test_no_placeable_host_says_why() -> None:
    cordoned = [host("a", maintenance={}), host("b", control_plane=False, maintenance={})]
    assert no_placeable_host(cordoned, control_plane=False) == (
        "no host of the LibvirtCluster can take a new machine: a, b are in maintenance"
    )
    assert no_placeable_host(cordoned, control_plane=True) == (
        "no control-plane host of the LibvirtCluster can take a new machine: a is in maintenance"
    )
    workers_only = [host("w", control_plane=False)]
    assert no_placeable_host(workers_only, control_plane=True) == (
        "no host of the LibvirtCluster allows control-plane machines"
    )


def _report(name: str, *, control_plane: bool, cordoned: bool) -> HostReport:
    plan = HostPlan(
        name=name,
        host_id=f"qemu+ssh://root@{name}/system",
        control_plane=control_plane,
        owner=OWNER,
        network=NetworkSpec(name="net", mode=NetworkMode.ISOLATED, owner=OWNER, cidr="10.0.0.0/24"),
        adopt_network=False,
        pool=PoolSpec(name="pool", path="/p", owner=OWNER),
        api=None,
        cordoned=cordoned,
    )
    info = HostInfo(
        host_id=HostId("x"),
        hostname="h",
        arch="x86_64",
        cpus=4,
        memory_total_bytes=8 * 1024**3,
        memory_free_bytes=1,
        libvirt_version="9.0.0",
        hypervisor="QEMU",
        hypervisor_version="7.2.0",
        domain_types=("qemu",),
        best_domain_type="qemu",
        uefi_supported=False,
        uefi_loaders=(),
    )
    return HostReport(plan=plan, info=info)


def test_failure_domain_of_a_cordoned_host_is_not_for_control_planes() -> None:
    reports = [
        _report("a", control_plane=True, cordoned=True),
        _report("b", control_plane=True, cordoned=False),
        _report("c", control_plane=False, cordoned=True),
    ]
    domains = failure_domains(reports, None)
    assert [(d["name"], d["controlPlane"]) for d in domains] == [
        ("a", False),
        ("b", True),
        ("c", False),
    ]
    # maintenance over: the spec's value again
    back = failure_domains([_report("a", control_plane=True, cordoned=False)], domains)
    assert back[0]["controlPlane"] is True
