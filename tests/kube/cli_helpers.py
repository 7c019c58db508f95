"""What the CLI tests against the real kube-apiserver share: running `capl` as a subprocess
(to its end, or line by line for ``--wait``), and a small fleet of LibvirtClusters and
LibvirtMachines with the status the controllers would have written.

The fleet (namespace of the test):

- LibvirtCluster ``alpha``: ``kvm1`` (``qemu+ssh://root@kvm1.<namespace>/system``: URIs
  name the namespace, so that `-A` does not merge the hosts of other tests' fleets;
  reachable, libvirt 10.0.0) and ``kvm2`` (unreachable, ``controlPlane: false``);
- LibvirtCluster ``beta``: the same ``kvm1`` (same name and URI) and ``kvm3`` (no status);
- machines (provisioned, with a domain): ``alpha-cp-0`` (control plane) and ``alpha-w-0`` on
  kvm1, ``alpha-w-0`` migrating to kvm2, ``alpha-w-1`` on kvm2; ``beta-w-0`` on kvm1,
  ``beta-w-1`` on kvm3; and ``beta-w-2``, with only ``status.host`` kvm3 (no domain yet).
"""

from __future__ import annotations

import asyncio
import sys
import uuid
from pathlib import Path
from typing import Any

from capl.kube import KubeClient
from capl.runtime.objects import ObjectKey
from capl.runtime.resources import LIBVIRT_CLUSTER, LIBVIRT_MACHINE, Resource

CAPL = str(Path(sys.executable).with_name("capl"))
API_VERSION = "infrastructure.cluster.x-k8s.io/v1alpha1"
_LIMIT = 60.0
"""Upper bound of any one step of a subprocess (a safety net, never a synchronisation)."""


def uri(host: str, namespace: str) -> str:
    """The URI of a host of the fleet in ``namespace``."""
    return f"qemu+ssh://root@{host}.{namespace}/system"


async def capl(*args: str) -> tuple[int, str, str]:
    """Run `capl ARGS` to its end: (exit code, stdout, stderr)."""
    proc = await asyncio.create_subprocess_exec(
        CAPL,
        *args,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), _LIMIT)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


class Running:
    """A `capl` subprocess read line by line while the test changes the objects it follows."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.lines: list[str] = []

    @classmethod
    async def start(cls, *args: str) -> Running:
        proc = await asyncio.create_subprocess_exec(
            CAPL,
            *args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        return cls(proc)

    async def line(self) -> str:
        """The next line of stdout (fails when the process ends first)."""
        assert self.proc.stdout is not None
        raw = await asyncio.wait_for(self.proc.stdout.readline(), _LIMIT)
        if not raw:
            code, _, err = await self.finish()
            raise AssertionError(f"capl ended (exit {code}) before the next line: {err}")
        line = raw.decode().rstrip("\n")
        self.lines.append(line)
        return line

    async def finish(self) -> tuple[int, str, str]:
        """Wait for the end: (exit code, the rest of stdout, stderr)."""
        out, err = await asyncio.wait_for(self.proc.communicate(), _LIMIT)
        assert self.proc.returncode is not None
        return self.proc.returncode, out.decode(), err.decode()

    def kill(self) -> None:
        if self.proc.returncode is None:
            self.proc.kill()


async def create(
    kube: KubeClient, resource: Resource, body: dict[str, Any], status: dict[str, Any] | None
) -> dict[str, Any]:
    """Create the object and, as its controller would, write its status."""
    created = await kube.resource(resource).create(body)
    if status is None:
        return created
    key = ObjectKey(created["metadata"]["namespace"], created["metadata"]["name"])
    return await kube.resource(resource).patch_status(key, {"status": status})


def libvirt_cluster(name: str, namespace: str, hosts: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "LibvirtCluster",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"cluster.x-k8s.io/cluster-name": name},
        },
        "spec": {"hosts": hosts, "network": {"name": "default"}},
    }


def libvirt_machine(
    name: str,
    namespace: str,
    cluster: str,
    *,
    host: str | None,
    control_plane: bool = False,
    **spec: Any,
) -> dict[str, Any]:
    labels = {"cluster.x-k8s.io/cluster-name": cluster}
    if control_plane:
        labels["cluster.x-k8s.io/control-plane"] = ""
    body_spec: dict[str, Any] = {"image": {"volume": "base.qcow2"}, **spec}
    if host is not None:  # placed, and its domain defined
        domain = str(uuid.uuid4())
        body_spec |= {"hostName": host, "domainUUID": domain, "providerID": f"libvirt:///{domain}"}
    return {
        "apiVersion": API_VERSION,
        "kind": "LibvirtMachine",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": body_spec,
    }


async def create_fleet(kube: KubeClient, namespace: str) -> None:
    """The fleet of the module docstring."""
    kvm1, kvm2, kvm3 = (uri(h, namespace) for h in ("kvm1", "kvm2", "kvm3"))
    alpha_hosts = [
        {"name": "kvm1", "uri": kvm1},
        {"name": "kvm2", "uri": kvm2, "controlPlane": False},
    ]
    await create(
        kube,
        LIBVIRT_CLUSTER,
        libvirt_cluster("alpha", namespace, alpha_hosts),
        {
            "observedGeneration": 1,
            "hosts": [
                {"name": "kvm1", "reachable": True, "libvirtVersion": "10.0.0"},
                {"name": "kvm2", "reachable": False, "message": "connection refused"},
            ],
        },
    )
    beta_hosts = [{"name": "kvm1", "uri": kvm1}, {"name": "kvm3", "uri": kvm3}]
    await create(
        kube,
        LIBVIRT_CLUSTER,
        libvirt_cluster("beta", namespace, beta_hosts),
        {
            "observedGeneration": 1,
            "hosts": [{"name": "kvm1", "reachable": True, "libvirtVersion": "10.0.0"}],
        },
    )
    machines = [
        libvirt_machine("alpha-cp-0", namespace, "alpha", host="kvm1", control_plane=True),
        libvirt_machine("alpha-w-0", namespace, "alpha", host="kvm1", migrationTarget="kvm2"),
        libvirt_machine("alpha-w-1", namespace, "alpha", host="kvm2"),
        libvirt_machine("beta-w-0", namespace, "beta", host="kvm1"),
        libvirt_machine("beta-w-1", namespace, "beta", host="kvm3"),
    ]
    for body in machines:
        status = {"host": body["spec"]["hostName"], "initialization": {"provisioned": True}}
        await create(kube, LIBVIRT_MACHINE, body, status)
    unplaced = libvirt_machine("beta-w-2", namespace, "beta", host=None)
    await create(kube, LIBVIRT_MACHINE, unplaced, {"host": "kvm3"})
