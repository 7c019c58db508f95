"""`capl hosts`: the KVM hosts of the LibvirtClusters, their maintenance and their machines.

The report (what is read, how hosts and machines are joined) is ``capl.commands.hosts_report``;
this module renders it and is the command.

One row per host (a name and URI; the same host in several clusters is one row): whether it
is reachable and its libvirt version (from ``status.hosts[]``), its maintenance (Pending,
Evacuating, Blocked, Evacuated, Ending, or "-"), the machines on it, the control-plane ones
among them, the machines migrating to and from it, and the LibvirtClusters that have it.
Where the clusters disagree (a host reachable from one cluster's credentials and not from
another's), the cell says ``cluster:value`` for each. Then, for every host in maintenance,
one line per cluster with the reason (``spec.hosts[].maintenance.reason``), the machines left
and what is being waited on (``status.hosts[].maintenance``).

Output: rich tables on a terminal, plain aligned columns otherwise, or JSON with ``-o json``,
as `capl status`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from capl.commands.hosts_report import HostEntry, HostsReport, HostView, collect_hosts
from capl.commands.shared import (
    add_api_flags,
    add_scope_flags,
    align_columns,
    connect,
    dash,
    formatter,
    scope_namespace,
)
from capl.errors import EXIT_NOT_FOUND, EXIT_OK, CliError

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["maintenance_line", "register", "render_json", "render_plain", "render_rich"]

_COLUMNS: list[tuple[str, Any]] = [
    ("HOST", lambda h: h.name),
    ("URI", lambda h: h.uri),
    ("REACHABLE", lambda h: h.reachable),
    ("LIBVIRT", lambda h: h.libvirt_version),
    ("MAINTENANCE", lambda h: h.maintenance),
    ("MACHINES", lambda h: h.machines),
    ("CONTROL-PLANE", lambda h: h.control_plane_machines),
    ("MIGRATING-IN", lambda h: h.migrating_in),
    ("MIGRATING-OUT", lambda h: h.migrating_out),
    ("CLUSTERS", lambda h: None),  # per report: see _rows
]
_STYLES = {
    "True": "green",
    "False": "red",
    "Evacuated": "green",
    "Evacuating": "yellow",
    "Pending": "yellow",
    "Ending": "yellow",
    "Blocked": "red",
}


def _cluster_label(report: HostsReport, entry: HostEntry) -> str:
    return entry.label if report.namespace is None else entry.cluster


def _rows(report: HostsReport) -> tuple[list[str], list[list[str]]]:
    rows = []
    for host in report.hosts:
        row = [dash(get(host)) for _, get in _COLUMNS]
        row[-1] = ",".join(_cluster_label(report, e) for e in host.entries)
        rows.append(row)
    return [name for name, _ in _COLUMNS], rows


def _in_maintenance(report: HostsReport) -> list[tuple[HostView, HostEntry]]:
    return [(h, e) for h in report.hosts for e in h.entries if e.maintenance is not None]


def maintenance_line(report: HostsReport, host: HostView, entry: HostEntry) -> str:
    """``kvm1 in LibvirtCluster alpha: Blocked; reason: ...; 1 machine left: <message>``."""
    line = f"{host.name} in LibvirtCluster {_cluster_label(report, entry)}: {entry.maintenance}"
    if entry.maintenance_reason:
        line += f"; reason: {entry.maintenance_reason}"
    if entry.machines_left is not None and entry.maintenance != "Evacuated":
        plural = "" if entry.machines_left == 1 else "s"
        line += f"; {entry.machines_left} machine{plural} left"
    if entry.maintenance_message:
        line += f": {' '.join(entry.maintenance_message.split())}"
    return line


def render_plain(report: HostsReport) -> str:
    """Aligned columns without colour (kubectl style), then the hosts in maintenance."""
    lines = align_columns(*_rows(report))
    maintained = _in_maintenance(report)
    if maintained:
        lines += ["", "HOSTS IN MAINTENANCE"]
        lines += [maintenance_line(report, h, e) for h, e in maintained]
    return "\n".join(lines)


def render_rich(report: HostsReport, console: Console) -> None:
    """Tables with colour for a terminal."""
    from rich.table import Table
    from rich.text import Text

    header, rows = _rows(report)
    hosts = Table(title="Hosts", title_justify="left", header_style="bold")
    for name in header:
        hosts.add_column(name, overflow="fold")
    styled = (header.index("REACHABLE"), header.index("MAINTENANCE"))
    for row in rows:
        cells = [Text(cell) for cell in row]
        for at in styled:
            cells[at].stylize(_STYLES.get(row[at], ""))
        hosts.add_row(*cells)
    console.print(hosts)
    maintained = _in_maintenance(report)
    if not maintained:
        return
    table = Table(title="Hosts in maintenance", title_justify="left", header_style="bold")
    for name in ("HOST", "CLUSTER", "PHASE", "REASON", "MACHINES LEFT", "MESSAGE"):
        table.add_column(name, overflow="fold")
    for host, entry in maintained:
        table.add_row(
            host.name,
            _cluster_label(report, entry),
            Text(dash(entry.maintenance), style=_STYLES.get(entry.maintenance or "", "")),
            dash(entry.maintenance_reason),
            dash(entry.machines_left),
            dash(entry.maintenance_message),
        )
    console.print(table)


def render_json(report: HostsReport) -> str:
    return json.dumps(asdict(report), indent=2)


# --- the command -------------------------------------------------------------------------------


def register(sub: Any) -> None:
    p = sub.add_parser(
        "hosts",
        help="KVM hosts: reachability, maintenance, machines",
        formatter_class=formatter,
        description=(
            "Show the KVM hosts of the LibvirtClusters: reachable, libvirt version,\n"
            "maintenance (Pending, Evacuating, Blocked, Evacuated, Ending), the machines on\n"
            "each (control-plane ones apart) and the machines migrating to and from it.\n"
            "A host is a name and URI: the same host in several clusters is one row."
        ),
        epilog=(
            "examples:\n"
            "  capl hosts                           the current namespace\n"
            "  capl hosts demo -n team-a            the hosts of one cluster\n"
            "  capl hosts -A                        every namespace\n"
            "  capl hosts -o json | jq '.hosts[] | select(.maintenance != null)'\n"
            "\n"
            "exit codes: 0 shown, 3 no such cluster, 4 API server unreachable"
        ),
    )
    add_api_flags(p)
    add_scope_flags(p)
    p.add_argument("cluster", nargs="?", metavar="CLUSTER", help="show only this cluster's hosts")
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
    if args.cluster is not None and not report.hosts:
        raise CliError(
            f"cluster {args.cluster!r} not found in {where} (no LibvirtCluster of that name, "
            "or of a Cluster of that name)",
            code=EXIT_NOT_FOUND,
        )
    if args.output == "json":
        print(render_json(report))
        return EXIT_OK
    for note in report.notes:
        print(f"note: {note}", file=sys.stderr)
    if not report.hosts:
        print(f"No LibvirtClusters (and so no hosts) found in {where}.", file=sys.stderr)
        return EXIT_OK
    if sys.stdout.isatty() and os.environ.get("TERM") != "dumb":
        from rich.console import Console

        render_rich(report, Console())
    else:
        print(render_plain(report))
    return EXIT_OK


async def _collect(args: argparse.Namespace, namespace: str | None) -> HostsReport:
    client = await connect(args.kubeconfig, context=args.context)
    async with client:
        return await collect_hosts(client, namespace=namespace, cluster=args.cluster)
