"""The manager: one client, one shared cache, controllers, leader election, probes, metrics.

    manager = Manager(ManagerOptions(leader_elect=True, ...), client)
    manager.add_controller("libvirtmachine", for_=LIBVIRT_MACHINE, reconciler=r, watches=[...])
    manager.add_web_app(webhook_app, address=":9443", ssl_context=ctx)   # runs on every replica
    await manager.run()          # until SIGTERM/SIGINT or stop(); raises LeadershipLost

Order of `run()`: health + metrics servers, the event recorder, the informers marked
`before_leader` (webhook caches) and non-leader runnables (webhook server) start at once. With
leader election the manager then waits for the lease; controllers, their informers and leader
runnables start only while leading. Losing the lease (no renew within renew_deadline) cancels the
controllers at once and `run()` raises `LeadershipLost`; the process should exit and be restarted
(like controller-runtime), which also gives a clean cache. SIGTERM: stop taking work, give
in-flight reconciles `graceful_shutdown_timeout`, release the lease, stop informers and servers.

/healthz answers ok while the event loop runs; /readyz once the informers this replica runs (the
before-leader ones; and the controllers' ones while leading) have synced. A standby is ready.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog
from aiohttp import web

from capl.runtime.client import Client
from capl.runtime.clock import Clock, LoopClock
from capl.runtime.controller import Controller, ControllerOptions, Reconciler, Watch, label_filter
from capl.runtime.events import EventRecorder, default_instance
from capl.runtime.handlers import PRIMARY_DEFAULT_PREDICATES, Predicate
from capl.runtime.informer import Cache, InformerOptions
from capl.runtime.leaderelection import LeaderElectionConfig, LeaderElector, default_identity
from capl.runtime.metrics import EventCollector, RuntimeMetrics
from capl.runtime.objects import WATCH_FILTER_LABEL, ObjectKey
from capl.runtime.resources import EVENT, LEASE, Resource
from capl.runtime.serving import Check, Server, health_app, metrics_app, parse_bind_address
from capl.runtime.workqueue import RateLimiter

log = structlog.get_logger("capl.runtime.manager")

IN_CLUSTER_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

Runnable = Callable[[asyncio.Event], Coroutine[Any, Any, None]]
"""A long-running coroutine that returns once the given stop event is set."""


class LeadershipLost(RuntimeError):
    """The lease was lost while leading; the controllers were stopped."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ManagerOptions:
    """The manager flags (controller-runtime / Cluster API names in comments)."""

    leader_elect: bool = False  # --leader-elect
    leader_election_id: str = "controller-leader-election-capl"  # --leader-election-id
    leader_election_namespace: str | None = None  # default: own namespace, else "default"
    lease_duration: float = 15.0  # --leader-elect-lease-duration
    renew_deadline: float = 10.0  # --leader-elect-renew-deadline
    retry_period: float = 2.0  # --leader-elect-retry-period
    identity: str | None = None  # default: hostname_uuid
    metrics_bind_address: str = ":8080"  # --metrics-bind-address ("0" disables)
    health_probe_bind_address: str = ":9440"  # --health-probe-bind-address ("0" disables)
    namespace: str | None = None  # --namespace: watch only this namespace
    watch_filter: str | None = None  # --watch-filter: label cluster.x-k8s.io/watch-filter
    concurrency: int = 10  # --concurrency: workers per controller
    sync_period: float | None = None  # --sync-period: resync cached objects (no API call)
    graceful_shutdown_timeout: float = 30.0
    watch_timeout: float = 300.0
    handle_signals: bool = True
    event_component: str = "capl"


def _default_lease_namespace() -> str:
    for env in ("POD_NAMESPACE",):
        if os.environ.get(env):
            return os.environ[env]
    try:
        with open(IN_CLUSTER_NAMESPACE_FILE) as f:
            return f.read().strip() or "default"
    except OSError:
        return "default"


@dataclass(slots=True)
class _RunnableSpec:
    name: str
    run: Runnable
    needs_leader: bool
    task: asyncio.Task[None] | None = None
    stop: asyncio.Event = field(default_factory=asyncio.Event)


