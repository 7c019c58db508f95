"""The manager's identity on a test control plane: as deployed, never an administrator.

Every `capl manager` the test bed starts (the `CaplManager` process, the in-process
`capl.testing.harness`, the benchmarks, `capl demo`) authenticates as one of these, never
with the admin kubeconfig (system:masters), so every request it makes is authorised by
exactly the ClusterRole and the Role that config/rbac ships (generated from
capl/api/rbac.py by `make crds`):

- where `clusterctl init` installed capl (its ServiceAccount, labelled
  `cluster.x-k8s.io/provider=infrastructure-libvirt`, exists): that ServiceAccount, with a
  token from the TokenRequest API (what `kubectl create token` asks for) in a kubeconfig —
  so the shipped ServiceAccount, ClusterRole, Role and their bindings are what is exercised;
- elsewhere: the user `capl-manager` (client certificate, group `MANAGER_GROUP`) bound to
  config/rbac/role.yaml's ClusterRole by a ClusterRoleBinding and to
  config/rbac/leader_election_role.yaml's Role by a RoleBinding in the lease namespace.

Identities are minted once per control plane (the kubeconfig is reused by every manager of
that plane; a ServiceAccount token again when the ServiceAccount was re-created, e.g. by
`clusterctl upgrade apply`); a leader-election namespace gets its Role and RoleBinding the
first time a manager asks for it.

Refused requests. A control plane that runs a manager must write an audit log
(`ControlPlane(audit_log=...)`; `MANAGER_AUDIT_POLICY` records only the managers' requests):
minting refuses a plane without one. `refused_requests()` reads every such plane's log from
where the previous call stopped and returns the manager identities' requests answered 401 or
403 — the test suite fails the test during which one happened (tests/fixtures/rbac.py), and
`capl demo` and the benchmarks can check the same. The log of a plane that was stopped stays
readable as long as its file exists (keep it outside a temporary workdir to check after stop).
"""

from __future__ import annotations

import asyncio
import json
import secrets
import threading
import time
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Final

import yaml

from capl.testbed.controlplane import ControlPlane, ControlPlaneError

REPO: Final = Path(__file__).resolve().parents[2]
ROLE_FILE: Final = REPO / "config" / "rbac" / "role.yaml"
LEADER_ELECTION_ROLE_FILE: Final = REPO / "config" / "rbac" / "leader_election_role.yaml"

MANAGER_USER: Final = "capl-manager"
MANAGER_GROUP: Final = "capl-testbed:managers"
PROVIDER_LABEL: Final = "cluster.x-k8s.io/provider=infrastructure-libvirt"
TOKEN_SECONDS: Final = 48 * 3600
_SA_PREFIX: Final = "system:serviceaccount:"

MANAGER_AUDIT_POLICY: Final[Mapping[str, Any]] = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {"level": "Metadata", "userGroups": [MANAGER_GROUP, "system:serviceaccounts"]},
        {"level": "None"},
    ],
}
"""An audit policy that records only the managers' requests (and other ServiceAccounts')."""


class IdentityError(ControlPlaneError):
    """The manager's identity could not be set up on this control plane."""


@dataclass
class ManagerIdentity:
    """The identity of the managers of one control plane."""

    username: str
    kubeconfig: Path
    service_account: tuple[str, str] | None  # (namespace, name) when it is clusterctl's
    service_account_uid: str = ""
    lease_namespaces: set[str] = field(default_factory=set)


@dataclass
class _Watched:
    """One control plane's audit log as `refused_requests` reads it."""

    audit_log: Path
    plane_url: str
    users: set[str]
    offset: int
    starts: list[tuple[float, float]]  # the plane's kube-apiserver starts (shared list)

    def starting(self, event: Mapping[str, Any]) -> bool:
        """Whether the request came while kube-apiserver was starting (not yet ready: its
        RBAC authorizer may still refuse what the roles grant)."""
        stamp = event.get("requestReceivedTimestamp")
        if not stamp:
            return False
        at = datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()
        return any(launched <= at <= ready for launched, ready in self.starts)


