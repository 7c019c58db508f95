"""What both sides of bench/realnode.py share: the clock, the Node check, the deadlines.

Both sides are timed the same way: a `Timeline` started just before their first step, marks
for the steps on the way (seconds since the start, each kept once), and the end when the
workload cluster's API server lists the side's new Node with condition Ready=True — read by
`new_ready_node`, polled every `POLL` seconds by both sides, so both see the Node with the
same resolution.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from capl.kube import KubeClient
from capl.runtime.errors import NotFound
from capl.runtime.objects import ObjectKey
from capl.runtime.resources import NODE

POLL: Final = 0.5
"""Seconds between two looks at the API servers while a side waits (both sides)."""
FIRST_BOOT_S: Final = 300.0
"""Before any boot of this run was measured: a node's boot to Ready on a quiet 2-core
machine took 91-188 s in the demo (README); scaled by the load below."""


def deadline(measured: list[float]) -> float:
    """Seconds a side may take to get its Node Ready: three times the slowest measured so far
    in this run (either side); before any, `FIRST_BOOT_S` times the load average per CPU (at
    least 1): TCG guests slow down with the machine's load."""
    if measured:
        return 3.0 * max(measured)
    load = os.getloadavg()[0] / max(1, os.cpu_count() or 1)
    return FIRST_BOOT_S * max(1.0, load)


def removal_deadline(measured: list[float]) -> float:
    """Seconds to wait for a side's removal (not timed): a third of the boot deadline, at
    least 120 s (a drain, an ACPI shutdown under TCG, capl's shutdown timeout)."""
    return max(120.0, deadline(measured) / 3)


@dataclass
class Timeline:
    """One side's clock (see the module docstring)."""

    started: float = field(default_factory=time.perf_counter)
    marks: dict[str, float] = field(default_factory=dict)

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def mark(self, step: str) -> None:
        self.marks.setdefault(step, round(self.elapsed(), 2))

    def seen(self, step: str) -> bool:
        return step in self.marks


def _ready_condition(node: Mapping[str, Any]) -> Mapping[str, Any]:
    for condition in (node.get("status") or {}).get("conditions") or ():
        if condition.get("type") == "Ready":
            return dict(condition)
    return {}


def _ready(node: Mapping[str, Any]) -> bool:
    return bool(_ready_condition(node).get("status") == "True")


def _not_ready_step(node: Mapping[str, Any]) -> str:
    """The step a registered, not yet Ready Node is at: what its kubelet says (the Ready
    condition's reason and message, e.g. the container runtime's network not ready yet), so
    the time from registration to Ready is split by cause in the timeline."""
    condition = _ready_condition(node)
    said = f"{condition.get('reason') or 'no Ready condition'}: {condition.get('message') or ''}"
    return f"Node not Ready ({said.strip(': ')[:_STEP_TEXT]})"


_STEP_TEXT = 80


async def node_names(workload: KubeClient) -> set[str]:
    return {n["metadata"]["name"] for n in (await workload.resource(NODE).list()).items}


async def new_ready_node(workload: KubeClient, before: set[str], timeline: Timeline) -> str | None:
    """The name of a Node not in `before` once it is Ready (None until then); marks "Node
    registered" when one exists and "Node Ready". The Node is found as the new one, not by
    the name the guest should have: under heavy load the node image's `kubeadm join` has run
    before the guest had its DHCP host name, and the Node registered as "localhost"."""
    new = [
        n
        for n in (await workload.resource(NODE).list()).items
        if n["metadata"]["name"] not in before
    ]
    if not new:
        return None
    timeline.mark("Node registered")
    for node in new:
        if _ready(node):
            timeline.mark("Node Ready")
            return str(node["metadata"]["name"])
        timeline.mark(_not_ready_step(node))
    return None


async def node_gone(workload: KubeClient, name: str) -> bool:
    try:
        await workload.resource(NODE).get(ObjectKey("", name))
    except NotFound:
        return True
    return False
