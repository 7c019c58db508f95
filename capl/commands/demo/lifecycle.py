"""One demo run: set-up, the demo cluster, the live view; then clean-up (always).

What ``Demo.up`` starts, all owned by this one process:

1. a **control plane** (``capl.testbed.ControlPlane``: etcd + kube-apiserver on loopback) in a
   fresh work directory ``$TMPDIR/capl-demo-XXXX``, with capl's CRDs;
2. the **Cluster API core manager** (``capl.testbed.capi.CapiCore``, the real Go binary that
   ``make capi`` builds) with its CRDs and webhooks on loopback. The demo uses real Cluster
   API objects, so what it shows is what a management cluster does: the Cluster controller
   adopts the LibvirtCluster, the MachineDeployment's MachineSet clones LibvirtMachines from
   a template, ``kubectl scale`` works;
3. **capl's manager in this process** (``capl.manager.build`` as an asyncio task, webhooks
   off, metrics on a free loopback port, logs to ``<workdir>/logs/capl-manager.log``). In
   process because ``test:///default`` is per-process state: the demo, its checks and the
   manager must share one libvirt test driver;
4. the **demo cluster** (``capl.commands.demo.objects``) on one host, with real nodes through
   ``capl.commands.demo.real_nodes``.

Then the **live view** (``capl.commands.demo.view``, printed by ``capl.commands.demo.ui``)
until all N machines are done, the Ready line and the commands to try; it keeps running,
printing changes (e.g. after scaling), until SIGINT or SIGTERM (``--exit-when-ready``:
returns at once). A step that waits is cancelled by the first signal (``Interrupted``); a
second one tells the clean-up (``capl.commands.demo.cleanup``) to hurry.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from capl.commands.demo.assets import (
    NodeParts,
    cache_dir,
    find_capi_assets,
    find_control_plane_assets,
    node_image_for,
)
from capl.commands.demo.cleanup import Cleanup
from capl.commands.demo.image_server import ImageServer, image_source, sha256_of, synthetic_qcow2
from capl.commands.demo.leftovers import sweep_stale
from capl.commands.demo.network import pick_network
from capl.commands.demo.node_objects import write_testbed_manifests
from capl.commands.demo.objects import demo_objects, layout_names, resource_of, write_crds
from capl.commands.demo.plan import (
    DEFAULT_NAMESPACE,
    DemoPlan,
    is_test_driver,
)
from capl.commands.demo.real_nodes import RealNodes
from capl.commands.demo.state import POLL, DemoState
from capl.commands.demo.ui import Lines
from capl.commands.demo.view import Tracker, condition_detail, next_steps, ready_line
from capl.commands.demo.workdirs import WORKDIR_PREFIX, other_demos, process_identity, write_state
from capl.errors import (
    CliError,
)

if TYPE_CHECKING:
    from capl.commands.status_report import StatusReport
    from capl.testbed import Assets
    from capl.testbed.capibuild import CapiAssets


__all__ = ["Demo", "Interrupted"]


class Interrupted(Exception):
    """SIGINT/SIGTERM arrived during a phase that waits."""


@dataclass(frozen=True, slots=True, kw_only=True)
class _Parts:
    """What the run found on this machine before it started anything."""

    assets: Assets
    """The control-plane binaries."""
    capi: CapiAssets
    nodes: NodeParts | None
    """Real nodes: what they need; None in VM-only mode."""
    image_path: Path | None
    """VM-only: the base image, a local file (else ``image_url``, or synthetic)."""
    image_url: str | None


class Demo(DemoState):
    """One demo run: `up()` (set-up, create, live view), then `down()` (always)."""

    # -- signals ----------------------------------------------------------------------------

    def signalled(self, signum: int) -> None:
        name = signal.Signals(signum).name
        if not self.stop.is_set():
            self.ui.say(f"\n{name}: stopping the demo and removing everything it created")
            self.stop.set()
        else:
            self.ui.warn(
                f"{name} again: not waiting for capl any longer; removing what is left "
                "directly (domains, volumes, network, pool), then stopping the processes"
            )
            self.hurry.set()

    async def _sleep(self, seconds: float) -> None:
        """Sleep, but raise Interrupted as soon as the demo is asked to stop."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stop.wait(), timeout=seconds)
        if self.stop.is_set():
            raise Interrupted

    async def down(self) -> bool:
        """Remove everything; True when nothing is left. Never raises (reports instead)."""
        return await Cleanup(self).run()

    # -- set-up -----------------------------------------------------------------------------

    async def up(self) -> None:
        """The run until it is stopped (or, with --exit-when-ready, until it is Ready)."""
        found = self._find_parts()
        await sweep_stale(self.ui)
        self._check_no_other_demo()
        identity = self._make_workdir()
        await self._make_plan(found, identity=identity)
        await self._start_management(found)
        await self._create_cluster()
        await self._watch()

    def _find_parts(self) -> _Parts:
        """Everything the run needs on this machine, before anything starts."""
        opts = self.options
        node_image = None
        if opts.real_nodes:
            node_image = node_image_for(
                opts.uri, image=opts.image, node_image=opts.node_image, cache=cache_dir()
            )
        image_path, image_url = (
            (None, None) if opts.real_nodes else image_source(opts.image, uri=opts.uri)
        )
        assets = find_control_plane_assets()
        capi_assets = find_capi_assets()
        nodes = None
        if node_image is not None:
            nodes = NodeParts.find(
                image=node_image, envtest=assets.directory, capi=capi_assets, cache=cache_dir()
            )
        elif is_test_driver(opts.uri) and not opts.vm_only:
            self.ui.say(
                "the libvirt test driver boots no guests, so no real nodes: VM-only mode "
                "(as with --vm-only)"
            )
        return _Parts(
            assets=assets,
            capi=capi_assets,
            nodes=nodes,
            image_path=image_path,
            image_url=image_url,
        )

    def _make_workdir(self) -> str:
        """The work directory, owned by this process (its identity is returned), and the
        manager's log in it."""
        self.workdir = Path(tempfile.mkdtemp(prefix=WORKDIR_PREFIX))
        identity = process_identity(os.getpid()) or ""
        write_state(self.workdir, {"owner": identity, "uri": self.options.uri})
        (self.workdir / "logs").mkdir()
        self._configure_logging()
        logs = "logs/, control-plane/logs/, control-plane/capi-core/logs/"
        if self.options.real_nodes:
            logs += ", control-plane/capi-kubeadm-bootstrap/logs/, workload/logs/"
        self.ui.say(f"work directory: {self.workdir} (logs: {logs})")
        return identity

    async def _make_plan(self, found: _Parts, *, identity: str) -> None:
        """The network, the base image's URL (serving it first), the plan; recorded in the
        work directory's state so that a later demo can clean up after this one."""
        opts = self.options
        assert self.workdir is not None
        network_cidr = opts.network_cidr or await pick_network(
            opts.uri, domain_type=opts.domain_type
        )
        image_url, sha256 = found.image_url, None
        if image_url is None and not opts.real_nodes:
            image_url, sha256 = await self._serve_image(found.image_path)
        self.plan = DemoPlan(
            name=opts.name,
            uri=opts.uri,
            machines=opts.machines,
            image_url=image_url or "",
            image_sha256=sha256,
            cidr=network_cidr,
            pool_path=str(self.workdir / "pool"),
            domain_type=opts.domain_type,
            memory_mib=opts.memory_mib,
            **(await found.nodes.plan_values() if found.nodes is not None else {}),
        )
        network, pool = layout_names(self.plan)
        write_state(
            self.workdir,
            {
                "owner": identity,
                "uri": opts.uri,
                "namespace": self.plan.namespace,
                "cluster": self.plan.name,
                "network": network,
                "pool": pool,
            },
        )

    async def _serve_image(self, path: Path | None) -> tuple[str, str]:
        """(URL, sha256) of the base image (``path``, else a synthetic one) on loopback."""
        if path is not None:
            with self.ui.step(f"Checksumming the base image {path}"):
                sha256 = await asyncio.to_thread(sha256_of, path)
            server = ImageServer(path=path)
        else:
            data = synthetic_qcow2()
            sha256 = hashlib.sha256(data).hexdigest()
            server = ImageServer(path=None, data=data)
        await server.start()
        self.image_server = server
        return server.url, sha256

    async def _start_management(self, found: _Parts) -> None:
        """The control plane with the CRDs, Cluster API (with real nodes also its kubeadm
        bootstrap provider) and capl's manager."""
        from capl.testbed import ControlPlane
        from capl.testbed.capi import CapiCore

        assert self.workdir is not None
        assert self.plan is not None
        from capl.testbed.identities import MANAGER_AUDIT_POLICY

        # the manager runs as deployed (config/rbac's roles); the audit log shows whether
        # anything it asked for was refused
        self.plane = ControlPlane(
            assets=found.assets,
            workdir=self.workdir / "control-plane",
            audit_log=self.workdir / "control-plane" / "audit.log",
            audit_policy=MANAGER_AUDIT_POLICY,
        )
        with self.ui.step("Starting a local control plane (etcd + kube-apiserver)"):
            await self._cancellable(self.plane.start())
        shutil.copyfile(self.plane.kubeconfig, self.kubeconfig)
        self.kubeconfig.chmod(0o600)
        crd_dir = self.workdir / "crds"
        write_crds(crd_dir)
        crds = "capl's CRDs"
        if self.options.real_nodes:
            write_testbed_manifests(crd_dir)
            crds += " and the TestbedControlPlane CRD"
        with self.ui.step(f"Installing {crds}"):
            await self._cancellable(self.plane.install_crds(crd_dir))
        self.capi = CapiCore(plane=self.plane, capi=found.capi)
        with self.ui.step(f"Starting the Cluster API core manager {found.capi.version}"):
            await self._cancellable(self.capi.start())
        if found.nodes is not None:
            self.nodes = RealNodes(
                plan=self.plan, workdir=self.workdir, parts=found.nodes, plane=self.plane
            )
            await self.nodes.start_bootstrap_provider(self.ui, run=self._cancellable)
        self.ui.say("processes: " + ", ".join(self.processes()))
        with self.ui.step("Starting capl's manager (in this process)"):
            await self._cancellable(self._start_manager())

    async def _create_cluster(self) -> None:
        assert self.client is not None
        assert self.plan is not None
        if self.nodes is not None:
            self.created = True  # from the first object on (the clean-up tolerates NotFound)
            await self.nodes.create(self.client, self.ui, run=self._cancellable)
            return
        with self.ui.step(
            f"Creating the demo cluster {self.plan.name!r} on {self.options.uri} "
            f"(isolated network {self.plan.cidr}, {self.plan.machines} machines)"
        ):
            await self._cancellable(self._create())

    def _check_no_other_demo(self) -> None:
        if is_test_driver(self.options.uri):
            return
        for workdir, state, alive in other_demos():
            if (
                alive
                and state.get("uri") == self.options.uri
                and state.get("cluster") == self.options.name
            ):
                pid = str(state.get("owner", "")).split(" ", 1)[0]
                raise CliError(
                    f"another capl demo (pid {pid}, {workdir}) runs cluster "
                    f"{self.options.name!r} on {self.options.uri}: stop it, or pass --name"
                )

    def _configure_logging(self) -> None:
        from capl.runtime.logging import configure_logging

        assert self.workdir is not None
        self.log_file = (self.workdir / "logs" / "capl-manager.log").open("a", buffering=1)
        configure_logging(level=self.options.log_level, format="json", stream=self.log_file)

    async def _cancellable(self, work: Any) -> Any:
        """Run ``work``; cancel it and raise Interrupted when the demo is asked to stop."""
        task = asyncio.ensure_future(work)
        stopper = asyncio.ensure_future(self.stop.wait())
        try:
            await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopper.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
            raise Interrupted
        return task.result()

    async def _start_manager(self) -> None:
        from capl.controllers.libvirtcluster import LibvirtClusterOptions
        from capl.controllers.machine import MachineOptions
        from capl.kube.client import KubeClient
        from capl.manager import ProviderOptions, build
        from capl.runtime.manager import ManagerOptions
        from capl.testbed.identities import manager_kubeconfig

        assert self.plane is not None
        kubeconfig = str(self.plane.kubeconfig)
        # the manager as deployed: bound to config/rbac's roles, not the admin
        manager_config = str(await manager_kubeconfig(self.plane))
        options = ProviderOptions(
            manager=ManagerOptions(
                metrics_bind_address="127.0.0.1:0",
                health_probe_bind_address="0",
                namespace=DEFAULT_NAMESPACE,
                handle_signals=False,
                graceful_shutdown_timeout=5.0,
            ),
            kubeconfig=manager_config,
            webhook_port=0,
            log_level=self.options.log_level,
            log_format="json",
            machine=MachineOptions(
                shutdown_timeout=20.0, shutdown_poll=1.0, address_poll=1.0, node_poll=2.0
            ),
            cluster=LibvirtClusterOptions(health_interval=30.0, unreachable_retry=10.0),
        )
        self.client = await KubeClient.connect(kubeconfig, user_agent="capl-demo")
        self.manager_client = await KubeClient.connect(options.kubeconfig)
        built = build(options, self.manager_client)
        self.built = built
        manager, self.hosts = built.manager, built.hosts
        self.manager = manager
        self.manager_task = asyncio.create_task(manager.run(), name="capl-manager")
        deadline = time.monotonic() + 60
        while not manager.ready:
            if self.manager_task.done():
                self.manager_task.result()
                raise CliError("capl's manager stopped during start-up (see its log)")
            if time.monotonic() > deadline:
                raise CliError("capl's manager did not sync its caches within 60 s")
            await asyncio.sleep(0.1)

    async def _create(self) -> None:
        assert self.client is not None
        assert self.plan is not None
        for obj in demo_objects(self.plan):
            await self.client.resource(resource_of(obj)).create(obj)
            self.created = True

    # -- the live view --------------------------------------------------------------------

    def _metrics_url(self) -> str | None:
        port = getattr(self.manager, "metrics_port", None)
        return f"http://127.0.0.1:{port}/metrics" if port else None

    async def _report(self) -> StatusReport:
        from capl.commands.status_report import collect

        assert self.client is not None
        assert self.plan is not None
        return await collect(self.client, namespace=self.plan.namespace, cluster=self.plan.name)

    def _caption(self, tracker: Tracker, report: StatusReport) -> str:
        parts = [ready_line(tracker.ready, tracker.expected, nodes=tracker.nodes)]
        for cluster in report.clusters:
            if cluster.ready != "True":
                parts.append(f"LibvirtCluster Ready={cluster.ready or '-'}")
                detail = condition_detail(report, "LibvirtCluster", cluster.libvirt_cluster or "")
                if detail:
                    parts.append(detail)
        if self.image_server is not None and self.image_server.sent < self.image_server.size:
            parts.append(self.image_server.progress())
        parts.append("Ctrl-C stops and cleans up")
        return " · ".join(parts)

    async def _watch(self) -> None:
        assert self.plan is not None
        assert self.plane is not None
        plan = self.plan
        tracker = Tracker(cluster=plan.name, expected=plan.machines, nodes=plan.real_nodes)
        deadline = time.monotonic() + self.options.ready_timeout
        title = f"capl demo: cluster {plan.name} on {plan.uri} ({plan.machines} machines)"
        if self.nodes is not None:
            title = (
                f"capl demo: cluster {plan.name} on {plan.uri} ({plan.machines} worker "
                f"machines; control plane on this machine, {self.nodes.endpoint})"
            )
        report: StatusReport | None = None
        with self.ui.live(title, nodes=plan.real_nodes) as view:
            while True:
                report = await self._update(tracker)
                view.show(tracker.rows, self._caption(tracker, report))
                if tracker.all_ready or time.monotonic() > deadline:
                    break
                await self._sleep(POLL)
        if not tracker.all_ready:
            from capl.commands.status import render_plain

            self.ui.say(render_plain(report))
            done = "machines with a Ready Node" if plan.real_nodes else "machines Ready"
            raise CliError(
                f"{tracker.ready} of {plan.machines} {done} after "
                f"{self.options.ready_timeout:.0f} s (--ready-timeout); the conditions above "
                "say what they wait for"
            )
        self.ready = True
        self.ui.say(ready_line(tracker.ready, plan.machines, nodes=plan.real_nodes))
        self.ui.say("")
        kubectl = _command("kubectl", self.plane.assets.kubectl)
        workload_kubeconfig = None
        if self.nodes is not None:
            workload_kubeconfig = str(self.nodes.kubeconfig)
            self.ui.say(
                f"The workload cluster (its control plane runs on this machine, "
                f"{self.nodes.endpoint}):\n  {kubectl} --kubeconfig {workload_kubeconfig} "
                "get nodes\n"
            )
        self.ui.say(
            next_steps(
                plan=plan,
                kubeconfig=str(self.kubeconfig),
                kubectl=kubectl,
                capl=_command("capl", Path(sys.argv[0])),
                metrics_url=self._metrics_url(),
                workload_kubeconfig=workload_kubeconfig,
                console_machine=tracker.rows[0].name if plan.real_nodes else None,
            )
        )
        if self.options.exit_when_ready:
            return
        await self._follow(tracker)

    async def _update(self, tracker: Tracker) -> StatusReport:
        """One poll: the status report, with real nodes also the workload cluster's Nodes."""
        self._check_manager()
        report = await self._report()
        nodes = await self.nodes.nodes() if self.nodes is not None else None
        tracker.update(report, now=time.time(), nodes=nodes)
        return report

    async def _follow(self, tracker: Tracker) -> None:
        """After Ready: a line per change until the demo is stopped."""
        lines = Lines(self.ui)
        lines.prime(tracker.rows)
        counts = (len(tracker.rows), tracker.ready)
        ready = "with a Ready Node" if tracker.nodes else "Ready"
        with contextlib.suppress(Interrupted):
            while True:
                await self._sleep(2.0)
                await self._update(tracker)
                lines.show(tracker.rows, "")
                now = (len(tracker.rows), tracker.ready)
                if now != counts:
                    counts = now
                    self.ui.say(f"now {now[0]} machines, {now[1]} of them {ready}")

    def _check_manager(self) -> None:
        if self.manager_task is not None and self.manager_task.done():
            exc = self.manager_task.exception() if not self.manager_task.cancelled() else None
            raise CliError(f"capl's manager stopped: {exc!r} (see logs/capl-manager.log)")
        if self.nodes is not None:
            self.nodes.check_running()


def _command(name: str, fallback: Path) -> str:
    """``name`` when it is on PATH (and the same program), else the full path."""
    found = shutil.which(name)
    if found and (fallback.name != name or Path(found).resolve() == fallback.resolve()):
        return name
    return str(fallback.resolve()) if fallback.exists() else name
