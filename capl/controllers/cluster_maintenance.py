"""Host maintenance: the evacuation the LibvirtCluster reconcile runs for the hosts whose
`spec.hosts[].maintenance` is set (after KubeVirt's evictionStrategy and medik8s'
NodeMaintenance). The cordon itself is passive and lives elsewhere: placement never chooses
such a host for a new machine (`machine.plan_placement.placeable_hosts`) and its failure
domain is published with `controlPlane: false` (`cluster_status.failure_domains`).

One pass (`Maintenance.reconcile`), from the cache, decisions in `cluster_maintenance_plan`:

- reads the cluster's LibvirtMachines on each host in maintenance (the machine controller's
  host index, by `spec.hostName`; a machine pinned there but never created does not count),
  the evacuation migrations this LibvirtCluster created (owner-UID index, carrying the
  `EVACUATION_HOST_LABEL`), and — only when a control-plane machine is on such a host — the
  cluster's control-plane machines (cluster index);
- carries out the plan's actions: creates LibvirtMachineMigrations (409 AlreadyExists is "already
  there": the names are deterministic), deletes migrations (a failed one before its retry,
  those of hosts that left maintenance — deleting an unfinished one aborts it) and deletes
  Machines (evictionStrategy Recreate), every delete with a UID precondition so it never hits
  a re-created object of the same name;
- writes `status.hosts[].maintenance` into the reconcile's desired object (the controller's
  one status patch), removes it from hosts no longer in maintenance, and emits the Events
  `Evacuating` (once, when a host's maintenance starts), `Evacuated` (once, when it is
  empty) and `EvictionBlocked` (Warning, when a host turns Blocked or the blocked machines or
  causes change), plus `MigrationCreated` / `MachineDeleted` for what it did;
- says when to look again: every `poll_interval` while a host is not evacuated, and when a
  failed LiveMigrate evacuation's backoff ends (the migrations' and machines' own events
  usually come first: `cluster_watches`).

A write that fails (other than the races named above) is logged, appended to the host's
message and retried with the controller's backoff; the rest of the reconcile goes on.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog

from capl.api import constants as c
from capl.api.cluster import LibvirtCluster
from capl.controllers.cluster_maintenance_plan import (
    Action,
    ControlPlaneState,
    CreateMigration,
    DeleteMachine,
    DeleteMigration,
    HostInMaintenance,
    MachineView,
    MaintenancePlan,
    MigrationView,
    Settings,
    effective_strategy,
    plan_maintenance,
)
from capl.controllers.cluster_watches import is_control_plane_machine
from capl.controllers.common import CAPI_GROUP, Deps
from capl.controllers.machine.indexes import INDEX_HOST, host_index_value
from capl.runtime.client import ResourceClient
from capl.runtime.errors import AlreadyExists, ApiError, Conflict, NotFound
from capl.runtime.events import NORMAL, WARNING
from capl.runtime.objects import Obj, ObjectKey, get_path, is_deleting, labels, meta
from capl.runtime.resources import LIBVIRT_MACHINE, LIBVIRT_MACHINE_MIGRATION, MACHINE
from capl.runtime.store import INDEX_CLUSTER, INDEX_OWNER_UID, cluster_index_value

__all__ = ["Maintenance", "MaintenanceOptions", "MaintenanceResult"]

log = structlog.get_logger("capl.controllers.libvirtcluster")


@dataclass(frozen=True, slots=True, kw_only=True)
class MaintenanceOptions:
    """How hosts in maintenance are evacuated."""

    max_parallel: int = 2
    """Unfinished evacuation migrations per cluster at most (control-plane machines: one)."""
    retry_backoff: float = 300.0
    """Seconds after a failed LiveMigrate evacuation before a new migration is tried."""
    poll_interval: float = 30.0
    """Look again after this long while a host is not evacuated (events usually come first)."""


@dataclass(frozen=True, slots=True)
class MaintenanceResult:
    requeue_after: float | None = None
    failed: bool = False
    """A write failed: retry with backoff."""


@dataclass(slots=True)
class _Errors:
    by_host: dict[str, list[str]] = field(default_factory=dict)
    any: bool = False

    def add(self, host: str, text: str) -> None:
        self.by_host.setdefault(host, []).append(text)
        self.any = True


class Maintenance:
    """See the module docstring."""

    def __init__(self, deps: Deps, options: MaintenanceOptions | None = None) -> None:
        self.deps = deps
        self.options = options or MaintenanceOptions()

    async def reconcile(
        self, current: LibvirtCluster, obj: Obj, original: Obj, *, cluster: str
    ) -> MaintenanceResult:
        """Evacuate the hosts in maintenance of `current`; status into `obj` (the desired
        LibvirtCluster), Events compared with `original` (as read)."""
        metadata = current.metadata
        namespace = metadata.namespace or ""
        reasons = {
            h.name: (h.maintenance.reason if h.maintenance else None)
            for h in current.spec.hosts
            if h.maintenance is not None
        }
        raw_migrations = self._migrations(metadata.uid or "")
        if not reasons and not raw_migrations:
            _write_status(obj, {})
            return MaintenanceResult()
        hosts = [
            HostInMaintenance(name=name, machines=tuple(self._machines(namespace, cluster, name)))
            for name in reasons
        ]
        now = self.deps.clock.wall()
        plan = plan_maintenance(
            hosts,
            [self._migration_view(namespace, m) for m in raw_migrations],
            control_plane=self._control_plane(namespace, cluster, hosts),
            settings=Settings(
                max_parallel=self.options.max_parallel, retry_backoff=self.options.retry_backoff
            ),
            now=now,
        )
        errors = _Errors()
        for action in plan.actions:
            await self._act(obj, current, cluster, action, errors)
        statuses = {name: outcome.status() for name, outcome in plan.hosts.items()}
        for name, texts in errors.by_host.items():
            if name in statuses:
                status = statuses[name]
                status["message"] = _bounded("; ".join([status.get("message") or "", *texts]))
        self._report(obj, original, plan, statuses, reasons)
        _write_status(obj, statuses)
        return MaintenanceResult(requeue_after=self._requeue(plan, now), failed=errors.any)

    def _requeue(self, plan: MaintenancePlan, now: float) -> float | None:
        delays: list[float] = []
        if plan.busy:
            delays.append(self.options.poll_interval)
        if plan.next_retry is not None:
            delays.append(max(1.0, plan.next_retry - now))
        return min(delays) if delays else None

    # -- reading --------------------------------------------------------------------------

    def _migrations(self, owner_uid: str) -> list[Obj]:
        """The evacuation migrations this LibvirtCluster created."""
        if not owner_uid:
            return []
        return [
            m
            for m in self.deps.cache.by_index(LIBVIRT_MACHINE_MIGRATION, INDEX_OWNER_UID, owner_uid)
            if labels(m).get(c.EVACUATION_HOST_LABEL)
        ]

    def _machines(self, namespace: str, cluster: str, host: str) -> list[MachineView]:
        found: list[MachineView] = []
        value = host_index_value(namespace, cluster, host)
        for lm in self.deps.cache.by_index(LIBVIRT_MACHINE, INDEX_HOST, value):
            spec = lm.get("spec") or {}
            if not (spec.get("domainUUID") or spec.get("providerID") or _status_host(lm)):
                continue  # pinned there but never created: placement keeps it waiting
            owner, owner_uid, owner_deleting = self._owner(namespace, lm)
            found.append(
                MachineView(
                    name=str(meta(lm).get("name")),
                    uid=str(meta(lm).get("uid") or ""),
                    strategy=effective_strategy(spec.get("evictionStrategy")),
                    control_plane=is_control_plane_machine(self.deps.cache, lm),
                    owner=owner,
                    owner_uid=owner_uid,
                    deleting=is_deleting(lm),
                    owner_deleting=owner_deleting,
                    migrating_to=spec.get("migrationTarget") or None,
                )
            )
        return found

    def _owner(self, namespace: str, lm: Obj) -> tuple[str | None, str | None, bool]:
        """The owner Machine's name and UID, and whether it is being deleted (or gone)."""
        for ref in meta(lm).get("ownerReferences") or ():
            if ref.get("kind") != "Machine" or not str(ref.get("apiVersion", "")).startswith(
                CAPI_GROUP + "/"
            ):
                continue
            name = str(ref.get("name"))
            machine = self.deps.cache.get(MACHINE, ObjectKey(namespace, name))
            gone = machine is None or is_deleting(machine)
            return name, str(ref.get("uid") or "") or None, gone
        return None, None, False

    def _control_plane(
        self, namespace: str, cluster: str, hosts: Sequence[HostInMaintenance]
    ) -> ControlPlaneState:
        """The cluster's control-plane machines; read only when one is on a host in
        maintenance (nothing else depends on them)."""
        if not any(m.control_plane for h in hosts for m in h.machines):
            return ControlPlaneState()
        disrupted: list[str] = []
        unsettled: list[str] = []
        live = 0
        cache = self.deps.cache
        for lm in cache.by_index(
            LIBVIRT_MACHINE, INDEX_CLUSTER, cluster_index_value(namespace, cluster)
        ):
            if not is_control_plane_machine(cache, lm):
                continue
            name = str(meta(lm).get("name"))
            _, _, owner_deleting = self._owner(namespace, lm)
            leaving = is_deleting(lm) or owner_deleting
            if leaving or get_path(lm, "spec", "migrationTarget"):
                disrupted.append(name)
            if not leaving:
                live += 1
                if not get_path(lm, "status", "initialization", "provisioned"):
                    unsettled.append(name)
        return ControlPlaneState(
            disrupted=tuple(sorted(disrupted)), unsettled=tuple(sorted(unsettled)), live=live
        )

    def _migration_view(self, namespace: str, obj: Obj) -> MigrationView:
        status = obj.get("status") or {}
        succeeded: Mapping[str, Any] = next(
            (
                cond
                for cond in status.get("conditions") or ()
                if cond.get("type") == c.ConditionType.SUCCEEDED
            ),
            {},
        )
        machine = str(get_path(obj, "spec", "machineName") or "")
        lm = self.deps.cache.get(LIBVIRT_MACHINE, ObjectKey(namespace, machine))
        finished = (
            status.get("completionTime")
            or succeeded.get("lastTransitionTime")
            or meta(obj).get("creationTimestamp")
        )
        return MigrationView(
            name=str(meta(obj).get("name")),
            uid=str(meta(obj).get("uid") or ""),
            machine=machine,
            host=labels(obj).get(c.EVACUATION_HOST_LABEL, ""),
            phase=status.get("phase"),
            reason=succeeded.get("reason") if status.get("phase") == "Failed" else None,
            message=status.get("message"),
            finished_at=_seconds(finished),
            deleting=is_deleting(obj),
            control_plane=lm is not None and is_control_plane_machine(self.deps.cache, lm),
        )

    # -- acting ---------------------------------------------------------------------------

    async def _act(
        self, obj: Obj, current: LibvirtCluster, cluster: str, action: Action, errors: _Errors
    ) -> None:
        namespace = current.metadata.namespace or ""
        client = self.deps.client
        recorder = self.deps.recorder
        try:
            match action:
                case CreateMigration(name, machine, host):
                    try:
                        await client.resource(LIBVIRT_MACHINE_MIGRATION).create(
                            _migration(current, cluster, name=name, machine=machine, host=host)
                        )
                    except AlreadyExists:
                        return  # made before (a crash, or a cache behind our own create)
                    log.info("evacuation migration created", migration=name, host=host)
                    recorder.event(
                        obj,
                        NORMAL,
                        "MigrationCreated",
                        f"host {host} is in maintenance: created LibvirtMachineMigration "
                        f"{name} for machine {machine}",
                    )
                case DeleteMigration(name, uid, why):
                    resource = client.resource(LIBVIRT_MACHINE_MIGRATION)
                    if await _delete(resource, namespace, name, uid):
                        log.info("evacuation migration deleted", migration=name, why=why)
                case DeleteMachine(name, uid, libvirt_machine, host):
                    if not await _delete(client.resource(MACHINE), namespace, name, uid):
                        return
                    log.info("Machine deleted for maintenance", machine=name, host=host)
                    recorder.event(
                        obj,
                        NORMAL,
                        "MachineDeleted",
                        f"host {host} is in maintenance: deleted Machine {name} (LibvirtMachine "
                        f"{libvirt_machine}, evictionStrategy Recreate) for its owner to replace",
                    )
        except ApiError as exc:
            host = action.host if isinstance(action, CreateMigration | DeleteMachine) else ""
            log.warning("maintenance action failed", action=repr(action), error=str(exc))
            errors.add(host, f"{_describe(action)} failed: {exc}")

    # -- reporting ------------------------------------------------------------------------

    def _report(
        self,
        obj: Obj,
        original: Obj,
        plan: MaintenancePlan,
        statuses: Mapping[str, Mapping[str, Any]],
        reasons: Mapping[str, str | None],
    ) -> None:
        """The Events of phase changes, compared with the status as read."""
        before = {
            str(entry.get("name")): entry.get("maintenance") or None
            for entry in get_path(original, "status", "hosts") or ()
            if isinstance(entry, Mapping)
        }
        recorder = self.deps.recorder
        for name, outcome in plan.hosts.items():
            previous = before.get(name)
            phase = previous.get("phase") if isinstance(previous, Mapping) else None
            if previous is None:
                why = f" ({reasons[name]})" if reasons.get(name) else ""
                recorder.event(
                    obj,
                    NORMAL,
                    c.Reason.EVACUATING,
                    f"host {name} is in maintenance{why}: evacuating "
                    f"{outcome.machines} machine(s) of the cluster",
                )
            if outcome.phase == "Evacuated" and phase != "Evacuated":
                recorder.event(
                    obj,
                    NORMAL,
                    c.Reason.EVACUATED,
                    f"host {name} is evacuated: no machine of the cluster is left on it",
                )
            message = statuses[name].get("message")
            if outcome.phase == "Blocked" and (
                phase != "Blocked" or (previous or {}).get("message") != message
            ):
                recorder.event(obj, WARNING, c.Reason.EVICTION_BLOCKED, f"host {name}: {message}")


