"""The capl side of bench/migration.py: a machine moved by LibvirtMachineMigrations through a
real `capl manager` process, as tests/multihost/test_machine_migration.py does it.

- `CaplSide.cluster()`: credentials Secrets (the bed's client certificate), a Cluster and a
  LibvirtCluster in bridge mode on kvm1 and kvm2 (the bed's LAN bridge, each host its own
  pool directory: the disks are copied); the manager's LibvirtCluster controller provisions
  network and pool on both; the Cluster is then marked provisioned (standing in for Cluster
  API core, which does not run).
- `CaplSide.boot()`: a bootstrap Secret, Machine and LibvirtMachine (the test image, 1 vCPU,
  256 MiB, TCG, on kvm1), until the LibvirtMachine reports an InternalIP.
- `CaplSide.move(to)`: a LibvirtMachineMigration with `targetHost` created; timed from just
  before the create to the moment this process's watch sees `phase: Succeeded`. The same
  watch records when each phase first showed and when the machine controller acknowledged
  the target (the LibvirtMachine's `Migrating` condition True), so the time splits into
  scheduling, handshake, preparation, running (the libvirt call) and finalizing. Downtime
  and libvirt's job time are the migration's own report (`status.state.downtimeMs`; the job
  time in the Succeeded message is libvirt's ``time_elapsed``). Afterwards (untimed) it
  waits until the machine reports the target as its host again, so the next measurement
  starts on a settled manager. `add_log` adds the manager's log lines of the move and, from
  their timestamps, how long the migrate3 call took and how much of it was not libvirt's job.
- `CaplSide.teardown()`: machine and cluster deleted through the manager, then whatever is
  left of the namespace swept from both hosts directly (`sweep_host`).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import libvirt

from capl.api import constants as c
from capl.kube import KubeClient
from capl.ports.naming import machine_names
from capl.runtime.errors import NotFound
from capl.runtime.informer import Cache, FuncHandler
from capl.runtime.objects import Obj, ObjectKey
from capl.runtime.resources import (
    CLUSTER,
    LIBVIRT_CLUSTER,
    LIBVIRT_MACHINE,
    LIBVIRT_MACHINE_MIGRATION,
    MACHINE,
    SECRET,
    Resource,
)
from capl.testbed.multihost import MultihostBed
from capl.testing.objects import (
    cluster_obj,
    condition,
    create_machine_objects,
    libvirt_cluster_obj,
)

HOSTS = ("kvm1", "kvm2")
ENDPOINT = "10.231.0.59"
"""The cluster's control-plane endpoint (a LAN address no guest gets: outside the range)."""
MACHINE_NAME = "worker"
_JOB = re.compile(r" in (\d+(?:\.\d+)?) s$")
PHASES = ("PreparingTarget", "Running", "Finalizing", "Succeeded", "Failed")


def internal_ip(obj: Mapping[str, Any]) -> str | None:
    for address in (obj.get("status") or {}).get("addresses") or ():
        if address.get("type") == "InternalIP":
            return str(address.get("address"))
    return None


@dataclass
class Seen:
    """When this process's watch first saw something (perf_counter and wall clock)."""

    perf: float
    wall: float

    @classmethod
    def now(cls) -> Seen:
        return cls(perf=time.perf_counter(), wall=time.time())