_identities: weakref.WeakKeyDictionary[ControlPlane, ManagerIdentity] = weakref.WeakKeyDictionary()
_watched: dict[Path, _Watched] = {}  # by audit log: kept after its plane stopped
_lock = threading.Lock()


def generated_roles(*, lease_namespace: str) -> list[dict[str, Any]]:
    """config/rbac's ClusterRole and Role, unchanged but for the Role's namespace."""
    cluster_role = next(d for d in yaml.safe_load_all(ROLE_FILE.read_text()) if d)
    role = next(d for d in yaml.safe_load_all(LEADER_ELECTION_ROLE_FILE.read_text()) if d)
    role["metadata"]["namespace"] = lease_namespace
    return [cluster_role, role]


def _subject(username: str) -> dict[str, str]:
    if username.startswith(_SA_PREFIX):
        namespace, name = username[len(_SA_PREFIX) :].split(":", 1)
        return {"kind": "ServiceAccount", "name": name, "namespace": namespace}
    return {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": username}


def cluster_role_binding(username: str, role: str = "manager-role") -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "capl-testbed-manager-rolebinding"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [_subject(username)],
    }


def role_binding(username: str, namespace: str, role: str) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "capl-testbed-leader-election-rolebinding", "namespace": namespace},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
        "subjects": [_subject(username)],
    }


_PATHS: Final = {
    "Namespace": "/api/v1/namespaces/{name}",
    "ClusterRole": "/apis/rbac.authorization.k8s.io/v1/clusterroles/{name}",
    "ClusterRoleBinding": "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{name}",
    "Role": "/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/roles/{name}",
    "RoleBinding": "/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings/{name}",
}


async def _request(
    plane: ControlPlane,
    method: str,
    path: str,
    body: Mapping[str, Any] | None = None,
    *,
    content_type: str = "application/json",
) -> Any:
    code, answer = await plane.admin_request(method, path, body, content_type=content_type)
    if code >= 300:
        raise IdentityError(f"{method} {path}: HTTP {code}: {answer}")
    return answer


async def _apply(plane: ControlPlane, items: list[dict[str, Any]]) -> None:
    """Server-side apply of each object, as the admin."""
    for obj in items:
        md = obj["metadata"]
        path = _PATHS[obj["kind"]].format(name=md["name"], namespace=md.get("namespace", ""))
        await _request(
            plane,
            "PATCH",
            f"{path}?fieldManager=capl-testbed&force=true",
            obj,
            content_type="application/apply-patch+yaml",
        )


async def _allowed(
    plane: ControlPlane, username: str, *, verb: str, group: str, resource: str, namespace: str
) -> bool:
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": username,
            "groups": [MANAGER_GROUP, "system:authenticated"],
            "resourceAttributes": {
                "verb": verb,
                "group": group,
                "resource": resource,
                "namespace": namespace,
            },
        },
    }
    answer = await _request(
        plane, "POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", review
    )
    return bool((answer.get("status") or {}).get("allowed"))


async def _wait_granted(
    plane: ControlPlane,
    username: str,
    *,
    verb: str,
    group: str,
    resource: str,
    namespace: str = "",
    within: float = 30.0,
) -> None:
    """Until kube-apiserver's RBAC authorizer (fed by informers: a new binding takes a
    moment) grants the request; a manager started earlier would be refused (403)."""
    deadline = time.monotonic() + within
    while not await _allowed(
        plane, username, verb=verb, group=group, resource=resource, namespace=namespace
    ):
        if time.monotonic() > deadline:
            raise IdentityError(
                f"{username} is still not allowed to {verb} {resource}.{group or 'core'} "
                f"{namespace or '(all namespaces)'} {within:g} s after it was bound"
            )
        await asyncio.sleep(0.1)


