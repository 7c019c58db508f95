"""`capl status`: clusters and machines at a glance, and why anything is not fine.

The report (what is read, how LibvirtClusters, LibvirtMachines, Clusters and Machines are
joined, which conditions are listed) is ``capl.commands.status_report``; this module renders
it and is the command.

What it shows: per cluster the Cluster phase, LibvirtCluster Ready, the control-plane
endpoint, reachable/total hosts and ready/total machines; per machine the host, libvirt
domain state, IP addresses, providerID, Ready, the Machine's phase and node, and age; then
every condition that is not in its good state, with type, reason and message.

Output: rich tables when stdout is a terminal, plain aligned columns otherwise (pipes, logs,
tests), or JSON with ``-o json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from capl.commands.shared import (
    add_api_flags,
    add_scope_flags,
    align_columns,
    connect,
    dash,
    formatter,
    scope_namespace,
)
from capl.commands.status_report import (
    ClusterView,
    ConditionView,
    MachineView,
    StatusReport,
    collect,
)
from capl.errors import EXIT_NOT_FOUND, EXIT_OK, CliError

if TYPE_CHECKING:
    from rich.console import Console

__all__ = [
    "format_age",
    "register",
    "render_json",
    "render_plain",
    "render_rich",
]

# --- rendering ---------------------------------------------------------------------------------


def format_age(created: str | None, *, now: datetime | None = None) -> str:
    """kubectl-style age ("45s", "12m", "3h20m", "5d") of an RFC 3339 timestamp."""
    if not created:
        return "-"
    try:
        then = datetime.fromisoformat(created.replace("Z", "+00:00"))
    except ValueError:
        return "-"
    seconds = int(((now or datetime.now(UTC)) - then).total_seconds())
    if seconds < 0:
        seconds = 0
    if seconds < 120:
        return f"{seconds}s"
    minutes = seconds // 60
    if minutes < 60:
        return f"{minutes}m"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h{minutes}m" if minutes and hours < 10 else f"{hours}h"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours}h" if hours and days < 10 else f"{days}d"


def _table(
    report: StatusReport,
    items: Sequence[ClusterView] | Sequence[MachineView],
    columns: list[tuple[str, Any]],
) -> tuple[list[str], list[list[str]]]:
    """Header and rows; NAMESPACE first for all namespaces; Cluster API columns only when
    its CRDs are installed."""
    if report.namespace is None:
        columns = [("NAMESPACE", lambda x: x.namespace), *columns]
    if not report.capi_installed:
        columns = [(name, get) for name, get in columns if name not in _CAPI_COLUMNS]
    return [name for name, _ in columns], [[dash(get(x)) for _, get in columns] for x in items]


_CAPI_COLUMNS = frozenset({"PHASE", "NODE"})


def _cluster_rows(report: StatusReport, now: datetime | None) -> tuple[list[str], list[list[str]]]:
    return _table(
        report,
        report.clusters,
        [
            ("CLUSTER", lambda c: c.name),
            ("PHASE", lambda c: c.phase),
            ("READY", lambda c: c.ready),
            ("ENDPOINT", lambda c: c.endpoint),
            (
                "HOSTS",
                lambda c: f"{c.hosts_reachable}/{c.hosts_total}" if c.libvirt_cluster else None,
            ),
            ("MACHINES", lambda c: f"{c.machines_ready}/{c.machines_total}"),
            ("AGE", lambda c: format_age(c.created, now=now)),
        ],
    )


def _machine_rows(report: StatusReport, now: datetime | None) -> tuple[list[str], list[list[str]]]:
    return _table(
        report,
        report.machines,
        [
            ("CLUSTER", lambda m: m.cluster),
            ("MACHINE", lambda m: m.name),
            ("HOST", lambda m: m.host),
            ("STATE", lambda m: m.state),
            ("ADDRESSES", lambda m: ",".join(m.addresses)),
            ("PROVIDERID", lambda m: m.provider_id),
            ("READY", lambda m: m.ready),
            ("PHASE", lambda m: m.phase),
            ("NODE", lambda m: m.node),
            ("AGE", lambda m: format_age(m.created, now=now)),
        ],
    )


def _object_name(report: StatusReport, c: ConditionView) -> str:
    return f"{c.kind} {c.namespace}/{c.name}" if report.namespace is None else f"{c.kind} {c.name}"


def _condition_line(report: StatusReport, c: ConditionView) -> str:
    text = f"{_object_name(report, c)}: {c.type}={c.status}"
    if c.reason:
        text += f" {c.reason}"
    if c.message:
        text += f": {c.message}"
    return text


def render_plain(report: StatusReport, *, now: datetime | None = None) -> str:
    """Aligned columns without colour (kubectl style), for pipes and logs."""
    lines: list[str] = []
    if report.clusters:
        lines += align_columns(*_cluster_rows(report, now))
    if report.machines:
        if lines:
            lines.append("")
        lines += align_columns(*_machine_rows(report, now))
    if report.conditions:
        lines += ["", "CONDITIONS NOT IN THEIR GOOD STATE"]
        lines += [_condition_line(report, c) for c in report.conditions]
    return "\n".join(lines)


_STYLES = {"True": "green", "False": "red", "Unknown": "yellow"}


def render_rich(report: StatusReport, console: Console, *, now: datetime | None = None) -> None:
    """Tables with colour for a terminal."""
    from rich.table import Table
    from rich.text import Text

    def table(title: str, header: list[str], rows: list[list[str]], ready_at: int) -> Table:
        result = Table(title=title, title_justify="left", header_style="bold", expand=False)
        for name in header:
            result.add_column(name, overflow="fold")
        for row in rows:
            cells = [Text(cell) for cell in row]
            cells[ready_at].stylize(_STYLES.get(row[ready_at], ""))
            result.add_row(*cells)
        return result

    if report.clusters:
        header, rows = _cluster_rows(report, now)
        console.print(table("Clusters", header, rows, header.index("READY")))
    if report.machines:
        header, rows = _machine_rows(report, now)
        console.print(table("Machines", header, rows, header.index("READY")))
    if report.conditions:
        conditions = Table(
            title="Conditions not in their good state", title_justify="left", header_style="bold"
        )
        for name in ("OBJECT", "CONDITION", "REASON", "MESSAGE"):
            conditions.add_column(name, overflow="fold")
        for c in report.conditions:
            conditions.add_row(
                _object_name(report, c),
                Text(f"{c.type}={c.status}", style=_STYLES.get(c.status, "")),
                c.reason or "-",
                c.message or "-",
            )
        console.print(conditions)


def render_json(report: StatusReport, *, now: datetime | None = None) -> str:
    data = asdict(report)
    for group in ("clusters", "machines"):
        for item in data[group]:
            item["age"] = format_age(item["created"], now=now)
    return json.dumps(data, indent=2)


# --- the command -------------------------------------------------------------------------------


def register(sub: Any) -> None:
    p = sub.add_parser(
        "status",
        help="clusters and machines at a glance",
        formatter_class=formatter,
        description=(
            "Show LibvirtClusters and LibvirtMachines (with their Cluster API Cluster and\n"
            "Machine when installed): phase, host, domain state, addresses, providerID,\n"
            "Ready, and the reason of every condition that is not in its good state."
        ),
        epilog=(
            "examples:\n"
            "  capl status                          the current namespace\n"
            "  capl status demo -n team-a           one cluster\n"
            "  capl status -A                       every namespace\n"
            "  capl status -o json | jq '.machines[].ready'\n"
            "  capl status --kubeconfig ~/.kube/mgmt.yaml\n"
            "\n"
            "exit codes: 0 shown, 3 no such cluster, 4 API server unreachable"
        ),
    )
    add_api_flags(p)
    add_scope_flags(p)
    p.add_argument("cluster", nargs="?", metavar="CLUSTER", help="show only this cluster")
    p.add_argument(
        "-o",
        "--output",
        choices=("table", "json"),
        default="table",
        help="table (default; colour on a terminal) or json",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    namespace = scope_namespace(args)
    report = asyncio.run(_collect(args, namespace))
    where = "any namespace" if namespace is None else f"namespace {namespace}"
    if args.cluster is not None and report.empty:
        raise CliError(
            f"cluster {args.cluster!r} not found in {where} "
            "(no Cluster, LibvirtCluster or LibvirtMachine belongs to it)",
            code=EXIT_NOT_FOUND,
        )
    if args.output == "json":
        print(render_json(report))
        return EXIT_OK
    for note in report.notes:
        print(f"note: {note}", file=sys.stderr)
    if report.empty:
        print(f"No clusters or machines found in {where}.", file=sys.stderr)
        return EXIT_OK
    if sys.stdout.isatty() and os.environ.get("TERM") != "dumb":
        from rich.console import Console

        render_rich(report, Console())
    else:
        print(render_plain(report))
    return EXIT_OK


async def _collect(args: argparse.Namespace, namespace: str | None) -> StatusReport:
    client = await connect(args.kubeconfig, context=args.context)
    async with client:
        return await collect(client, namespace=namespace, cluster=args.cluster)
