"""The live view's content: a row per machine, the one Ready line, what to try (pure).

``Tracker`` turns status reports (``capl.commands.status_report.collect``, the same join
``capl status`` shows) into ``MachineRow``s: host, domain state, address, Ready, with real
nodes the Node (name, Ready or NotReady), elapsed time and what each machine waits for (the
first condition not in its good state). When all N are done the demo prints exactly one line
(scripts wait for it, ``ready_line``): ``N/N machines Ready``, with real nodes
``N/N Nodes Ready`` (every Machine has a Ready Node); then ``next_steps``, the commands to
try with the demo's kubeconfig. ``render_table`` is the rich table of a terminal,
``row_line`` a change as a plain line.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from capl.commands.demo.node_view import NodeIndex, row_node
from capl.commands.demo.plan import DemoPlan

if TYPE_CHECKING:
    from rich.table import Table

    from capl.commands.status_report import StatusReport


__all__ = [
    "MachineRow",
    "Tracker",
    "condition_detail",
    "format_elapsed",
    "next_steps",
    "ready_line",
    "render_table",
    "row_line",
    "workload_lines",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class MachineRow:
    name: str
    host: str
    state: str
    address: str
    ready: str
    elapsed: float
    """Seconds since the machine was created; frozen once it became Ready."""
    detail: str
    """What the machine waits for (the first condition not in its good state), or ""."""
    node: str = ""
    """Real nodes: the Node's name and Ready/NotReady ("-": no Node yet); else ""."""
    node_ready: bool = False

    @property
    def is_ready(self) -> bool:
        return self.ready == "True"

    def key(self) -> tuple[str, ...]:
        """What a change line is printed for (not the ticking elapsed time)."""
        return (self.host, self.state, self.address, self.ready, self.node, self.detail)


