"""The LibvirtMachineMigration controller: live-migrates one LibvirtMachine to another host.

One reconcile, level-based:

1. Finished (Succeeded/Failed): nothing, except dropping the finalizer once deleted.
2. Gates: pause first (the Cluster's spec.paused, or the paused annotation on the migration
   or its machine: the `Paused` condition is the only write — no finalizer, no scheduling,
   no finalizer dropped on deletion; a job already running when the pause comes is not
   interrupted, and a deletion aborts it only once unpaused); the finalizer (so that a
   deletion can abort); the LibvirtMachine, its Cluster and LibvirtCluster from the cache.
3. Scheduling (phase empty/Pending/Scheduling): the request is checked (the machine exists,
   is provisioned, not being deleted, no older unfinished migration of it; the target is
   acceptable: `migration_plan.choose_target`) — a bad request ends Failed at once with the
   reason, nothing changed. The choice is written first (status: PreparingTarget, source,
   target), then the machine's `spec.migrationTarget`.
4. Handshake: the job starts only once the machine controller has acknowledged the target
   (the machine's `Migrating` condition True at an observedGeneration that includes it), so
   that no reconcile of the machine that began before can still be looking for its domain.
5. The job (`migration_job.MigrationJob`) runs as a task of this controller; its end
   requeues the migration.
6. Recovery: a migration in PreparingTarget/Running/Finalizing without a task of ours (the
   manager restarted, or leadership moved) is resolved from where libvirt says the domain is
   (`migration_plan.recover`): finalized when it runs on the target, restarted when nothing
   had started, failed when the job ended on the source, waited for while the destination
   holds an incoming domain, left alone (Warning, condition) if it is active on both.

Deletion of an unfinished migration, or of its machine, aborts it: the task's job is asked
to abort (the domain stays on the source), then the finalizer goes.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import structlog

from capl.api import constants as c
from capl.api.capi import Cluster
from capl.api.cluster import LibvirtCluster
from capl.api.machine import LibvirtMachine
from capl.api.migration import TERMINAL_PHASES, LibvirtMachineMigration
from capl.controllers.common import (
    Deps,
    InvalidObject,
    add_finalizer,
    find_host,
    libvirt_cluster_of,
    parse,
    paused,
    remove_finalizer,
)
from capl.controllers.machine.indexes import cluster_name_of_libvirt_cluster
from capl.controllers.machine.plan import fault_point
from capl.controllers.machine.watches import CLUSTER_CHANGES, LIBVIRT_CLUSTER_CHANGES
from capl.controllers.migration_job import MigrationJob, Moving, succeeded_condition
from capl.controllers.migration_plan import (
    NoTarget,
    Recovery,
    choose_target,
    migration_address,
    recover,
)
from capl.controllers.migration_schedule import (
    ACTIVE_PHASES,
    INDEX_MACHINE,
    candidates,
    control_plane_hosts,
    index_machine,
    is_control_plane,
    refusal,
)
from capl.ports.errors import VirtError
from capl.ports.virt.migration import Migrations
from capl.runtime.conditions import get_condition, rfc3339, set_condition
from capl.runtime.controller import Controller, Result, Watch
from capl.runtime.errors import ApiError, NotFound
from capl.runtime.events import WARNING
from capl.runtime.handlers import Mapper
from capl.runtime.manager import Manager
from capl.runtime.objects import Obj, ObjectKey, copy_obj, meta, resource_version
from capl.runtime.patch import ReadYourWrites, apply_patch
from capl.runtime.resources import (
    CLUSTER,
    LIBVIRT_CLUSTER,
    LIBVIRT_MACHINE,
    LIBVIRT_MACHINE_MIGRATION,
)
from capl.runtime.store import INDEX_CLUSTER, cluster_index_value

__all__ = ["CONTROLLER_NAME", "INDEX_MACHINE", "MigrationOptions", "MigrationReconciler", "setup"]

log = structlog.get_logger("capl.controllers.migration")

CONTROLLER_NAME = "libvirtmachinemigration"
DONE = Result()


@dataclass(frozen=True, slots=True, kw_only=True)
class MigrationOptions:
    handshake_retry: float = 1.0
    """How soon to look again while the machine controller has not acknowledged the target."""
    incoming_retry: float = 5.0
    """How soon to look again while the destination holds an incoming domain (recovery)."""
    conflict_retry: float = 60.0
    cleanup_retry: float = 15.0
    """How soon to try again to clean a host that was unreachable when a migration ended."""


class MigrationReconciler:
    def __init__(
        self, deps: Deps, migrations: Migrations, options: MigrationOptions | None = None
    ) -> None:
        self.deps = deps
        self.migrations = migrations
        self.options = options or MigrationOptions()
        self.controller: Controller | None = None
        self.jobs: dict[ObjectKey, tuple[asyncio.Task[None], Moving]] = {}
        self.writes = ReadYourWrites()
        """Our own status writes, read back until the cache has them (a reconcile right
        after a write must not act on the phase before it)."""

    # -- wiring ------------------------------------------------------------------------------

    def watches(self) -> list[Watch]:
        cache = self.deps.cache

        def machine_to_migrations(obj: Obj) -> Iterable[ObjectKey]:
            value = f"{meta(obj).get('namespace') or ''}/{meta(obj).get('name')}"
            return [
                ObjectKey(str(meta(m).get("namespace") or ""), str(meta(m)["name"]))
                for m in cache.by_index(LIBVIRT_MACHINE_MIGRATION, INDEX_MACHINE, value)
            ]

        def cluster_to_migrations(name_of: Callable[[Obj], str | None]) -> Mapper:
            def mapper(obj: Obj) -> Iterable[ObjectKey]:
                namespace = str(meta(obj).get("namespace") or "")
                name = name_of(obj)
                if not name:
                    return []
                machines = cache.by_index(
                    LIBVIRT_MACHINE, INDEX_CLUSTER, cluster_index_value(namespace, name)
                )
                return [key for m in machines for key in machine_to_migrations(m)]

            return mapper

        # the Cluster (pause) and the LibvirtCluster (hosts) are read from the cache: watching
        # them also makes this controller wait for their informers before its first reconcile
        return [
            Watch(LIBVIRT_MACHINE, machine_to_migrations),
            Watch(
                CLUSTER, cluster_to_migrations(lambda o: meta(o).get("name")), (CLUSTER_CHANGES,)
            ),
            Watch(
                LIBVIRT_CLUSTER,
                cluster_to_migrations(cluster_name_of_libvirt_cluster),
                (LIBVIRT_CLUSTER_CHANGES,),
            ),
        ]

    async def stop_jobs(self, stop: asyncio.Event) -> None:
        """A runnable: on shutdown (or lost leadership) the running jobs are cancelled, which
        aborts their libvirt jobs; the next leader recovers the migrations."""
        try:
            await stop.wait()
        finally:
            for task, _ in list(self.jobs.values()):
                task.cancel()
            for task, _ in list(self.jobs.values()):
                with contextlib.suppress(BaseException):
                    await task

    # -- reconcile ---------------------------------------------------------------------------

    async def reconcile(self, key: ObjectKey) -> Result:
        raw = self.writes.read(key, self.deps.cache.get(LIBVIRT_MACHINE_MIGRATION, key))
        running = self.jobs.get(key)
        if raw is None:
            self.writes.forget(key)
            if running is not None:
                running[1].abort_requested = True
                await self.migrations.abort(running[1].uuid)
            return DONE
        try:
            mig = parse(LibvirtMachineMigration, raw)
        except InvalidObject as exc:
            log.warning("cannot read LibvirtMachineMigration", error=str(exc))
            return DONE
        deleting = mig.metadata.deletion_timestamp is not None
        machine = await self._machine(key, mig)
        pause = self._paused(key, mig, machine)
        if running is not None:
            task, moving = running
            if not task.done():
                if pause is None and (deleting or self._machine_deleting(key, mig)):
                    await self._abort(key, moving)
                return DONE
            self.jobs.pop(key, None)
            return Result(requeue_after=0.0)  # look again at what the job left
        if pause is not None or get_condition(raw, c.ConditionType.PAUSED) is not None:
            await self._paused_condition(key, raw, pause)
            if pause is not None:
                return DONE  # the Cluster's pause (e.g. clusterctl move): nothing moves
        if mig.status.phase in TERMINAL_PHASES:
            if mig.status.cleanup_pending:
                return await self._clean_up(key, mig, machine)
            if deleting:
                await self._drop_finalizer(raw)
            return DONE
        if deleting and mig.status.phase not in ACTIVE_PHASES:
            await self._drop_finalizer(raw)  # nothing was started
            return DONE
        if not deleting and c.MIGRATION_FINALIZER not in (meta(raw).get("finalizers") or []):
            desired = copy_obj(raw)
            add_finalizer(desired, c.MIGRATION_FINALIZER)
            before = resource_version(raw)
            raw = await apply_patch(self._client(), raw, desired, status=False)
            self.writes.wrote(key, before=before, answer=raw)
        return await self._step(key, mig, machine, deleting)

    async def _step(
        self, key: ObjectKey, mig: LibvirtMachineMigration, machine: Obj | None, deleting: bool
    ) -> Result:
        found = self._resolve(key, mig, machine)
        if isinstance(found, str):
            if mig.status.phase in ACTIVE_PHASES:
                # in flight: the machine cannot be deleted before it ends (its deletion waits
                # for migrationTarget to clear), so this is a cache that lags: look again
                log.warning("a migration in flight misses its objects", why=found)
                return Result(requeue_after=self.options.incoming_retry)
            return await self._finish_failed(key, c.Reason.MIGRATION_FAILED, found)
        lm, _, lcluster = found
        if mig.status.phase in ACTIVE_PHASES:
            return await self._resume(key, mig, lm, lcluster, deleting)
        return await self._schedule(key, mig, lm, lcluster)

    def _resolve(
        self, key: ObjectKey, mig: LibvirtMachineMigration, machine: Obj | None
    ) -> tuple[LibvirtMachine, Cluster, LibvirtCluster] | str:
        name = mig.spec.machine_name
        if machine is None:
            return f"LibvirtMachine {key.namespace}/{name} not found"
        lm = parse(LibvirtMachine, machine)
        cluster_name = lm.metadata.label(c.CLUSTER_NAME_LABEL) or ""
        cluster_raw = self.deps.cache.get(CLUSTER, ObjectKey(key.namespace, cluster_name))
        if cluster_raw is None:
            return f"Cluster {key.namespace}/{cluster_name} of {name} not found"
        cluster = parse(Cluster, cluster_raw)
        lcluster = libvirt_cluster_of(self.deps.cache, cluster)
        if lcluster is None:
            return f"the LibvirtCluster of Cluster {key.namespace}/{cluster_name} not found"
        return lm, cluster, lcluster

    async def _machine(self, key: ObjectKey, mig: LibvirtMachineMigration) -> Obj | None:
        """The migration's LibvirtMachine (None: there is none). One the cache does not hold
        yet (created just before the migration, its watch event not in) is read from the API
        server: else its Cluster's pause would go unseen and the finalizer be written first,
        and a migration created with its machine would fail as "not found"."""
        machine_key = ObjectKey(key.namespace, mig.spec.machine_name)
        raw = self.deps.cache.get(LIBVIRT_MACHINE, machine_key)
        if raw is not None:
            return raw
        try:
            return await self.deps.client.resource(LIBVIRT_MACHINE).get(machine_key)
        except NotFound:
            return None

    def _paused(
        self, key: ObjectKey, mig: LibvirtMachineMigration, machine: Obj | None
    ) -> str | None:
        """Why the migration is paused (None: it is not): the paused annotation on it or on
        its LibvirtMachine, or its Cluster's spec.paused (read from the cache)."""
        if paused(None, mig.metadata):
            return f"annotation {c.PAUSED_ANNOTATION} on the migration"
        if machine is None:
            return None
        lm_meta = parse(LibvirtMachine, machine).metadata
        if paused(None, lm_meta):
            return f"annotation {c.PAUSED_ANNOTATION} on LibvirtMachine {mig.spec.machine_name}"
        cluster_name = lm_meta.label(c.CLUSTER_NAME_LABEL) or ""
        cluster_raw = self.deps.cache.get(CLUSTER, ObjectKey(key.namespace, cluster_name))
        if cluster_raw is not None and paused(parse(Cluster, cluster_raw), lm_meta):
            return f"Cluster {key.namespace}/{cluster_name} is paused"
        return None

    async def _paused_condition(self, key: ObjectKey, raw: Obj, pause: str | None) -> None:
        """The Paused condition, the only write while paused; flipped to False/NotPaused once
        the pause ends (a migration never paused gets none)."""
        desired = copy_obj(raw)
        set_condition(
            desired,
            c.ConditionType.PAUSED,
            pause is not None,
            reason=c.Reason.PAUSED if pause is not None else c.Reason.NOT_PAUSED,
            message=f"reconciliation is paused ({pause})" if pause is not None else "",
            now=lambda: rfc3339(self.deps.clock.wall()),
        )
        conditions = (desired.get("status") or {}).get("conditions")
        if conditions != (raw.get("status") or {}).get("conditions"):
            await self._status(key, {"conditions": conditions})

    def _machine_deleting(self, key: ObjectKey, mig: LibvirtMachineMigration) -> bool:
        raw = self.deps.cache.get(LIBVIRT_MACHINE, ObjectKey(key.namespace, mig.spec.machine_name))
        return raw is None or bool(meta(raw).get("deletionTimestamp"))

    # -- scheduling --------------------------------------------------------------------------

    async def _schedule(
        self,
        key: ObjectKey,
        mig: LibvirtMachineMigration,
        lm: LibvirtMachine,
        lcluster: LibvirtCluster,
    ) -> Result:
        problem = refusal(self.deps.cache, key, mig, lm)
        if problem is not None:
            return await self._finish_failed(key, c.Reason.MIGRATION_FAILED, problem)
        source = lm.spec.host_name or ""
        chosen = choose_target(
            source=source,
            requested=mig.spec.target_host,
            candidates=candidates(self.deps.cache, lcluster, key.namespace, lm),
            control_plane=is_control_plane(self.deps.cache, key.namespace, lm),
            control_plane_hosts=control_plane_hosts(self.deps.cache, key.namespace, lm),
        )
        if isinstance(chosen, NoTarget):
            return await self._finish_failed(key, c.Reason.NO_TARGET_HOST, chosen.message)
        target = find_host(lcluster, chosen)
        assert target is not None
        if migration_address(target) is None:
            return await self._finish_failed(
                key,
                c.Reason.NO_TARGET_HOST,
                f"host {chosen} has no address to receive a migration at: its uri has no host"
                " part; set spec.hosts[].migrationAddress",
            )
        message = f"preparing {chosen} for {lm.metadata.name}"
        await self._status(
            key,
            {
                "phase": "PreparingTarget",
                "sourceHost": source,
                "targetHost": chosen,
                "message": message,
                "conditions": [succeeded_condition(False, c.Reason.MIGRATION_RUNNING, message)],
            },
        )
        await self._machine_spec(key.namespace, lm, {"migrationTarget": chosen})
        fault_point("migration-scheduled")
        return Result(requeue_after=self.options.handshake_retry)

    # -- in flight ---------------------------------------------------------------------------

    async def _resume(
        self,
        key: ObjectKey,
        mig: LibvirtMachineMigration,
        lm: LibvirtMachine,
        lcluster: LibvirtCluster,
        deleting: bool,
    ) -> Result:
        moving = self._moving(key, mig, lm, lcluster)
        if isinstance(moving, str):
            return await self._finish_failed(key, c.Reason.MIGRATION_FAILED, moving)
        moving.abort_requested = deleting or lm.metadata.deletion_timestamp is not None
        job = MigrationJob(
            self.deps, self.migrations, moving, status=self._writer(key), clock=time.monotonic
        )
        if mig.status.phase == "PreparingTarget" and not moving.abort_requested:
            if lm.spec.host_name != moving.source.name:
                return await self._recover(key, mig, job)
            if lm.spec.migration_target != moving.target.name:
                await self._machine_spec(key.namespace, lm, {"migrationTarget": moving.target.name})
                return Result(requeue_after=self.options.handshake_retry)
            if not _acknowledged(lm):
                return Result(requeue_after=self.options.handshake_retry)
            source, destination = job.hosts()
            try:
                location = await self.migrations.locate(source, destination, moving.uuid)
            except VirtError as exc:
                return await self._finish_failed(key, c.Reason.MIGRATION_FAILED, str(exc), job)
            if recover(phase=mig.status.phase, where=location.where, abort_requested=False) is (
                Recovery.RESTART
            ):
                self._start(key, job)
                return DONE
        return await self._recover(key, mig, job)

    async def _clean_up(
        self, key: ObjectKey, mig: LibvirtMachineMigration, machine: Obj | None
    ) -> Result:
        """A finished migration left a host uncleaned (unreachable then): try again."""
        found = self._resolve(key, mig, machine)
        moving = self._moving(key, mig, found[0], found[2]) if not isinstance(found, str) else found
        if isinstance(moving, str):
            log.warning("cannot clean up after a migration", why=moving)
            await self._status(key, {"cleanupPending": None, "message": f"not cleaned: {moving}"})
            return DONE
        job = MigrationJob(
            self.deps, self.migrations, moving, status=self._writer(key), clock=time.monotonic
        )
        try:
            await job.clean_up(mig.status.cleanup_pending or "")
        except VirtError as exc:
            log.info("clean-up after a migration waits for its host", error=str(exc))
            return Result(requeue_after=self.options.cleanup_retry)
        return Result(requeue_after=0.0)

    def _moving(
        self,
        key: ObjectKey,
        mig: LibvirtMachineMigration,
        lm: LibvirtMachine,
        lcluster: LibvirtCluster,
    ) -> Moving | str:
        source = find_host(lcluster, mig.status.source_host or "")
        target = find_host(lcluster, mig.status.target_host or "")
        if source is None or target is None:
            return "the source or target host is no longer in the LibvirtCluster's spec.hosts"
        address = migration_address(target)
        if address is None:
            return f"host {target.name} has no migration address"
        return Moving(
            key=key,
            migration=mig,
            machine=lm,
            cluster=lcluster,
            source=source,
            target=target,
            address=address,
        )

    def _start(self, key: ObjectKey, job: MigrationJob) -> None:
        async def run() -> None:
            try:
                await job.run()
            except (ApiError, VirtError) as exc:
                log.error("migration job stopped", error=str(exc))
            finally:
                if self.controller is not None:
                    self.controller.enqueue(key)

        task = asyncio.get_running_loop().create_task(run(), name=f"migrate-{key}")
        self.jobs[key] = (task, job.moving)

    async def _abort(self, key: ObjectKey, moving: Moving) -> None:
        if not moving.abort_requested:
            moving.abort_requested = True
            with contextlib.suppress(ApiError):
                await self._status(key, {"abortRequested": True})
        await self.migrations.abort(moving.uuid)

    async def _recover(
        self, key: ObjectKey, mig: LibvirtMachineMigration, job: MigrationJob
    ) -> Result:
        """No job of ours watches this migration: decide from where the domain is."""
        moving = job.moving
        source, destination = job.hosts()
        try:
            location = await self.migrations.locate(source, destination, moving.uuid)
        except VirtError as exc:
            log.warning("cannot locate a migrating domain", error=str(exc))
            return Result(requeue_after=self.options.incoming_retry)
        decision = recover(
            phase=mig.status.phase, where=location.where, abort_requested=moving.abort_requested
        )
        log.info("recovering a migration", where=location.describe(), decision=decision.value)
        if decision is Recovery.FINALIZE:
            request = await job.with_files(job.request(copy_storage=bool(mig.status.copy_storage)))
            await job.finalize(request, None)
            return DONE
        if decision is Recovery.WAIT:
            return Result(requeue_after=self.options.incoming_retry)
        if decision is Recovery.CONFLICT:
            message = f"the domain is active on both hosts ({location.describe()}): resolve by hand"
            job.events("Warning", c.Reason.MIGRATION_FAILED, message)
            await self._status(key, {"message": message})
            return Result(requeue_after=self.options.conflict_retry)
        if decision is Recovery.RESTART:
            self._start(key, job)
            return DONE
        why = (
            "aborted"
            if moving.abort_requested
            else "the job ended while the manager was away; the domain stayed on the source"
        )
        if decision is Recovery.LOST:
            why = f"the domain is running on neither host ({location.describe()})"
        reason = c.Reason.MIGRATION_ABORTED if moving.abort_requested else c.Reason.MIGRATION_FAILED
        await job.fail(None, reason, why)
        return DONE

    # -- writes ------------------------------------------------------------------------------

    def _client(self) -> Any:
        return self.deps.client.resource(LIBVIRT_MACHINE_MIGRATION)

    async def _status(self, key: ObjectKey, changes: dict[str, Any]) -> None:
        current = self.writes.read(key, self.deps.cache.get(LIBVIRT_MACHINE_MIGRATION, key))
        before = resource_version(current) if current is not None else ""
        answer = await self._client().patch_status(key, {"status": changes})
        self.writes.wrote(key, before=before, answer=answer)

    def _writer(self, key: ObjectKey) -> Callable[[dict[str, Any]], Awaitable[None]]:
        async def write(changes: dict[str, Any]) -> None:
            await self._status(key, changes)

        return write

    async def _machine_spec(
        self, namespace: str, lm: LibvirtMachine, changes: dict[str, Any]
    ) -> None:
        client = self.deps.client.resource(LIBVIRT_MACHINE)
        await client.patch(ObjectKey(namespace, lm.metadata.name or ""), {"spec": changes})

    async def _drop_finalizer(self, raw: Obj) -> None:
        desired = copy_obj(raw)
        if remove_finalizer(desired, c.MIGRATION_FINALIZER):
            await apply_patch(self._client(), raw, desired, status=False)

    async def _finish_failed(
        self, key: ObjectKey, reason: str, message: str, job: MigrationJob | None = None
    ) -> Result:
        if job is not None:
            await job.fail(None, reason, message)
            return DONE
        await self._status(
            key,
            {
                "phase": "Failed",
                "message": message[:2048],
                "conditions": [succeeded_condition(False, reason, message[:1024])],
            },
        )
        raw = self.deps.cache.get(LIBVIRT_MACHINE_MIGRATION, key)
        if raw is not None:
            self.deps.recorder.event(raw, WARNING, reason, message[:1024])
        return DONE


def _acknowledged(lm: LibvirtMachine) -> bool:
    """The machine controller saw spec.migrationTarget: Migrating True at a generation that
    includes it."""
    raw = lm.wire()
    cond = get_condition(raw, c.ConditionType.MIGRATING)
    if cond is None or cond.get("status") != "True":
        return False
    observed = lm.status.observed_generation or 0
    return observed >= (lm.metadata.generation or 0)


def setup(
    manager: Manager,
    deps: Deps,
    *,
    migrations: Migrations,
    options: MigrationOptions | None = None,
) -> Controller:
    """Register the LibvirtMachineMigration controller (`deps.cache` is `manager.cache`)."""
    reconciler = MigrationReconciler(deps, migrations, options)
    manager.cache.informer(LIBVIRT_MACHINE_MIGRATION).add_indexer(INDEX_MACHINE, index_machine)
    controller = manager.add_controller(
        CONTROLLER_NAME,
        for_=LIBVIRT_MACHINE_MIGRATION,
        reconciler=reconciler,
        watches=reconciler.watches(),
        concurrency=4,
    )
    reconciler.controller = controller
    manager.add_runnable(reconciler.stop_jobs, name=f"{CONTROLLER_NAME}-jobs")
    return controller
