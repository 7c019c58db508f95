"""``LibvirtMigrations``: live migration of a domain between two ``LibvirtHost``s of one
registry (implements ``capl.ports.virt.migration.Migrations``).

Managed direct migration: capl holds both connections and calls
``dom.migrate3(dest_conn, params, flags)`` (flags and parameters: ``capl.virt.migration_params``;
the destination made ready first: ``capl.virt.migration_prepare``). ``migrate3`` blocks its
connection for the whole job, so it runs on a thread of its own over two *dedicated*
connections (one per host, outside the hosts' handle pools, closed afterwards). The job is
watched from the asyncio side (``capl.virt.migration_watch``): every second ``jobStats()`` on
the source through the host's ordinary pool becomes a ``MigrationProgress`` for the caller's
callback, and the completion and progress timeouts, a lost destination connection, ``abort``
or the cancellation of ``migrate`` end the job by ``abortJob()``.

The job's end is checked, never assumed: after a success the domain must run on the
destination and be gone from the source; after a failure or an abort the domain's location on
both hosts is read again (a source left paused by the failed switch-over is resumed) and
travels with the error, so a caller always learns where its one copy runs.

If the manager dies while the job runs, its connections close and libvirt aborts the job on
both sides (the destination's incoming domain dies with the connection that prepared it).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import libvirt

from capl.ports.errors import DomainNotFound, HostUnreachable, OperationInvalid, VirtError
from capl.ports.virt import Host, HostId
from capl.ports.virt.migration import (
    AbortReason,
    DomainLocation,
    MigrationAborted,
    MigrationFailed,
    MigrationRequest,
    MigrationResult,
    PreparedMigration,
    ProgressCallback,
    Whereabouts,
)
from capl.virt import migration_prepare as prep
from capl.virt.errors import is_connection_error
from capl.virt.handles import alive
from capl.virt.host import LibvirtHost
from capl.virt.migration_params import migration_flags, migration_params
from capl.virt.migration_watch import Outcome, Watch, drive, progress_of
from capl.virt.support import code_of

__all__ = ["LibvirtMigrations"]

log = logging.getLogger(__name__)

POLL_INTERVAL = 1.0
_POLL_LIMIT = 10.0
_ABORT_WAIT = 60.0
"""How long a cancelled ``migrate`` waits for libvirt to end the aborted job."""


def _close_later(*conns: Any) -> None:
    """Close dedicated connections on a short-lived thread (a dead peer blocks ``close``)."""

    def close() -> None:
        for conn in conns:
            with contextlib.suppress(libvirt.libvirtError):
                conn.close()

    threading.Thread(target=close, name="libvirt-migration-close", daemon=True).start()


def _job_stats(c: Any, uuid: str) -> dict[str, object] | None:
    domain = c.lookupByUUIDString(uuid)
    stats = dict(domain.jobStats(0) or {})
    return None if stats.get("type", 0) == libvirt.VIR_DOMAIN_JOB_NONE else stats


def _completed_stats(c: Any, uuid: str) -> dict[str, object]:
    domain = c.lookupByUUIDString(uuid)
    try:
        return dict(domain.jobStats(libvirt.VIR_DOMAIN_JOB_STATS_COMPLETED) or {})
    except libvirt.libvirtError:
        return {}


def _abort_job(c: Any, uuid: str) -> bool:
    try:
        c.lookupByUUIDString(uuid).abortJob()
    except libvirt.libvirtError as exc:
        if code_of(exc) in (libvirt.VIR_ERR_OPERATION_INVALID, libvirt.VIR_ERR_NO_DOMAIN):
            return False  # no job (any more)
        raise
    return True


def _resume_if_left_paused(c: Any, uuid: str) -> bool:
    """A failed switch-over can leave the source paused (reason migration): resume it."""
    try:
        domain = c.lookupByUUIDString(uuid)
        state, reason = domain.state(0)
        if state == libvirt.VIR_DOMAIN_PAUSED and reason in (
            libvirt.VIR_DOMAIN_PAUSED_MIGRATION,
            libvirt.VIR_DOMAIN_PAUSED_POSTCOPY_FAILED,
        ):
            domain.resume()
            return True
    except libvirt.libvirtError as exc:
        log.warning("resuming %s on the source after a failed migration: %s", uuid, exc)
    return False


class _Job:
    """The blocking ``migrate3`` on its own thread, over two dedicated connections."""

    def __init__(self, source_conn: Any, dest_conn: Any) -> None:
        self.source_conn = source_conn
        self.dest_conn = dest_conn
        self.future: concurrent.futures.Future[None] = concurrent.futures.Future()

    def start(self, uuid: str, params: Mapping[str, object], flags: int) -> None:
        def run() -> None:
            try:
                domain = self.source_conn.lookupByUUIDString(uuid)
                domain.migrate3(self.dest_conn, dict(params), flags)
            except BaseException as exc:
                self.future.set_exception(exc)
            else:
                self.future.set_result(None)

        threading.Thread(target=run, name=f"libvirt-migrate-{uuid[:8]}", daemon=True).start()

    def destination_alive(self) -> bool:
        return alive(self.dest_conn)

    def close(self) -> None:
        _close_later(self.source_conn, self.dest_conn)


class LibvirtMigrations:
    """See the module docstring. ``clock``: monotonic seconds (tests pass a fake)."""

    def __init__(
        self,
        *,
        poll_interval: float = POLL_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.poll_interval = poll_interval
        self.clock = clock
        self._running: dict[str, asyncio.Event] = {}

    async def prepare(self, request: MigrationRequest) -> PreparedMigration:
        return await prep.prepare(request)

    async def unprepare(self, request: MigrationRequest) -> list[str]:
        return await prep.unprepare(request)

    async def cleanup_source(self, request: MigrationRequest) -> list[str]:
        return await prep.cleanup_source(request)

    async def locate(self, source: Host, destination: Host, uuid: str) -> DomainLocation:
        if not isinstance(source, LibvirtHost) or not isinstance(destination, LibvirtHost):
            raise TypeError("locate needs two LibvirtHosts")
        return await prep.locate(source, destination, uuid)

    async def abort(self, uuid: str) -> bool:
        cancelled = self._running.get(uuid.lower())
        if cancelled is None:
            return False
        cancelled.set()
        return True

    async def migrate(
        self,
        request: MigrationRequest,
        prepared: PreparedMigration,
        *,
        on_progress: ProgressCallback | None = None,
    ) -> MigrationResult:
        source, destination = prep.hosts_of(request)
        uuid = request.uuid.lower()
        if uuid in self._running:
            raise OperationInvalid(f"domain {uuid} is being migrated already")
        await prep.check_distinct(source, destination)
        before = await prep.locate(source, destination, uuid)
        if before.where is not Whereabouts.SOURCE or before.destination is not None:
            raise OperationInvalid(f"domain {uuid} cannot be migrated now: {before.describe()}")
        options = request.options
        if options.copy_storage != prepared.copy_storage:
            raise OperationInvalid("the preparation was made for another storage mode")
        flags = migration_flags(options)
        params = migration_params(options, address=request.migration_address, disks=prepared.disks)
        job = await self._open(source, destination)
        cancelled = self._running[uuid] = asyncio.Event()
        try:
            outcome, error = await self._watch(
                request, job, params, flags, prepared, cancelled, on_progress
            )
            # e.g. "connection closed due to keepalive timeout": the destination went away
            lost = error is not None and not job.destination_alive()
        finally:
            self._running.pop(uuid, None)
            job.close()
        if error is None:
            if before.source is not None and before.source.autostart:  # not carried over
                await destination.connection.run(
                    f"set autostart of {uuid}", lambda c: c.lookupByUUIDString(uuid).setAutostart(1)
                )
            return await self._succeeded(source, destination, uuid, prepared, outcome)
        raise await self._failed(source, destination, uuid, outcome, error, lost=lost)

    async def _open(self, source: LibvirtHost, destination: LibvirtHost) -> _Job:
        def open_both() -> _Job:
            dest_conn = destination.connection.pool.open_dedicated("migrate to this host")
            try:
                source_conn = source.connection.pool.open_dedicated("migrate from this host")
            except BaseException:
                _close_later(dest_conn)
                raise
            return _Job(source_conn, dest_conn)

        return await asyncio.to_thread(open_both)

    async def _watch(
        self,
        request: MigrationRequest,
        job: _Job,
        params: Mapping[str, object],
        flags: int,
        prepared: PreparedMigration,
        cancelled: asyncio.Event,
        on_progress: ProgressCallback | None,
    ) -> tuple[Outcome, BaseException | None]:
        """Start the job and watch it to its end: (how watching ended, migrate3's error)."""
        source, uuid = prep.hosts_of(request)[0], request.uuid.lower()

        async def poll() -> Mapping[str, object] | None:
            try:
                return await source.connection.run(
                    f"read migration job of {uuid}",
                    lambda c: _job_stats(c, uuid),
                    time_limit=_POLL_LIMIT,
                )
            except DomainNotFound:  # undefined on the source: the job has just ended
                return None
            except VirtError as exc:
                log.warning("reading the migration job of %s: %s", uuid, exc)
                return None

        async def abort() -> None:
            try:
                await source.connection.run(
                    f"abort migration of {uuid}", lambda c: _abort_job(c, uuid)
                )
            except VirtError as exc:
                log.error("aborting the migration of %s: %s", uuid, exc)

        async def post_copy() -> None:
            try:
                await source.connection.run(
                    f"switch migration of {uuid} to post-copy",
                    lambda c: c.lookupByUUIDString(uuid).migrateStartPostCopy(0),
                )
            except VirtError as exc:
                log.error("switching the migration of %s to post-copy: %s", uuid, exc)

        watch = Watch(request.options, copy_bytes=prepared.copy_bytes, clock=self.clock)
        log.info(
            "migrating %s from %s to %s (storage copy: %s, %d bytes to move)",
            uuid,
            source.host_id,
            request.destination.host_id,
            prepared.copy_storage,
            prepared.copy_bytes,
        )
        job.start(uuid, params, flags)
        finished = asyncio.wrap_future(job.future)
        try:
            outcome = await drive(
                finished,
                watch=watch,
                poll=poll,
                abort=abort,
                start_post_copy=post_copy,
                cancelled=cancelled,
                destination_alive=job.destination_alive,
                on_progress=on_progress,
                interval=self.poll_interval,
            )
        except asyncio.CancelledError:
            await abort()
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(asyncio.shield(finished), _ABORT_WAIT)
            raise
        return outcome, finished.exception()

    async def _succeeded(
        self,
        source: LibvirtHost,
        destination: LibvirtHost,
        uuid: str,
        prepared: PreparedMigration,
        outcome: Outcome,
    ) -> MigrationResult:
        location = await prep.locate(source, destination, uuid)
        if location.where is not Whereabouts.DESTINATION or location.source is not None:
            raise MigrationFailed(
                f"migration of {uuid} reported success, but the domain is {location.describe()}",
                location=location,
                host=destination.host_id,
            )
        stats = await destination.connection.run(
            f"read completed migration of {uuid}", lambda c: _completed_stats(c, uuid)
        )
        elapsed = (outcome.last.elapsed_seconds if outcome.last else 0.0) or 0.0
        final = progress_of(stats, elapsed=elapsed, completed=True) if stats else None
        took = stats.get("time_elapsed")
        if final is not None and isinstance(took, int):
            elapsed = took / 1000.0
        log.info("migrated %s to %s in %.1f s", uuid, destination.host_id, elapsed)
        return MigrationResult(
            location=location,
            elapsed_seconds=elapsed,
            downtime_ms=final.downtime_ms if final else None,
            data_processed_bytes=final.data_processed_bytes if final else 0,
            copy_storage=prepared.copy_storage,
            last=final or outcome.last,
        )

    async def _failed(
        self,
        source: LibvirtHost,
        destination: LibvirtHost,
        uuid: str,
        outcome: Outcome,
        error: BaseException,
        *,
        lost: bool = False,
    ) -> MigrationFailed:
        """The error to raise, with where the domain is now (the source resumed if it was
        left paused)."""
        text = error.get_error_message() if isinstance(error, libvirt.libvirtError) else None
        detail = " ".join((text or str(error)).split())
        reason = outcome.abort_reason
        if reason is None and (
            lost or (isinstance(error, libvirt.libvirtError) and is_connection_error(error))
        ):
            reason = AbortReason.DESTINATION_LOST
        location: DomainLocation | None = None
        try:
            location = await prep.locate(source, destination, uuid)
            info = location.source
            if (
                location.where is Whereabouts.SOURCE
                and info is not None
                and info.reason
                in (
                    "migration",
                    "postcopy-failed",
                )
            ):
                await source.connection.run(
                    f"resume {uuid}", lambda c: _resume_if_left_paused(c, uuid)
                )
                location = await prep.locate(source, destination, uuid)
        except HostUnreachable as exc:
            log.error("after the failed migration of %s: %s", uuid, exc)
        where = location.describe() if location is not None else "location unknown"
        host: HostId = source.host_id
        if reason is not None:
            why = outcome.detail or detail
            return MigrationAborted(
                f"migration of {uuid} to {destination.host_id} aborted ({reason}: {why}); "
                f"libvirt: {detail}; domain {where}",
                abort_reason=reason,
                location=location,
                host=host,
            )
        code = code_of(error) if isinstance(error, libvirt.libvirtError) else None
        return MigrationFailed(
            f"migration of {uuid} to {destination.host_id} failed: {detail}; domain {where}",
            location=location,
            host=host,
            code=code,
            reason="MigrationUnsafe" if code == libvirt.VIR_ERR_MIGRATE_UNSAFE else None,
        )


if TYPE_CHECKING:  # mypy checks that the adapter satisfies the port
    from capl.ports.virt.migration import Migrations

    def _implements_the_port(migrations: LibvirtMigrations) -> Migrations:
        return migrations
