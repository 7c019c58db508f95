"""The site of tests/multihost/test_maintenance.py: one namespace of the management cluster
(`Site`: create, get, list, wait, the real `capl` CLI, a watcher of every host a
LibvirtMachine ever names, `explain`), readers of the LibvirtCluster's host and
failure-domain status, of libvirt (`traces`) and of `capl hosts`, the Events of a
maintenance, the MachineDeployment the test rolls, and the teardown.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import libvirt

from capl.api import constants as c
from capl.kube import KubeClient
from capl.runtime.errors import NotFound
from capl.runtime.objects import Obj, ObjectKey, get_path
from capl.runtime.resources import (
    CLUSTER,
    EVENT,
    LIBVIRT_CLUSTER,
    LIBVIRT_MACHINE,
    LIBVIRT_MACHINE_MIGRATION,
    LIBVIRT_MACHINE_TEMPLATE,
    MACHINE,
    SECRET,
    Resource,
)
from capl.testbed.caplmanager import capl_command
from capl.testbed.multihost import MultihostBed
from capl.testing.objects import (
    bootstrap_secret_obj,
    condition_of,
)
from tests.e2e.harness import (
    CLUSTER_NAME_LABEL,
    DEPLOYMENT_NAME_LABEL,
    KUBERNETES_VERSION,
    MACHINE_DEPLOYMENT,
    Management,
    internal_ip,
)
from tests.fixtures.common import eventually
from tests.fixtures.libvirt_direct import open_libvirt, sweep_namespace

CLUSTER_NAME = "maint"
MD = f"{CLUSTER_NAME}-md"
HOSTS = ("kvm1", "kvm2")
ENDPOINT = {"host": "10.231.0.52", "port": 6443}
BOOT = 240.0  # TCG guests on two shared cores
BLOCKED = "stay: evictionStrategy None"


# --- the site: one namespace of the management cluster, the CLI, libvirt ------------------------


@dataclass(frozen=True)
class CliRun:
    code: int
    out: str
    err: str


@dataclass
class Site:
    management: Management
    lan: MultihostBed
    namespace: str
    seen_hosts: dict[str, list[str]] = field(default_factory=dict)
    """LibvirtMachine name -> every spec.hostName it was seen with, in order (the watcher)."""

    @property
    def api(self) -> KubeClient:
        return self.management.api

    async def create(self, resource: Resource, obj: Obj) -> Obj:
        obj.setdefault("metadata", {})["namespace"] = self.namespace
        return await self.api.resource(resource).create(obj)

    async def get(self, resource: Resource, name: str) -> Obj | None:
        try:
            return await self.api.resource(resource).get(ObjectKey(self.namespace, name))
        except NotFound:
            return None

    async def list(self, resource: Resource, selector: str | None = None) -> list[Obj]:
        listing = await self.api.resource(resource).list(
            namespace=self.namespace, label_selector=selector
        )
        return listing.items

    async def wait(
        self,
        resource: Resource,
        name: str,
        predicate: Callable[[Obj], bool],
        *,
        within: float,
        what: str,
    ) -> Obj:
        async def probe() -> Obj | None:
            obj = await self.get(resource, name)
            return obj if obj is not None and predicate(obj) else None

        return await eventually(
            probe, within=within, what=f"{resource.kind} {name}: {what}", explain=self.explain
        )

    async def wait_gone(self, resource: Resource, name: str, *, within: float) -> None:
        async def gone() -> bool:
            return await self.get(resource, name) is None

        await eventually(
            gone, within=within, what=f"{resource.kind} {name} gone", explain=self.explain
        )

    async def libvirt_cluster(self) -> Obj:
        obj = await self.get(LIBVIRT_CLUSTER, CLUSTER_NAME)
        assert obj is not None
        return obj

    async def wait_cluster(self, predicate: Callable[[Obj], bool], what: str) -> Obj:
        return await self.wait(LIBVIRT_CLUSTER, CLUSTER_NAME, predicate, within=120, what=what)

    async def md_machine(self) -> Obj | None:
        """The MachineDeployment's Machine when it has exactly one, not being deleted."""
        selector = f"{CLUSTER_NAME_LABEL}={CLUSTER_NAME},{DEPLOYMENT_NAME_LABEL}={MD}"
        found = await self.list(MACHINE, selector)
        if len(found) != 1 or found[0]["metadata"].get("deletionTimestamp"):
            return None
        return found[0]

    async def capl(self, *argv: str) -> CliRun:
        """The real CLI as a subprocess against the management cluster's kubeconfig."""
        proc = await asyncio.create_subprocess_exec(
            *capl_command(),
            *argv,
            "-n",
            self.namespace,
            "--kubeconfig",
            str(self.management.plane.kubeconfig),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout=120)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise
        assert proc.returncode is not None
        return CliRun(proc.returncode, out.decode(), err.decode())

    async def watch_hosts(self) -> None:
        """Record every spec.hostName every LibvirtMachine of the namespace shows (polls
        until cancelled): proves where a machine never was."""
        while True:
            for lm in await self.list(LIBVIRT_MACHINE):
                host = get_path(lm, "spec", "hostName")
                seen = self.seen_hosts.setdefault(lm["metadata"]["name"], [])
                if host and (not seen or seen[-1] != host):
                    seen.append(str(host))
            await asyncio.sleep(0.25)

    async def explain(self) -> str:
        lines: list[str] = []
        with contextlib.suppress(Exception):
            lc = await self.libvirt_cluster()
            for entry in get_path(lc, "status", "hosts") or ():
                lines.append(f"host {entry.get('name')}: maintenance={entry.get('maintenance')}")
            lines.append(f"failureDomains: {get_path(lc, 'status', 'failureDomains')}")
            for m in await self.list(MACHINE):
                lines.append(
                    f"Machine {m['metadata']['name']}: phase={get_path(m, 'status', 'phase')} "
                    f"deleting={bool(m['metadata'].get('deletionTimestamp'))}"
                )
            for lm in await self.list(LIBVIRT_MACHINE):
                ready = condition_of(lm, c.ConditionType.READY)
                lines.append(
                    f"LibvirtMachine {lm['metadata']['name']}: "
                    f"hostName={get_path(lm, 'spec', 'hostName')} "
                    f"host={get_path(lm, 'status', 'host')} "
                    f"migrationTarget={get_path(lm, 'spec', 'migrationTarget')} "
                    f"ip={internal_ip(lm)} Ready={ready.get('status')} {ready.get('reason')} "
                    f"{str(ready.get('message'))[:200]}"
                )
            for mig in await self.list(LIBVIRT_MACHINE_MIGRATION):
                status = mig.get("status") or {}
                lines.append(
                    f"migration {mig['metadata']['name']}: {status.get('phase')} "
                    f"{status.get('sourceHost')}->{status.get('targetHost')} "
                    f"{status.get('message')}"
                )
        return "\n".join(lines)