@dataclass
class MigrationWatch:
    """Phases of the namespace's migrations and the machine's Migrating condition, as seen."""

    client: KubeClient
    namespace: str
    phases: dict[str, dict[str, Seen]] = field(default_factory=dict)
    acknowledged: list[Seen] = field(default_factory=list)
    """Each time the machine's Migrating condition turned True."""
    finished: dict[str, asyncio.Event] = field(default_factory=dict)
    cache: Cache | None = None

    def _migration(self, obj: Obj) -> None:
        name = str(obj["metadata"]["name"])
        phase = (obj.get("status") or {}).get("phase")
        seen = self.phases.setdefault(name, {})
        if phase and phase not in seen:
            seen[phase] = Seen.now()
            if phase in ("Succeeded", "Failed"):
                self.finished.setdefault(name, asyncio.Event()).set()

    def _machine(self, old: Obj | None, new: Obj) -> None:
        was = condition(old, c.ConditionType.MIGRATING) if old is not None else None
        if condition(new, c.ConditionType.MIGRATING) == "True" and was != "True":
            self.acknowledged.append(Seen.now())

    async def start(self) -> None:
        self.cache = Cache(self.client, namespace=self.namespace)
        self.cache.informer(LIBVIRT_MACHINE_MIGRATION).add_handler(
            FuncHandler(add=self._migration, update=lambda _o, new: self._migration(new))
        )
        self.cache.informer(LIBVIRT_MACHINE).add_handler(
            FuncHandler(add=lambda o: self._machine(None, o), update=self._machine)
        )
        resources = [LIBVIRT_MACHINE_MIGRATION, LIBVIRT_MACHINE]
        self.cache.start(resources)
        await self.cache.wait_synced(resources)

    async def stop(self) -> None:
        if self.cache is not None:
            await self.cache.stop()

    async def wait_finished(self, name: str, *, within: float) -> None:
        await asyncio.wait_for(self.finished.setdefault(name, asyncio.Event()).wait(), within)


