"""The report of `capl status` (and of `capl demo`'s live view): what is read and how it is joined.

What it reads (``collect``: one list per kind, in parallel, through ``capl.kube.KubeClient``):
LibvirtClusters, LibvirtMachines and, when the Cluster API CRDs are installed, Clusters and
Machines. A kind whose CRD is missing (404 on the list) is skipped with a note, so the report
works on a bare API server with only capl's CRDs as well as on a full management cluster.

How objects are joined (``build_report``, a pure function the tests and ``capl demo`` use):

- a *cluster* is a (namespace, Cluster API cluster name) pair. The name comes from the
  ``cluster.x-k8s.io/cluster-name`` label, else an owner reference of kind Cluster, else
  (LibvirtCluster) its own name; a Cluster's ``spec.infrastructureRef`` pins its
  LibvirtCluster even when the names differ;
- a *machine* row is a LibvirtMachine, joined with the Machine that owns it (owner reference,
  or the Machine's ``spec.infrastructureRef``). A Machine whose LibvirtMachine does not exist
  yet still gets a row, so a stuck machine is never invisible.

Every condition that is not in its good state is listed with type, reason and message. Most
conditions are good when True; the "negative polarity" types of Cluster API v1beta2
(``Paused``, ``Deleting``, ``RollingOut``, ``Scaling*``, ``Remediating``) are good when False
and are listed only when True.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from capl.commands.raw import (
    CLUSTER_NAME_LABEL,
    dig,
    obj_label,
    obj_meta,
    obj_name,
    obj_ns,
    obj_owner,
    text,
)
from capl.commands.shared import list_kind

if TYPE_CHECKING:
    from capl.kube.client import KubeClient

__all__ = [
    "CLUSTER_NAME_LABEL",
    "ClusterView",
    "ConditionView",
    "MachineView",
    "StatusReport",
    "build_report",
    "clusters_by_key",
    "collect",
    "condition_status",
    "machine_pairs",
]

NEGATIVE_POLARITY = frozenset(
    {"Paused", "Deleting", "RollingOut", "ScalingUp", "ScalingDown", "Remediating"}
)
"""Condition types whose good state is False (Cluster API v1beta2 conventions)."""

Raw = Mapping[str, Any]
"""A Kubernetes object as decoded JSON, read-only here."""
Key = tuple[str, str]
"""(namespace, cluster name)."""


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


def _conditions(obj: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    value = dig(obj, "status", "conditions")
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
                namespace=obj_ns(obj),
                name=obj_name(obj),
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
    host = dig(obj, "spec", "controlPlaneEndpoint", "host")
    port = dig(obj, "spec", "controlPlaneEndpoint", "port")
    if not host:
        return None
    return f"{host}:{port}" if port else str(host)


def _ref_name(obj: Mapping[str, Any], ref: str, kind: str) -> str | None:
    value = dig(obj, "spec", ref)
    if isinstance(value, Mapping) and value.get("kind") == kind and value.get("name"):
        return str(value["name"])
    return None


def _addresses(obj: Mapping[str, Any] | None) -> list[str]:
    if obj is None:
        return []
    found = []
    for address in dig(obj, "status", "addresses") or ():
        if (
            isinstance(address, Mapping)
            and address.get("type") in ("InternalIP", "ExternalIP")
            and address.get("address")
            and str(address["address"]) not in found
        ):
            found.append(str(address["address"]))
    return found


def clusters_by_key(caps: list[Raw], lcs: list[Raw]) -> tuple[dict[Key, Raw], dict[Key, Raw]]:
    """Cluster API Clusters and LibvirtClusters by (namespace, cluster name)."""
    capi_by_key = {(obj_ns(c), obj_name(c)): c for c in caps}
    lc_by_name = {(obj_ns(lc), obj_name(lc)): lc for lc in lcs}
    lc_by_key: dict[Key, Raw] = {}
    for key, capi in capi_by_key.items():
        infra = _ref_name(capi, "infrastructureRef", "LibvirtCluster")
        if infra and (key[0], infra) in lc_by_name:
            lc_by_key[key] = lc_by_name[(key[0], infra)]
    claimed = {id(lc) for lc in lc_by_key.values()}
    for lc in lcs:
        if id(lc) not in claimed:
            name = obj_label(lc, CLUSTER_NAME_LABEL) or obj_owner(lc, "Cluster") or obj_name(lc)
            lc_by_key.setdefault((obj_ns(lc), name), lc)
    return capi_by_key, lc_by_key


def machine_pairs(lms: list[Raw], cms: list[Raw]) -> list[tuple[Raw | None, Raw | None]]:
    """(LibvirtMachine, Machine) pairs; either side may be missing."""
    cm_by_key = {(obj_ns(m), obj_name(m)): m for m in cms}
    machine_of: dict[Key, Raw] = {}
    for key, capi_machine in cm_by_key.items():
        infra = _ref_name(capi_machine, "infrastructureRef", "LibvirtMachine")
        if infra:
            machine_of[(key[0], infra)] = capi_machine
    for lm in lms:
        owner = obj_owner(lm, "Machine")
        if owner and (obj_ns(lm), owner) in cm_by_key:
            machine_of[(obj_ns(lm), obj_name(lm))] = cm_by_key[(obj_ns(lm), owner)]
    joined: set[int] = set()
    pairs: list[tuple[Raw | None, Raw | None]] = []
    for lm in lms:
        paired = machine_of.get((obj_ns(lm), obj_name(lm)))
        if paired is not None:
            joined.add(id(paired))
        pairs.append((lm, paired))
    pairs.extend((None, m) for m in cms if id(m) not in joined)
    return pairs


def _machine_view(lm: Raw | None, machine: Raw | None) -> MachineView:
    base = lm if lm is not None else machine
    assert base is not None
    cluster_name = obj_label(base, CLUSTER_NAME_LABEL) or text(dig(machine, "spec", "clusterName"))
    ready = condition_status(lm, "Ready") if lm is not None else None
    if ready is None and machine is not None:
        ready = condition_status(machine, "Ready")
    return MachineView(
        namespace=obj_ns(base),
        cluster=cluster_name,
        name=obj_name(base),
        machine=obj_name(machine) if machine is not None else None,
        libvirt_machine=obj_name(lm) if lm is not None else None,
        host=text(dig(lm, "status", "host") or dig(lm, "spec", "hostName")),
        state=text(dig(lm, "status", "domainState")),
        addresses=_addresses(lm) or _addresses(machine),
        provider_id=text(dig(lm, "spec", "providerID") or dig(machine, "spec", "providerID")),
        ready=ready,
        phase=text(dig(machine, "status", "phase")),
        node=text(dig(machine, "status", "nodeRef", "name")),
        created=text(obj_meta(base).get("creationTimestamp")),
    )


def _cluster_view(
    key: Key, capi: Raw | None, lc: Raw | None, members: list[MachineView]
) -> ClusterView:
    spec_hosts = dig(lc, "spec", "hosts")
    status_hosts = dig(lc, "status", "hosts")
    base = lc if lc is not None else capi
    return ClusterView(
        namespace=key[0],
        name=key[1],
        libvirt_cluster=obj_name(lc) if lc is not None else None,
        phase=text(dig(capi, "status", "phase")),
        ready=condition_status(lc, "Ready") if lc is not None else None,
        endpoint=_endpoint(lc) or _endpoint(capi),
        hosts_reachable=sum(
            1 for h in status_hosts or () if isinstance(h, Mapping) and h.get("reachable") is True
        ),
        hosts_total=len(spec_hosts) if isinstance(spec_hosts, list) else 0,
        machines_ready=sum(1 for m in members if m.ready == "True"),
        machines_total=len(members),
        created=text(obj_meta(base).get("creationTimestamp")) if base is not None else None,
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

    capi_by_key, lc_by_key = clusters_by_key(caps, lcs)
    keys = sorted(set(capi_by_key) | set(lc_by_key))
    pairs = machine_pairs(lms, cms)
    views = [_machine_view(lm, m) for lm, m in pairs]
    if cluster is not None:
        keys = [
            k
            for k in keys
            if k[1] == cluster or (k in lc_by_key and obj_name(lc_by_key[k]) == cluster)
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
