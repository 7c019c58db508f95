"""`ControllerHarness`: capl's controllers for real, for the tests (tests/controllers,
tests/libvirtd) and the benchmarks (bench/machines_testdriver.py, bench/machines_realvm.py).

The controllers run in a `capl.runtime.Manager` with `capl.kube.KubeClient` against a real
kube-apiserver (a `capl.testbed.ControlPlane` with the project's and the reduced Cluster API
CRDs of `capl.testing.crds`), `capl.virt.LibvirtHosts` against a libvirt test driver or a
real libvirtd, `capl.kube.workload` for workload clusters. Nothing is faked.

- `new_harness(kubeconfig, namespace, manager_kubeconfig=...)` / `close_harness(h)`: one
  with clients of its own, and everything it opened closed again (the pytest fixture
  `harness` is these two). The manager's client runs as deployed: with the identity bound
  to config/rbac's roles (`capl.testbed.identities`), never the admin's.
- `await h.start(setup, ...)`: build the Deps and call each `setup(manager, deps)` (the
  controllers' `setup` functions, e.g. `functools.partial(libvirtmachine.setup,
  options=...)`), run the manager, wait until it leads and its informers synced.
- Creators (on the builders of `capl.testing.objects`): `make_cluster(...)` creates a
  Cluster + its LibvirtCluster (optionally preparing each host's network and pool through the
  Hosts port and marking both provisioned, standing in for the cluster controller),
  `make_machine(...)` a bootstrap Secret + Machine + LibvirtMachine owned by it.
- `h.api` is a separate KubeClient for the caller's own reads and writes, so the manager's
  client (`h.client`, per-object request accounting on) counts only the controllers'
  requests: `h.writes(LIBVIRT_MACHINE, name)`.
- `await h.wait_for(resource, name, predicate)` polls the API server with a deadline;
  `settle` / `reconciled_after` wait for a controller to go idle.
- `gather_limited(jobs, limit=...)`: bulk creation with a bounded number in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from capl.api.cluster import LibvirtCluster
from capl.api.defaults import default_libvirt_cluster
from capl.controllers.common import Deps, layout
from capl.kube import KubeClient
from capl.kube.workload import KubeWorkloadClusters
from capl.ports.virt import (
    ClusterOwner,
    Host,
    NetworkMode,
    NetworkSpec,
    PoolSpec,
    VolumeFormat,
)
from capl.runtime.controller import Controller
from capl.runtime.errors import NotFound
from capl.runtime.manager import Manager, ManagerOptions
from capl.runtime.objects import Obj, ObjectKey
from capl.runtime.resources import CLUSTER, LIBVIRT_CLUSTER, LIBVIRT_MACHINE, Resource
from capl.testing.objects import (
    BASE_VOLUME,
    create_cluster_objects,
    create_machine_objects,
    is_ready,
    random_cidr,
    wait_for_absence,
    wait_for_object,
)
from capl.virt import LibvirtHosts
from capl.virt.snapshot import snapshots_of

TEST_DRIVER = "test:///default"
"""The per-process libvirt test driver: the harness's default host."""
GIB = 1024**3

Setup = Callable[[Manager, Deps], object]


@dataclass
class ClusterObjects:
    """A Cluster and its LibvirtCluster as created (`make_cluster`)."""

    cluster: Obj
    libvirt_cluster: Obj
    adopted_cidr: str | None = None
    """The CIDR `prepare_hosts` gives an adopted network it makes on every host."""

    @property
    def name(self) -> str:
        return str(self.cluster["metadata"]["name"])

    def layout_model(self) -> LibvirtCluster:
        """The LibvirtCluster as the controllers see it (defaults applied)."""
        return default_libvirt_cluster(LibvirtCluster.model_validate(self.libvirt_cluster))


@dataclass
class MachineObjects:
    """A Machine, its LibvirtMachine and bootstrap Secret as created (`make_machine`)."""

    machine: Obj
    libvirt_machine: Obj
    secret: Obj | None

    @property
    def name(self) -> str:
        return str(self.libvirt_machine["metadata"]["name"])


@dataclass
class _Prepared:
    """One host's network and pool made by `prepare_hosts`, for `cleanup_libvirt`."""

    uri: str
    owner: ClusterOwner
    network: str | None
    pool: str | None
    cluster: str


