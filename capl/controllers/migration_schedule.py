"""What the migration controller decides before anything moves, read from the cache: whether
a request can be served (`refusal`), the hosts it may go to (`candidates`) and the control-plane
spreading rule's inputs (`is_control_plane`, `control_plane_hosts`). The choice itself is
`capl.controllers.migration_plan.choose_target`.
"""

from __future__ import annotations

from collections.abc import Iterable

from capl.api import constants as c
from capl.api.cluster import LibvirtCluster
from capl.api.machine import LibvirtMachine
from capl.api.migration import TERMINAL_PHASES, LibvirtMachineMigration
from capl.controllers.migration_plan import Candidate
from capl.runtime.informer import Cache
from capl.runtime.objects import Obj, ObjectKey, meta
from capl.runtime.resources import LIBVIRT_MACHINE, LIBVIRT_MACHINE_MIGRATION, MACHINE
from capl.runtime.store import INDEX_CLUSTER, cluster_index_value

__all__ = [
    "ACTIVE_PHASES",
    "INDEX_MACHINE",
    "candidates",
    "control_plane_hosts",
    "index_machine",
    "is_control_plane",
    "refusal",
]

INDEX_MACHINE = "migration-machine"
ACTIVE_PHASES = ("PreparingTarget", "Running", "Finalizing")


def index_machine(obj: Obj) -> Iterable[str]:
    name = (obj.get("spec") or {}).get("machineName")
    return (f"{meta(obj).get('namespace') or ''}/{name}",) if name else ()


def refusal(
    cache: Cache, key: ObjectKey, mig: LibvirtMachineMigration, lm: LibvirtMachine
) -> str | None:
    name = lm.metadata.name
    if lm.metadata.deletion_timestamp is not None:
        return f"LibvirtMachine {name} is being deleted"
    if not lm.spec.domain_uuid or not lm.spec.host_name:
        return f"LibvirtMachine {name} has no domain yet (nothing to migrate)"
    if not (lm.status.initialization and lm.status.initialization.provisioned):
        return f"LibvirtMachine {name} is not provisioned yet"
    if lm.spec.migration_target:
        return f"LibvirtMachine {name} is migrating already (to {lm.spec.migration_target})"
    for other in cache.by_index(
        LIBVIRT_MACHINE_MIGRATION, INDEX_MACHINE, f"{key.namespace}/{name}"
    ):
        phase = (other.get("status") or {}).get("phase")
        other_key = ObjectKey(key.namespace, str(meta(other)["name"]))
        if other_key == key or phase in TERMINAL_PHASES:
            continue
        if phase in ACTIVE_PHASES or older(other, mig):
            return f"another migration of {name} is not finished: {other_key.name}"
    return None


def _machines(cache: Cache, namespace: str, lm: LibvirtMachine) -> list[Obj]:
    cluster = lm.metadata.label(c.CLUSTER_NAME_LABEL) or ""
    return list(
        cache.by_index(LIBVIRT_MACHINE, INDEX_CLUSTER, cluster_index_value(namespace, cluster))
    )


def candidates(
    cache: Cache, lcluster: LibvirtCluster, namespace: str, lm: LibvirtMachine
) -> list[Candidate]:
    reachable = {h.name: h.reachable for h in lcluster.status.hosts or []}
    counts: dict[str, int] = {}
    for other in _machines(cache, namespace, lm):
        host = (other.get("spec") or {}).get("hostName")
        if host:
            counts[host] = counts.get(host, 0) + 1
    return [
        Candidate(
            name=h.name,
            reachable=reachable.get(h.name) is not False,
            in_maintenance=h.maintenance is not None,
            control_plane_allowed=h.control_plane,
            machines=counts.get(h.name, 0),
        )
        for h in lcluster.spec.hosts
    ]


def is_control_plane(cache: Cache, namespace: str, lm: LibvirtMachine) -> bool:
    if c.CONTROL_PLANE_LABEL in (lm.metadata.labels or {}):
        return True
    for ref in lm.metadata.owner_references or []:
        if ref.kind == "Machine":
            raw = cache.get(MACHINE, ObjectKey(namespace, ref.name))
            if raw is not None and c.CONTROL_PLANE_LABEL in (meta(raw).get("labels") or {}):
                return True
    return False


def control_plane_hosts(cache: Cache, namespace: str, lm: LibvirtMachine) -> set[str]:
    hosts: set[str] = set()
    for other in _machines(cache, namespace, lm):
        if meta(other).get("name") == lm.metadata.name:
            continue
        if c.CONTROL_PLANE_LABEL not in (meta(other).get("labels") or {}):
            continue
        spec = other.get("spec") or {}
        hosts.update(h for h in (spec.get("hostName"), spec.get("migrationTarget")) if h)
    return hosts


def older(a: Obj, b: LibvirtMachineMigration) -> bool:
    created_a = str(meta(a).get("creationTimestamp") or "")
    created_b = b.metadata.creation_timestamp
    stamp_b = created_b.strftime("%Y-%m-%dT%H:%M:%SZ") if created_b else ""
    return (created_a, str(meta(a).get("name"))) < (stamp_b, b.metadata.name or "")
