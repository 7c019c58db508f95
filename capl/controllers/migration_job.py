"""One live migration, from a scheduled LibvirtMachineMigration to its end.

`MigrationJob` runs as a task beside the reconciler (a migration takes seconds to minutes;
a reconcile must not hold a worker that long). Each step writes what a crash must not lose
before it is taken (`capl.api.migration`):

    PreparingTarget  prepare the destination (volumes, files, DHCP and DNS entries)
    Running          startTime; the libvirt job, its progress in status.state (throttled)
    Finalizing       the domain runs on the target: the machine's hostName moves there
                     (migrationTarget cleared in the same write), the source is cleaned
    Succeeded        condition Succeeded True, Normal event on both objects

A failure (or an abort) undoes the preparation, clears the machine's migrationTarget (the
domain runs on the source: the machine controller takes over again) and ends in Failed with
the reason in the Succeeded condition and a Warning event.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import structlog

from capl.api import constants as c
from capl.api.cluster import LibvirtCluster, LibvirtHost
from capl.api.machine import LibvirtMachine
from capl.api.migration import LibvirtMachineMigration
from capl.controllers.common import Deps, connect_host, layout
from capl.controllers.machine.plan import fault_point, image_plan
from capl.ports.errors import InvalidSpec, VirtError
from capl.ports.naming import machine_names
from capl.ports.virt import DomainOwner, Host
from capl.ports.virt.migration import (
    MigrationAborted,
    MigrationFailed,
    MigrationOptions,
    MigrationProgress,
    MigrationRequest,
    MigrationResult,
    Migrations,
    MigrationStorage,
    PreparedMigration,
)
from capl.runtime.conditions import rfc3339
from capl.runtime.errors import ApiError
from capl.runtime.events import NORMAL, WARNING
from capl.runtime.objects import ObjectKey
from capl.runtime.resources import LIBVIRT_MACHINE

__all__ = ["MigrationJob", "Moving", "succeeded_condition"]

log = structlog.get_logger("capl.controllers.migration")

_STATE_INTERVAL = 2.0  # seconds between status.state patches while the job runs


def succeeded_condition(status: bool, reason: str, message: str) -> dict[str, Any]:
    return {
        "type": c.ConditionType.SUCCEEDED.value,
        "status": "True" if status else "False",
        "reason": reason,
        "message": message,
        "lastTransitionTime": rfc3339(),
    }


@dataclass(slots=True, kw_only=True)
class Moving:
    """Everything one job needs, resolved by the reconciler from the cache."""

    key: ObjectKey
    migration: LibvirtMachineMigration
    machine: LibvirtMachine
    cluster: LibvirtCluster
    source: LibvirtHost
    target: LibvirtHost
    address: str
    abort_requested: bool = False
    history: list[str] = field(default_factory=list)

    @property
    def machine_key(self) -> ObjectKey:
        return ObjectKey(self.key.namespace, self.machine.metadata.name or "")

    @property
    def uuid(self) -> str:
        return (self.machine.spec.domain_uuid or "").lower()


class MigrationJob:
    """Prepare, migrate, finalize (or undo) one migration; see the module docstring."""

    def __init__(
        self,
        deps: Deps,
        migrations: Migrations,
        moving: Moving,
        *,
        status: Callable[[dict[str, Any]], Awaitable[None]],
        clock: Callable[[], float],
    ) -> None:
        self.deps = deps
        self.status = status
        """Patches the migration's status (and remembers the answer: read-your-writes)."""
        self.migrations = migrations
        self.moving = moving
        self.clock = clock
        self._last_state = -_STATE_INTERVAL

    # -- the request --------------------------------------------------------------------------

    def hosts(self) -> tuple[Host, Host]:
        ns = self.moving.key.namespace
        return (
            connect_host(self.deps, namespace=ns, host=self.moving.source),
            connect_host(self.deps, namespace=ns, host=self.moving.target),
        )

    def request(self, *, copy_storage: bool) -> MigrationRequest:
        m, lm = self.moving, self.moving.machine
        spec = m.migration.spec
        names = machine_names(namespace=m.key.namespace, name=lm.metadata.name or "")
        image = image_plan(lm.spec)
        source, destination = self.hosts()
        return MigrationRequest(
            source=source,
            destination=destination,
            uuid=m.uuid,
            owner=DomainOwner(
                cluster=lm.metadata.label(c.CLUSTER_NAME_LABEL) or "",
                namespace=m.key.namespace,
                name=lm.metadata.name or "",
                uid=lm.metadata.uid or "",
            ),
            storage=MigrationStorage(
                pool=layout(m.cluster).pool,
                volumes=(
                    names.root_volume,
                    *(names.extra_volume(i) for i in range(len(lm.spec.extra_disks or ()))),
                ),
                files=(),
                base_image=image.volume,
                image_source=image.source,
                leftovers=(names.console_log,),
            ),
            migration_address=m.address,
            options=MigrationOptions(
                bandwidth_mib_per_s=spec.bandwidth_mib_per_second,
                completion_timeout_per_gib=float(spec.completion_timeout_per_gib),
                progress_timeout=float(spec.progress_timeout_seconds),
                allow_auto_converge=spec.allow_auto_converge,
                allow_post_copy=spec.allow_post_copy,
                copy_storage=copy_storage,
                # prepare proves a pool shared (a probe volume seen from both hosts) before
                # a migration without storage copy is allowed at all
                allow_unsafe=not copy_storage,
            ),
        )

    async def with_files(self, request: MigrationRequest) -> MigrationRequest:
        """The request with the bootstrap file the domain reads (Ignition or NoCloud ISO)."""
        names = machine_names(
            namespace=self.moving.key.namespace, name=self.moving.machine.metadata.name or ""
        )
        files = []
        for name in (names.ignition_volume, names.cidata_volume):
            if await request.source.get_volume(pool=request.storage.pool, name=name):
                files.append(name)
        storage = request.storage
        return MigrationRequest(
            source=request.source,
            destination=request.destination,
            uuid=request.uuid,
            owner=request.owner,
            storage=MigrationStorage(
                pool=storage.pool,
                volumes=storage.volumes,
                files=tuple(files),
                base_image=storage.base_image,
                image_source=storage.image_source,
                leftovers=storage.leftovers,
            ),
            migration_address=request.migration_address,
            options=request.options,
        )

    async def prepared(self) -> tuple[MigrationRequest, PreparedMigration]:
        """prepare() with storage copy, or without when the pool turns out to be shared."""
        request = await self.with_files(self.request(copy_storage=True))
        try:
            return request, await self.migrations.prepare(request)
        except InvalidSpec as exc:
            if exc.reason != "StorageSharingMismatch":
                raise
        request = await self.with_files(self.request(copy_storage=False))
        return request, await self.migrations.prepare(request)

    # -- writes -------------------------------------------------------------------------------

    async def machine_spec(self, changes: dict[str, Any]) -> None:
        client = self.deps.client.resource(LIBVIRT_MACHINE)
        await client.patch(self.moving.machine_key, {"spec": changes})

    def events(self, type_: str, reason: str, message: str) -> None:
        kind = NORMAL if type_ == "Normal" else WARNING
        self.deps.recorder.event(self.moving.migration.wire(), kind, reason, message)
        self.deps.recorder.event(self.moving.machine.wire(), kind, reason, message)

    async def on_progress(self, progress: MigrationProgress) -> None:
        fault_point("migration-running")
        now = self.clock()
        if now - self._last_state < _STATE_INTERVAL:
            return
        self._last_state = now
        try:
            await self.status(
                {
                    "state": {
                        "dataTotalBytes": progress.data_total_bytes,
                        "dataRemainingBytes": progress.data_remaining_bytes,
                        "dataProcessedBytes": progress.data_processed_bytes,
                    },
                    "message": f"{progress.phase.value}: {progress.data_remaining_bytes} bytes"
                    f" left of {progress.data_total_bytes}",
                }
            )
        except ApiError as exc:  # progress is advisory: the job goes on
            log.warning("cannot report migration progress", error=str(exc))

    # -- the run ------------------------------------------------------------------------------

    async def run(self) -> None:
        m = self.moving
        try:
            request, prepared = await self.prepared()
        except VirtError as exc:
            await self.fail(None, c.Reason.MIGRATION_FAILED, f"preparing {m.target.name}: {exc}")
            return
        fault_point("migration-prepared")
        await self.status(
            {
                "phase": "Running",
                "copyStorage": prepared.copy_storage,
                "startTime": rfc3339(),
                "message": f"moving to {m.target.name}",
            }
        )
        self.events("Normal", c.Reason.MIGRATION_RUNNING, self.started_message(prepared))
        started = time.monotonic()
        try:
            result = await self.migrations.migrate(request, prepared, on_progress=self.on_progress)
        except MigrationAborted as exc:
            await self.fail(request, c.Reason.MIGRATION_ABORTED, str(exc))
            return
        except (MigrationFailed, VirtError) as exc:
            await self.fail(request, c.Reason.MIGRATION_FAILED, str(exc))
            return
        log.info("live migration done", seconds=round(time.monotonic() - started, 2))
        fault_point("migration-moved")
        await self.finalize(request, result)

    def started_message(self, prepared: PreparedMigration) -> str:
        m = self.moving
        how = "copying its disks" if prepared.copy_storage else "shared storage"
        return (
            f"live migration of {m.machine.metadata.name} from {m.source.name} to"
            f" {m.target.name} started ({how}, {prepared.copy_bytes} bytes to move)"
        )

    async def finalize(self, request: MigrationRequest, result: MigrationResult | None) -> None:
        """The domain runs on the target: record it, then clean the source."""
        m = self.moving
        await self.status({"phase": "Finalizing", "message": "the domain runs on the target"})
        await self.machine_spec({"hostName": m.target.name, "migrationTarget": None})
        fault_point("migration-recorded")
        pending = None
        try:
            removed = await self.migrations.cleanup_source(request)
        except VirtError as exc:
            # the domain runs on the target; the source is cleaned later (cleanupPending)
            log.warning("cleaning the source after a migration", error=str(exc))
            removed, pending = [], "Source"
        state: dict[str, Any] = {}
        if result is not None:
            state = {
                "dataProcessedBytes": result.data_processed_bytes,
                "dataRemainingBytes": 0,
            }
            if result.downtime_ms is not None:
                state["downtimeMs"] = result.downtime_ms
        took = f" in {result.elapsed_seconds:.1f} s" if result is not None else ""
        message = f"{m.machine.metadata.name} runs on {m.target.name}{took}"
        await self.status(
            {
                "phase": "Succeeded",
                "cleanupPending": pending,
                "completionTime": rfc3339(),
                "state": state or None,
                "message": message,
                "conditions": [succeeded_condition(True, c.Reason.MIGRATION_SUCCEEDED, message)],
            }
        )
        log.info("migration succeeded", removed_from_source=len(removed))
        self.events("Normal", c.Reason.MIGRATION_SUCCEEDED, message)

    async def clean_up(self, which: str) -> None:
        """Retry what a finished migration could not clean (status.cleanupPending): the
        source after success, the target after a failure. Raises VirtError while the host
        still cannot be reached."""
        request = await self.with_files(
            self.request(copy_storage=bool(self.moving.migration.status.copy_storage))
        )
        if which == "Source":
            removed = await self.migrations.cleanup_source(request)
        else:
            removed = await self.migrations.unprepare(request)
        log.info("cleaned up after a migration", host=which, removed=len(removed))
        await self.status({"cleanupPending": None})

    async def fail(self, request: MigrationRequest | None, reason: str, message: str) -> None:
        """The domain stays (or is back) on the source: undo the preparation, hand the
        machine back to its controller, report Failed."""
        m = self.moving
        if m.abort_requested and reason == c.Reason.MIGRATION_FAILED:
            reason = c.Reason.MIGRATION_ABORTED
        if request is None:
            try:
                request = await self.with_files(self.request(copy_storage=True))
            except VirtError:
                request = None
        pending = None
        if request is None:
            pending = "Target"
        else:
            try:
                await self.migrations.unprepare(request)
            except VirtError as exc:
                log.warning("undoing the preparation of a failed migration", error=str(exc))
                pending = "Target"
        await self.machine_spec({"migrationTarget": None})
        await self.status(
            {
                "phase": "Failed",
                "cleanupPending": pending,
                "completionTime": rfc3339(),
                "message": message[:2048],
                "conditions": [succeeded_condition(False, reason, message[:1024])],
            }
        )
        self.events("Warning", reason, message[:1024])
