"""LibvirtCluster status from the per-host reports (pure functions on raw status dicts).

Everything here is deterministic in its inputs (hosts in spec order, sorted names, no
timestamps besides the conditions' transition times, which `set_condition` keeps while the
status does not change), so a reconcile that finds the world unchanged computes a status equal
to the stored one and the status patch stays empty.

- `status.failureDomains`: one per host that capl has reached at least once (attributes
  `cpus`, `memoryMiB`, `libvirtVersion`, `uri` without query/credentials). A host that becomes
  unreachable keeps its failure domain with the last known attributes, so placement does not
  reshuffle on a transient outage; a host never reached is published once it answers.
  `controlPlane` is the host's spec value, except `false` while the host is in maintenance
  (cordoned: Cluster API stops offering it to control planes).
- `status.hosts[]`: per host, what was observed this time (fields of an unreachable host are
  carried over from the previous status, with `reachable: false` and the cause in `message`).
  `networkUUID` is the network's identity: the LibvirtMachine controller watches it and, when
  it changes (the network was re-created, by this controller after it vanished or out of
  band), the machines on that host restore their DHCP reservations and DNS records.
- Conditions: `HostsReachable` names the hosts that could not be used and why;
  `NetworkReady` / `StorageReady` judge the reachable hosts; `ControlPlaneEndpointReady`
  the endpoint and its records; `Ready` summarises the four in that order.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from capl.api.constants import ConditionType, Reason
from capl.controllers.cluster_hosts import HostReport, Problem
from capl.runtime.conditions import FALSE, TRUE, UNKNOWN, Status, set_condition, summarize

__all__ = [
    "MAX_MESSAGE",
    "READY_ORDER",
    "failure_domains",
    "host_statuses",
    "join_messages",
    "set_host_conditions",
    "set_ready",
]

MiB = 1024 * 1024
MAX_MESSAGE = 1024
"""Bound of status.hosts[].message; condition messages are kept to a few of these."""

READY_ORDER = (
    ConditionType.HOSTS_REACHABLE,
    ConditionType.NETWORK_READY,
    ConditionType.STORAGE_READY,
    ConditionType.CONTROL_PLANE_ENDPOINT_READY,
)


def join_messages(messages: Sequence[str], *, limit: int = 4 * MAX_MESSAGE) -> str:
    text = "; ".join(messages)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def failure_domains(
    reports: Sequence[HostReport], previous: Sequence[Mapping[str, Any]] | None
) -> list[dict[str, Any]]:
    before = {str(fd.get("name")): fd for fd in previous or () if isinstance(fd, Mapping)}
    result: list[dict[str, Any]] = []
    for report in reports:
        info = report.info
        if info is not None:
            attributes = {
                "cpus": str(info.cpus),
                "memoryMiB": str(info.memory_total_bytes // MiB),
                "libvirtVersion": info.libvirt_version,
            }
        else:
            old = before.get(report.name, {}).get("attributes")
            if not isinstance(old, Mapping) or not old:
                continue
            attributes = {str(k): str(v) for k, v in old.items()}
        attributes["uri"] = report.plan.host_id
        result.append(
            {
                "name": report.name,
                "controlPlane": report.plan.control_plane and not report.plan.cordoned,
                "attributes": attributes,
            }
        )
    return result


def host_statuses(
    reports: Sequence[HostReport], previous: Sequence[Mapping[str, Any]] | None
) -> list[dict[str, Any]]:
    before = {str(h.get("name")): h for h in previous or () if isinstance(h, Mapping)}
    result: list[dict[str, Any]] = []
    for report in reports:
        entry: dict[str, Any] = dict(before.get(report.name, {}))
        entry["name"] = report.name
        entry["reachable"] = report.reachable
        if report.info is not None:
            entry["libvirtVersion"] = report.info.libvirt_version
        if report.network is not None:
            entry["network"] = report.network.name
            entry["networkCreated"] = bool(report.network_created_by_capl)
            if report.network.uuid:
                # a new UUID (network re-created) makes the machines restore their entries
                entry["networkUUID"] = report.network.uuid.lower()
            if report.network.bridge:
                entry["bridge"] = report.network.bridge
            else:
                entry.pop("bridge", None)
        if report.pool is not None:
            entry["storagePool"] = report.pool.name
            entry["storagePoolCreated"] = bool(report.pool_created_by_capl)
        problems = report.problems()
        if problems:
            entry["message"] = join_messages([p.message for p in problems], limit=MAX_MESSAGE)
        else:
            entry.pop("message", None)
        result.append(entry)
    return result


def _first_reason(problems: Sequence[Problem]) -> str:
    return problems[0].reason


def _set(
    obj: dict[str, Any],
    type_: str,
    status: Status,
    reason: str,
    message: str,
    now: Callable[[], str],
) -> bool:
    return set_condition(obj, type_, status, reason=reason, message=message, now=now)


def set_host_conditions(
    obj: dict[str, Any],
    reports: Sequence[HostReport],
    *,
    network: str,
    pool: str,
    now: Callable[[], str],
) -> None:
    """HostsReachable, NetworkReady and StorageReady on a (copied) LibvirtCluster."""
    unreachable = [r.connect for r in reports if r.connect is not None]
    if not unreachable:
        _set(obj, ConditionType.HOSTS_REACHABLE, TRUE, Reason.REACHABLE, "", now)
    else:
        all_credentials = all(p.reason == Reason.CREDENTIALS_INVALID for p in unreachable)
        _set(
            obj,
            ConditionType.HOSTS_REACHABLE,
            FALSE,
            Reason.CREDENTIALS_INVALID if all_credentials else Reason.UNREACHABLE,
            join_messages([p.message for p in unreachable]),
            now,
        )
    reachable = [r for r in reports if r.reachable]
    for type_, what, problems, done in (
        (
            ConditionType.NETWORK_READY,
            f"network {network}",
            [r.network_problem for r in reachable if r.network_problem is not None],
            [r.name for r in reachable if r.network is not None],
        ),
        (
            ConditionType.STORAGE_READY,
            f"storage pool {pool}",
            [r.pool_problem for r in reachable if r.pool_problem is not None],
            [r.name for r in reachable if r.pool is not None],
        ),
    ):
        if problems:
            _set(
                obj,
                type_,
                FALSE,
                _first_reason(problems),
                join_messages([p.message for p in problems]),
                now,
            )
        elif not reachable:
            _set(obj, type_, UNKNOWN, Reason.UNREACHABLE, "no host is reachable", now)
        else:
            _set(obj, type_, TRUE, Reason.READY, f"{what} on {', '.join(done)}", now)


def set_ready(obj: dict[str, Any], *, now: Callable[[], str]) -> None:
    summarize(obj, READY_ORDER, true_reason=Reason.READY, now=now)
