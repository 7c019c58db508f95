"""Shared fixtures and the `ControllerHarness` for controller tests (and benchmarks).

The controllers run for real: a `capl.runtime.Manager` with `capl.kube.KubeClient` against
the session's kube-apiserver (`control_plane`), `capl.virt.LibvirtHosts` against a libvirt
test driver (or the real libvirtd in tests/libvirtd), `capl.kube.workload` for workload
clusters. Nothing is faked.

Fixtures
- `capi_crds` (session): the Cluster API `Cluster` and `Machine` CRDs from the Cluster API
  build (`$CAPL_CAPI_DIR/config/crd/bases`, `make capi`), reduced to their v1beta2 storage
  version with no conversion webhook (no Cluster API manager runs here). When they are
  installed already with a conversion webhook (the e2e fixtures' real Cluster API), they are
  left as they are.
- `harness`: a `ControllerHarness` in the test's `namespace`, not started; stopped (and the
  libvirt resources it prepared removed) after the test.

`ControllerHarness` (also imported by tests/libvirtd and bench/)
- `await h.start(setup, ...)`: build the Deps and call each `setup(manager, deps)` (the
  controllers' `setup` functions, e.g. `functools.partial(libvirtmachine.setup,
  options=...)`), run the manager, wait until it leads and its informers synced.
- Object builders (plain dicts) and creators: `make_cluster(...)` creates a Cluster + its
  LibvirtCluster (optionally preparing each host's network and pool through the Hosts port
  and marking both provisioned, standing in for the cluster controller), `make_machine(...)`
  a bootstrap Secret + Machine + LibvirtMachine owned by it.
- `h.api` is a separate KubeClient for the test's own reads and writes, so the manager's
  client (`h.client`, per-object request accounting on) counts only the controllers' requests:
  `h.writes(LIBVIRT_MACHINE, name)`.
- `await h.wait_for(resource, name, predicate)` polls the API server with a deadline.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ipaddress
import os
import secrets
import struct
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web

from capl.api import constants as c
from capl.api.cluster import LibvirtCluster
from capl.api.defaults import default_libvirt_cluster
from capl.controllers.common import Deps, layout
from capl.kube import KubeClient
from capl.kube.workload import KubeWorkloadClusters
from capl.ports.errors import PoolNotFound
from capl.ports.naming import machine_hostname, machine_names
from capl.ports.virt import (
    ClusterOwner,
    DomainOwner,
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
from capl.runtime.resources import (
    CLUSTER,
    CUSTOM_RESOURCE_DEFINITION,
    EVENT,
    LIBVIRT_CLUSTER,
    LIBVIRT_MACHINE,
    MACHINE,
    SECRET,
    Resource,
)
from capl.testbed import ControlPlane
from capl.virt import LibvirtHosts
from tests.fixtures.common import require_part

CAPI_DIR_ENV = "CAPL_CAPI_DIR"
CAPI_CRD_FILES = ("cluster.x-k8s.io_clusters.yaml", "cluster.x-k8s.io_machines.yaml")
TEST_DRIVER = "test:///default"
BASE_VOLUME = "capl-test-base.qcow2"
GIB = 1024**3

Setup = Callable[[Manager, Deps], object]


# --- the Cluster API CRDs --------------------------------------------------------------------


def capi_crd_dir() -> Path:
    value = os.environ.get(CAPI_DIR_ENV) or ""
    candidates = [Path(value)] if value else []
    cache = Path(os.environ.get("CAPL_CACHE", Path.home() / ".cache" / "capl")) / "capi"
    if not value and cache.is_dir():
        candidates += sorted((p for p in cache.iterdir() if p.is_dir()), reverse=True)
    for root in candidates:
        bases = root / "config" / "crd" / "bases"
        if all((bases / f).is_file() for f in CAPI_CRD_FILES):
            return bases
    require_part(
        "the Cluster API CRDs (config/crd/bases of the Cluster API build)",
        f"run `make capi` and export {CAPI_DIR_ENV}=<the directory it prints>",
    )
    raise AssertionError("unreachable")


def reduced_crd(document: Mapping[str, Any]) -> dict[str, Any]:
    """The CRD with only its storage version (v1beta2) and no conversion webhook."""
    crd = dict(document)
    spec = dict(crd["spec"])
    spec["versions"] = [v for v in spec["versions"] if v.get("storage")]
    spec["conversion"] = {"strategy": "None"}
    crd["spec"] = spec
    metadata = dict(crd.get("metadata") or {})
    metadata.pop("annotations", None)
    crd["metadata"] = metadata
    return crd


async def install_capi_crds(plane: ControlPlane, workdir: Path) -> list[str]:
    """Install the reduced Cluster/Machine CRDs unless a real Cluster API installed them."""
    async with await KubeClient.connect(str(plane.kubeconfig)) as client:
        crds = client.resource(CUSTOM_RESOURCE_DEFINITION)
        present = []
        for filename in CAPI_CRD_FILES:
            name = filename.split("_", 1)[1].removesuffix(".yaml") + ".cluster.x-k8s.io"
            with contextlib.suppress(NotFound):
                crd = await crds.get(ObjectKey("", name))
                if (crd["spec"].get("conversion") or {}).get("strategy") == "Webhook":
                    present.append(name)
        if len(present) == len(CAPI_CRD_FILES):
            return present
    write_reduced_crds(capi_crd_dir(), workdir)
    return await plane.install_crds(workdir)


def write_reduced_crds(bases: Path, workdir: Path) -> None:
    workdir.mkdir(parents=True, exist_ok=True)
    for filename in CAPI_CRD_FILES:
        document = yaml.safe_load((bases / filename).read_text())
        (workdir / filename).write_text(yaml.safe_dump(reduced_crd(document)))


@pytest.fixture(scope="session")
async def capi_crds(
    control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> list[str]:
    return await install_capi_crds(control_plane, tmp_path_factory.mktemp("capi-crds"))


# --- object builders -------------------------------------------------------------------------


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def random_cidr() -> str:
    """A random /24 in 10.0.0.0/8 (test networks must not overlap on one host)."""
    return f"10.{secrets.randbelow(250) + 2}.{secrets.randbelow(256)}.0/24"


def cluster_obj(name: str, namespace: str, *, libvirt_cluster: str, paused: bool = False) -> Obj:
    spec: dict[str, Any] = {
        "infrastructureRef": {
            "apiGroup": c.GROUP,
            "kind": c.Kind.LIBVIRT_CLUSTER.value,
            "name": libvirt_cluster,
        }
    }
    if paused:
        spec["paused"] = True
    return {
        "apiVersion": c.CAPI_API_VERSION,
        "kind": "Cluster",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def libvirt_cluster_obj(
    name: str,
    namespace: str,
    *,
    cluster: Obj,
    hosts: Sequence[Mapping[str, Any]],
    cidr: str | None = None,
    mode: str = "isolated",
    dns_domain: str | None = None,
    pool_path: str | None = None,
) -> Obj:
    network: dict[str, Any] = {"mode": mode}
    if cidr is not None:
        network["cidr"] = cidr
    if dns_domain is not None:
        network["dnsDomain"] = dns_domain
    spec: dict[str, Any] = {"hosts": [dict(h) for h in hosts], "network": network}
    if pool_path is not None:
        spec["storagePool"] = {"path": pool_path}
    return {
        "apiVersion": c.API_VERSION,
        "kind": c.Kind.LIBVIRT_CLUSTER.value,
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {c.CLUSTER_NAME_LABEL: cluster["metadata"]["name"]},
            "ownerReferences": [owner_ref(cluster, controller=True)],
        },
        "spec": spec,
    }


def owner_ref(obj: Obj, *, controller: bool = False) -> dict[str, Any]:
    ref = {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "name": obj["metadata"]["name"],
        "uid": obj["metadata"]["uid"],
    }
    if controller:
        ref["controller"] = True
        ref["blockOwnerDeletion"] = True
    return ref


def bootstrap_secret_obj(
    name: str, namespace: str, *, data: bytes, format: str | None = None, cluster: str = ""
) -> Obj:
    payload = {c.BOOTSTRAP_DATA_KEY: b64(data)}
    if format is not None:
        payload[c.BOOTSTRAP_FORMAT_KEY] = b64(format.encode())
    labels = {c.CLUSTER_NAME_LABEL: cluster} if cluster else {}
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "type": "cluster.x-k8s.io/secret",
        "data": payload,
    }


def machine_obj(
    name: str,
    namespace: str,
    *,
    cluster: str,
    infra_name: str,
    bootstrap_secret: str | None,
    failure_domain: str | None = None,
    control_plane: bool = False,
) -> Obj:
    labels = {c.CLUSTER_NAME_LABEL: cluster}
    if control_plane:
        labels[c.CONTROL_PLANE_LABEL] = ""
    bootstrap: dict[str, Any] = {}
    if bootstrap_secret is not None:
        bootstrap["dataSecretName"] = bootstrap_secret
    else:
        bootstrap["configRef"] = {
            "apiGroup": "bootstrap.cluster.x-k8s.io",
            "kind": "KubeadmConfig",
            "name": name,
        }
    spec: dict[str, Any] = {
        "clusterName": cluster,
        "bootstrap": bootstrap,
        "infrastructureRef": {
            "apiGroup": c.GROUP,
            "kind": c.Kind.LIBVIRT_MACHINE.value,
            "name": infra_name,
        },
    }
    if failure_domain is not None:
        spec["failureDomain"] = failure_domain
    return {
        "apiVersion": c.CAPI_API_VERSION,
        "kind": "Machine",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": spec,
    }


def libvirt_machine_spec(**overrides: Any) -> dict[str, Any]:
    """A small TCG machine booting from the test base volume (test driver defaults)."""
    spec: dict[str, Any] = {
        "image": {"volume": BASE_VOLUME},
        "cpus": 1,
        "memoryMiB": 128,
        "domainType": "qemu",
    }
    spec.update(overrides)
    return spec


def libvirt_machine_obj(
    name: str,
    namespace: str,
    *,
    cluster: str,
    machine: Obj | None,
    spec: Mapping[str, Any],
    control_plane: bool = False,
) -> Obj:
    labels = {c.CLUSTER_NAME_LABEL: cluster}
    if control_plane:
        labels[c.CONTROL_PLANE_LABEL] = ""
    metadata: dict[str, Any] = {"name": name, "namespace": namespace, "labels": labels}
    if machine is not None:
        metadata["ownerReferences"] = [owner_ref(machine, controller=True)]
    return {
        "apiVersion": c.API_VERSION,
        "kind": c.Kind.LIBVIRT_MACHINE.value,
        "metadata": metadata,
        "spec": dict(spec),
    }


# --- the harness -----------------------------------------------------------------------------


@dataclass
class ClusterObjects:
    cluster: Obj
    libvirt_cluster: Obj

    @property
    def name(self) -> str:
        return str(self.cluster["metadata"]["name"])

    def layout_model(self) -> LibvirtCluster:
        return default_libvirt_cluster(LibvirtCluster.model_validate(self.libvirt_cluster))


@dataclass
class MachineObjects:
    machine: Obj
    libvirt_machine: Obj
    secret: Obj | None

    @property
    def name(self) -> str:
        return str(self.libvirt_machine["metadata"]["name"])


@dataclass
class _Prepared:
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
        deadline = time.monotonic() + within
        delay = 0.02
        last: Obj | None = None
        while True:
            last = await self.get(resource, name)
            if last is not None and predicate(last):
                return last
            if time.monotonic() > deadline:
                status = (last or {}).get("status")
                raise AssertionError(
                    f"{resource.kind} {self.namespace}/{name} not {what or 'as expected'} "
                    f"within {within:.0f}s; status: {status}"
                )
            await asyncio.sleep(delay)
            delay = min(delay * 1.5, 0.25)

    async def wait_gone(self, resource: Resource, name: str, *, within: float = 30.0) -> None:
        deadline = time.monotonic() + within
        while await self.get(resource, name) is not None:
            if time.monotonic() > deadline:
                raise AssertionError(f"{resource.kind} {name} still exists after {within:.0f}s")
            await asyncio.sleep(0.05)

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
    ) -> ClusterObjects:
        """Cluster + LibvirtCluster (owned by it). `prepare`: create each host's network and
        pool through the Hosts port (and a small base volume `BASE_VOLUME` when
        `base_image`); `provisioned`: mark both provisioned, as the cluster controller would."""
        name = name or "c-" + secrets.token_hex(3)
        hosts = hosts or [{"name": "h1", "uri": TEST_DRIVER}]
        cluster = await self.create(
            CLUSTER, cluster_obj(name, self.namespace, libvirt_cluster=name, paused=paused)
        )
        lc = await self.create(
            LIBVIRT_CLUSTER,
            libvirt_cluster_obj(
                name,
                self.namespace,
                cluster=cluster,
                hosts=hosts,
                cidr=cidr or random_cidr(),
                mode=mode,
                dns_domain=dns_domain,
                pool_path=pool_path,
            ),
        )
        objects = ClusterObjects(cluster, lc)
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
            host = self.hosts.get(uri=str(entry.uri))
            prepared = _Prepared(str(entry.uri), owner, lay.network, lay.pool, objects.name)
            self._prepared.append(prepared)
            net = model.spec.network
            await host.ensure_network(
                NetworkSpec(
                    name=lay.network,
                    mode=NetworkMode(net.mode),
                    owner=owner,
                    cidr=None if net.cidr is None else str(net.cidr),
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
        name = name or "m-" + secrets.token_hex(3)
        secret = None
        secret_name = None
        if bootstrap is not None:
            secret_name = f"{name}-bootstrap"
            secret = await self.create(
                SECRET,
                bootstrap_secret_obj(
                    secret_name, self.namespace, data=bootstrap, format=format, cluster=cluster.name
                ),
            )
        machine = await self.create(
            MACHINE,
            machine_obj(
                name,
                self.namespace,
                cluster=cluster.name,
                infra_name=name,
                bootstrap_secret=secret_name,
                failure_domain=failure_domain,
                control_plane=control_plane,
            ),
        )
        lm = await self.create(
            LIBVIRT_MACHINE,
            libvirt_machine_obj(
                name,
                self.namespace,
                cluster=cluster.name,
                machine=machine if owned else None,
                spec=spec or libvirt_machine_spec(),
                control_plane=control_plane,
            ),
        )
        return MachineObjects(machine, lm, secret)

    async def wait_ready(self, name: str, *, within: float = 60.0) -> Obj:
        return await self.wait_for(LIBVIRT_MACHINE, name, is_ready, within=within, what="Ready")

    async def delete_machine(self, name: str, *, within: float = 60.0) -> None:
        await self.delete(LIBVIRT_MACHINE, name)
        await self.wait_gone(LIBVIRT_MACHINE, name, within=within)

    # -- libvirt -----------------------------------------------------------------------------

    def host(self, uri: str = TEST_DRIVER) -> Host:
        return self.hosts.get(uri=uri)

    async def cleanup_libvirt(self) -> None:
        """Remove every domain, volume, network and pool of the clusters prepared here."""
        for prepared in reversed(self._prepared):
            host = self.hosts.get(uri=prepared.uri)
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


async def leftovers(
    harness: ControllerHarness, cluster: ClusterObjects, machine: str, *, uri: str = TEST_DRIVER
) -> list[str]:
    """What of machine `machine` exists on the host: domains, volumes, DHCP hosts, DNS names
    (empty when nothing is left)."""
    found: list[str] = []
    model = cluster.layout_model()
    lay = layout(model)
    names = machine_names(namespace=harness.namespace, name=machine)
    hostname = machine_hostname(machine)
    host = harness.hosts.get(uri=uri)
    for info in await host.list_domains():
        if info.name == names.domain or (
            info.owner is not None
            and (info.owner.namespace, info.owner.name) == (harness.namespace, machine)
        ):
            found.append(f"domain {info.name} ({info.uuid})")
    with contextlib.suppress(PoolNotFound):
        for ref in await host.list_volumes(pool=lay.pool, prefix=names.prefix, refresh=True):
            found.append(f"volume {ref.name}")
    network = await host.get_network(lay.network)
    if network is not None:
        found += [f"dhcp {h.mac} {h.name}" for h in network.dhcp_hosts if h.name == hostname]
        found += [
            f"dns {d.ip} {d.hostnames}"
            for d in network.dns_hosts
            if any(n == hostname or n.startswith(hostname + ".") for n in d.hostnames)
        ]
    return found


async def events_of(harness: ControllerHarness, name: str) -> list[tuple[str, str, str]]:
    """(type, reason, message) of the Events about object `name` in the namespace."""
    listing = await harness.api.resource(EVENT).list(namespace=harness.namespace)
    return [
        (str(e.get("type")), str(e.get("reason")), str(e.get("message")))
        for e in listing.items
        if (e.get("involvedObject") or {}).get("name") == name
    ]


class ImageServer:
    """A loopback HTTP server for base images: `files[path] = bytes`, 404 otherwise."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.requests: list[str] = []
        self.base = ""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.requests.append(request.path)
        data = self.files.get(request.path)
        if data is None:
            return web.Response(status=404, text="not here")
        return web.Response(body=data, content_type="application/octet-stream")

    def url(self, path: str) -> str:
        return self.base + path