@dataclass
class ControllerHarness:
    """See the module docstring."""

    client: KubeClient
    api: KubeClient
    hosts: LibvirtHosts
    namespace: str
    # the test's own view of the hosts (its own connections): what the manager closes or
    # forgets (a deleted cluster's hosts) stays open here, as for any other libvirt client
    observer: LibvirtHosts = field(default_factory=LibvirtHosts)
    workload: KubeWorkloadClusters = field(default_factory=KubeWorkloadClusters)
    options: ManagerOptions | None = None
    manager: Manager = field(init=False)
    deps: Deps = field(init=False)
    _task: asyncio.Task[None] | None = field(default=None, init=False)
    _prepared: list[_Prepared] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        self.manager = Manager(
            self.options
            or ManagerOptions(
                namespace=self.namespace,
                metrics_bind_address="0",
                health_probe_bind_address="0",
                handle_signals=False,
                graceful_shutdown_timeout=5.0,
                concurrency=4,
            ),
            self.client,
        )
        self.deps = Deps(
            cache=self.manager.cache,
            client=self.client,
            recorder=self.manager.recorder,
            hosts=self.hosts,
            workload=self.workload,
            clock=self.manager.clock,
            snapshots=snapshots_of,  # as the manager: day-2 changes under a snapshot
        )

    # -- running -----------------------------------------------------------------------------

    async def start(self, *setups: Setup, within: float = 60.0) -> None:
        for setup in setups:
            setup(self.manager, self.deps)
        self._task = asyncio.create_task(self.manager.run(), name="harness-manager")
        deadline = time.monotonic() + within
        while not self.manager.leading.is_set():
            if self._task.done():
                self._task.result()
                raise AssertionError("the manager stopped before leading")
            if time.monotonic() > deadline:
                raise AssertionError("the manager did not start")
            await asyncio.sleep(0.02)
        await asyncio.wait_for(
            asyncio.gather(*(ctl.wait_synced() for ctl in self.manager.controllers)),
            timeout=max(1.0, deadline - time.monotonic()),
        )

    def controller(self, name: str) -> Controller:
        return self.manager.controller(name)

    async def settle(self, name: str, *, within: float = 30.0) -> Controller:
        """Wait until controller `name` has nothing queued or in progress (keys parked for
        a delayed requeue do not count); returns the controller."""
        controller = self.controller(name)
        deadline = time.monotonic() + within
        while controller.queue.depth() or controller.queue.processing:
            if time.monotonic() > deadline:
                raise AssertionError(f"controller {name} still busy after {within:.0f}s")
            await asyncio.sleep(0.01)
        return controller

    async def reconciled_after(
        self, name: str, action: Awaitable[Any], *, within: float = 30.0
    ) -> None:
        """Run `action` (e.g. a patch) and wait until controller `name` has reconciled since
        and gone idle: what it did about the change is visible afterwards."""
        controller = await self.settle(name, within=within)
        before = controller.reconciles
        await action
        deadline = time.monotonic() + within
        while controller.reconciles == before:
            if time.monotonic() > deadline:
                raise AssertionError(f"controller {name} did not reconcile within {within:.0f}s")
            await asyncio.sleep(0.01)
        await self.settle(name, within=within)

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            self.manager.stop()
            try:
                await asyncio.wait_for(task, timeout=30)
            except TimeoutError:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def close(self) -> None:
        """Stop the manager, remove the libvirt resources `prepare_hosts` made."""
        try:
            await self.stop()
        finally:
            await self.cleanup_libvirt()
            await self.workload.close()

    # -- API access --------------------------------------------------------------------------

    async def create(self, resource: Resource, obj: Obj) -> Obj:
        return await self.api.resource(resource).create(obj)

    async def get(self, resource: Resource, name: str) -> Obj | None:
        try:
            return await self.api.resource(resource).get(ObjectKey(self.namespace, name))
        except NotFound:
            return None

    async def patch(self, resource: Resource, name: str, patch: Mapping[str, Any]) -> Obj:
        return await self.api.resource(resource).patch(ObjectKey(self.namespace, name), patch)

    async def patch_status(self, resource: Resource, name: str, patch: Mapping[str, Any]) -> Obj:
        return await self.api.resource(resource).patch_status(
            ObjectKey(self.namespace, name), patch
        )

    async def delete(self, resource: Resource, name: str) -> None:
        with contextlib.suppress(NotFound):
            await self.api.resource(resource).delete(ObjectKey(self.namespace, name))

    async def wait_for(
        self,
        resource: Resource,
        name: str,
        predicate: Callable[[Obj], bool],
        *,
        within: float = 30.0,
        what: str = "",
    ) -> Obj:
        """Poll the API server until the object satisfies `predicate`; returns it."""
        return await wait_for_object(
            self.get,
            resource,
            name,
            predicate,
            namespace=self.namespace,
            within=within,
            what=what or "as expected",
            interval=0.02,
        )

    async def wait_gone(self, resource: Resource, name: str, *, within: float = 30.0) -> None:
        await wait_for_absence(self.get, resource, name, within=within, interval=0.05)

    def writes(self, resource: Resource, name: str) -> dict[str, int]:
        """The manager client's write requests to one object: {"PATCH": n, "PATCH/status": m}."""
        counts: dict[str, int] = {}
        for record, n in self.client.stats.object_counts(
            resource=resource, key=ObjectKey(self.namespace, name)
        ).items():
            if record.method in ("GET", "WATCH"):
                continue
            label = record.method + (f"/{record.subresource}" if record.subresource else "")
            counts[label] = counts.get(label, 0) + n
        return counts

    # -- cluster and machines ----------------------------------------------------------------

    async def make_cluster(
        self,
        name: str | None = None,
        *,
        hosts: Sequence[Mapping[str, Any]] | None = None,
        cidr: str | None = None,
        mode: str = "isolated",
        dns_domain: str | None = None,
        pool_path: str | None = None,
        prepare: bool = True,
        provisioned: bool = True,
        base_image: bool = True,
        paused: bool = False,
        adopt_network: bool = False,
    ) -> ClusterObjects:
        """Cluster + LibvirtCluster (owned by it). `prepare`: create each host's network and
        pool through the Hosts port (and a small base volume `BASE_VOLUME` when
        `base_image`); `provisioned`: mark both provisioned, as the cluster controller would.
        `adopt_network`: the LibvirtCluster adopts a network by name (`prepare` makes it on
        every host) — the way to several test-driver hosts (see `libvirt_cluster_obj`)."""
        name = name or "c-" + secrets.token_hex(3)
        hosts = hosts or [{"name": "h1", "uri": TEST_DRIVER}]
        cidr = cidr or random_cidr()
        adopted = f"capl-adopt-{secrets.token_hex(4)}" if adopt_network else None
        cluster, lc = await create_cluster_objects(
            self.create,
            name,
            self.namespace,
            hosts=hosts,
            cidr=cidr,
            mode=mode,
            dns_domain=dns_domain,
            pool_path=pool_path,
            paused=paused,
            adopt_network=adopted,
        )
        objects = ClusterObjects(cluster, lc, adopted_cidr=cidr if adopted else None)
        if prepare:
            await self.prepare_hosts(objects, base_image=base_image)
        if provisioned:
            await self.mark_provisioned(objects)
        return objects

    async def prepare_hosts(
        self,
        objects: ClusterObjects,
        *,
        base_image: bool = True,
        only: Sequence[str] | None = None,
    ) -> None:
        """Network and pool of the cluster on every host (or the hosts named in `only`),
        made through the Hosts port."""
        model = objects.layout_model()
        lay = layout(model)
        owner = ClusterOwner(
            namespace=self.namespace,
            name=str(objects.libvirt_cluster["metadata"]["name"]),
            uid=str(objects.libvirt_cluster["metadata"]["uid"]),
        )
        for entry in model.spec.hosts:
            if only is not None and entry.name not in only:
                continue
            host = self.observer.get(uri=str(entry.uri))
            prepared = _Prepared(str(entry.uri), owner, lay.network, lay.pool, objects.name)
            self._prepared.append(prepared)
            net = model.spec.network
            await host.ensure_network(
                NetworkSpec(
                    name=lay.network,
                    mode=NetworkMode("isolated" if objects.adopted_cidr else net.mode),
                    owner=owner,
                    cidr=objects.adopted_cidr or (None if net.cidr is None else str(net.cidr)),
                    dhcp_start=None if net.dhcp is None else str(net.dhcp.start),
                    dhcp_end=None if net.dhcp is None else str(net.dhcp.end),
                    dns_domain=net.dns_domain,
                    bridge=net.bridge,
                )
            )
            assert lay.pool_path is not None
            await host.ensure_pool(PoolSpec(name=lay.pool, path=lay.pool_path, owner=owner))
            if base_image:
                await host.create_volume(
                    pool=lay.pool, name=BASE_VOLUME, capacity_bytes=GIB, format=VolumeFormat.QCOW2
                )

    async def mark_provisioned(self, objects: ClusterObjects) -> None:
        """What the cluster controller and Cluster API would write once the network is up."""
        await self.patch_status(
            LIBVIRT_CLUSTER,
            str(objects.libvirt_cluster["metadata"]["name"]),
            {"status": {"initialization": {"provisioned": True}}},
        )
        await self.patch_status(
            CLUSTER,
            objects.name,
            {"status": {"initialization": {"infrastructureProvisioned": True}}},
        )

    async def make_machine(
        self,
        cluster: ClusterObjects,
        name: str | None = None,
        *,
        spec: Mapping[str, Any] | None = None,
        bootstrap: bytes | None = b"#cloud-config\n",
        format: str | None = None,
        failure_domain: str | None = None,
        control_plane: bool = False,
        owned: bool = True,
    ) -> MachineObjects:
        """Bootstrap Secret (unless `bootstrap` is None) + Machine + LibvirtMachine owned by
        the Machine (unless `owned` is False)."""
        machine, lm, secret = await create_machine_objects(
            self.create,
            name or "m-" + secrets.token_hex(3),
            self.namespace,
            cluster=cluster.name,
            spec=spec,
            bootstrap=bootstrap,
            format=format,
            failure_domain=failure_domain,
            control_plane=control_plane,
            owned=owned,
        )
        return MachineObjects(machine, lm, secret)

    async def wait_ready(self, name: str, *, within: float = 60.0) -> Obj:
        return await self.wait_for(LIBVIRT_MACHINE, name, is_ready, within=within, what="Ready")

    async def delete_machine(self, name: str, *, within: float = 60.0) -> None:
        await self.delete(LIBVIRT_MACHINE, name)
        await self.wait_gone(LIBVIRT_MACHINE, name, within=within)

    # -- libvirt -----------------------------------------------------------------------------

    def host(self, uri: str = TEST_DRIVER) -> Host:
        return self.observer.get(uri=uri)

    async def cleanup_libvirt(self) -> None:
        """Remove every domain, volume, network and pool of the clusters prepared here."""
        for prepared in reversed(self._prepared):
            host = self.observer.get(uri=prepared.uri)
            with contextlib.suppress(Exception):
                for info in await host.list_domains(cluster=prepared.cluster):
                    if info.owner is not None and info.owner.namespace == self.namespace:
                        await host.undefine_domain(info.uuid, owner=info.owner)
            if prepared.pool:
                with contextlib.suppress(Exception):
                    await host.delete_pool(name=prepared.pool, owner=prepared.owner)
            if prepared.network:
                with contextlib.suppress(Exception):
                    await host.delete_network(name=prepared.network, owner=prepared.owner)
        self._prepared.clear()


