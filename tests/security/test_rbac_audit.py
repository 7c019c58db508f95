"""RBAC: the manager's ClusterRole grants exactly what the manager uses.

A control plane of its own (kube-apiserver with RBAC and an audit log of the managers'
requests) runs the real `capl manager` process as every test runs it: as the plane's manager
identity (`capl.testbed.identities`: the user `capl-manager`, a client certificate, bound to
exactly the generated config/rbac/role.yaml (ClusterRole `manager-role`) and
config/rbac/leader_election_role.yaml (Role in the leader-election namespace) — no
system:masters). The manager runs as deployed: all namespaces, leader election on, its
admission webhooks serving the generated webhook configurations.

The scenario covers every request path: a credentials Secret (TLS host through the private
TLS libvirtd, so the manager reads the Secret and adds its owner reference), a Cluster +
LibvirtCluster (network and pool created by the manager), machines with cloud-config and
Ignition bootstrap Secrets plus one with invalid bootstrap data (condition + Warning event),
all Ready; then one LibvirtMachine is deleted as `clusterctl move` deletes its source
objects (its domain is left): the orphan sweep (every second here) finds the domain,
confirms with a live GET that the object is gone, and removes it from a reconcile of its key
(the vanished-object clean-up, another live GET) with a Warning event; then the host goes
into maintenance: the manager creates an evacuation LibvirtMachineMigration for a machine,
the migration controller takes it (finalizer) and fails it (no other host: status), the
fallback deletes the machine's Cluster API Machine, and the end of the maintenance deletes
the migration; then everything deleted (finalizers removed by the manager), then SIGTERM
(the Lease released).

Proven:
- the role is sufficient: the scenario converges and no request of the manager's user was
  answered 403 (or 401);
- the role is minimal: the set of (apiGroup, resource, subresource, verb, namespaced) the
  audit log shows for the manager is derived, every one is granted, and every verb of every
  rule of both roles was used — except the grants listed in `NOT_EXERCISED` with the code
  path that needs them and why this scenario does not reach it.
"""

from __future__ import annotations

import secrets
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from capl.api import constants as c
from capl.controllers.machine.cleanup import DELETE_FOR_MOVE_ANNOTATION, ORPHAN_REMOVED_REASON
from capl.kube import KubeClient
from capl.runtime.resources import (
    LIBVIRT_CLUSTER,
    LIBVIRT_MACHINE,
    LIBVIRT_MACHINE_MIGRATION,
    LIBVIRT_MACHINE_TEMPLATE,
    MACHINE,
    NAMESPACE,
    SECRET,
)
from capl.testbed import AssetsMissing, ControlPlane, find_assets
from capl.testbed.caplmanager import CaplManager
from capl.testbed.identities import (
    LEADER_ELECTION_ROLE_FILE,
    MANAGER_AUDIT_POLICY,
    MANAGER_USER,
    ROLE_FILE,
    manager_identity,
)
from capl.testing.crds import CRD_DIR
from capl.testing.objects import libvirt_machine_spec
from tests.fixtures.bed import Host
from tests.fixtures.capl import CaplManagerFactory
from tests.fixtures.common import eventually, require_part
from tests.fixtures.guest import ignition_config
from tests.fixtures.objects import install_capi_crds
from tests.fixtures.transports import TlsLibvirtd
from tests.security.bed import WEBHOOK_MANIFESTS, SecurityBed

pytestmark = [pytest.mark.apiserver, pytest.mark.libvirtd]

LEASE_NAMESPACE = "capl-system"
# the orphan sweep every second, an orphan removed at the second sweep that reports it
SWEEP = ["--orphan-sweep-interval=1s", "--orphan-grace=0s"]