def host_status(lc: Obj, name: str) -> dict[str, Any]:
    for entry in get_path(lc, "status", "hosts") or ():
        if entry.get("name") == name:
            return dict(entry)
    return {}


def maintenance_of(lc: Obj, name: str) -> dict[str, Any] | None:
    value = host_status(lc, name).get("maintenance")
    return dict(value) if value is not None else None


def control_plane_allowed(obj: Obj, name: str) -> bool | None:
    """status.failureDomains[name].controlPlane (LibvirtCluster or Cluster)."""
    for fd in get_path(obj, "status", "failureDomains") or ():
        if fd.get("name") == name:
            return bool(fd.get("controlPlane"))
    return None


def guest_spec(image: Path, strategy: str) -> dict[str, Any]:
    return {
        "image": {"path": str(image), "format": "qcow2"},
        "cpus": 1,
        "memoryMiB": 256,
        "domainType": "qemu",
        "evictionStrategy": strategy,
    }


def traces(lan: MultihostBed, host: str, namespace: str) -> list[str]:
    """Everything of the namespace on a host, read directly: domains (by name or capl's
    owner tag), storage pools, volumes in any pool, networks."""
    conn = open_libvirt(lan.host(host).local_uri)
    try:
        found = [f"domain {d.name()}" for d in conn.listAllDomains() if namespace in d.name()]
        for pool in conn.listAllStoragePools():
            if namespace in pool.name():
                found.append(f"pool {pool.name()}")
            if pool.isActive():
                with contextlib.suppress(libvirt.libvirtError):
                    pool.refresh(0)
                found += [
                    f"volume {v.name()}" for v in pool.listAllVolumes() if namespace in v.name()
                ]
        found += [f"network {n.name()}" for n in conn.listAllNetworks() if namespace in n.name()]
        return sorted(found)
    finally:
        conn.close()