async def new_harness(
    kubeconfig: Path,
    namespace: str,
    *,
    manager_kubeconfig: Path,
    hosts: LibvirtHosts | None = None,
) -> ControllerHarness:
    """A harness in `namespace` with two clients of its own, not started: the manager's
    (`manager_kubeconfig`: the identity the manager is deployed with, e.g.
    `capl.testbed.identities.manager_kubeconfig(plane)`; counting requests per object) and
    the caller's (`kubeconfig`, e.g. the admin's)."""
    client = await KubeClient.connect(str(manager_kubeconfig), track_objects=True)
    api = await KubeClient.connect(str(kubeconfig))
    return ControllerHarness(
        client=client, api=api, hosts=hosts or LibvirtHosts(), namespace=namespace
    )


async def close_harness(harness: ControllerHarness) -> None:
    """Stop the harness, remove what it prepared, close its hosts and clients."""
    try:
        await harness.close()
    finally:
        await harness.hosts.close()
        await harness.observer.close()
        await harness.client.close()
        await harness.api.close()


async def gather_limited(jobs: Sequence[Awaitable[Any]], *, limit: int = 16) -> list[Any]:
    """Run awaitables with at most `limit` at a time (bulk object creation)."""
    sem = asyncio.Semaphore(limit)

    async def run(job: Awaitable[Any]) -> Any:
        async with sem:
            return await job

    return await asyncio.gather(*(run(j) for j in jobs))
