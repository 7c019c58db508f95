"""capl's side of bench/realnode.py: one worker through Cluster API (MachineDeployment 0 -> 1).

Timed from just before the scale-up (a merge patch of the MachineDeployment's
`spec.replicas`, what `kubectl scale` sends) until the workload cluster lists the worker's
Node Ready. That includes everything a user's scale-up costs: Cluster API's MachineDeployment
and MachineSet controllers create the Machine with its KubeadmConfig and LibvirtMachine from
their templates; the kubeadm bootstrap provider creates a bootstrap token in the workload
cluster and renders the Ignition config into the bootstrap data Secret; capl's
LibvirtMachine controller places the machine, creates the root overlay of the base volume,
uploads the Ignition file, reserves its address in DHCP and DNS, defines and starts the
domain (fw_cfg); the guest boots, Ignition writes the files in the initramfs,
`kubeadm.service` joins, kubelet registers the Node and reports it Ready.

Marks on the way (seconds since the scale-up): "Machine" (the MachineSet made it),
"bootstrap data" (the Machine names its bootstrap data Secret), "domain started" (the
LibvirtMachine's DomainProvisioned condition), "Node registered", "Node Ready".

Removal (`scale_down`, not timed): replicas back to 0; until the Machine, its LibvirtMachine
and its Node are gone (Cluster API drains and deletes the Node; capl shuts the domain down
and removes it, its volumes and its DHCP and DNS entries). A Node Cluster API could not
match to its Machine (registered under another name, see `new_ready_node`) is deleted here
once the machine is gone, and recorded (`nodes_deleted`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

from bench.realnode_common import POLL, Timeline, new_ready_node, node_gone, node_names
from capl.commands.demo.node_objects import extra_resources
from capl.kube import KubeClient
from capl.runtime.errors import NotFound
from capl.runtime.objects import Obj, ObjectKey
from capl.runtime.resources import LIBVIRT_MACHINE, MACHINE, NODE


def _condition(obj: Obj, type_: str) -> dict[str, Any] | None:
    for c in (obj.get("status") or {}).get("conditions") or ():
        if c.get("type") == type_:
            return dict(c)
    return None


@dataclass
class CaplSide:
    """The MachineDeployment capl's workers come from (the demo's Ignition one)."""

    api: KubeClient
    """The management cluster (admin)."""
    workload: KubeClient
    namespace: str
    cluster: str
    deployment: str
    machines_seen: list[str] = field(default_factory=list)
    nodes_seen: list[str] = field(default_factory=list)
    nodes_deleted: list[str] = field(default_factory=list)
    """Nodes Cluster API did not delete with their Machine (it found no nodeRef: a Node
    registered under another name than the machine's), deleted by the benchmark."""

    async def _scale(self, replicas: int) -> None:
        await self.api.resource(extra_resources()["MachineDeployment"]).patch(
            ObjectKey(self.namespace, self.deployment), {"spec": {"replicas": replicas}}
        )

    async def machines(self) -> list[Obj]:
        selector = (
            f"cluster.x-k8s.io/cluster-name={self.cluster},"
            f"cluster.x-k8s.io/deployment-name={self.deployment}"
        )
        listed = await self.api.resource(MACHINE).list(
            namespace=self.namespace, label_selector=selector
        )
        return list(listed.items)

    async def join(self, *, within: float) -> tuple[Timeline, str]:
        """Scale to 1, until the new Machine's Node is Ready: (timeline, Node name)."""
        before = await node_names(self.workload)
        timeline = Timeline()
        await self._scale(1)
        name: str | None = None
        while True:
            if name is None:
                machines = await self.machines()
                if machines:
                    name = str(machines[0]["metadata"]["name"])
                    self.machines_seen.append(name)
                    timeline.mark("Machine")
            if name is not None:
                await self._progress(name, timeline)
            node = await new_ready_node(self.workload, before, timeline)
            if node is not None:
                self.nodes_seen.append(node)
                return timeline, node
            if timeline.elapsed() > within:
                raise TimeoutError(
                    f"capl: no Ready Node within {within:.0f} s: {await self._why(name)}"
                )
            await asyncio.sleep(POLL)

    async def _progress(self, name: str, timeline: Timeline) -> None:
        key = ObjectKey(self.namespace, name)
        with contextlib.suppress(NotFound):
            if not timeline.seen("bootstrap data"):
                machine = await self.api.resource(MACHINE).get(key)
                if (machine["spec"].get("bootstrap") or {}).get("dataSecretName"):
                    timeline.mark("bootstrap data")
            if not timeline.seen("domain started"):
                lm = await self.api.resource(LIBVIRT_MACHINE).get(key)
                if (_condition(lm, "DomainProvisioned") or {}).get("status") == "True":
                    timeline.mark("domain started")

    async def _why(self, name: str | None) -> str:
        """The LibvirtMachine's conditions that are not True (capl redacts bootstrap data
        from its messages; the console tail is in BootstrapSucceeded)."""
        if name is None:
            return "the MachineSet made no Machine"
        try:
            lm = await self.api.resource(LIBVIRT_MACHINE).get(ObjectKey(self.namespace, name))
        except NotFound:
            return f"no LibvirtMachine {name}"
        return "; ".join(
            f"{c.get('type')}={c.get('status')} {c.get('reason')}: {c.get('message')}"
            for c in (lm.get("status") or {}).get("conditions") or ()
            if c.get("status") != "True"
        )

    async def scale_down(self, *, within: float) -> list[str]:
        """Replicas 0, until the Machines and LibvirtMachines of this side are gone and its
        Nodes too (one Cluster API left behind is deleted here and recorded); what is still
        there after `within` seconds."""
        await self._scale(0)
        started = time.monotonic()
        while True:
            left = await self.left()
            if not left or time.monotonic() - started > within:
                return left
            if not [x for x in left if not x.startswith("Node ")]:
                await self._delete_stale_nodes()
            await asyncio.sleep(POLL)

    async def _delete_stale_nodes(self) -> None:
        """The machines are gone: a Node of theirs still there is one Cluster API had no
        nodeRef for (kubelet is gone with the guest; nothing registers it again)."""
        for node in self.nodes_seen:
            if not await node_gone(self.workload, node):
                with contextlib.suppress(NotFound):
                    await self.workload.resource(NODE).delete(ObjectKey("", node))
                    self.nodes_deleted.append(node)

    async def left(self) -> list[str]:
        left = [f"Machine {m['metadata']['name']}" for m in await self.machines()]
        for name in self.machines_seen:
            with contextlib.suppress(NotFound):
                await self.api.resource(LIBVIRT_MACHINE).get(ObjectKey(self.namespace, name))
                left.append(f"LibvirtMachine {name}")
        for node in self.nodes_seen:
            if not await node_gone(self.workload, node):
                left.append(f"Node {node}")
        return left
