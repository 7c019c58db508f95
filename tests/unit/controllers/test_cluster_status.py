"""LibvirtCluster status from host reports, problem classification, spec defaults (pure)."""

from __future__ import annotations

from typing import Any

import pytest

from capl.api.cluster import LibvirtCluster
from capl.api.constants import ConditionType, Reason
from capl.api.meta import APIEndpoint
from capl.controllers.cluster_endpoint import fill_spec_defaults
from capl.controllers.cluster_hosts import HostPlan, HostReport, Problem, problem_of
from capl.controllers.cluster_status import (
    failure_domains,
    host_statuses,
    set_host_conditions,
    set_ready,
)
from capl.controllers.common import CredentialsMissing
from capl.ports.errors import (
    AlreadyExists,
    BridgeNotFound,
    CredentialsError,
    ForeignObjectError,
    HostUnreachable,
    NetworkNotFound,
    NetworkOverlap,
    StorageError,
    VirtError,
)
from capl.ports.naming import pool_owner_marker
from capl.ports.virt import (
    ClusterOwner,
    HostId,
    HostInfo,
    NetworkInfo,
    NetworkMode,
    NetworkSpec,
    PoolInfo,
    PoolSpec,
)
from capl.runtime.conditions import get_condition

OWNER = ClusterOwner(namespace="ns", name="c1", uid="u1")
NOW = "2026-01-01T00:00:00Z"


def now() -> str:
    return NOW


def plan(name: str, *, control_plane: bool = True) -> HostPlan:
    return HostPlan(
        name=name,
        host_id=f"qemu+ssh://root@{name}/system",
        control_plane=control_plane,
        owner=OWNER,
        network=NetworkSpec(name="net", mode=NetworkMode.ISOLATED, owner=OWNER, cidr="10.0.0.0/24"),
        adopt_network=False,
        pool=PoolSpec(name="pool", path="/p", owner=OWNER),
        api=None,
    )