@dataclass
class CaplSide:
    bed: MultihostBed
    api: KubeClient
    namespace: str
    image: Path
    cluster_name: str = "mig"
    watch: MigrationWatch | None = None
    lcluster: Obj = field(default_factory=dict)
    host: str = ""
    moves: int = 0

    # -- API ----------------------------------------------------------------------------------

    async def create(self, resource: Resource, obj: Obj) -> Obj:
        obj.setdefault("metadata", {})["namespace"] = self.namespace
        return await self.api.resource(resource).create(obj)

    async def get(self, resource: Resource, name: str) -> Obj | None:
        try:
            return await self.api.resource(resource).get(ObjectKey(self.namespace, name))
        except NotFound:
            return None

    async def wait_for(
        self, resource: Resource, name: str, ok: Any, *, within: float, what: str
    ) -> Obj:
        deadline = time.monotonic() + within
        while True:
            obj = await self.get(resource, name)
            if obj is not None and ok(obj):
                return obj
            if time.monotonic() > deadline:
                status = (obj or {}).get("status")
                raise RuntimeError(f"{resource.kind} {name}: not {what} in {within:g} s: {status}")
            await asyncio.sleep(0.25)

    async def still_there_after(self, resource: Resource, name: str, within: float) -> bool:
        """Waits until the object is gone; True when it is still there after `within`."""
        deadline = time.monotonic() + within
        while await self.get(resource, name) is not None:
            if time.monotonic() > deadline:
                return True
            await asyncio.sleep(0.25)
        return False

    # -- set-up -------------------------------------------------------------------------------

    @property
    def pool(self) -> str:
        return str(self.lcluster["spec"]["storagePool"]["name"])

    @property
    def pool_path(self) -> str:
        return str(self.lcluster["spec"]["storagePool"]["path"])

    @property
    def network(self) -> str:
        return str(((self.lcluster.get("spec") or {}).get("network") or {}).get("name") or "")

    async def cluster(self) -> Obj:
        hosts = []
        for name in HOSTS:
            secret = f"{name}-credentials"
            data = self.bed.host(name).credentials
            await self.create(
                SECRET,
                {
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "metadata": {"name": secret},
                    "data": {k: base64.b64encode(v).decode() for k, v in data.items()},
                },
            )
            hosts.append(
                {"name": name, "uri": self.bed.host(name).uri, "credentialsRef": {"name": secret}}
            )
        name = self.cluster_name
        cluster = await self.create(
            CLUSTER, cluster_obj(name, self.namespace, libvirt_cluster=name)
        )
        lc = libvirt_cluster_obj(
            name, self.namespace, cluster=cluster, hosts=hosts, mode="bridge",
            bridge=self.bed.host_bridge,
        )  # fmt: skip
        lc["spec"]["controlPlaneEndpoint"] = {"host": ENDPOINT, "port": 6443}
        await self.create(LIBVIRT_CLUSTER, lc)
        self.lcluster = await self.wait_for(
            LIBVIRT_CLUSTER,
            name,
            provisioned,
            within=120,
            what="provisioned on kvm1 and kvm2",
        )
        await self.api.resource(CLUSTER).patch_status(
            ObjectKey(self.namespace, name),
            {"status": {"initialization": {"infrastructureProvisioned": True}}},
        )
        self.watch = MigrationWatch(self.api, self.namespace)
        await self.watch.start()
        return self.lcluster

    def machine_spec(self, host: str) -> dict[str, Any]:
        return {
            "image": {"path": str(self.image), "format": "qcow2"},
            "cpus": 1,
            "memoryMiB": 256,
            "domainType": "qemu",
            "hostName": host,
        }

    async def boot(self, host: str, *, within: float) -> float:
        started = time.perf_counter()
        await create_machine_objects(
            self.create,
            MACHINE_NAME,
            self.namespace,
            cluster=self.cluster_name,
            spec=self.machine_spec(host),
        )
        await self.wait_for(
            LIBVIRT_MACHINE, MACHINE_NAME, lambda o: bool(internal_ip(o)), within=within,
            what="given an address",
        )  # fmt: skip
        self.host = host
        return time.perf_counter() - started

    # -- one move -----------------------------------------------------------------------------

    async def move(self, to: str, *, within: float = 300.0) -> dict[str, Any]:
        watch = self.watch
        assert watch is not None
        self.moves += 1
        name = f"{MACHINE_NAME}-{self.moves}-to-{to}"
        acked_before = len(watch.acknowledged)
        start = Seen.now()
        await self.create(
            LIBVIRT_MACHINE_MIGRATION,
            {
                "apiVersion": c.API_VERSION,
                "kind": "LibvirtMachineMigration",
                "metadata": {"name": name},
                "spec": {"machineName": MACHINE_NAME, "targetHost": to},
            },
        )
        await watch.wait_finished(name, within=within)
        seen = watch.phases[name]
        done = await self.get(LIBVIRT_MACHINE_MIGRATION, name)
        status = (done or {}).get("status") or {}
        if status.get("phase") != "Succeeded":
            raise RuntimeError(f"migration {name} ended {status.get('phase')}: {status}")
        acked = watch.acknowledged[acked_before] if len(watch.acknowledged) > acked_before else None
        await self.wait_for(
            LIBVIRT_MACHINE, MACHINE_NAME,
            lambda o: (o.get("status") or {}).get("host") == to
            and condition(o, c.ConditionType.MIGRATING) != "True",
            within=120, what=f"reporting {to} as its host",
        )  # fmt: skip
        settled = time.perf_counter() - start.perf
        origin, self.host = self.host, to
        message = str(status.get("message") or "")
        job = _JOB.search(message)

        def at(mark: Seen | None) -> float | None:
            return None if mark is None else round(mark.perf - start.perf, 3)

        marks = {
            "PreparingTarget": at(seen.get("PreparingTarget")),
            "acknowledged": at(acked),
            "Running": at(seen.get("Running")),
            "Finalizing": at(seen.get("Finalizing")),
            "Succeeded": at(seen.get("Succeeded")),
        }
        return {
            "migration": name,
            "from": origin,
            "to": to,
            "started_at": start.wall,
            "finished_at": seen["Succeeded"].wall,
            "seconds": seen["Succeeded"].perf - start.perf,
            "job_s": float(job.group(1)) if job else None,
            "downtime_ms": (status.get("state") or {}).get("downtimeMs"),
            "data_processed_bytes": (status.get("state") or {}).get("dataProcessedBytes"),
            "copy_storage": status.get("copyStorage"),
            "seen_at_s": marks,
            "split_s": split(marks),
            "machine_settled_s": round(settled, 3),
            "message": message,
        }

    def add_log(self, move: dict[str, Any], lines: list[dict[str, Any]]) -> None:
        """The manager's log lines of `move`; from them, the migrate3 call (``migrating ...``
        logged as it starts, ``migrated ... in`` after it and its checks) and its part
        outside libvirt's job."""
        move["log"] = lines
        begin = next(
            (x["t_s"] for x in lines if str(x.get("event")).startswith("migrating ")), None
        )
        end = next((x["t_s"] for x in lines if str(x.get("event")).startswith("migrated ")), None)
        call = None if begin is None or end is None else round(end - begin, 3)
        move["migrate_call_s"] = call
        job = move.get("job_s")
        move["outside_job_s"] = None if call is None or job is None else round(call - job, 3)
        move["capl_steps_s"] = None if call is None else round(move["seconds"] - call, 3)

    # -- the end ------------------------------------------------------------------------------

    async def teardown(self, *, within: float = 150.0) -> None:
        """Machine, then cluster, deleted through the manager (waits until they are gone)."""
        if self.watch is not None:
            await self.watch.stop()
        for resource, name in (
            (LIBVIRT_MACHINE, MACHINE_NAME),
            (MACHINE, MACHINE_NAME),
            (SECRET, f"{MACHINE_NAME}-bootstrap"),
        ):
            with contextlib.suppress(NotFound):
                await self.api.resource(resource).delete(ObjectKey(self.namespace, name))
        if await self.still_there_after(LIBVIRT_MACHINE, MACHINE_NAME, within):
            raise RuntimeError(f"LibvirtMachine {MACHINE_NAME} not deleted in {within:g} s")
        for resource in (LIBVIRT_CLUSTER, CLUSTER):
            with contextlib.suppress(NotFound):
                await self.api.resource(resource).delete(
                    ObjectKey(self.namespace, self.cluster_name)
                )
        if await self.still_there_after(LIBVIRT_CLUSTER, self.cluster_name, within):
            raise RuntimeError(f"LibvirtCluster {self.cluster_name} not deleted in {within:g} s")

    def sweep(self) -> list[str]:
        """Directly on both hosts: the namespace's domains, the cluster's pool and network."""
        prefix = machine_names(namespace=self.namespace, name=MACHINE_NAME).prefix
        removed: list[str] = []
        for host in HOSTS:
            removed += sweep_host(
                self.bed.host(host).local_uri,
                host=host,
                domain_prefix=prefix,
                pool=self.pool if self.lcluster else None,
                network=self.network or None,
            )
        return removed


