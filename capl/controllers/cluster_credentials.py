"""The credentials Secrets of a LibvirtCluster travel with it on `clusterctl move`.

`clusterctl move` takes an object when it leads back to a Cluster through owner references,
or when it carries the label `clusterctl.cluster.x-k8s.io/move` (any value; the Cluster API
book, clusterctl provider contract, "Move"). capl does both for every Secret named by
`spec.hosts[].credentialsRef`, in two patches:

1. the label (`metadata.labels` only: the role's `patch` on Secrets is enough everywhere);
2. a (non-controller, no blockOwnerDeletion) owner reference to the LibvirtCluster, added to
   the list, never replacing another. Where the OwnerReferencesPermissionEnforcement
   admission plugin runs (OpenShift), changing ownerReferences also needs `delete` on the
   Secret, which the manager's role does not grant: the API server answers 403. The label
   already makes `clusterctl move` take the Secret, so this is reported, not fatal.

Condition `CredentialsOwned` on the LibvirtCluster (not part of Ready): True/
`OwnerReferenceSet` when every named Secret that exists carries the owner reference,
False/`OwnerReferenceRefused` naming the Secrets and the API server's answer (a Warning
Event comes with the change, `cluster_events.warn_new_failures`). No condition when no host
names a Secret. A refused Secret is not asked again while its resourceVersion stays the same
(no 403 every health interval); any change to it (e.g. an administrator adds the reference)
and a manager restart try again. Nothing of a Secret's data is ever read here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import structlog

from capl.api import constants as c
from capl.api.cluster import LibvirtCluster
from capl.controllers.common import Deps
from capl.runtime.conditions import TRUE, remove_condition, set_condition
from capl.runtime.errors import ApiError, NotFound
from capl.runtime.objects import Obj, ObjectKey, copy_obj, owner_references, resource_version
from capl.runtime.patch import apply_patch
from capl.runtime.resources import SECRET

__all__ = ["CredentialsOwnership"]

log = structlog.get_logger("capl.controllers.libvirtcluster")

_LABEL_REFUSED = "label and owner reference refused: "


@dataclass(slots=True)
class CredentialsOwnership:
    """Labels and owner references on credentials Secrets; remembers refusals (see the
    module docstring)."""

    deps: Deps
    refused: dict[ObjectKey, tuple[str, str]] = field(default_factory=dict)
    """Secret -> (its resourceVersion when refused, the API server's answer)."""

    async def reconcile(self, current: LibvirtCluster, obj: Obj, now: Callable[[], str]) -> None:
        """Label and own every credentials Secret of `current`; the condition into `obj`."""
        metadata = current.metadata
        namespace, uid = metadata.namespace or "", metadata.uid or ""
        names = sorted({h.credentials_ref.name for h in current.spec.hosts if h.credentials_ref})
        if not names or not uid:
            remove_condition(obj, c.ConditionType.CREDENTIALS_OWNED)
            return
        owner = {
            "apiVersion": c.API_VERSION,
            "kind": c.Kind.LIBVIRT_CLUSTER,
            "name": metadata.name,
            "uid": uid,
        }
        problems: list[str] = []
        unlabelled = False
        for name in names:
            problem = await self._secret(ObjectKey(namespace, name), owner)
            if problem is not None:
                problems.append(f"{namespace}/{name} ({problem})")
                unlabelled = unlabelled or problem.startswith(_LABEL_REFUSED)
        if problems:
            consequence = (
                "clusterctl move will not take the unlabelled ones: grant the manager patch "
                "on Secrets or label them by hand"
                if unlabelled
                else f"they carry the label {c.CLUSTERCTL_MOVE_LABEL}, so clusterctl move "
                "takes them anyway"
            )
            set_condition(
                obj,
                c.ConditionType.CREDENTIALS_OWNED,
                False,
                reason=c.Reason.OWNER_REFERENCE_REFUSED,
                message=(
                    "the owner reference to this LibvirtCluster was refused on credentials "
                    f"Secret(s) {'; '.join(problems)}; {consequence}"
                )[:1024],
                now=now,
            )
        else:
            set_condition(
                obj,
                c.ConditionType.CREDENTIALS_OWNED,
                TRUE,
                reason=c.Reason.OWNER_REFERENCE_SET,
                now=now,
            )

    async def _secret(self, key: ObjectKey, owner: dict[str, Any]) -> str | None:
        """Label and own one Secret; the refusal (HTTP answer) when the owner reference is
        refused, None when it is set (or the Secret does not exist: HostsReachable says so)."""
        secret = self.deps.cache.get(SECRET, key)
        if secret is None:
            return None
        secrets = self.deps.client.resource(SECRET)
        labels = (secret.get("metadata") or {}).get("labels") or {}
        try:
            if c.CLUSTERCTL_MOVE_LABEL not in labels:
                desired = copy_obj(secret)
                desired["metadata"].setdefault("labels", {})[c.CLUSTERCTL_MOVE_LABEL] = ""
                try:
                    secret = await apply_patch(secrets, secret, desired, status=False)
                except ApiError as exc:
                    if exc.code != 403:
                        raise
                    return f"{_LABEL_REFUSED}HTTP 403: {exc.message or exc.reason}"[:300]
            if any(r.get("uid") == owner["uid"] for r in owner_references(secret)):
                self.refused.pop(key, None)
                return None
            known = self.refused.get(key)
            if known is not None and known[0] == resource_version(secret):
                return known[1]
            desired = copy_obj(secret)
            desired["metadata"].setdefault("ownerReferences", []).append(dict(owner))
            await apply_patch(secrets, secret, desired, status=False)
        except NotFound:
            return None
        except ApiError as exc:
            if exc.code != 403:  # secondary to the hosts' work: retried next time
                log.warning(
                    "cannot label or own the credentials Secret", secret=key.name, error=str(exc)
                )
                return None
            answer = f"HTTP 403: {exc.message or exc.reason}"[:300]
            log.warning("owner reference refused", secret=key.name, error=answer)
            self.refused[key] = (resource_version(secret), answer)
            return answer
        self.refused.pop(key, None)
        return None
