"""The report of `capl hosts`: every KVM host of the LibvirtClusters in scope, with its
maintenance and the machines on it.

What it reads (``collect``, one list per kind in parallel): LibvirtClusters and
LibvirtMachines and, when the Cluster API CRDs are installed, Clusters and Machines (a
Cluster's ``infrastructureRef`` pins its LibvirtCluster; a Machine's
``cluster.x-k8s.io/control-plane`` label counts as its LibvirtMachine's).

How it is joined (``build_hosts``, a pure function):

- a *host* is a (name, URI) pair: the same host in several LibvirtClusters is one row, with
  one ``HostEntry`` per cluster (a host name alone is per cluster: two clusters may give the
  name ``kvm1`` to different hosts, which are then two rows);
- a machine belongs to the LibvirtCluster of its cluster (``status_report``'s join, as in
  `capl status`) and is *on* a host when its ``status.host`` (else ``spec.hostName``) names
  it; it migrates *out* while it is on the host with ``spec.migrationTarget`` set, and *in*
  while its ``spec.migrationTarget`` names the host;
- the maintenance of an entry is ``status.hosts[].maintenance.phase`` (Evacuating, Blocked,
  Evacuated) while ``spec.hosts[].maintenance`` is set; ``Pending`` when the spec asks for
  maintenance and the status does not show it yet; ``Ending`` when the spec no longer asks
  for it and the status still shows it; None otherwise.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from capl.commands.raw import (
    CLUSTER_NAME_LABEL,
    CONTROL_PLANE_LABEL,
    dig,
    has_label,
    obj_label,
    obj_name,
    obj_ns,
    text,
)
from capl.commands.shared import list_kind
from capl.commands.status_report import clusters_by_key, machine_pairs

if TYPE_CHECKING:
    from capl.kube.client import KubeClient

__all__ = [
    "HostEntry",
    "HostView",
    "HostsReport",
    "build_hosts",
    "collect_hosts",
    "combine",
    "maintenance_phase",
]

Raw = Mapping[str, Any]


@dataclass(slots=True, kw_only=True)
class HostEntry:
    """One host as one LibvirtCluster has it."""

    namespace: str
    cluster: str
    """The LibvirtCluster's name."""
    reachable: bool | None
    libvirt_version: str | None
    control_plane_allowed: bool
    maintenance: str | None
    """None, Pending, Evacuating, Blocked, Evacuated or Ending (see the module docstring)."""
    maintenance_reason: str | None = None
    maintenance_message: str | None = None
    machines_left: int | None = None
    """status.hosts[].maintenance.machines: machines of the cluster still on the host."""
    message: str | None = None
    """status.hosts[].message: why the host is not ready."""
    machines: list[str] = field(default_factory=list)
    control_plane_machines: list[str] = field(default_factory=list)
    migrating_in: list[str] = field(default_factory=list)
    migrating_out: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"{self.namespace}/{self.cluster}"


@dataclass(slots=True, kw_only=True)
class HostView:
    """One KVM host (name and URI) across the clusters that have it."""

    name: str
    uri: str
    clusters: list[str]
    """The LibvirtClusters that have it (namespace/name)."""
    reachable: str | None
    libvirt_version: str | None
    maintenance: str | None
    machines: int
    control_plane_machines: int
    migrating_in: int
    migrating_out: int
    entries: list[HostEntry]


@dataclass(slots=True, kw_only=True)
class HostsReport:
    namespace: str | None
    """The namespace shown, None for all namespaces."""
    hosts: list[HostView] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def maintenance_phase(spec_host: Raw, status_host: Raw | None) -> str | None:
    """The maintenance state of one host entry (see the module docstring)."""
    wanted = isinstance(spec_host.get("maintenance"), Mapping)
    phase = text(dig(status_host, "maintenance", "phase"))
    if wanted:
        return phase or "Pending"
    return "Ending" if phase is not None else None


def combine(values: Sequence[tuple[str, str | None]]) -> str | None:
    """One value when every cluster agrees, else ``cluster:value`` for each ("-" for none)."""
    distinct = {value for _, value in values}
    if len(distinct) <= 1:
        return next(iter(distinct), None)
    return ",".join(f"{label}:{value or '-'}" for label, value in values)


def _entry(lc: Raw, spec_host: Raw, status_host: Raw | None) -> HostEntry:
    reachable = dig(status_host, "reachable")
    entry = HostEntry(
        namespace=obj_ns(lc),
        cluster=obj_name(lc),
        reachable=reachable if isinstance(reachable, bool) else None,
        libvirt_version=text(dig(status_host, "libvirtVersion")),
        control_plane_allowed=spec_host.get("controlPlane") is not False,
        maintenance=maintenance_phase(spec_host, status_host),
        maintenance_reason=text(dig(spec_host, "maintenance", "reason")),
        maintenance_message=text(dig(status_host, "maintenance", "message")),
        message=text(dig(status_host, "message")),
    )
    left = dig(status_host, "maintenance", "machines")
    entry.machines_left = left if isinstance(left, int) else None
    return entry


