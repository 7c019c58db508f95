"""`capl manager`: the product wiring of the generic runtime.

This is the one place that knows every layer: it connects the Kubernetes adapter
(capl.kube) and the libvirt adapter (capl.virt), hands them to the reconcilers as the
Protocols of capl.ports/capl.runtime, mounts the admission webhooks, and runs the runtime
Manager (informers, work queues, leader election, health and metrics servers).
"""

from __future__ import annotations

import argparse
import asyncio
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog
import uvloop

from capl.api.cluster import LibvirtCluster
from capl.controllers import libvirtcluster, machine_template, migration
from capl.controllers import machine as libvirtmachine
from capl.controllers.common import Deps, parse
from capl.controllers.machine.bootstrap import BootstrapOptions
from capl.errors import EXIT_FAILED, EXIT_OK, EXIT_UNREACHABLE, CliError
from capl.kube.client import KubeClient
from capl.kube.config import KubeconfigError
from capl.kube.workload import KubeWorkloadClusters
from capl.runtime.errors import ApiError, TransportError
from capl.runtime.logging import configure_logging
from capl.runtime.manager import LeadershipLost, Manager, ManagerOptions
from capl.runtime.objects import ObjectKey
from capl.runtime.resources import LIBVIRT_CLUSTER, LIBVIRT_MACHINE
from capl.virt.connection import CALL_TIMEOUT, LONG_CALL_TIMEOUT
from capl.virt.hosts import LibvirtHosts
from capl.virt.migration import LibvirtMigrations
from capl.virt.snapshot import snapshots_of
from capl.webhooks.inplace import mount_in_place_extension
from capl.webhooks.server import CERT_NAME, KEY_NAME, WebhookServer, create_app

log = structlog.get_logger("capl.manager")