def hosts_row(plain: str, host: str) -> list[str]:
    """The cells of `host`'s row in `capl hosts` plain output."""
    for line in plain.splitlines():
        cells = line.split()
        if cells and cells[0] == host:
            return cells
    raise AssertionError(f"no row for {host} in:\n{plain}")


async def events(site: Site, reason: str, host: str = "kvm1") -> set[tuple[str, str]]:
    """(type, message) of the Events with `reason` about the LibvirtCluster and `host`
    (every maintenance Event's message starts with ``host <name>`` and a space or colon)."""
    return {
        (str(e.get("type")), str(e.get("message")))
        for e in await site.list(EVENT)
        if (e.get("involvedObject") or {}).get("name") == CLUSTER_NAME
        and (e.get("involvedObject") or {}).get("kind") == c.Kind.LIBVIRT_CLUSTER.value
        and e.get("reason") == reason
        and str(e.get("message")).startswith((f"host {host} ", f"host {host}:"))
    }


async def create_machine_deployment(site: Site, image: Path) -> None:
    """LibvirtMachineTemplate (evictionStrategy Recreate, no host) + bootstrap Secret +
    MachineDeployment of 1 replica."""
    await site.create(
        LIBVIRT_MACHINE_TEMPLATE,
        {
            "apiVersion": c.API_VERSION,
            "kind": c.Kind.LIBVIRT_MACHINE_TEMPLATE.value,
            "metadata": {"name": MD},
            "spec": {"template": {"spec": guest_spec(image, "Recreate")}},
        },
    )
    await site.create(
        SECRET,
        bootstrap_secret_obj(
            f"{MD}-bootstrap", site.namespace, data=b"#cloud-config\n", cluster=CLUSTER_NAME
        ),
    )
    labels = {CLUSTER_NAME_LABEL: CLUSTER_NAME, DEPLOYMENT_NAME_LABEL: MD}
    await site.create(
        MACHINE_DEPLOYMENT,
        {
            "apiVersion": c.CAPI_API_VERSION,
            "kind": "MachineDeployment",
            "metadata": {"name": MD},
            "spec": {
                "clusterName": CLUSTER_NAME,
                "replicas": 1,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "clusterName": CLUSTER_NAME,
                        "version": KUBERNETES_VERSION,
                        "bootstrap": {"dataSecretName": f"{MD}-bootstrap"},
                        "infrastructureRef": {
                            "apiGroup": c.GROUP,
                            "kind": c.Kind.LIBVIRT_MACHINE_TEMPLATE.value,
                            "name": MD,
                        },
                    },
                },
            },
        },
    )


async def teardown(site: Site, *, network: str | None, pool: str | None) -> None:
    """After the test: the Cluster deleted through Cluster API if still there (bounded),
    then — if libvirt still holds anything of the namespace — capl stopped (it would make
    again what is removed under it) and the rest swept directly."""
    if await site.get(CLUSTER, CLUSTER_NAME) is not None:
        with contextlib.suppress(Exception):
            await site.api.resource(CLUSTER).delete(ObjectKey(site.namespace, CLUSTER_NAME))
            await site.wait_gone(CLUSTER, CLUSTER_NAME, within=180)
    left = {host: traces(site.lan, host, site.namespace) for host in HOSTS}
    if any(left.values()):
        await site.management.capl.stop()
        for host in HOSTS:
            sweep_namespace(
                site.lan.host(host).local_uri, namespace=site.namespace, network=network, pool=pool
            )
