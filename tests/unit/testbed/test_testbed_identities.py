"""capl.testbed.identities without a control plane: the generated roles it binds, the refused
requests it finds in an audit log, and its refusal to mint on a plane without one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from capl.testbed import ControlPlane, find_assets
from capl.testbed.identities import (
    MANAGER_AUDIT_POLICY,
    MANAGER_GROUP,
    IdentityError,
    cluster_role_binding,
    generated_roles,
    manager_identity,
    refused_requests,
    role_binding,
    watch_user,
)
from tests.unit.testbed.test_testbed_controlplane import fake_assets


def event(user: str, verb: str, code: int, resource: str = "libvirtmachines") -> dict[str, Any]:
    return {
        "verb": verb,
        "user": {"username": user},
        "objectRef": {
            "resource": resource,
            "namespace": "ns",
            "name": "m1",
            "apiGroup": "infrastructure.cluster.x-k8s.io",
        },
        "responseStatus": {"code": code, "reason": "Forbidden" if code == 403 else ""},
    }


def append(path: Path, *events: dict[str, Any]) -> None:
    with path.open("a") as f:
        for e in events:
            f.write(json.dumps(e, separators=(",", ":")) + "\n")


def test_the_generated_roles_are_bound_unchanged_but_for_the_namespace() -> None:
    cluster_role, role = generated_roles(lease_namespace="leases-here")
    assert (cluster_role["kind"], cluster_role["metadata"]["name"]) == (
        "ClusterRole",
        "manager-role",
    )
    assert role["metadata"] == {"name": "leader-election-role", "namespace": "leases-here"}
    assert cluster_role_binding("capl-manager")["subjects"] == [
        {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "capl-manager"}
    ]
    sa = role_binding("system:serviceaccount:capl-system:capl-controller-manager", "x", "r")
    assert sa["subjects"] == [
        {"kind": "ServiceAccount", "name": "capl-controller-manager", "namespace": "capl-system"}
    ]
    assert MANAGER_AUDIT_POLICY["rules"][0]["userGroups"][0] == MANAGER_GROUP


def test_refused_requests_of_the_watched_users_since_the_last_call(tmp_path: Path) -> None:
    log = tmp_path / "audit.log"
    append(log, event("capl-manager", "get", 403))  # before it was watched: not reported
    plane = ControlPlane(assets=find_assets(fake_assets(tmp_path / "bin")), audit_log=log)
    watch_user(plane, "capl-manager")
    append(
        log,
        event("capl-manager", "list", 200),
        event("someone-else", "get", 403),
        event("capl-manager", "get", 403),
        event("capl-manager", "patch", 401, resource="secrets"),
    )
    found = refused_requests()
    assert len(found) == 2, found
    assert (
        "capl-manager get libvirtmachines.infrastructure.cluster.x-k8s.io ns/m1: HTTP 403"
        in (found[0])
    )
    assert "HTTP 401" in found[1]
    assert refused_requests() == []
    with log.open("a") as f:
        f.write('{"verb":"get","user":{"username":"capl-manager"},"responseStatus":{"code":403')
    assert refused_requests() == []  # a line still being written waits for its end
    with log.open("a") as f:
        f.write("}}\n")
    assert len(refused_requests()) == 1


async def test_no_identity_on_a_plane_without_an_audit_log(tmp_path: Path) -> None:
    plane = ControlPlane(assets=find_assets(fake_assets(tmp_path / "bin")))
    with pytest.raises(IdentityError, match="needs an audit log"):
        await manager_identity(plane)


def test_refusals_while_kube_apiserver_starts_are_left_out(tmp_path: Path) -> None:
    """Until /readyz passes, kube-apiserver's authorizer may refuse what RBAC grants."""
    log = tmp_path / "audit.log"
    plane = ControlPlane(assets=find_assets(fake_assets(tmp_path / "bin")), audit_log=log)
    watch_user(plane, "capl-manager")
    plane.apiserver_starts.append((1_800_000_000.0, 1_800_000_005.0))
    during = event("capl-manager", "watch", 403) | {
        "requestReceivedTimestamp": "2027-01-15T08:00:02.000000Z"  # 1_800_000_002
    }
    after = event("capl-manager", "watch", 403) | {
        "requestReceivedTimestamp": "2027-01-15T08:00:06.000000Z"
    }
    append(log, during, after)
    found = refused_requests()
    assert len(found) == 1, found
