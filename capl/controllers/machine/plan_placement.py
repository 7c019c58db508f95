"""Pure decisions of placement: which host a new machine goes to, and where it went.

- `wanted_host`: the host a machine is pinned to, if any. Cluster API's spreading is
  authoritative: a machine not created yet whose `spec.hostName` names another host than its
  Machine's `spec.failureDomain` is refused (`FailureDomainConflict`), never silently placed
  on either. Once created, `spec.hostName` is where the domain lives (a live migration may
  have moved it out of its failure domain): it wins.
- `placeable_hosts` / `pinned_refusal` / `no_placeable_host`: which of the LibvirtCluster's
  hosts may take a new machine at all — control-plane machines only `controlPlane: true`
  hosts, nobody a host in maintenance (`spec.hosts[].maintenance`: cordoned) — and what the
  placement condition says when a pinned machine (spec.hostName or the Machine's failure
  domain) names a cordoned host, or no host is left.
- `choose_host`: the reachable candidate with the most memory left, after the memory of
  machines already placed there whose domains do not run yet (`committed_memory`,
  `pending_on_host`: keeps a burst of placements from all landing on the host that looked
  emptiest).
- `topology_labels`: the labels of the workload Node, as a cloud provider sets them: zone =
  the machine's host (its failure domain), region = the LibvirtCluster's spec.region.
- `Placement`: the record of where a machine's resources live, kept in an annotation with the
  identity (`clusterctl move` restores no status); deletion falls back to it when the
  LibvirtCluster is gone.

No I/O, no clock (see `capl.controllers.machine.plan`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from capl.api import constants as c
from capl.api.cluster import LibvirtHost

__all__ = [
    "PLACEMENT_ANNOTATION",
    "FailureDomainConflict",
    "HostCandidate",
    "Placement",
    "choose_host",
    "committed_memory",
    "cordoned_message",
    "no_placeable_host",
    "pending_on_host",
    "pinned_refusal",
    "placeable_hosts",
    "topology_labels",
    "wanted_host",
]

MIB: Final = 1024**2


# --- which hosts may take a new machine ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FailureDomainConflict:
    """spec.hostName and the Machine's spec.failureDomain name different hosts."""

    message: str


def wanted_host(
    *,
    host_name: str | None,
    failure_domain: str | None,
    created: bool,
    machine: str,
) -> str | FailureDomainConflict | None:
    """The host a machine is pinned to (None: capl chooses), or the conflict that keeps a
    machine not created yet from being placed at all.

    `machine` is the Machine's namespace/name, for the message. `created`: the identity is
    recorded (spec.domainUUID or spec.providerID): spec.hostName is then where the domain
    lives, whatever the failure domain says (a live migration moves machines across hosts).
    """
    if created or not host_name or not failure_domain or host_name == failure_domain:
        return host_name or failure_domain or None
    return FailureDomainConflict(
        f"spec.hostName {host_name!r} conflicts with Machine {machine}'s spec.failureDomain "
        f"{failure_domain!r}: Cluster API places this machine in failure domain "
        f"{failure_domain!r}; change the Machine's failure domain, or replace the machine "
        f"from a LibvirtMachineTemplate whose hostName is empty or {failure_domain!r} "
        "(hostName is immutable); nothing is created until they agree"
    )


def cordoned_message(host: LibvirtHost) -> str:
    """Why nothing new goes to a host in maintenance."""
    maintenance = host.maintenance
    why = f" ({maintenance.reason})" if maintenance is not None and maintenance.reason else ""
    return f"host {host.name} is in maintenance{why}: no new machine is placed there"


def placeable_hosts(hosts: Sequence[LibvirtHost], *, control_plane: bool) -> list[LibvirtHost]:
    """The hosts a new machine may be placed on, in spec order: not in maintenance, and for
    a control-plane machine only `controlPlane: true` hosts."""
    return [h for h in hosts if h.maintenance is None and (h.control_plane or not control_plane)]


def pinned_refusal(host: LibvirtHost) -> str | None:
    """Why a machine pinned to `host` (spec.hostName, or the Machine's failure domain) that
    has not been created yet waits instead (None: it may go there)."""
    if host.maintenance is None:
        return None
    return cordoned_message(host) + "; the machine waits until the maintenance ends"


