"""The Node watch of the real-node demo's live view.

``NodeIndex`` holds the workload cluster's Nodes (read with the workload kubeconfig by
``capl.commands.demo.real_nodes.RealNodes.nodes``) by name and by providerID, and finds each
machine's: its Machine's nodeRef, else the same providerID, else the machine's name.
``row_node`` makes the NODE column and what the machine waits for: a machine is done when its
Node is Ready and is its Machine's nodeRef.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from capl.commands.status_report import MachineView


__all__ = ["NodeIndex", "NodeState", "node_state", "row_node"]


@dataclass(frozen=True, slots=True)
class NodeState:
    """A workload cluster Node, as the live view shows it."""

    name: str
    ready: bool
    reason: str = ""
    message: str = ""

    @property
    def text(self) -> str:
        return f"{self.name} {'Ready' if self.ready else 'NotReady'}"

    @property
    def detail(self) -> str:
        text = f"Node NotReady: {self.reason}" if self.reason else "Node NotReady"
        return f"{text} ({self.message})" if self.message else text


def node_state(node: Mapping[str, Any]) -> NodeState:
    name = str((node.get("metadata") or {}).get("name") or "")
    for condition in (node.get("status") or {}).get("conditions") or ():
        if isinstance(condition, Mapping) and condition.get("type") == "Ready":
            message = " ".join(str(condition.get("message") or "").split())
            return NodeState(
                name=name,
                ready=condition.get("status") == "True",
                reason=str(condition.get("reason") or ""),
                message=message[:160],
            )
    return NodeState(name=name, ready=False, reason="NoReadyCondition")


class NodeIndex:
    """The workload cluster's Nodes by name and by providerID."""

    def __init__(self, nodes: Iterable[Mapping[str, Any]] = ()) -> None:
        self.by_name: dict[str, NodeState] = {}
        self.by_provider_id: dict[str, NodeState] = {}
        for node in nodes:
            state = node_state(node)
            self.by_name[state.name] = state
            provider_id = (node.get("spec") or {}).get("providerID")
            if provider_id:
                self.by_provider_id[str(provider_id)] = state

    def find(self, view: MachineView) -> NodeState | None:
        """The Node of a machine: its Machine's nodeRef, else the same providerID (capl sets
        it on the Node before Cluster API sets the nodeRef), else the machine's name (the
        node's hostname)."""
        if view.node and view.node in self.by_name:
            return self.by_name[view.node]
        if view.provider_id and view.provider_id in self.by_provider_id:
            return self.by_provider_id[view.provider_id]
        for name in (view.machine, view.name):
            if name and name in self.by_name:
                return self.by_name[name]
        return None


def row_node(view: MachineView, nodes: NodeIndex, *, machine_detail: str) -> tuple[str, bool, str]:
    """(NODE column, done, WAITING FOR) of one machine in the real-node view: done when its
    Node is Ready and is the Machine's nodeRef."""
    node = nodes.find(view)
    if node is None:
        if view.ready != "True" or machine_detail:
            return "-", False, machine_detail or "waiting for its LibvirtMachine"
        return "-", False, "kubeadm join: no Node yet"
    if not node.ready:
        return node.text, False, node.detail
    if view.node != node.name:  # done only when Cluster API linked them (what users see)
        return node.text, False, "the Machine's nodeRef (capl sets the Node's providerID)"
    return node.text, True, ""