# (apiGroup, resource, verb) granted but not reached by this scenario, with the reason.
NOT_EXERCISED: dict[tuple[str, str, str], str] = {
    **{
        ("ipam.cluster.x-k8s.io", resource, verb): (
            "Cluster API IPAM: only machines with networkInterfaces[].addressesFromPools make"
            " these requests; this scenario has none (tests/controllers/test_machine_ipam.py"
            " runs them against the real in-cluster IPAM provider)"
        )
        for resource, verb in (
            ("ipaddressclaims", "create"),
            ("ipaddressclaims", "delete"),
            ("ipaddressclaims", "get"),
            ("ipaddresses", "get"),
            ("inclusterippools", "get"),
            ("globalinclusterippools", "get"),
        )
    },
    ("", "events", "patch"): (
        "the event recorder patches count/lastTimestamp of an Event only when an identical "
        "event repeats within its aggregation window; the controllers emit a Warning once per "
        "condition change, which this scenario never repeats"
    ),
}


@dataclass(frozen=True, order=True)
class Call:
    group: str
    resource: str
    subresource: str
    verb: str
    namespaced: bool

    @property
    def full_resource(self) -> str:
        return f"{self.resource}/{self.subresource}" if self.subresource else self.resource

    def __str__(self) -> str:
        scope = "namespaced" if self.namespaced else "cluster-wide"
        return f"{self.verb} {self.full_resource}.{self.group or 'core'} ({scope})"


@dataclass(frozen=True)
class Rule:
    """One rule of a role file, with the namespace a Role applies to (None: ClusterRole)."""

    groups: tuple[str, ...]
    resources: tuple[str, ...]
    verbs: tuple[str, ...]
    namespace: str | None

    def grants(self, call: Call, namespace: str | None) -> bool:
        if self.namespace is not None and namespace != self.namespace:
            return False
        return (
            call.group in self.groups
            and call.full_resource in self.resources
            and call.verb in self.verbs
        )


def load_rules(path: Path, *, namespace: str | None = None) -> list[Rule]:
    role = yaml.safe_load_all(path.read_text())
    doc = next(d for d in role if d)
    return [
        Rule(
            groups=tuple(r["apiGroups"]),
            resources=tuple(r["resources"]),
            verbs=tuple(r["verbs"]),
            namespace=namespace if doc["kind"] == "Role" else None,
        )
        for r in doc["rules"]
    ]


