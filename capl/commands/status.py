"""`capl status`: clusters and machines at a glance, and why anything is not fine.

What it reads (one list per kind, in parallel, through ``capl.kube.KubeClient``):
LibvirtClusters, LibvirtMachines and, when the Cluster API CRDs are installed, Clusters and
Machines. A kind whose CRD is missing (404 on the list) is skipped with a note, so the command
works on a bare API server with only capl's CRDs as well as on a full management cluster.

How objects are joined (``build_report``, a pure function the tests and ``capl demo`` use):

- a *cluster* is a (namespace, Cluster API cluster name) pair. The name comes from the
  ``cluster.x-k8s.io/cluster-name`` label, else an owner reference of kind Cluster, else
  (LibvirtCluster) its own name; a Cluster's ``spec.infrastructureRef`` pins its
  LibvirtCluster even when the names differ;
- a *machine* row is a LibvirtMachine, joined with the Machine that owns it (owner reference,
  or the Machine's ``spec.infrastructureRef``). A Machine whose LibvirtMachine does not exist
  yet still gets a row, so a stuck machine is never invisible.

What it shows: per cluster the Cluster phase, LibvirtCluster Ready, the control-plane
endpoint, reachable/total hosts and ready/total machines; per machine the host, libvirt
domain state, IP addresses, providerID, Ready, the Machine's phase and node, and age; then
every condition that is not in its good state, with type, reason and message. Most
conditions are good when True; the "negative polarity" types of Cluster API v1beta2
(``Paused``, ``Deleting``, ``RollingOut``, ``Scaling*``, ``Remediating``) are good when False
and are listed only when True.

Output: rich tables when stdout is a terminal, plain aligned columns otherwise (pipes, logs,
tests), or JSON with ``-o json``.

This module also holds the API helpers the operator commands share: ``connect`` (kubeconfig
resolution as client-go does it, errors mapped to exit codes), ``default_namespace`` (the
kubeconfig context's namespace) and ``api_failure`` (one-line messages for API errors).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from capl.errors import EXIT_FAILED, EXIT_NOT_FOUND, EXIT_OK, EXIT_UNREACHABLE, CliError

if TYPE_CHECKING:
    from rich.console import Console

    from capl.kube.client import KubeClient
    from capl.runtime.errors import ApiError
    from capl.runtime.resources import Resource

__all__ = [
    "CLUSTER_NAME_LABEL",
    "ClusterView",
    "ConditionView",
    "MachineView",
    "StatusReport",
    "add_api_flags",
    "api_failure",
    "build_report",
    "collect",
    "connect",
    "default_namespace",
    "format_age",
    "formatter",
    "list_kind",
    "register",
    "render_json",
    "render_plain",
    "render_rich",
]

CLUSTER_NAME_LABEL = "cluster.x-k8s.io/cluster-name"
_IN_CLUSTER_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
NEGATIVE_POLARITY = frozenset(
    {"Paused", "Deleting", "RollingOut", "ScalingUp", "ScalingDown", "Remediating"}
)
"""Condition types whose good state is False (Cluster API v1beta2 conventions)."""

Raw = Mapping[str, Any]
"""A Kubernetes object as decoded JSON, read-only here."""
Key = tuple[str, str]
"""(namespace, cluster name)."""


# --- argparse helpers shared by the operator commands ----------------------------------------


def formatter(prog: str) -> argparse.HelpFormatter:
    return argparse.RawDescriptionHelpFormatter(prog, max_help_position=36)


def add_api_flags(p: argparse.ArgumentParser) -> None:
    """--kubeconfig and --context, as every command that talks to the API server has them."""
    p.add_argument(
        "--kubeconfig",
        default=None,
        help="kubeconfig file (default: $KUBECONFIG, in-cluster, then ~/.kube/config)",
    )
    p.add_argument("--context", default=None, help="kubeconfig context (default: the current)")


# --- API access ------------------------------------------------------------------------------


async def connect(kubeconfig: str | None, *, context: str | None = None) -> KubeClient:
    """A client for the configured API server; no usable configuration -> exit 4."""
    from capl.kube.client import KubeClient
    from capl.kube.config import KubeconfigError

    try:
        return await KubeClient.connect(
            kubeconfig, context=context, user_agent="capl-cli", request_timeout=30.0
        )
    except KubeconfigError as exc:
        raise CliError(
            f"cannot load the cluster configuration: {exc}", code=EXIT_UNREACHABLE
        ) from exc


def default_namespace(kubeconfig: str | None, *, context: str | None = None) -> str:
    """The namespace of the kubeconfig context in use (kubectl's default), else "default"."""
    import yaml

    from capl.kube.config import KubeconfigError, find_source

    try:
        source = find_source(kubeconfig)
    except KubeconfigError:
        return "default"
    if source.path is None:
        try:
            with open(_IN_CLUSTER_NAMESPACE, encoding="utf-8") as handle:
                return handle.read().strip() or "default"
        except OSError:
            return "default"
    documents: list[Mapping[str, Any]] = []
    for path in source.path.split(":"):
        try:
            with open(path, encoding="utf-8") as handle:
                loaded = yaml.safe_load(handle)
        except (OSError, yaml.YAMLError):
            continue
        if isinstance(loaded, Mapping):
            documents.append(loaded)
    current = context or next(
        (str(d["current-context"]) for d in documents if d.get("current-context")), ""
    )
    for document in documents:
        for entry in document.get("contexts") or ():
            if isinstance(entry, Mapping) and entry.get("name") == current:
                namespace = (entry.get("context") or {}).get("namespace")
                return str(namespace) if namespace else "default"
    return "default"


def api_failure(exc: ApiError, *, server: str, what: str) -> CliError:
    """A one-line CliError with the right exit code for a failed API request."""
    from capl.runtime.errors import Forbidden, NotFound, TransportError

    if isinstance(exc, TransportError):
        cause = exc.__cause__
        detail = (str(cause) or type(cause).__name__) if cause is not None else exc.message
        if isinstance(cause, TimeoutError):
            detail = "timed out"
        return CliError(f"cannot reach the API server {server}: {detail}", code=EXIT_UNREACHABLE)
    if exc.code == 401:
        return CliError(
            f"the API server {server} rejected the credentials (401 Unauthorized)",
            code=EXIT_UNREACHABLE,
        )
    if isinstance(exc, Forbidden):
        return CliError(f"{what}: forbidden: {exc.message or exc}", code=EXIT_FAILED)
    if isinstance(exc, NotFound):
        return CliError(f"{what}: not found", code=EXIT_NOT_FOUND)
    return CliError(f"{what}: {exc}", code=EXIT_FAILED)


async def list_kind(
    client: KubeClient, resource: Resource, *, namespace: str | None
) -> list[dict[str, Any]] | None:
    """Every object of a kind (None when its CRD is not installed)."""
    from capl.runtime.errors import ApiError, NotFound

    try:
        listed = await client.resource(resource).list(namespace=namespace)
    except NotFound:
        return None
    except ApiError as exc:
        raise api_failure(exc, server=_server(client), what=f"list {resource.plural}") from exc
    return list(listed.items)


def _server(client: KubeClient) -> str:
    return str(client.configuration.host)


# --- the report --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class ConditionView:
    """A condition that is not in its good state."""

    kind: str
    namespace: str
    name: str
    type: str
    status: str
    reason: str
    message: str


@dataclass(slots=True, kw_only=True)
class ClusterView:
    namespace: str
    name: str
    libvirt_cluster: str | None
    phase: str | None
    ready: str | None
    endpoint: str | None
    hosts_reachable: int
    hosts_total: int
    machines_ready: int = 0
    machines_total: int = 0
    created: str | None = None


@dataclass(slots=True, kw_only=True)
class MachineView:
    namespace: str
    cluster: str | None
    name: str
    machine: str | None
    libvirt_machine: str | None
    host: str | None
    state: str | None
    addresses: list[str]
    provider_id: str | None
    ready: str | None
    phase: str | None
    node: str | None
    created: str | None = None


@dataclass(slots=True, kw_only=True)
class StatusReport:
    namespace: str | None
    """The namespace shown, None for all namespaces."""
    clusters: list[ClusterView] = field(default_factory=list)
    machines: list[MachineView] = field(default_factory=list)
    conditions: list[ConditionView] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    capi_installed: bool = True
    """Whether the Cluster API CRDs (Cluster, Machine) answered."""

    @property
    def empty(self) -> bool:
        return not self.clusters and not self.machines


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    value = obj.get("metadata")
    return value if isinstance(value, Mapping) else {}


def _get(obj: Any, *path: str) -> Any:
    for part in path:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(part)
    return obj


def _ns(obj: Mapping[str, Any]) -> str:
    return str(_meta(obj).get("namespace") or "")


def _name(obj: Mapping[str, Any]) -> str:
    return str(_meta(obj).get("name") or "")


def _owner(obj: Mapping[str, Any], kind: str) -> str | None:
    for ref in _meta(obj).get("ownerReferences") or ():
        if isinstance(ref, Mapping) and ref.get("kind") == kind and ref.get("name"):
            return str(ref["name"])
    return None


def _label(obj: Mapping[str, Any], key: str) -> str | None:
    labels = _meta(obj).get("labels")
    value = labels.get(key) if isinstance(labels, Mapping) else None
    return str(value) if value else None


def _conditions(obj: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    value = _get(obj, "status", "conditions")
    return [c for c in value if isinstance(c, Mapping)] if isinstance(value, list) else []


def condition_status(obj: Mapping[str, Any], type_: str) -> str | None:
    for condition in _conditions(obj):
        if condition.get("type") == type_:
            return str(condition.get("status") or "Unknown")
    return None


def _bad_conditions(obj: Mapping[str, Any]) -> list[ConditionView]:
    result = []
    for condition in _conditions(obj):
        type_ = str(condition.get("type") or "")
        status = str(condition.get("status") or "Unknown")
        good = "False" if type_ in NEGATIVE_POLARITY else "True"
        if status == good:
            continue
        result.append(
            ConditionView(
                kind=str(obj.get("kind") or ""),
                namespace=_ns(obj),
                name=_name(obj),
                type=type_,
                status=status,
                reason=str(condition.get("reason") or ""),
                message=" ".join(str(condition.get("message") or "").split()),
            )
        )
    return result


def _endpoint(obj: Mapping[str, Any] | None) -> str | None:
    if obj is None:
        return None
    host = _get(obj, "spec", "controlPlaneEndpoint", "host")
    port = _get(obj, "spec", "controlPlaneEndpoint", "port")
    if not host:
        return None
    return f"{host}:{port}" if port else str(host)


def _ref_name(obj: Mapping[str, Any], ref: str, kind: str) -> str | None:
    value = _get(obj, "spec", ref)
    if isinstance(value, Mapping) and value.get("kind") == kind and value.get("name"):
        return str(value["name"])
    return None


def _addresses(obj: Mapping[str, Any] | None) -> list[str]:
    if obj is None:
        return []
    found = []
    for address in _get(obj, "status", "addresses") or ():
        if (
            isinstance(address, Mapping)
            and address.get("type") in ("InternalIP", "ExternalIP")
            and address.get("address")
            and str(address["address"]) not in found
        ):
            found.append(str(address["address"]))
    return found


def _clusters_by_key(caps: list[Raw], lcs: list[Raw]) -> tuple[dict[Key, Raw], dict[Key, Raw]]:
    """Cluster API Clusters and LibvirtClusters by (namespace, cluster name)."""
    capi_by_key = {(_ns(c), _name(c)): c for c in caps}
    lc_by_name = {(_ns(lc), _name(lc)): lc for lc in lcs}
    lc_by_key: dict[Key, Raw] = {}
    for key, capi in capi_by_key.items():
        infra = _ref_name(capi, "infrastructureRef", "LibvirtCluster")
        if infra and (key[0], infra) in lc_by_name:
            lc_by_key[key] = lc_by_name[(key[0], infra)]
    claimed = {id(lc) for lc in lc_by_key.values()}
    for lc in lcs:
        if id(lc) not in claimed:
            name = _label(lc, CLUSTER_NAME_LABEL) or _owner(lc, "Cluster") or _name(lc)
            lc_by_key.setdefault((_ns(lc), name), lc)
    return capi_by_key, lc_by_key


def _machine_pairs(lms: list[Raw], cms: list[Raw]) -> list[tuple[Raw | None, Raw | None]]:
    """(LibvirtMachine, Machine) pairs; either side may be missing."""
    cm_by_key = {(_ns(m), _name(m)): m for m in cms}
    machine_of: dict[Key, Raw] = {}
    for key, capi_machine in cm_by_key.items():
        infra = _ref_name(capi_machine, "infrastructureRef", "LibvirtMachine")
        if infra:
            machine_of[(key[0], infra)] = capi_machine
    for lm in lms:
        owner = _owner(lm, "Machine")
        if owner and (_ns(lm), owner) in cm_by_key:
            machine_of[(_ns(lm), _name(lm))] = cm_by_key[(_ns(lm), owner)]
    joined: set[int] = set()
    pairs: list[tuple[Raw | None, Raw | None]] = []
    for lm in lms:
        paired = machine_of.get((_ns(lm), _name(lm)))
        if paired is not None:
            joined.add(id(paired))
        pairs.append((lm, paired))
    pairs.extend((None, m) for m in cms if id(m) not in joined)
    return pairs


def _text(value: Any) -> str | None:
    return str(value) if value not in (None, "") else None


def _machine_view(lm: Raw | None, machine: Raw | None) -> MachineView:
    base = lm if lm is not None else machine
    assert base is not None
    cluster_name = _label(base, CLUSTER_NAME_LABEL) or _text(_get(machine, "spec", "clusterName"))
    ready = condition_status(lm, "Ready") if lm is not None else None
    if ready is None and machine is not None:
        ready = condition_status(machine, "Ready")
    return MachineView(
        namespace=_ns(base),
        cluster=cluster_name,
        name=_name(base),
        machine=_name(machine) if machine is not None else None,
        libvirt_machine=_name(lm) if lm is not None else None,
        host=_text(_get(lm, "status", "host") or _get(lm, "spec", "hostName")),
        state=_text(_get(lm, "status", "domainState")),
        addresses=_addresses(lm) or _addresses(machine),
        provider_id=_text(_get(lm, "spec", "providerID") or _get(machine, "spec", "providerID")),
        ready=ready,
        phase=_text(_get(machine, "status", "phase")),
        node=_text(_get(machine, "status", "nodeRef", "name")),
        created=_text(_meta(base).get("creationTimestamp")),
    )


def _cluster_view(
    key: Key, capi: Raw | None, lc: Raw | None, members: list[MachineView]
) -> ClusterView:
    spec_hosts = _get(lc, "spec", "hosts")
    status_hosts = _get(lc, "status", "hosts")
    base = lc if lc is not None else capi
    return ClusterView(
        namespace=key[0],
        name=key[1],
        libvirt_cluster=_name(lc) if lc is not None else None,
        phase=_text(_get(capi, "status", "phase")),
        ready=condition_status(lc, "Ready") if lc is not None else None,
        endpoint=_endpoint(lc) or _endpoint(capi),
        hosts_reachable=sum(
            1 for h in status_hosts or () if isinstance(h, Mapping) and h.get("reachable") is True
        ),
        hosts_total=len(spec_hosts) if isinstance(spec_hosts, list) else 0,
        machines_ready=sum(1 for m in members if m.ready == "True"),
        machines_total=len(members),
        created=_text(_meta(base).get("creationTimestamp")) if base is not None else None,
    )


def build_report(
    *,
    namespace: str | None,
    libvirt_clusters: Sequence[Raw] | None,
    libvirt_machines: Sequence[Raw] | None,
    clusters: Sequence[Raw] | None,
    machines: Sequence[Raw] | None,
    cluster: str | None = None,
) -> StatusReport:
    """Join the four kinds into rows (None: that kind's CRD is not installed); ``cluster``
    keeps only that cluster (by Cluster API name, or by LibvirtCluster name)."""
    report = StatusReport(namespace=namespace)
    if libvirt_clusters is None or libvirt_machines is None:
        report.notes.append(
            "capl's CRDs (LibvirtCluster, LibvirtMachine) are not installed on this API server"
        )
    if clusters is None or machines is None:
        report.capi_installed = False
        report.notes.append("the Cluster API CRDs are not installed: showing capl's objects only")
    lcs, lms = list(libvirt_clusters or ()), list(libvirt_machines or ())
    caps, cms = list(clusters or ()), list(machines or ())

    capi_by_key, lc_by_key = _clusters_by_key(caps, lcs)
    keys = sorted(set(capi_by_key) | set(lc_by_key))
    pairs = _machine_pairs(lms, cms)
    views = [_machine_view(lm, m) for lm, m in pairs]
    if cluster is not None:
        keys = [
            k
            for k in keys
            if k[1] == cluster or (k in lc_by_key and _name(lc_by_key[k]) == cluster)
        ]
        wanted = {k[1] for k in keys} | {cluster}
        kept = [(p, v) for p, v in zip(pairs, views, strict=True) if v.cluster in wanted]
        pairs, views = [p for p, _ in kept], [v for _, v in kept]

    for key in keys:
        capi, lc = capi_by_key.get(key), lc_by_key.get(key)
        members = [v for v in views if (v.namespace, v.cluster) == key]
        report.clusters.append(_cluster_view(key, capi, lc, members))
        for obj in (capi, lc):
            if obj is not None:
                report.conditions.extend(_bad_conditions(obj))
    order = sorted(
        range(len(views)), key=lambda i: (views[i].namespace, views[i].cluster or "", views[i].name)
    )
    for i in order:
        report.machines.append(views[i])
        for obj in pairs[i][::-1]:  # Machine first, then LibvirtMachine
            if obj is not None:
                report.conditions.extend(_bad_conditions(obj))
    return report


async def collect(
    client: KubeClient, *, namespace: str | None, cluster: str | None = None
) -> StatusReport:
    """Read the four kinds (``namespace`` None: all namespaces) and build the report."""
    from capl.runtime.resources import CLUSTER, LIBVIRT_CLUSTER, LIBVIRT_MACHINE, MACHINE

    lcs, lms, caps, cms = await asyncio.gather(
        list_kind(client, LIBVIRT_CLUSTER, namespace=namespace),
        list_kind(client, LIBVIRT_MACHINE, namespace=namespace),
        list_kind(client, CLUSTER, namespace=namespace),
        list_kind(client, MACHINE, namespace=namespace),
    )
    return build_report(
        namespace=namespace,
        libvirt_clusters=_with_kind(lcs, "LibvirtCluster"),
        libvirt_machines=_with_kind(lms, "LibvirtMachine"),
        clusters=_with_kind(caps, "Cluster"),
        machines=_with_kind(cms, "Machine"),
        cluster=cluster,
    )


def _with_kind(items: list[dict[str, Any]] | None, kind: str) -> list[dict[str, Any]] | None:
    if items is not None:
        for item in items:
            item.setdefault("kind", kind)
    return items


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


def _dash(value: object) -> str:
    return "-" if value is None or value == "" else str(value)


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
    return [name for name, _ in columns], [[_dash(get(x)) for _, get in columns] for x in items]


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


def _columns(header: list[str], rows: Iterable[list[str]]) -> list[str]:
    table = [header, *rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    return [
        "   ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in table
    ]


def render_plain(report: StatusReport, *, now: datetime | None = None) -> str:
    """Aligned columns without colour (kubectl style), for pipes and logs."""
    lines: list[str] = []
    if report.clusters:
        lines += _columns(*_cluster_rows(report, now))
    if report.machines:
        if lines:
            lines.append("")
        lines += _columns(*_machine_rows(report, now))
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
    scope = p.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", default=None, help="namespace (default: context's)")
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="every namespace")
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
    namespace: str | None
    if args.all_namespaces:
        namespace = None
    else:
        namespace = args.namespace or default_namespace(args.kubeconfig, context=args.context)
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