def provisioned(obj: Obj) -> bool:
    return bool(((obj.get("status") or {}).get("initialization") or {}).get("provisioned"))


def split(marks: Mapping[str, float | None]) -> dict[str, float | None]:
    """Seconds between the marks: scheduling (create -> PreparingTarget), handshake (->
    the machine controller's acknowledgement), preparation (-> Running), running (the
    libvirt call with its checks -> Finalizing), finalizing (-> Succeeded)."""
    order = [
        ("scheduling", None, "PreparingTarget"),
        ("handshake", "PreparingTarget", "acknowledged"),
        ("preparation", "acknowledged", "Running"),
        ("running", "Running", "Finalizing"),
        ("finalizing", "Finalizing", "Succeeded"),
    ]
    out: dict[str, float | None] = {}
    for label, a, b in order:
        begin = 0.0 if a is None else marks.get(a)
        end = marks.get(b)
        out[label] = None if begin is None or end is None else round(end - begin, 3)
    return out


def sweep_host(
    uri: str, *, host: str, domain_prefix: str, pool: str | None, network: str | None
) -> list[str]:
    """Remove domains named `domain_prefix`*, the pool `pool` with its volumes and the network
    `network` from one host (direct libvirt calls); what was removed."""
    removed: list[str] = []
    conn = libvirt.open(uri)
    try:
        for dom in conn.listAllDomains(0):
            with contextlib.suppress(libvirt.libvirtError):
                if not dom.name().startswith(domain_prefix):
                    continue
                if dom.isActive():
                    dom.destroy()
                dom.undefine()
                removed.append(f"{host}: domain {dom.name()}")
        if pool:
            with contextlib.suppress(libvirt.libvirtError):
                handle = conn.storagePoolLookupByName(pool)
                with contextlib.suppress(libvirt.libvirtError):
                    handle.refresh(0)
                for vol in handle.listAllVolumes(0):
                    with contextlib.suppress(libvirt.libvirtError):
                        vol.delete(0)
                        removed.append(f"{host}: volume {vol.name()}")
                for step in (handle.destroy, lambda: handle.delete(0), handle.undefine):
                    with contextlib.suppress(libvirt.libvirtError):
                        step()
                removed.append(f"{host}: pool {pool}")
        if network:
            with contextlib.suppress(libvirt.libvirtError):
                net = conn.networkLookupByName(network)
                for step in (net.destroy, net.undefine):
                    with contextlib.suppress(libvirt.libvirtError):
                        step()
                removed.append(f"{host}: network {network}")
    finally:
        conn.close()
    return removed