# --- helpers ---------------------------------------------------------------------------------


def _write_status(obj: Obj, statuses: Mapping[str, Mapping[str, Any]]) -> None:
    """status.hosts[].maintenance: set for the hosts in `statuses`, removed elsewhere."""
    for entry in get_path(obj, "status", "hosts") or ():
        if not isinstance(entry, dict):
            continue
        status = statuses.get(str(entry.get("name")))
        if status is None:
            entry.pop("maintenance", None)
        else:
            entry["maintenance"] = dict(status)


def _migration(current: LibvirtCluster, cluster: str, *, name: str, machine: str, host: str) -> Obj:
    metadata = current.metadata
    return {
        "apiVersion": c.API_VERSION,
        "kind": c.Kind.LIBVIRT_MACHINE_MIGRATION.value,
        "metadata": {
            "name": name,
            "namespace": metadata.namespace,
            "labels": {c.EVACUATION_HOST_LABEL: host, c.CLUSTER_NAME_LABEL: cluster},
            "ownerReferences": [
                {
                    "apiVersion": c.API_VERSION,
                    "kind": c.Kind.LIBVIRT_CLUSTER.value,
                    "name": metadata.name,
                    "uid": metadata.uid,
                }
            ],
        },
        "spec": {"machineName": machine},
    }


async def _delete(client: ResourceClient, namespace: str, name: str, uid: str | None) -> bool:
    """Delete with a UID precondition; False when it was gone already, or another object
    has the name now (409) — a cache behind our own earlier delete, not an error."""
    try:
        await client.delete(ObjectKey(namespace, name), uid=uid or None)
    except (NotFound, Conflict):
        return False
    return True


def _describe(action: Action) -> str:
    match action:
        case CreateMigration(name, _, _):
            return f"creating LibvirtMachineMigration {name}"
        case DeleteMigration(name, _, _):
            return f"deleting LibvirtMachineMigration {name}"
        case DeleteMachine(name, _, _, _):
            return f"deleting Machine {name}"


def _bounded(text: str, limit: int = 1024) -> str:
    text = text.strip("; ")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _status_host(obj: Obj) -> str | None:
    value = get_path(obj, "status", "host")
    return str(value) if value else None


def _seconds(value: object) -> float | None:
    if not value:
        return None
    try:
        return datetime.datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