def format_elapsed(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds}s" if seconds < 120 else f"{seconds // 60}m{seconds % 60:02d}s"


def _parse_time(text: str | None) -> float | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def condition_detail(report: StatusReport, kind: str, name: str) -> str:
    for condition in report.conditions:
        if condition.kind == kind and condition.name == name and condition.type != "Ready":
            text = f"{condition.type}: {condition.reason}" if condition.reason else condition.type
            if condition.message:
                text += f" ({condition.message})"
            return text
    for condition in report.conditions:
        if condition.kind == kind and condition.name == name:
            return condition.reason or condition.message
    return ""


class Tracker:
    """Turns status reports into rows; remembers when each machine was first seen Ready
    (with ``nodes``: when it was first seen with a Ready Node, which is what counts then)."""

    def __init__(self, *, cluster: str, expected: int, nodes: bool = False) -> None:
        self.cluster = cluster
        self.expected = expected
        self.nodes = nodes
        self._ready_at: dict[str, float] = {}
        self.rows: list[MachineRow] = []

    def update(
        self,
        report: StatusReport,
        *,
        now: float,
        nodes: NodeIndex | None = None,
    ) -> list[MachineRow]:
        rows = []
        for view in report.machines:
            if view.cluster not in (None, self.cluster):
                continue
            created = _parse_time(view.created) or now
            if view.libvirt_machine is not None:
                detail = condition_detail(report, "LibvirtMachine", view.libvirt_machine)
            else:
                detail = "waiting for its LibvirtMachine"
            node, node_ready = "", False
            if self.nodes:
                node, node_ready, detail = row_node(
                    view, nodes or NodeIndex(), machine_detail=detail
                )
            elif view.ready == "True":
                detail = ""
            done = node_ready if self.nodes else view.ready == "True"
            if done:
                ready_at = self._ready_at.setdefault(view.name, now)
            else:
                self._ready_at.pop(view.name, None)
                ready_at = now
            rows.append(
                MachineRow(
                    name=view.name,
                    host=view.host or "-",
                    state=view.state or "-",
                    address=",".join(view.addresses) or "-",
                    ready=view.ready or "-",
                    elapsed=max(0.0, ready_at - created),
                    detail=detail,
                    node=node,
                    node_ready=node_ready,
                )
            )
        self.rows = rows
        return rows

    @property
    def ready(self) -> int:
        """Machines Ready (with ``nodes``: machines whose Node is Ready)."""
        return sum(1 for row in self.rows if (row.node_ready if self.nodes else row.is_ready))

    @property
    def all_ready(self) -> bool:
        return len(self.rows) == self.expected and self.ready == self.expected


def ready_line(ready: int, total: int, *, nodes: bool = False) -> str:
    """The one line scripts wait for (real nodes: `N/N Nodes Ready`)."""
    return f"{ready}/{total} {'Nodes' if nodes else 'machines'} Ready"


def row_line(row: MachineRow, *, since_start: float) -> str:
    """A change of one machine, as a plain line (no terminal, or after the live view)."""
    text = (
        f"[{format_elapsed(since_start):>6}] {row.name}: host={row.host} state={row.state} "
        f"address={row.address} ready={row.ready}"
    )
    if row.node:
        text += f" node={row.node.replace(' ', '/')}"
    text += f" elapsed={format_elapsed(row.elapsed)}"
    return f"{text} - {row.detail}" if row.detail else text


_STYLE = {"True": "green", "False": "red", "Unknown": "yellow"}


def render_table(
    rows: Sequence[MachineRow], *, title: str, caption: str, nodes: bool = False
) -> Table:
    """The live table; ``nodes`` adds the NODE column (the Node's name, Ready/NotReady)."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title=title, title_justify="left", caption=caption, caption_justify="left")
    columns = ["MACHINE", "HOST", "STATE", "ADDRESS", "READY"]
    columns += ["NODE"] if nodes else []
    for column in (*columns, "ELAPSED", "WAITING FOR"):
        table.add_column(column, overflow="fold", no_wrap=column != "WAITING FOR")
    for row in rows:
        node = [Text(row.node, style="green" if row.node_ready else "")] if nodes else []
        table.add_row(
            row.name,
            row.host,
            row.state,
            row.address,
            Text(row.ready, style=_STYLE.get(row.ready, "")),
            *node,
            format_elapsed(row.elapsed),
            Text(row.detail, style="dim"),
        )
    return table


def next_steps(
    *,
    plan: DemoPlan,
    kubeconfig: str,
    kubectl: str,
    capl: str,
    metrics_url: str | None,
    workload_kubeconfig: str | None = None,
    console_machine: str | None = None,
) -> str:
    """What to try while the demo runs (exact commands with the demo's kubeconfig; with
    real nodes first the workload cluster's, with ``workload_kubeconfig``)."""
    kc = f"--kubeconfig {kubeconfig}"
    lines = ["Try it, in another terminal:"]
    if workload_kubeconfig is not None:
        lines += workload_lines(kubectl=kubectl, kubeconfig=workload_kubeconfig)
    lines += [
        f"  {kubectl} {kc} get clusters,machinedeployments,machines",
        f"  {kubectl} {kc} get libvirtclusters,libvirtmachines -o wide",
        f"  {capl} status {kc}",
        f"  {kubectl} {kc} scale machinedeployment {plan.deployment} --replicas {plan.workers + 1}",
    ]
    if plan.test_driver:
        lines.append(
            "  (the libvirt test driver lives inside this process: `capl console` and virsh "
            "cannot see its domains; run with a real libvirtd, e.g. `make demo`, for that)"
        )
    else:
        lines += [
            f"  {capl} console {console_machine or plan.control_plane_machine} {kc}"
            "    (Ctrl-] leaves)",
            f"  virsh -c {plan.uri} list --all",
        ]
    if metrics_url:
        lines.append(
            f"  curl -s {metrics_url} | grep -E "
            "'^(controller_runtime_reconcile_total|rest_client_requests_total)'"
        )
    lines.append("Ctrl-C stops the demo and removes everything it created.")
    return "\n".join(lines)


def workload_lines(*, kubectl: str, kubeconfig: str) -> list[str]:
    """The commands for the workload cluster (real nodes), for the demo's "Try it" list."""
    kc = f"--kubeconfig {kubeconfig}"
    return [
        f"  {kubectl} {kc} get nodes -o wide",
        f"  {kubectl} {kc} run hello --image capl.local/busybox:1 --image-pull-policy Never "
        "--restart Never --command -- /bin/busybox echo hello from a capl node",
        f"  {kubectl} {kc} logs hello",
    ]