def info(cpus: int = 4) -> HostInfo:
    return HostInfo(
        host_id=HostId("x"),
        hostname="h",
        arch="x86_64",
        cpus=cpus,
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


def network(*, owner: ClusterOwner | None = OWNER, bridge: str | None = "virbr9") -> NetworkInfo:
    return NetworkInfo(
        name="net",
        uuid="n",
        mode=NetworkMode.ISOLATED,
        forward_mode="none",
        bridge=bridge,
        active=True,
        persistent=True,
        autostart=True,
        cidr="10.0.0.0/24",
        gateway="10.0.0.1",
        dhcp_start=None,
        dhcp_end=None,
        dns_domain=None,
        dhcp_hosts=(),
        dns_hosts=(),
        owner=owner,
    )


def pool(*, mine: bool = True) -> PoolInfo:
    markers = (pool_owner_marker(namespace="ns", name="c1"),) if mine else ()
    return PoolInfo(
        name="pool",
        uuid="p",
        pool_type="dir",
        path="/p",
        active=True,
        persistent=True,
        autostart=True,
        capacity_bytes=1,
        allocation_bytes=1,
        available_bytes=1,
        owner_markers=markers,
    )


def healthy(name: str, **kwargs: Any) -> HostReport:
    return HostReport(plan=plan(name, **kwargs), info=info(), network=network(), pool=pool())


def unreachable(name: str, reason: str = Reason.UNREACHABLE) -> HostReport:
    return HostReport(
        plan=plan(name), connect=Problem(reason, f"host {name}: gone", unreachable=True)
    )


@pytest.mark.parametrize(
    ("error", "reason", "terminal"),
    [
        (HostUnreachable("x"), Reason.UNREACHABLE, False),
        (CredentialsError("x"), Reason.CREDENTIALS_INVALID, True),
        (CredentialsMissing("x"), Reason.CREDENTIALS_INVALID, True),
        (
            NetworkOverlap("x", other_network="default", other_cidr="c"),
            Reason.NETWORK_CONFLICT,
            True,
        ),
        (BridgeNotFound("x"), Reason.BRIDGE_NOT_FOUND, True),
        (NetworkNotFound("x"), Reason.NETWORK_NOT_FOUND, True),
        (ForeignObjectError("x", kind="network", name="n"), Reason.NAME_COLLISION, True),
        (AlreadyExists("x"), Reason.NAME_COLLISION, True),
        (StorageError("x"), Reason.STORAGE_UNAVAILABLE, True),
        (VirtError("x"), Reason.LIBVIRT_ERROR, False),
        (TimeoutError(), Reason.UNREACHABLE, False),
        (RuntimeError("boom"), Reason.INTERNAL_ERROR, False),
    ],
)
def test_problem_classification(error: Exception, reason: str, terminal: bool) -> None:
    problem = problem_of(error, host="kvm1 (qemu:///system)")
    assert (problem.reason, problem.terminal) == (reason, terminal)
    assert problem.message.startswith("host kvm1 (qemu:///system): ")


def test_failure_domains_publish_reached_hosts_and_keep_last_known_attributes() -> None:
    reports = [healthy("a"), healthy("b", control_plane=False), unreachable("c")]
    first = failure_domains(reports, None)
    assert first == [
        {
            "name": "a",
            "controlPlane": True,
            "attributes": {
                "cpus": "4",
                "memoryMiB": "8192",
                "libvirtVersion": "9.0.0",
                "uri": "qemu+ssh://root@a/system",
            },
        },
        {
            "name": "b",
            "controlPlane": False,
            "attributes": {
                "cpus": "4",
                "memoryMiB": "8192",
                "libvirtVersion": "9.0.0",
                "uri": "qemu+ssh://root@b/system",
            },
        },
    ]  # "c" was never reached: not published
    later = failure_domains([unreachable("a"), healthy("b", control_plane=False)], first)
    assert later == first  # "a" keeps its domain while it is away


def test_host_statuses_carry_over_while_unreachable() -> None:
    first = host_statuses([healthy("a")], None)
    assert first == [
        {
            "name": "a",
            "reachable": True,
            "libvirtVersion": "9.0.0",
            "network": "net",
            "networkCreated": True,
            "networkUUID": "n",
            "bridge": "virbr9",
            "storagePool": "pool",
            "storagePoolCreated": True,
        }
    ]
    later = host_statuses([unreachable("a")], first)
    assert later == [{**first[0], "reachable": False, "message": "host a: gone"}]
    adopted = HostReport(
        plan=plan("a"), info=info(), network=network(owner=None, bridge=None), pool=pool(mine=False)
    )
    assert host_statuses([adopted], later) == [
        {
            "name": "a",
            "reachable": True,
            "libvirtVersion": "9.0.0",
            "network": "net",
            "networkCreated": False,
            "networkUUID": "n",
            "storagePool": "pool",
            "storagePoolCreated": False,
        }
    ]


def conditions(obj: dict[str, Any]) -> dict[str, tuple[str, str, str]]:
    return {
        c["type"]: (c["status"], c["reason"], c["message"]) for c in obj["status"]["conditions"]
    }


def test_conditions_name_the_cause() -> None:
    obj: dict[str, Any] = {"metadata": {"name": "c1", "generation": 3}}
    broken = HostReport(
        plan=plan("b"),
        info=info(),
        network_problem=Problem(Reason.NETWORK_CONFLICT, "host b: overlaps default", terminal=True),
        pool=pool(),
    )
    reports = [healthy("a"), broken, unreachable("c", Reason.CREDENTIALS_INVALID)]
    set_host_conditions(obj, reports, network="net", pool="pool", now=now)
    set_ready(obj, now=now)
    got = conditions(obj)
    assert got[ConditionType.HOSTS_REACHABLE] == ("False", "CredentialsInvalid", "host c: gone")
    assert got[ConditionType.NETWORK_READY] == (
        "False",
        "NetworkConflict",
        "host b: overlaps default",
    )
    assert got[ConditionType.STORAGE_READY] == ("True", "Ready", "storage pool pool on a, b")
    assert got[ConditionType.READY][0:2] == ("False", "CredentialsInvalid")
    assert get_condition(obj, ConditionType.READY)["observedGeneration"] == 3  # type: ignore[index]
    # mixed causes: Unreachable
    set_host_conditions(
        obj,
        [unreachable("c", Reason.CREDENTIALS_INVALID), unreachable("d")],
        network="n",
        pool="p",
        now=now,
    )
    got = conditions(obj)
    assert got[ConditionType.HOSTS_REACHABLE] == (
        "False",
        "Unreachable",
        "host c: gone; host d: gone",
    )
    assert got[ConditionType.NETWORK_READY] == ("Unknown", "Unreachable", "no host is reachable")


def cluster(spec: dict[str, Any]) -> tuple[dict[str, Any], LibvirtCluster]:
    raw = {
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1",
        "kind": "LibvirtCluster",
        "metadata": {"name": "c1", "namespace": "ns"},
        "spec": {"hosts": [{"name": "a", "uri": "qemu:///system"}], **spec},
    }
    return raw, LibvirtCluster.model_validate(raw)


def test_spec_defaults_for_a_created_network() -> None:
    raw, parsed = cluster({"network": {"cidr": "10.9.0.0/24", "mode": "isolated"}})
    fill_spec_defaults(raw, parsed)
    assert raw["spec"]["network"] == {
        "cidr": "10.9.0.0/24",
        "mode": "isolated",
        "name": "capl-ns.c1",
        "dnsDomain": "c1.ns.capl.internal",
        "dhcp": {"start": "10.9.0.2", "end": "10.9.0.254"},
    }
    assert raw["spec"]["storagePool"] == {
        "name": "capl-ns.c1",
        "path": "/var/lib/libvirt/images/capl-ns.c1",
    }
    assert raw["spec"]["controlPlaneEndpoint"] == {"host": "api.c1.ns.capl.internal", "port": 6443}


def test_spec_defaults_keep_user_values() -> None:
    raw, parsed = cluster(
        {
            "network": {"cidr": "10.9.0.0/24", "name": "mine", "dnsDomain": "x.test"},
            "storagePool": {"name": "p"},
            "controlPlaneEndpoint": {"host": "10.9.0.100"},
        }
    )
    fill_spec_defaults(raw, parsed)
    assert raw["spec"]["network"]["name"] == "mine"
    assert raw["spec"]["network"]["dnsDomain"] == "x.test"
    assert raw["spec"]["storagePool"] == {"name": "p", "path": "/var/lib/libvirt/images/p"}
    assert raw["spec"]["controlPlaneEndpoint"] == {"host": "10.9.0.100", "port": 6443}


def test_spec_defaults_leave_adopted_and_bridged_endpoints_undecided() -> None:
    raw, parsed = cluster({"network": {"name": "default"}})
    fill_spec_defaults(raw, parsed)
    assert raw["spec"]["network"] == {"name": "default"}
    assert "controlPlaneEndpoint" not in raw["spec"]
    raw, parsed = cluster({"network": {"mode": "bridge", "bridge": "br0"}})
    fill_spec_defaults(raw, parsed)
    assert raw["spec"]["network"]["name"] == "capl-ns.c1"
    assert "controlPlaneEndpoint" not in raw["spec"]


def test_spec_defaults_take_the_endpoint_the_user_set_on_the_cluster() -> None:
    raw, parsed = cluster({"network": {"cidr": "10.9.0.0/24"}})
    fill_spec_defaults(raw, parsed, cluster_endpoint=APIEndpoint(host="10.9.0.5", port=443))
    assert raw["spec"]["controlPlaneEndpoint"] == {"host": "10.9.0.5", "port": 443}
    raw, parsed = cluster({"network": {"mode": "bridge", "bridge": "br0"}})
    fill_spec_defaults(raw, parsed, cluster_endpoint=APIEndpoint(host="192.0.2.7"))
    assert raw["spec"]["controlPlaneEndpoint"] == {"host": "192.0.2.7", "port": 6443}