async def _installed_service_account(plane: ControlPlane) -> tuple[str, str, str] | None:
    """clusterctl's ServiceAccount of capl on `plane` (namespace, name, uid), if it
    installed capl."""
    selector = PROVIDER_LABEL.replace("/", "%2F").replace("=", "%3D")
    answer = await _request(plane, "GET", f"/api/v1/serviceaccounts?labelSelector={selector}")
    items = answer.get("items") or []
    if not items:
        return None
    if len(items) > 1:
        names = [f"{i['metadata']['namespace']}/{i['metadata']['name']}" for i in items]
        raise IdentityError(f"more than one ServiceAccount of capl: {', '.join(names)}")
    md = items[0]["metadata"]
    return md["namespace"], md["name"], md["uid"]


def _token_kubeconfig(plane: ControlPlane, username: str, token: str, path: Path) -> Path:
    admin = yaml.safe_load(plane.kubeconfig.read_text())
    cluster = admin["clusters"][0]
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [cluster],
        "users": [{"name": username, "user": {"token": token}}],
        "contexts": [
            {"name": "manager", "context": {"cluster": cluster["name"], "user": username}}
        ],
        "current-context": "manager",
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=0o600)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


async def _mint(plane: ControlPlane) -> ManagerIdentity:
    identity = await _mint_unchecked(plane)
    await _wait_granted(
        plane,
        identity.username,
        verb="watch",
        group="infrastructure.cluster.x-k8s.io",
        resource="libvirtmachines",
    )
    return identity


async def _mint_unchecked(plane: ControlPlane) -> ManagerIdentity:
    account = await _installed_service_account(plane)
    if account is None:
        username = MANAGER_USER
        cluster_role = next(d for d in yaml.safe_load_all(ROLE_FILE.read_text()) if d)
        await _apply(plane, [cluster_role, cluster_role_binding(username)])
        kubeconfig = plane.add_user(username, groups=[MANAGER_GROUP])
        return ManagerIdentity(username=username, kubeconfig=kubeconfig, service_account=None)
    namespace, name, uid = account
    request = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"expirationSeconds": TOKEN_SECONDS},
    }
    answer = await _request(
        plane, "POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token", request
    )
    token = str(answer["status"]["token"])
    username = f"{_SA_PREFIX}{namespace}:{name}"
    path = plane.workdir / "users" / f"sa-{namespace}-{name}-{secrets.token_hex(3)}.kubeconfig"
    return ManagerIdentity(
        username=username,
        kubeconfig=_token_kubeconfig(plane, username, token.strip(), path),
        service_account=(namespace, name),
        service_account_uid=uid,
        # clusterctl installed the Role and its binding in the ServiceAccount's namespace
        lease_namespaces={namespace},
    )


async def manager_identity(
    plane: ControlPlane, *, lease_namespace: str | None = None
) -> ManagerIdentity:
    """The managers' identity on `plane` (minted on first use, see the module docstring);
    with `lease_namespace`, the leader-election Role is bound there too."""
    if plane.audit_log is None:
        raise IdentityError(
            "a control plane that runs a capl manager needs an audit log (ControlPlane("
            "audit_log=..., audit_policy=MANAGER_AUDIT_POLICY)): refused requests are "
            "found there"
        )
    identity = _identities.get(plane)
    if identity is not None and identity.service_account is not None:
        # `clusterctl upgrade apply` re-creates the ServiceAccount: its old tokens are void
        current = await _installed_service_account(plane)
        if current is None or current[2] != identity.service_account_uid:
            identity = None
    if identity is None or not identity.kubeconfig.exists():
        identity = await _mint(plane)
        _identities[plane] = identity
        watch_user(plane, identity.username)
    if lease_namespace and lease_namespace not in identity.lease_namespaces:
        await _bind_lease_role(plane, identity, lease_namespace)
        identity.lease_namespaces.add(lease_namespace)
    return identity