def _place_machines(
    entries: Mapping[tuple[int, str], HostEntry],
    lc_by_key: Mapping[tuple[str, str], Raw],
    pairs: Sequence[tuple[Raw | None, Raw | None]],
) -> None:
    """Count each LibvirtMachine on (and migrating to) its cluster's hosts."""
    for lm, machine in pairs:
        if lm is None:
            continue
        cluster = obj_label(lm, CLUSTER_NAME_LABEL) or text(dig(machine, "spec", "clusterName"))
        lc = lc_by_key.get((obj_ns(lm), cluster or ""))
        if lc is None:
            continue
        name = obj_name(lm)
        host = text(dig(lm, "status", "host")) or text(dig(lm, "spec", "hostName"))
        target = text(dig(lm, "spec", "migrationTarget"))
        on = entries.get((id(lc), host or ""))
        if on is not None:
            on.machines.append(name)
            if has_label(lm, CONTROL_PLANE_LABEL) or has_label(machine, CONTROL_PLANE_LABEL):
                on.control_plane_machines.append(name)
            if target is not None:
                on.migrating_out.append(name)
        into = entries.get((id(lc), target or ""))
        if into is not None:
            into.migrating_in.append(name)


def _view(name: str, uri: str, entries: list[HostEntry]) -> HostView:
    one_namespace = len({e.namespace for e in entries}) == 1
    labels = [e.cluster if one_namespace else e.label for e in entries]

    def per_cluster(values: list[str | None]) -> str | None:
        return combine(list(zip(labels, values, strict=True)))

    reachable = [None if e.reachable is None else str(e.reachable) for e in entries]
    return HostView(
        name=name,
        uri=uri,
        clusters=[e.label for e in entries],
        reachable=per_cluster(reachable),
        libvirt_version=per_cluster([e.libvirt_version for e in entries]),
        maintenance=per_cluster([e.maintenance for e in entries]),
        machines=sum(len(e.machines) for e in entries),
        control_plane_machines=sum(len(e.control_plane_machines) for e in entries),
        migrating_in=sum(len(e.migrating_in) for e in entries),
        migrating_out=sum(len(e.migrating_out) for e in entries),
        entries=entries,
    )


def build_hosts(
    *,
    namespace: str | None,
    libvirt_clusters: Sequence[Raw],
    libvirt_machines: Sequence[Raw],
    clusters: Sequence[Raw] = (),
    machines: Sequence[Raw] = (),
    cluster: str | None = None,
) -> HostsReport:
    """The hosts of the LibvirtClusters (only of ``cluster``, by Cluster API or LibvirtCluster
    name, when given), sorted by name and URI."""
    _, lc_by_key = clusters_by_key(list(clusters), list(libvirt_clusters))
    if cluster is not None:
        lc_by_key = {k: lc for k, lc in lc_by_key.items() if cluster in (k[1], obj_name(lc))}
    entries: dict[tuple[int, str], HostEntry] = {}
    rows: dict[tuple[str, str], list[HostEntry]] = {}
    for lc in sorted(lc_by_key.values(), key=lambda c: (obj_ns(c), obj_name(c))):
        statuses = {
            str(h.get("name")): h
            for h in dig(lc, "status", "hosts") or ()
            if isinstance(h, Mapping)
        }
        for spec_host in dig(lc, "spec", "hosts") or ():
            if not isinstance(spec_host, Mapping) or not spec_host.get("name"):
                continue
            name, uri = str(spec_host["name"]), str(spec_host.get("uri") or "")
            entry = _entry(lc, spec_host, statuses.get(name))
            entries[(id(lc), name)] = entry
            rows.setdefault((name, uri), []).append(entry)
    _place_machines(entries, lc_by_key, machine_pairs(list(libvirt_machines), list(machines)))
    report = HostsReport(namespace=namespace)
    report.hosts = [_view(name, uri, found) for (name, uri), found in sorted(rows.items())]
    return report


async def collect_hosts(
    client: KubeClient, *, namespace: str | None, cluster: str | None = None
) -> HostsReport:
    """Read the four kinds (``namespace`` None: all namespaces) and build the report."""
    from capl.runtime.resources import CLUSTER, LIBVIRT_CLUSTER, LIBVIRT_MACHINE, MACHINE

    lcs, lms, caps, cms = await asyncio.gather(
        list_kind(client, LIBVIRT_CLUSTER, namespace=namespace),
        list_kind(client, LIBVIRT_MACHINE, namespace=namespace),
        list_kind(client, CLUSTER, namespace=namespace),
        list_kind(client, MACHINE, namespace=namespace),
    )
    report = build_hosts(
        namespace=namespace,
        libvirt_clusters=lcs or (),
        libvirt_machines=lms or (),
        clusters=caps or (),
        machines=cms or (),
        cluster=cluster,
    )
    if lcs is None or lms is None:
        report.notes.append(
            "capl's CRDs (LibvirtCluster, LibvirtMachine) are not installed on this API server"
        )
    return report