def no_placeable_host(hosts: Sequence[LibvirtHost], *, control_plane: bool) -> str:
    """The placement message when `placeable_hosts` is empty."""
    cordoned = [h for h in hosts if h.maintenance is not None]
    if control_plane:
        allowed = [h for h in hosts if h.control_plane]
        if not allowed:
            return "no host of the LibvirtCluster allows control-plane machines"
        what = "control-plane host"
        cordoned = [h for h in allowed if h.maintenance is not None]
    else:
        what = "host"
    names = ", ".join(h.name for h in cordoned)
    return (
        f"no {what} of the LibvirtCluster can take a new machine: {names} "
        f"{'is' if len(cordoned) == 1 else 'are'} in maintenance"
    )


def topology_labels(*, host: str, region: str | None) -> dict[str, str]:
    """The well-known topology labels of a machine's Node: the zone is its host (a failure
    domain; host names are DNS labels, valid label values), the region the cluster's."""
    labels = {c.ZONE_LABEL: host}
    if region:
        labels[c.REGION_LABEL] = region
    return labels


@dataclass(frozen=True, slots=True, kw_only=True)
class HostCandidate:
    name: str
    free_bytes: int
    committed_bytes: int = 0
    """Memory of machines already placed on the host whose domains do not run yet."""

    @property
    def headroom(self) -> int:
        return self.free_bytes - self.committed_bytes


def choose_host(candidates: Sequence[HostCandidate]) -> str | None:
    """The candidate with the most memory left (ties: the first in spec order)."""
    best: HostCandidate | None = None
    for candidate in candidates:
        if best is None or candidate.headroom > best.headroom:
            best = candidate
    return None if best is None else best.name


PLACEMENT_ANNOTATION: Final = "libvirtmachine.infrastructure.cluster.x-k8s.io/placement"


@dataclass(frozen=True, slots=True, kw_only=True)
class Placement:
    """Where a machine's resources live; recorded (annotation, JSON) with the identity.

    Deletion prefers the live LibvirtCluster; this record is the fall-back when that is gone
    (forced deletion) and survives `clusterctl move`. Nothing in it is secret: the
    credentials Secret is named, not copied.
    """

    host: str
    uri: str
    pool: str
    network: str | None = None
    dns_domain: str | None = None
    credentials_secret: str | None = None
    cluster: str = ""

    def encode(self) -> str:
        record = {
            "host": self.host,
            "uri": self.uri,
            "pool": self.pool,
            "network": self.network,
            "dnsDomain": self.dns_domain,
            "credentialsSecret": self.credentials_secret,
            "cluster": self.cluster,
        }
        return json.dumps(
            {k: v for k, v in record.items() if v is not None},
            sort_keys=True,
            separators=(",", ":"),
        )

    @classmethod
    def decode(cls, text: str | None) -> Placement | None:
        if not text:
            return None
        try:
            record = json.loads(text)
            return cls(
                host=str(record["host"]),
                uri=str(record["uri"]),
                pool=str(record["pool"]),
                network=record.get("network"),
                dns_domain=record.get("dnsDomain"),
                credentials_secret=record.get("credentialsSecret"),
                cluster=str(record.get("cluster", "")),
            )
        except (ValueError, KeyError, TypeError):
            return None


def pending_on_host(obj: Mapping[str, Any]) -> bool:
    """Placed on a host (spec.hostName) and not provisioned yet: its memory is committed
    there although its domain may not run (see committed_memory)."""
    spec = obj.get("spec") or {}
    if not spec.get("hostName"):
        return False
    return not ((obj.get("status") or {}).get("initialization") or {}).get("provisioned")


def committed_memory(machines: Iterable[Mapping[str, Any]], *, host: str, skip_uid: str) -> int:
    """Memory (bytes) of machines placed on `host` that do not run yet (not provisioned):
    keeps a burst of placements from all landing on the host that looked emptiest."""
    total = 0
    for obj in machines:
        meta = obj.get("metadata") or {}
        spec = obj.get("spec") or {}
        if meta.get("uid") == skip_uid or spec.get("hostName") != host:
            continue
        if not pending_on_host(obj):
            continue
        total += int(spec.get("memoryMiB") or 4096) * MIB
    return total