async def _bind_lease_role(plane: ControlPlane, identity: ManagerIdentity, namespace: str) -> None:
    _, role = generated_roles(lease_namespace=namespace)
    namespace_obj = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
    await _apply(
        plane,
        [
            namespace_obj,
            role,
            role_binding(identity.username, namespace, role["metadata"]["name"]),
        ],
    )
    await _wait_granted(
        plane,
        identity.username,
        verb="create",
        group="coordination.k8s.io",
        resource="leases",
        namespace=namespace,
    )


async def manager_kubeconfig(plane: ControlPlane, *, lease_namespace: str | None = None) -> Path:
    """The kubeconfig of `manager_identity(plane, ...)`."""
    return (await manager_identity(plane, lease_namespace=lease_namespace)).kubeconfig


def watch_user(plane: ControlPlane, username: str) -> None:
    """Also report refused requests of `username` on `plane` (an identity made elsewhere)."""
    if plane.audit_log is None:
        raise IdentityError("the control plane has no audit log")
    with _lock:
        watched = _watched.get(plane.audit_log)
        if watched is None:
            watched = _Watched(
                plane.audit_log, plane.url, set(), plane.audit_offset(), plane.apiserver_starts
            )
            _watched[plane.audit_log] = watched
        watched.users.add(username)


def forget(plane: ControlPlane) -> None:
    """Drop the cached identity of `plane` (its next manager mints a new one)."""
    _identities.pop(plane, None)


def refused_requests() -> list[str]:
    """The manager identities' requests answered 401/403 since the previous call, on every
    control plane a manager identity was minted on (one line each). Requests that came
    while that plane's kube-apiserver was (re)starting are left out: until its /readyz
    passes, its authorizer may refuse what the roles grant (a chaos test restarts it under
    a running manager, which retries)."""
    with _lock:
        watched = list(_watched.values())
    found: list[str] = []
    for w in watched:
        # a cheap filter first: the session's log holds every request of every test
        events, w.offset = _refused_events(w.audit_log, w.offset)
        for event in events:
            user = (event.get("user") or {}).get("username")
            code = (event.get("responseStatus") or {}).get("code")
            if user in w.users and code in (401, 403) and not w.starting(event):
                found.append(f"{w.plane_url}: {describe(event)}")
    return found


def _refused_events(path: Path, offset: int) -> tuple[list[dict[str, Any]], int]:
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return [], offset
    if size < offset:  # a new log (the plane was started again)
        offset = 0
    with path.open("rb") as f:
        f.seek(offset)
        data = f.read()
    end = data.rfind(b"\n") + 1
    lines = [
        line for line in data[:end].splitlines() if b'"code":403' in line or b'"code":401' in line
    ]
    return [json.loads(line) for line in lines], offset + end


def describe(event: Mapping[str, Any]) -> str:
    """One audit event as `user VERB resource/sub.group ns/name: HTTP code reason`."""
    ref = event.get("objectRef") or {}
    resource = ref.get("resource") or event.get("requestURI", "?")
    if ref.get("subresource"):
        resource += "/" + ref["subresource"]
    group = ref.get("apiGroup") or "core"
    where = "/".join(x for x in (ref.get("namespace"), ref.get("name")) if x) or "-"
    status = event.get("responseStatus") or {}
    user = (event.get("user") or {}).get("username", "?")
    return (
        f"{user} {event.get('verb')} {resource}.{group} {where}: HTTP {status.get('code')} "
        f"{status.get('reason', '')} {status.get('message', '')}".rstrip()
    )


__all__ = [
    "LEADER_ELECTION_ROLE_FILE",
    "MANAGER_AUDIT_POLICY",
    "MANAGER_GROUP",
    "MANAGER_USER",
    "ROLE_FILE",
    "IdentityError",
    "ManagerIdentity",
    "describe",
    "forget",
    "generated_roles",
    "manager_identity",
    "manager_kubeconfig",
    "refused_requests",
    "watch_user",
]
