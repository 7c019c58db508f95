"""Watching a migration job: libvirt's job statistics as ``MigrationProgress``, and the two
timeouts that end a job (pure: no libvirt call, time from an injected clock).

- The completion timeout is ``completion_timeout_per_gib`` times the GiB to move (memory plus
  the disks to copy), counted from the start of the job (KubeVirt's rule).
- The progress timeout: the job is stalled when the data remaining has reached no new low for
  ``progress_timeout`` seconds. The low is kept per phase: with storage copy libvirt mirrors
  the disks first and only then counts memory, so the data remaining jumps up once when the
  memory phase begins; that is not a stall.
- At the completion timeout a job that may use post-copy is switched to it (once) instead of
  aborted.

The statistics are ``virDomainGetJobStats``'s typed parameters (``data_total``,
``memory_remaining``, ``disk_total``...; names as libvirt's ``VIR_DOMAIN_JOB_*`` macros spell
them); keys a driver does not report count as 0.
"""

from __future__ import annotations

import asyncio
import enum
import inspect
import logging
import math
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from capl.ports.virt.migration import (
    GIB,
    AbortReason,
    MigrationOptions,
    MigrationPhase,
    MigrationProgress,
    ProgressCallback,
)

__all__ = [
    "Decision",
    "Outcome",
    "Verdict",
    "Watch",
    "completion_timeout",
    "drive",
    "phase_of",
    "progress_of",
    "wait_done",
]

log = logging.getLogger(__name__)

_POSTCOPY_PHASE = "postcopy"


def _int(stats: Mapping[str, object], key: str) -> int:
    value = stats.get(key, 0)
    return int(value) if isinstance(value, int | float) else 0


def phase_of(stats: Mapping[str, object], *, postcopy: bool = False) -> MigrationPhase:
    """The phase a running job is in: disks are mirrored before memory moves."""
    if postcopy:
        return MigrationPhase.POST_COPY
    if _int(stats, "memory_total") > 0 and (
        _int(stats, "memory_processed") > 0 or _int(stats, "disk_remaining") == 0
    ):
        return MigrationPhase.COPYING_MEMORY
    if _int(stats, "disk_total") > 0:
        return MigrationPhase.COPYING_STORAGE
    if _int(stats, "data_processed") > 0:
        return MigrationPhase.COPYING_MEMORY
    return MigrationPhase.STARTING


def progress_of(
    stats: Mapping[str, object],
    *,
    elapsed: float,
    postcopy: bool = False,
    completed: bool = False,
) -> MigrationProgress:
    """``MigrationProgress`` from one ``jobStats()`` answer; ``elapsed`` is capl's own
    count (libvirt's ``time_elapsed`` is in ms and starts a little later)."""
    downtime = stats.get("downtime") if completed else stats.get("downtime_net")
    return MigrationProgress(
        phase=MigrationPhase.COMPLETED if completed else phase_of(stats, postcopy=postcopy),
        elapsed_seconds=elapsed,
        data_total_bytes=_int(stats, "data_total"),
        data_processed_bytes=_int(stats, "data_processed"),
        data_remaining_bytes=_int(stats, "data_remaining"),
        memory_remaining_bytes=_int(stats, "memory_remaining"),
        disk_remaining_bytes=_int(stats, "disk_remaining"),
        downtime_ms=int(downtime) if isinstance(downtime, int | float) else None,
    )


def completion_timeout(options: MigrationOptions, copy_bytes: int) -> float:
    """Seconds the whole job may take: per GiB of memory plus disks to copy."""
    return options.completion_timeout_per_gib * max(copy_bytes, 0) / GIB


class Verdict(enum.Enum):
    CONTINUE = "continue"
    ABORT = "abort"
    POST_COPY = "post-copy"
    """Switch the job to post-copy (once; only when the options allow it)."""


@dataclass(frozen=True, slots=True)
class Decision:
    verdict: Verdict
    reason: AbortReason | None = None
    detail: str = ""