@pytest.fixture
async def image_server() -> AsyncIterator[ImageServer]:
    server = ImageServer()
    app = web.Application()
    app.router.add_get("/{tail:.*}", server.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    server.base = f"http://127.0.0.1:{port}"
    try:
        yield server
    finally:
        await runner.cleanup()


def qcow2_image(virtual_size: int = GIB, body: int = 4096) -> bytes:
    """Bytes that look like a qcow2 image to the importer (header with the virtual size)."""
    header = b"QFI\xfb" + struct.pack(">I", 3) + b"\0" * 16 + struct.pack(">Q", virtual_size)
    return header + b"\x01" * body


def is_ready(obj: Obj) -> bool:
    return condition(obj, c.ConditionType.READY) == "True"


def condition(obj: Obj, type_: str, field_: str = "status") -> str | None:
    for cond in (obj.get("status") or {}).get("conditions") or ():
        if cond.get("type") == type_:
            value = cond.get(field_)
            return None if value is None else str(value)
    return None


def domain_owner(obj: Obj) -> DomainOwner:
    """The owner tag the controller writes for a LibvirtMachine."""
    md = obj["metadata"]
    return DomainOwner(
        cluster=md["labels"][c.CLUSTER_NAME_LABEL],
        namespace=md["namespace"],
        name=md["name"],
        uid=md["uid"],
    )


def network_of(obj: Obj) -> ipaddress.IPv4Network:
    return ipaddress.IPv4Network(obj["spec"]["network"]["cidr"])


# --- fixtures --------------------------------------------------------------------------------


async def new_harness(
    kubeconfig: Path, namespace: str, *, hosts: LibvirtHosts | None = None
) -> ControllerHarness:
    client = await KubeClient.connect(str(kubeconfig), track_objects=True)
    api = await KubeClient.connect(str(kubeconfig))
    return ControllerHarness(
        client=client, api=api, hosts=hosts or LibvirtHosts(), namespace=namespace
    )


async def close_harness(harness: ControllerHarness) -> None:
    try:
        await harness.close()
    finally:
        await harness.hosts.close()
        await harness.client.close()
        await harness.api.close()


@pytest.fixture
async def harness(
    control_plane: ControlPlane, capi_crds: list[str], namespace: str
) -> AsyncIterator[ControllerHarness]:
    h = await new_harness(control_plane.kubeconfig, namespace)
    try:
        yield h
    finally:
        await close_harness(h)


async def gather_limited(jobs: Sequence[Awaitable[Any]], *, limit: int = 16) -> list[Any]:
    """Run awaitables with at most `limit` at a time (bulk object creation)."""
    sem = asyncio.Semaphore(limit)

    async def run(job: Awaitable[Any]) -> Any:
        async with sem:
            return await job

    return await asyncio.gather(*(run(j) for j in jobs))
