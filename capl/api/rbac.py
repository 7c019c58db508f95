"""The permissions the manager needs, in one place.

`MANAGER_RULES` becomes the ClusterRole `manager-role` and `LEADER_ELECTION_RULES` the
namespaced Role `leader-election-role` (config/rbac/*.yaml are generated from them by
crdgen, and `crdgen --check` fails when they drift). Code that talks to the API server can
assert its requests against `is_allowed()` in tests, so a new call without a matching rule
fails a test instead of failing in a user's cluster.

Least privilege, and why each rule exists (tests/security/test_rbac_audit.py derives the
requests the manager makes from a real apiserver's audit log and fails when a rule or verb
here is not used, or a request is not granted):

- capl's own kinds: `list` and `watch` (informers; reads are served from the cache);
  `patch` for finalizers and spec write-backs (providerID, domainUUID, hostName, endpoint,
  defaults; merge patches carry a resourceVersion precondition where lists change, so no
  `update` is needed).
- LibvirtMachines also `get`: the one live read outside the cache
  (capl/controllers/machine/cleanup.py `_live`). Before the orphan sweep removes a domain
  whose LibvirtMachine the cache does not have, and before the clean-up of an object that
  vanished (a write answered 404, or the cache lost the object or holds another UID) removes
  what was made for it, a GET confirms the object is really gone — the cache may lag. Without
  it both are refused (403) and orphaned domains are never removed. Every other request the
  controllers and the runtime make is a write below or an informer's list/watch.
- LibvirtMachineTemplates: `list` and `watch` (the template controller's informer) and
  `patch` on `libvirtmachinetemplates/status` only: the manager keeps `status.capacity` and
  `status.nodeInfo` (what the Cluster API autoscaler reads to scale from zero) in sync with
  the spec, one status patch when they differ. The spec is never written. LibvirtCluster
  templates are never read by the manager: not listed.
- `/status`: patched once per reconcile with the computed diff.
- LibvirtMachineMigrations: `list`, `watch`, `patch` (finalizer) and `/status` like the
  above, plus `create` and `delete`: a host in maintenance is evacuated by migrations the
  manager creates, retries a failed one by deleting and re-creating it, and deletes them
  (aborting the unfinished) when the maintenance ends.
- Cluster API Clusters and Machines: `list` and `watch` (owners, pause, bootstrap secret
  name, failure domain); `delete` on Machines: a host in maintenance evacuates a machine
  with evictionStrategy Recreate by deleting its Machine, which its owner replaces.
- Secrets: `list` and `watch` (bootstrap data, host credentials, `<cluster>-kubeconfig`, all
  from the cache); `patch` to add the label `clusterctl.cluster.x-k8s.io/move` and the
  LibvirtCluster owner reference to credentials Secrets (so `clusterctl move` takes them),
  in two patches. Where the OwnerReferencesPermissionEnforcement admission plugin is
  enabled (e.g. OpenShift), changing ownerReferences also requires `delete` on the Secret,
  which is deliberately not granted: the owner reference is then refused (HTTP 403), the
  label alone makes clusterctl move take the Secret, and the LibvirtCluster's
  `CredentialsOwned` condition says so (tests/controllers/test_cluster_credentials_move.py).
- Pause: while paused the controllers write only the `Paused` condition (`/status` patches
  already granted); a paused LibvirtMachineMigration's condition is one more
  `libvirtmachinemigrations/status` patch, no new rule.
- Events: `create`, and `patch` to aggregate repeats (the ClusterRole covers every namespace,
  including the leader-election one).
- Cluster API IPAM (only for NICs with `addressesFromPools`): IPAddressClaims `create` (one
  per such NIC), `get` (is it bound? and, before deleting, is it this machine's?) and
  `delete` (the address goes back to the pool once the domain is gone); IPAddresses `get`
  (the bound address, prefix, gateway); the in-cluster provider's pools
  (InClusterIPPool, GlobalInClusterIPPool) `get`, to tell an exhausted pool (its
  status.ipAddresses.free is 0) from a slow provider. GETs instead of informers: the IPAM
  CRDs exist only where an IPAM provider is installed, and an informer on a missing kind
  never syncs.
- Leases (leader election): `get`, `create`, and `patch` (renewal and release are merge
  patches with a resourceVersion precondition), only in the manager's own namespace, hence
  a Role.

No owner reference capl sets has blockOwnerDeletion, so no `/finalizers` grant is needed.
Workload-cluster Nodes (providerID, topology.kubernetes.io/zone and /region labels) are
patched through the workload cluster's own kubeconfig, so no rule for them exists here.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from capl.api.constants import CAPI_GROUP, GROUP, Plural

IPAM_GROUP = "ipam.cluster.x-k8s.io"

MANAGER_ROLE_NAME = "manager-role"
LEADER_ELECTION_ROLE_NAME = "leader-election-role"


@dataclass(frozen=True, kw_only=True)
class PolicyRule:
    """rbac.authorization.k8s.io/v1 PolicyRule (the subset we use)."""

    api_groups: tuple[str, ...]
    resources: tuple[str, ...]
    verbs: tuple[str, ...]

    def to_k8s(self) -> dict[str, list[str]]:
        return {
            "apiGroups": list(self.api_groups),
            "resources": list(self.resources),
            "verbs": list(self.verbs),
        }

    def allows(self, *, group: str, resource: str, verb: str) -> bool:
        return group in self.api_groups and resource in self.resources and verb in self.verbs


_OWN = (Plural.LIBVIRT_CLUSTERS.value, Plural.LIBVIRT_MACHINES.value)
_MIGRATIONS = Plural.LIBVIRT_MACHINE_MIGRATIONS.value
_MACHINE_TEMPLATES = Plural.LIBVIRT_MACHINE_TEMPLATES.value

MANAGER_RULES: tuple[PolicyRule, ...] = (
    PolicyRule(
        api_groups=("",),
        resources=("events",),
        verbs=("create", "patch"),
    ),
    PolicyRule(
        api_groups=("",),
        resources=("secrets",),
        verbs=("list", "patch", "watch"),
    ),
    PolicyRule(
        api_groups=(CAPI_GROUP,),
        resources=("clusters",),
        verbs=("list", "watch"),
    ),
    PolicyRule(
        api_groups=(CAPI_GROUP,),
        resources=("machines",),
        verbs=("delete", "list", "watch"),
    ),
    PolicyRule(
        api_groups=(GROUP,),
        resources=(Plural.LIBVIRT_CLUSTERS.value,),
        verbs=("list", "patch", "watch"),
    ),
    PolicyRule(
        api_groups=(GROUP,),
        resources=(Plural.LIBVIRT_MACHINES.value,),
        verbs=("get", "list", "patch", "watch"),
    ),
    PolicyRule(
        api_groups=(GROUP,),
        resources=(_MIGRATIONS,),
        verbs=("create", "delete", "list", "patch", "watch"),
    ),
    PolicyRule(
        api_groups=(GROUP,),
        resources=(_MACHINE_TEMPLATES,),
        verbs=("list", "watch"),
    ),
    PolicyRule(
        api_groups=(GROUP,),
        resources=tuple(f"{r}/status" for r in (*_OWN, _MIGRATIONS, _MACHINE_TEMPLATES)),
        verbs=("patch",),
    ),
    PolicyRule(
        api_groups=(IPAM_GROUP,),
        resources=("ipaddressclaims",),
        verbs=("create", "delete", "get"),
    ),
    PolicyRule(
        api_groups=(IPAM_GROUP,),
        resources=("globalinclusterippools", "inclusterippools", "ipaddresses"),
        verbs=("get",),
    ),
)

LEADER_ELECTION_RULES: tuple[PolicyRule, ...] = (
    PolicyRule(
        api_groups=("coordination.k8s.io",),
        resources=("leases",),
        verbs=("create", "get", "patch"),
    ),
)


def is_allowed(
    *, group: str, resource: str, verb: str, rules: Iterable[PolicyRule] = MANAGER_RULES
) -> bool:
    """Whether `rules` grant `verb` on `resource` (e.g. "libvirtmachines/status") in `group`."""
    return any(rule.allows(group=group, resource=resource, verb=verb) for rule in rules)