@pytest.fixture(scope="module")
async def rbac_plane(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[ControlPlane]:
    try:
        assets = find_assets()
    except AssetsMissing as e:
        require_part("the Kubernetes control plane (kube-apiserver, etcd, kubectl)", str(e))
        raise
    workdir = tmp_path_factory.mktemp("rbac-plane")
    plane = ControlPlane(
        assets=assets,
        audit_log=workdir / "audit.log",
        audit_policy=MANAGER_AUDIT_POLICY,
    )
    try:
        await plane.start()
        await plane.install_crds(CRD_DIR)
        with tempfile.TemporaryDirectory() as tmp:
            await install_capi_crds(plane, Path(tmp))
        yield plane
    finally:
        await plane.stop()


def manager_calls(
    events: list[dict[str, Any]], user: str
) -> tuple[set[tuple[Call, str | None]], list[str]]:
    """(Call, namespace) of every request of the manager's user, and the refused ones."""
    calls: set[tuple[Call, str | None]] = set()
    refused: list[str] = []
    for event in events:
        if (event.get("user") or {}).get("username") != user:
            continue
        ref = event.get("objectRef") or {}
        if not ref.get("resource"):  # non-resource URLs (none expected)
            calls.add((Call("", event.get("requestURI", "?"), "", event["verb"], False), None))
            continue
        namespace = ref.get("namespace") or None
        call = Call(
            group=ref.get("apiGroup", ""),
            resource=ref["resource"],
            subresource=ref.get("subresource", ""),
            verb=event["verb"],
            namespaced=namespace is not None,
        )
        calls.add((call, namespace))
        code = (event.get("responseStatus") or {}).get("code", 0)
        if code in (401, 403):
            refused.append(f"{call} in {namespace or '-'}: HTTP {code}")
    return calls, sorted(set(refused))


async def orphan_removed(
    bed: SecurityBed, manager: CaplManager, cluster: str, machine: str
) -> None:
    """The orphan sweep and the vanished-object clean-up under the role: `machine` is
    deleted as `clusterctl move` deletes its source objects (annotation delete-for-move:
    the manager removes its finalizer and leaves the domain); the next sweeps find the
    domain, confirm with a live GET that the object is gone, and the reconcile of its key
    (another live GET) removes it, with a Warning event."""
    await bed.api.resource(LIBVIRT_MACHINE).patch(
        bed.key(machine), {"metadata": {"annotations": {DELETE_FOR_MOVE_ANNOTATION: ""}}}
    )
    await bed.delete_machine(machine)
    await bed.wait_gone(LIBVIRT_MACHINE, machine, within=60)

    async def removed() -> bool:
        return any(reason == ORPHAN_REMOVED_REASON for _, reason, _ in await bed.events(cluster))

    await eventually(
        removed,
        within=60,
        what=f"the orphaned domain of {machine} removed ({ORPHAN_REMOVED_REASON})",
        explain=lambda: _log_tail(manager),
    )


async def evacuated(bed: SecurityBed, manager: CaplManager, cluster: str, machine: str) -> None:
    """Host maintenance under the role: the cluster's only host goes into maintenance, so
    `machine` (evictionStrategy LiveMigrateIfPossible, the default) gets an evacuation
    LibvirtMachineMigration (create), which the migration controller takes (finalizer:
    patch) and fails for want of another host (status patch); the fallback, Recreate,
    deletes its Machine; the end of the maintenance deletes the migration."""
    key, lcs = bed.key(cluster), bed.api.resource(LIBVIRT_CLUSTER)
    hosts = (await lcs.get(key))["spec"]["hosts"]
    await lcs.patch(
        key, {"spec": {"hosts": [h | {"maintenance": {"reason": "rbac"}} for h in hosts]}}
    )
    await bed.wait_gone(MACHINE, machine, within=90)
    assert await bed.list_objects(LIBVIRT_MACHINE_MIGRATION), "no evacuation migration"
    await lcs.patch(
        key,
        {"spec": {"hosts": [{k: v for k, v in h.items() if k != "maintenance"} for h in hosts]}},
    )

    async def no_migrations() -> bool:
        return not await bed.list_objects(LIBVIRT_MACHINE_MIGRATION)

    await eventually(
        no_migrations,
        within=60,
        what="the evacuation migrations deleted at the end of the maintenance",
        explain=lambda: _log_tail(manager),
    )


async def _log_tail(manager: CaplManager) -> str:
    return manager.log_text()[-3000:]


async def test_the_role_grants_what_the_manager_uses_and_nothing_more(
    rbac_plane: ControlPlane,
    capl_manager_factory: CaplManagerFactory,
    tls_libvirtd: TlsLibvirtd,
    tls_pki: Path,
) -> None:
    plane = rbac_plane
    namespace = f"rbac-{secrets.token_hex(3)}"
    admin = await KubeClient.connect(str(plane.kubeconfig))
    bed = SecurityBed(plane=plane, api=admin, namespace=namespace)
    try:
        for name in (LEASE_NAMESPACE, namespace):
            await admin.resource(NAMESPACE).create({"metadata": {"name": name}})
        manager = await capl_manager_factory(
            plane,
            name="capl-rbac",
            leader_elect=True,
            leader_election_namespace=LEASE_NAMESPACE,
            log_level="info",
            extra_args=["--machine-shutdown-timeout=5s", *SWEEP],
        )
        await manager.install_webhooks(
            [d for d in yaml.safe_load_all(WEBHOOK_MANIFESTS.read_text()) if d]
        )
        await manager.start()

        await bed.secret("tls-credentials", tls_libvirtd.credentials)
        tls = Host(
            "tls",
            tls_libvirtd.uri(),
            direct_uri=f"{tls_libvirtd.uri()}?pkipath={tls_pki}",
            credentials_secret="tls-credentials",
        )
        cluster = await bed.create_cluster("rbac", hosts=[tls], base_volume_on=["tls"])
        spec = libvirt_machine_spec()
        await bed.create_machine(cluster, "cc", spec=spec, bootstrap=b"#cloud-config\n")
        await bed.create_machine(
            cluster, "ign", spec=spec, bootstrap=ignition_config(hostname="ign"), format="ignition"
        )
        await bed.create_machine(
            cluster, "bad", spec=spec, bootstrap=b"{not json", format="ignition"
        )
        for name in ("cc", "ign"):
            await bed.wait_ready(name, within=120)
        await bed.wait_condition(
            "bad",
            c.ConditionType.BOOTSTRAP_DATA_DELIVERED,
            reason=c.Reason.BOOTSTRAP_DATA_INVALID,
            within=60,
        )
        # the template controller: list/watch templates, patch templates/status (capacity)
        await admin.resource(LIBVIRT_MACHINE_TEMPLATE).create(
            {
                "apiVersion": LIBVIRT_MACHINE_TEMPLATE.api_version,
                "kind": LIBVIRT_MACHINE_TEMPLATE.kind,
                "metadata": {"name": "workers", "namespace": namespace},
                "spec": {"template": {"spec": spec}},
            }
        )

        async def template_capacity() -> bool:
            template = await admin.resource(LIBVIRT_MACHINE_TEMPLATE).get(bed.key("workers"))
            return bool((template.get("status") or {}).get("capacity"))

        await eventually(template_capacity, within=30, what="the template's status.capacity")

        async def secret_owned() -> bool:
            secret = await admin.resource(SECRET).get(bed.key("tls-credentials"))
            refs = secret["metadata"].get("ownerReferences") or []
            return any(r.get("kind") == c.Kind.LIBVIRT_CLUSTER for r in refs)

        assert await secret_owned(), "the manager did not adopt the credentials Secret"
        await orphan_removed(bed, manager, cluster.name, "cc")
        await evacuated(bed, manager, cluster.name, "ign")
        await bed.delete_all(within=120)
        assert await manager.stop() == 0
        # audit mode "blocking": every event is in the log before its response was sent

        identity = await manager_identity(plane)
        assert identity.username == MANAGER_USER
        assert identity.service_account is None
        calls, refused = manager_calls(plane.audit_events(), identity.username)
        assert calls, "no request of the manager's user in the audit log"
        assert refused == [], "requests the role did not allow:\n" + "\n".join(refused)

        rules = load_rules(ROLE_FILE) + load_rules(
            LEADER_ELECTION_ROLE_FILE, namespace=LEASE_NAMESPACE
        )
        ungranted = sorted(
            str(call) for call, ns in calls if not any(r.grants(call, ns) for r in rules)
        )
        assert ungranted == [], "used but not granted:\n" + "\n".join(ungranted)

        unused = []
        for rule in rules:
            for group in rule.groups:
                for resource in rule.resources:
                    for verb in rule.verbs:
                        used = any(
                            call.group == group
                            and call.full_resource == resource
                            and call.verb == verb
                            and rule.grants(call, ns)
                            for call, ns in calls
                        )
                        if not used and (group, resource, verb) not in NOT_EXERCISED:
                            where = "Role" if rule.namespace else "ClusterRole"
                            unused.append(f"{where}: {verb} {resource}.{group or 'core'}")
        stale = sorted(
            f"{verb} {resource}.{group or 'core'}"
            for group, resource, verb in NOT_EXERCISED
            if any(
                (call.group, call.full_resource, call.verb) == (group, resource, verb)
                for call, _ in calls
            )
        )
        assert stale == [], "used after all, remove from NOT_EXERCISED:\n" + "\n".join(stale)
        used_list = "\n".join(sorted(str(call) for call, _ in calls))
        assert unused == [], (
            "granted but never used (remove from capl/api/rbac.py, or list in NOT_EXERCISED "
            "with the reason):\n" + "\n".join(unused) + f"\n\nused:\n{used_list}"
        )
    finally:
        await admin.close()