class Manager:
    """Runs everything; see the module docstring."""

    def __init__(
        self,
        options: ManagerOptions,
        client: Client,
        *,
        clock: Clock | None = None,
        metrics: RuntimeMetrics | None = None,
        informer_options: InformerOptions | None = None,
    ) -> None:
        self.options = options
        self.client = client
        self.clock: Clock = clock or LoopClock()
        self.metrics = metrics or RuntimeMetrics()
        self.metrics.register_collector(client.stats)
        base = informer_options or InformerOptions(
            watch_timeout=options.watch_timeout, resync_period=options.sync_period
        )
        self.cache = Cache(client, namespace=options.namespace, clock=self.clock, options=base)
        self.recorder = EventRecorder(
            client.resource(EVENT),
            component=options.event_component,
            instance=default_instance(),
            clock=self.clock,
        )
        self.metrics.register_collector(EventCollector(self.recorder))
        self.identity = options.identity or default_identity()
        self.elector: LeaderElector | None = None
        if options.leader_elect:
            self.elector = LeaderElector(
                client.resource(LEASE),
                LeaderElectionConfig(
                    name=options.leader_election_id,
                    namespace=options.leader_election_namespace or _default_lease_namespace(),
                    identity=self.identity,
                    lease_duration=options.lease_duration,
                    renew_deadline=options.renew_deadline,
                    retry_period=options.retry_period,
                ),
                clock=self.clock,
                metrics=self.metrics,
            )
        self.controllers: list[Controller] = []
        self._runnables: list[_RunnableSpec] = []
        self._before_leader: list[Resource] = []
        self._healthz: dict[str, Check] = {"ping": lambda: True}
        self._readyz: dict[str, Check] = {"informers": self._caches_ready}
        self._servers: list[Server] = []
        self._stop: asyncio.Event | None = None
        self._started_informers = False
        self._expected_informers: list[Resource] = []
        self.leading = asyncio.Event()
        self.health_port: int | None = None
        self.metrics_port: int | None = None

    # -- building ----------------------------------------------------------------------------

    def add_controller(
        self,
        name: str,
        *,
        for_: Resource,
        reconciler: Reconciler,
        watches: Sequence[Watch] = (),
        predicates: Sequence[Predicate] = PRIMARY_DEFAULT_PREDICATES,
        concurrency: int | None = None,
        rate_limiter: RateLimiter[ObjectKey] | None = None,
    ) -> Controller:
        """Add a controller (started when leading). --watch-filter applies to its primaries."""
        key_filter = (
            label_filter(WATCH_FILTER_LABEL, self.options.watch_filter)
            if self.options.watch_filter
            else None
        )
        controller = Controller(
            name,
            for_=for_,
            reconciler=reconciler,
            cache=self.cache,
            watches=watches,
            predicates=predicates,
            options=ControllerOptions(
                concurrency=concurrency or self.options.concurrency,
                rate_limiter=rate_limiter,
                key_filter=key_filter,
            ),
            clock=self.clock,
            metrics=self.metrics,
        )
        self.controllers.append(controller)
        return controller

    def add_runnable(self, run: Runnable, *, needs_leader: bool = True, name: str = "") -> None:
        """A coroutine function taking the stop event; started when leading, or at once."""
        self._runnables.append(
            _RunnableSpec(name or getattr(run, "__name__", "runnable"), run, needs_leader)
        )

    def add_web_app(
        self,
        app: web.Application,
        *,
        address: str,
        ssl_context: object = None,
        name: str = "webhook",
        needs_leader: bool = False,
    ) -> None:
        """Serve an aiohttp app (e.g. the webhook server) on every replica by default."""
        bind = parse_bind_address(address)
        if bind is None:
            return
        server = Server(app, bind, ssl_context=ssl_context)

        async def serve(stop: asyncio.Event) -> None:
            await server.start()
            try:
                await stop.wait()
            finally:
                await server.stop()

        self.add_runnable(serve, needs_leader=needs_leader, name=name)

    def cache_before_leader(self, resource: Resource) -> None:
        """Start this informer at once on every replica (e.g. webhooks reading the cache)."""
        self.cache.informer(resource)
        if resource not in self._before_leader:
            self._before_leader.append(resource)

    def controller(self, name: str) -> Controller:
        for c in self.controllers:
            if c.name == name:
                return c
        raise KeyError(name)

    # -- state -------------------------------------------------------------------------------

    def _caches_ready(self) -> bool:
        if not self._started_informers:
            return False
        return all(self.cache.informer(r).has_synced for r in self._expected_informers)

    @property
    def ready(self) -> bool:
        return all(check() for check in self._readyz.values())

    @property
    def is_leader(self) -> bool:
        return self.elector is None or self.elector.is_leader

    def stop(self) -> None:
        """Ask `run()` to shut down gracefully (what SIGTERM does)."""
        if self._stop is not None:
            self._stop.set()

    # -- running -----------------------------------------------------------------------------

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        self._stop = stop = asyncio.Event()
        signals: list[int] = []
        if self.options.handle_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                    loop.add_signal_handler(sig, self._on_signal, sig)
                    signals.append(sig)
        controller_tasks: list[asyncio.Task[None]] = []
        hold: asyncio.Task[None] | None = None
        lost = False
        try:
            await self._start_servers()
            self.recorder.start()
            self.cache.start(self._before_leader)
            self._expected_informers.extend(self._before_leader)
            self._started_informers = True
            self._start_runnables(leader=False)
            if self.elector is not None:
                acquired = await self._until_stopped(self.elector.acquire(), stop)
                if not acquired:
                    return
            for controller in self.controllers:
                self._expected_informers.extend(controller.resources)
            self.leading.set()
            log.info("starting controllers", controllers=[c.name for c in self.controllers])
            for controller in self.controllers:
                controller_tasks.append(
                    asyncio.create_task(controller.run(), name=f"controller:{controller.name}")
                )
            self._start_runnables(leader=True)
            waiters: set[asyncio.Future[object]] = {asyncio.ensure_future(stop.wait())}
            if self.elector is not None:
                hold = asyncio.create_task(self.elector.hold(), name="lease-renew")
                waiters.add(hold)  # type: ignore[arg-type]
            waiters.update(controller_tasks)  # type: ignore[arg-type]
            while True:
                done, _ = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
                if hold is not None and hold in done:
                    lost = True
                    break
                if stop.is_set():
                    break
                for task in done:
                    waiters.discard(task)
                    if task.exception() is not None:
                        log.error("controller crashed", error=repr(task.exception()))
                        raise task.exception()  # type: ignore[misc]
        finally:
            await self._shutdown(controller_tasks, hold, lost=lost)
            for signum in signals:
                loop.remove_signal_handler(signum)
        if lost:
            raise LeadershipLost("leader election lost")

    def _on_signal(self, sig: int) -> None:
        log.info("signal received, shutting down", signal=signal.Signals(sig).name)
        self.stop()

    async def _until_stopped(self, coro: Awaitable[None], stop: asyncio.Event) -> bool:
        work = asyncio.ensure_future(coro)
        stopped = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait({work, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
            if not work.done():
                work.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await work
        return work.done() and not work.cancelled() and work.exception() is None

    async def _start_servers(self) -> None:
        health = parse_bind_address(self.options.health_probe_bind_address)
        if health is not None:
            server = Server(health_app(healthz=self._healthz, readyz=self._readyz), health)
            await server.start()
            self._servers.append(server)
            self.health_port = server.port
        metrics = parse_bind_address(self.options.metrics_bind_address)
        if metrics is not None:
            server = Server(metrics_app(self.metrics.exposition), metrics)
            await server.start()
            self._servers.append(server)
            self.metrics_port = server.port

    def _start_runnables(self, *, leader: bool) -> None:
        for spec in self._runnables:
            if spec.needs_leader == leader and spec.task is None:
                spec.task = asyncio.create_task(spec.run(spec.stop), name=f"runnable:{spec.name}")

    async def _shutdown(
        self,
        controller_tasks: list[asyncio.Task[None]],
        hold: asyncio.Task[None] | None,
        *,
        lost: bool,
    ) -> None:
        grace = 0.0 if lost else self.options.graceful_shutdown_timeout
        log.info("shutting down", grace=grace, lost_lease=lost)
        await asyncio.gather(*(c.shutdown(grace=grace) for c in self.controllers))
        for task in controller_tasks:
            task.cancel()
        for task in controller_tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if hold is not None and not hold.done():
            hold.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await hold
        for spec in self._runnables:
            spec.stop.set()
        for spec in self._runnables:
            if spec.task is not None:
                try:
                    await asyncio.wait_for(spec.task, timeout=max(grace, 1.0))
                except (TimeoutError, asyncio.CancelledError):
                    pass
                except Exception as exc:
                    log.warning("runnable failed", runnable=spec.name, error=repr(exc))
        if self.elector is not None and not lost:
            await self.elector.release()
        self.leading.clear()
        await self.cache.stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.recorder.flush(), timeout=2.0)
        await self.recorder.close()
        for server in self._servers:
            await server.stop()
        self._servers.clear()
        log.info("stopped")
