"""The permissions the manager needs, in one place.

`MANAGER_RULES` becomes the ClusterRole `manager-role` and `LEADER_ELECTION_RULES` the
namespaced Role `leader-election-role` (config/rbac/*.yaml are generated from them by
crdgen, and `crdgen --check` fails when they drift). Code that talks to the API server can
assert its requests against `is_allowed()` in tests, so a new call without a matching rule
fails a test instead of failing in a user's cluster.

Least privilege, and why each rule exists:

- capl's own kinds: read and watch; `patch` for spec write-backs (providerID, domainUUID,
  hostName, endpoint) and finalizers; `update` for optimistic-concurrency writes that need a
  resourceVersion precondition. Templates are never read by the manager: not listed.
- `/status`: patched once per reconcile with the computed diff.
- `/finalizers`: `update`, required (with the OwnerReferencesPermissionEnforcement admission
  plugin) to set owner references with blockOwnerDeletion.
- Cluster API Clusters and Machines: read only (owners, pause, bootstrap secret name,
  failure domain).
- Secrets: read bootstrap data, host credentials and `<cluster>-kubeconfig`; `patch` to add
  the LibvirtCluster owner reference to credentials Secrets (so `clusterctl move` takes them).
- Events: create, and patch to aggregate repeats.
- Leases (leader election): only in the manager's own namespace, hence a Role.

Workload-cluster Nodes are patched through the workload cluster's own kubeconfig, so no rule
for them exists here.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from capl.api.constants import CAPI_GROUP, GROUP, Plural

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

MANAGER_RULES: tuple[PolicyRule, ...] = (
    PolicyRule(
        api_groups=("",),
        resources=("events",),
        verbs=("create", "patch"),
    ),
    PolicyRule(
        api_groups=("",),
        resources=("secrets",),
        verbs=("get", "list", "patch", "watch"),
    ),
    PolicyRule(
        api_groups=(CAPI_GROUP,),
        resources=("clusters", "machines"),
        verbs=("get", "list", "watch"),
    ),
    PolicyRule(
        api_groups=(GROUP,),
        resources=_OWN,
        verbs=("get", "list", "patch", "update", "watch"),
    ),
    PolicyRule(
        api_groups=(GROUP,),
        resources=tuple(f"{r}/finalizers" for r in _OWN),
        verbs=("update",),
    ),
    PolicyRule(
        api_groups=(GROUP,),
        resources=tuple(f"{r}/status" for r in _OWN),
        verbs=("patch",),
    ),
)

LEADER_ELECTION_RULES: tuple[PolicyRule, ...] = (
    PolicyRule(
        api_groups=("coordination.k8s.io",),
        resources=("leases",),
        verbs=("create", "get", "update"),
    ),
    PolicyRule(
        api_groups=("",),
        resources=("events",),
        verbs=("create", "patch"),
    ),
)


def is_allowed(
    *, group: str, resource: str, verb: str, rules: Iterable[PolicyRule] = MANAGER_RULES
) -> bool:
    """Whether `rules` grant `verb` on `resource` (e.g. "libvirtmachines/status") in `group`."""
    return any(rule.allows(group=group, resource=resource, verb=verb) for rule in rules)