class Watch:
    """The timeouts of one job. ``observe`` takes each poll's progress and says what to do;
    ``clock`` is monotonic seconds (tests pass a fake)."""

    def __init__(
        self, options: MigrationOptions, *, copy_bytes: int, clock: Callable[[], float]
    ) -> None:
        self.options = options
        self.clock = clock
        self.started = clock()
        self.completion_limit = completion_timeout(options, copy_bytes)
        self.postcopy = False
        self._phase: MigrationPhase | None = None
        self._low = math.inf
        self._low_at = self.started

    def elapsed(self) -> float:
        return self.clock() - self.started

    def observe(self, progress: MigrationProgress | None) -> Decision:
        """``progress`` None: the poll gave no statistics (the job is starting or ending)."""
        now = self.clock()
        if progress is not None:
            if progress.phase is not self._phase:
                if self._phase is not None:  # a new phase: a new low (the first: from start)
                    self._low, self._low_at = math.inf, now
                self._phase = progress.phase
            remaining = progress.data_remaining_bytes
            if progress.phase is not MigrationPhase.STARTING and remaining < self._low:
                self._low, self._low_at = remaining, now
        elapsed = now - self.started
        if elapsed > self.completion_limit and not self.postcopy:
            if self.options.allow_post_copy:
                self.postcopy = True
                self._low_at = now  # post-copy gets a fresh progress window
                return Decision(Verdict.POST_COPY)
            return Decision(
                Verdict.ABORT,
                AbortReason.COMPLETION_TIMEOUT,
                f"not completed within {self.completion_limit:.1f} s "
                f"({self.options.completion_timeout_per_gib:g} s per GiB to move)",
            )
        stalled = now - self._low_at
        if stalled > self.options.progress_timeout:
            low = "nothing" if math.isinf(self._low) else f"{int(self._low)} bytes"
            return Decision(
                Verdict.ABORT,
                AbortReason.NO_PROGRESS,
                f"no progress for {stalled:.1f} s (limit {self.options.progress_timeout:g} s; "
                f"lowest data remaining: {low})",
            )
        return Decision(Verdict.CONTINUE)


@dataclass(frozen=True, slots=True)
class Outcome:
    """How watching ended: why capl aborted (None: it did not), and the last progress."""

    abort_reason: AbortReason | None
    detail: str
    last: MigrationProgress | None


async def wait_done(finished: asyncio.Future[Any], seconds: float) -> None:
    """Until ``finished`` is done or ``seconds`` passed (never cancels ``finished``)."""
    await asyncio.wait({finished}, timeout=seconds)


async def drive(
    finished: asyncio.Future[Any],
    *,
    watch: Watch,
    poll: Callable[[], Awaitable[Mapping[str, object] | None]],
    abort: Callable[[], Awaitable[None]],
    start_post_copy: Callable[[], Awaitable[None]],
    cancelled: asyncio.Event,
    destination_alive: Callable[[], bool],
    on_progress: ProgressCallback | None = None,
    interval: float = 1.0,
    wait: Callable[[asyncio.Future[Any], float], Awaitable[None]] = wait_done,
) -> Outcome:
    """Poll the job every ``interval`` until ``finished`` (the blocking migrate call) is
    done; report progress; abort it once on a timeout, a lost destination or a cancel.
    After the abort the job is still watched until libvirt ends it."""
    reason: AbortReason | None = None
    detail = ""
    last: MigrationProgress | None = None
    while True:
        await wait(finished, interval)
        if finished.done():
            return Outcome(reason, detail, last)
        decision = Decision(Verdict.CONTINUE)
        if cancelled.is_set():
            decision = Decision(Verdict.ABORT, AbortReason.CANCELLED, "cancelled")
        elif not destination_alive():
            decision = Decision(
                Verdict.ABORT, AbortReason.DESTINATION_LOST, "the connection to it was lost"
            )
        stats = await poll()
        if stats is not None:
            last = progress_of(stats, elapsed=watch.elapsed(), postcopy=watch.postcopy)
            await _report(on_progress, last)
        observed = watch.observe(last if stats is not None else None)
        if decision.verdict is Verdict.CONTINUE:
            decision = observed
        if decision.verdict is Verdict.POST_COPY:
            log.info("migration past its completion timeout: switching to post-copy")
            await start_post_copy()
        elif decision.verdict is Verdict.ABORT and reason is None:
            reason, detail = decision.reason, decision.detail
            log.warning("aborting migration: %s: %s", reason, detail)
            await abort()


async def _report(callback: ProgressCallback | None, progress: MigrationProgress) -> None:
    if callback is None:
        return
    try:
        result = callback(progress)
        if inspect.isawaitable(result):
            await result
    except Exception:  # a broken observer must not break the job
        log.exception("migration progress callback failed")
