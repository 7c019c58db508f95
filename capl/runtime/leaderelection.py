"""Leader election on a coordination.k8s.io/v1 Lease, as client-go does it.

- A candidate polls every `retry_period` (jittered). It takes the lease when it does not exist,
  when its holder is empty (released), or when the record it observes has not changed for
  `leaseDurationSeconds` of *local* time (the holder stopped renewing); times written by other
  machines are never compared with our clock.
- Every write carries the lease's resourceVersion (optimistic concurrency): two candidates racing
  for a free lease get one 200 and one 409.
- The leader renews every `retry_period`. If no renew succeeds within `renew_deadline` of the
  last successful one, leadership is lost: `hold()` returns and the manager stops its
  controllers. renew_deadline < lease_duration leaves the gap in which nobody else may act yet.
- `release()` (on SIGTERM) empties holderIdentity and sets leaseDurationSeconds to 1, so a
  standby takes over on its next poll instead of waiting a whole lease duration.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import time
import uuid
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any, TypeVar

import structlog

from capl.runtime.client import ResourceClient
from capl.runtime.clock import Clock, LoopClock
from capl.runtime.errors import AlreadyExists, ApiError, Conflict, NotFound
from capl.runtime.metrics import RuntimeMetrics
from capl.runtime.objects import ObjectKey, resource_version

log = structlog.get_logger("capl.runtime.leaderelection")

T = TypeVar("T")


def default_identity() -> str:
    return f"{socket.gethostname()}_{uuid.uuid4()}"


def micro_time(seconds: float) -> str:
    """metav1.MicroTime: RFC 3339 with microseconds, UTC."""
    whole = int(seconds)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole)) + (
        f".{int((seconds - whole) * 1e6):06d}Z"
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class LeaderElectionConfig:
    name: str
    namespace: str
    identity: str
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def __post_init__(self) -> None:
        if not (self.lease_duration > self.renew_deadline > self.retry_period > 0):
            raise ValueError("need lease_duration > renew_deadline > retry_period > 0")


class LeaderElector:
    """Acquires, holds and releases one Lease. See the module docstring."""

    def __init__(
        self,
        client: ResourceClient,
        config: LeaderElectionConfig,
        *,
        clock: Clock | None = None,
        metrics: RuntimeMetrics | None = None,
    ) -> None:
        self.client = client
        self.config = config
        self.clock: Clock = clock or LoopClock()
        self.key = ObjectKey(config.namespace, config.name)
        self._observed: dict[str, Any] | None = None
        self._observed_rv = ""
        self._observed_at = 0.0
        self._last_renew = 0.0
        self.is_leader = False
        self.transitions = 0
        self._log = log.bind(lease=str(self.key), identity=config.identity)
        self._gauge = metrics.leader_election_master_status.labels(config.name) if metrics else None
        if self._gauge is not None:
            self._gauge.set(0)

    @property
    def observed_holder(self) -> str:
        return str((self._observed or {}).get("holderIdentity") or "")

    async def acquire(self) -> None:
        """Return once this candidate holds the lease."""
        self._log.info("waiting for leadership")
        while True:
            if await self._attempt(self.clock.now() + self.config.renew_deadline):
                self._became_leader()
                return
            await self.clock.sleep(self.config.retry_period * (1.0 + random.random() * 1.2))

    async def hold(self) -> None:
        """Renew until a renew deadline is missed (returns: leadership lost)."""
        cfg = self.config
        while True:
            await self.clock.sleep(cfg.retry_period)
            deadline = self._last_renew + cfg.renew_deadline
            renewed = False
            while self.clock.now() < deadline:
                if await self._attempt(deadline):
                    renewed = True
                    break
                remaining = deadline - self.clock.now()
                if remaining <= 0:
                    break
                await self.clock.sleep(min(cfg.retry_period, remaining))
            if not renewed:
                self._lost()
                return

    async def release(self) -> bool:
        """Give the lease up if we hold it (best effort); True when released."""
        if not self.is_leader:
            return False
        self.is_leader = False
        if self._gauge is not None:
            self._gauge.set(0)
        now = micro_time(self.clock.wall())
        patch = {
            "spec": {
                "holderIdentity": "",
                "leaseDurationSeconds": 1,
                "acquireTime": now,
                "renewTime": now,
            }
        }
        try:
            await self.client.patch(self.key, patch, resource_version=self._observed_rv or None)
        except ApiError as exc:
            self._log.warning("lease not released", error=str(exc))
            return False
        self._log.info("lease released")
        return True

    # -- internals ---------------------------------------------------------------------------

    async def _attempt(self, deadline: float) -> bool:
        try:
            return await self._bounded(self._try_acquire_or_renew(), deadline)
        except asyncio.CancelledError:
            raise
        except TimeoutError:
            self._log.debug("lease request timed out")
            return False
        except ApiError as exc:
            self._log.debug("lease request failed", error=str(exc))
            return False

    async def _bounded(self, coro: Awaitable[T], deadline: float) -> T:
        """Await `coro`, giving up (TimeoutError) at `deadline` on our clock.

        A cancellation of the caller (the manager stopping `hold`) stays a cancellation: it
        once became a TimeoutError here when it came during a request, `hold` took it for a
        failed renewal and went on renewing, and the manager's shutdown waited for it forever."""
        work = asyncio.ensure_future(coro)
        timer = asyncio.ensure_future(self.clock.sleep(max(0.0, deadline - self.clock.now())))
        try:
            await asyncio.wait({work, timer}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            work.cancel()
            raise
        finally:
            timer.cancel()
        if not work.done():
            work.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await work
            raise TimeoutError
        return work.result()

    async def _try_acquire_or_renew(self) -> bool:
        cfg = self.config
        started = self.clock.now()
        now_wall = micro_time(self.clock.wall())
        try:
            lease = await self.client.get(self.key)
        except NotFound:
            initial: dict[str, Any] = {
                "holderIdentity": cfg.identity,
                "leaseDurationSeconds": int(cfg.lease_duration),
                "acquireTime": now_wall,
                "renewTime": now_wall,
                "leaseTransitions": 0,
            }
            try:
                created = await self.client.create(
                    {
                        "apiVersion": "coordination.k8s.io/v1",
                        "kind": "Lease",
                        "metadata": {"name": cfg.name, "namespace": cfg.namespace},
                        "spec": initial,
                    }
                )
            except AlreadyExists:
                return False
            self._observe(created)
            self._last_renew = started
            return True
        self._observe(lease)
        spec: dict[str, Any] = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        duration = float(spec.get("leaseDurationSeconds") or cfg.lease_duration)
        if holder and holder != cfg.identity and self._observed_at + duration > self.clock.now():
            return False
        if holder == cfg.identity:
            new_spec = {"renewTime": now_wall, "leaseDurationSeconds": int(cfg.lease_duration)}
            if not spec.get("acquireTime"):
                new_spec["acquireTime"] = now_wall
        else:
            new_spec = {
                "holderIdentity": cfg.identity,
                "leaseDurationSeconds": int(cfg.lease_duration),
                "acquireTime": now_wall,
                "renewTime": now_wall,
                "leaseTransitions": int(spec.get("leaseTransitions") or 0) + 1,
            }
        try:
            updated = await self.client.patch(
                self.key, {"spec": new_spec}, resource_version=resource_version(lease)
            )
        except Conflict:
            return False
        self._observe(updated)
        self._last_renew = started
        return True

    def _observe(self, lease: dict[str, Any]) -> None:
        spec = lease.get("spec") or {}
        self._observed_rv = resource_version(lease)
        if spec != self._observed:
            self._observed = dict(spec)
            self._observed_at = self.clock.now()

    def _became_leader(self) -> None:
        self.is_leader = True
        self.transitions += 1
        if self._gauge is not None:
            self._gauge.set(1)
        self._log.info("became leader")

    def _lost(self) -> None:
        self.is_leader = False
        if self._gauge is not None:
            self._gauge.set(0)
        self._log.error("leadership lost: renew deadline passed")