@dataclass(frozen=True, kw_only=True)
class ProviderOptions:
    """The flags of `capl manager` beyond the runtime's own."""

    manager: ManagerOptions = field(default_factory=ManagerOptions)
    kubeconfig: str | None = None
    webhook_port: int = 9443
    webhook_host: str = "0.0.0.0"
    webhook_cert_dir: str = "/tmp/k8s-webhook-server/serving-certs"
    log_level: str = "info"
    log_format: str = "auto"
    machine: libvirtmachine.MachineOptions = field(default_factory=libvirtmachine.MachineOptions)
    cluster: libvirtcluster.LibvirtClusterOptions = field(
        default_factory=libvirtcluster.LibvirtClusterOptions
    )
    #: per-host limits of libvirt calls (capl.virt.connection): the time limit of an ordinary
    #: call and of a long one (image import/upload), worker threads, and calls in flight
    #: (None: 4 x workers)
    libvirt_call_timeout: float = CALL_TIMEOUT
    libvirt_long_call_timeout: float = LONG_CALL_TIMEOUT
    libvirt_workers_per_host: int = 8
    libvirt_max_inflight_per_host: int | None = None

    def __post_init__(self) -> None:
        for name in ("libvirt_call_timeout", "libvirt_long_call_timeout"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)!r}")
        for name in ("libvirt_workers_per_host", "libvirt_max_inflight_per_host"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be at least 1, got {value!r}")


class _CachedClusters:
    """The webhook's view of every LibvirtCluster, served from the manager's informer."""

    def __init__(self, manager: Manager) -> None:
        self._manager = manager

    async def list_libvirt_clusters(self) -> Sequence[LibvirtCluster]:
        return [parse(LibvirtCluster, raw) for raw in self._manager.cache.list(LIBVIRT_CLUSTER)]


class _CachedMachines:
    """The in-place update extension's view of LibvirtMachines: the manager's informer."""

    def __init__(self, manager: Manager) -> None:
        self._manager = manager

    def libvirt_machine(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        return self._manager.cache.get(LIBVIRT_MACHINE, ObjectKey(namespace, name))


def _check_webhook_certs(cert_dir: str) -> None:
    missing = [n for n in (CERT_NAME, KEY_NAME) if not (Path(cert_dir) / n).is_file()]
    if missing:
        raise CliError(
            f"webhook certificate {', '.join(missing)} not found in {cert_dir} "
            "(set --webhook-cert-dir, or --webhook-port=0 to run without webhooks)"
        )


@dataclass(frozen=True)
class Built:
    """A manager ready to run, and the adapters it owns (closed by `close`)."""

    manager: Manager
    hosts: LibvirtHosts
    workload: KubeWorkloadClusters

    async def close(self) -> None:
        await self.workload.close()
        await self.hosts.close()


def build(options: ProviderOptions, client: KubeClient) -> Built:
    """The manager with its controllers and the webhooks registered (not started)."""
    manager = Manager(options.manager, client)
    hosts = LibvirtHosts(
        max_workers_per_host=options.libvirt_workers_per_host,
        call_timeout=options.libvirt_call_timeout,
        long_call_timeout=options.libvirt_long_call_timeout,
        max_inflight_per_host=options.libvirt_max_inflight_per_host,
    )
    workload = KubeWorkloadClusters()
    deps = Deps(
        cache=manager.cache,
        client=client,
        recorder=manager.recorder,
        hosts=hosts,
        workload=workload,
        clock=manager.clock,
        snapshots=snapshots_of,
    )
    libvirtcluster.setup(manager, deps, options=options.cluster)
    libvirtmachine.setup(manager, deps, options=options.machine)
    migration.setup(manager, deps, migrations=LibvirtMigrations())
    machine_template.setup(manager, deps)
    if options.webhook_port:
        _check_webhook_certs(options.webhook_cert_dir)
        manager.cache_before_leader(LIBVIRT_CLUSTER)
        manager.cache_before_leader(LIBVIRT_MACHINE)  # the in-place update extension
        app = create_app(clusters=_CachedClusters(manager), images=None)
        mount_in_place_extension(app, machines=_CachedMachines(manager))
        server = WebhookServer(
            app=app,
            cert_dir=Path(options.webhook_cert_dir),
            host=options.webhook_host,
            port=options.webhook_port,
        )

        async def serve_webhooks(stop: asyncio.Event) -> None:
            await server.start()
            try:
                await stop.wait()
            finally:
                await server.stop()

        manager.add_runnable(serve_webhooks, needs_leader=False, name="webhooks")
    return Built(manager=manager, hosts=hosts, workload=workload)


def options_from_args(args: argparse.Namespace) -> ProviderOptions:
    """ProviderOptions from the flags `capl manager` parsed (see capl.cli)."""
    return ProviderOptions(
        manager=ManagerOptions(
            leader_elect=args.leader_elect,
            leader_election_id=args.leader_election_id,
            leader_election_namespace=args.leader_election_namespace,
            lease_duration=args.leader_elect_lease_duration,
            renew_deadline=args.leader_elect_renew_deadline,
            retry_period=args.leader_elect_retry_period,
            metrics_bind_address=args.metrics_bind_address,
            health_probe_bind_address=args.health_probe_bind_address,
            namespace=args.namespace,
            watch_filter=args.watch_filter,
            concurrency=args.concurrency,
            sync_period=args.sync_period,
            graceful_shutdown_timeout=args.graceful_shutdown_timeout,
        ),
        kubeconfig=args.kubeconfig,
        webhook_port=args.webhook_port,
        webhook_host=args.webhook_host,
        webhook_cert_dir=args.webhook_cert_dir,
        log_level=args.log_level,
        log_format=args.log_format,
        machine=libvirtmachine.MachineOptions(
            shutdown_timeout=args.machine_shutdown_timeout,
            orphan_sweep_interval=args.orphan_sweep_interval,
            orphan_grace=args.orphan_grace,
            bootstrap=BootstrapOptions(timeout=args.bootstrap_timeout),
        ),
        cluster=libvirtcluster.LibvirtClusterOptions(
            health_interval=args.cluster_health_interval or None,
            drift_interval=args.cluster_drift_interval or None,
        ),
        libvirt_call_timeout=args.libvirt_call_timeout,
        libvirt_long_call_timeout=args.libvirt_long_call_timeout,
        libvirt_workers_per_host=args.libvirt_workers_per_host,
        libvirt_max_inflight_per_host=args.libvirt_max_inflight_per_host,
    )


def run_from_args(args: argparse.Namespace) -> int:
    # uvloop's event loop: the manager's own CPU per machine of a scale-out about 16 % lower
    # than asyncio's (its I/O, TLS and callbacks in C; docs/benchmarks.md, Profile)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(run_manager(options_from_args(args)))


async def run_manager(options: ProviderOptions) -> int:
    configure_logging(level=options.log_level, format=options.log_format)  # type: ignore[arg-type]
    try:
        client = await KubeClient.connect(options.kubeconfig)
    except KubeconfigError as exc:
        raise CliError(str(exc), code=EXIT_UNREACHABLE) from None
    built = build(options, client)
    manager = built.manager
    log.info(
        "starting capl manager",
        version=_version(),
        pid=os.getpid(),
        leader_elect=options.manager.leader_elect,
        namespace=options.manager.namespace or "(all)",
    )
    try:
        await manager.run()
    except LeadershipLost:
        log.error("leader election lost; exiting so a fresh process can rejoin")
        return EXIT_FAILED
    except (TransportError, ApiError) as exc:
        raise CliError(f"API server: {exc}", code=EXIT_UNREACHABLE) from None
    finally:
        await built.close()
        await client.close()
    return EXIT_OK


def _version() -> str:
    from capl import __version__

    return __version__
