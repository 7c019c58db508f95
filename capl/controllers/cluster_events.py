"""The Events of the LibvirtCluster controller: Normal for what it created or removed on a
host (networks, pools, endpoint records), Warning for every condition that turned False or
changed its cause (with the libvirt cause in the message)."""

from __future__ import annotations

from collections.abc import Sequence

from capl.api import constants as c
from capl.controllers.cluster_hosts import HostReport
from capl.runtime.conditions import FALSE, get_condition
from capl.runtime.events import NORMAL, WARNING, Recorder
from capl.runtime.objects import Obj, get_path

__all__ = ["report_changes", "report_removals", "warn_new_failures"]


def report_changes(recorder: Recorder, obj: Obj, reports: Sequence[HostReport]) -> None:
    """Normal events for the networks and pools created and the endpoint records changed."""
    for report in reports:
        where = report.plan.label
        if report.network is not None and report.network.created:
            recorder.event(
                obj,
                NORMAL,
                "NetworkCreated",
                f"created network {report.network.name} on {where}",
            )
        if report.pool is not None and report.pool.created:
            recorder.event(
                obj,
                NORMAL,
                "StoragePoolCreated",
                f"created storage pool {report.pool.name} at {report.pool.path} on {where}",
            )
        for change in report.dns_changes:
            parts = []
            if change.add:
                parts.append(f"added {', '.join(change.add)}")
            if change.remove:
                parts.append(f"removed {', '.join(change.remove)}")
            recorder.event(
                obj,
                NORMAL,
                "EndpointRecordsUpdated",
                f"DNS record {change.ip} on {where}: {'; '.join(parts)}",
            )


def warn_new_failures(recorder: Recorder, original: Obj, obj: Obj) -> None:
    """A Warning event for every condition that turned False or changed its cause."""
    for cond in get_path(obj, "status", "conditions") or []:
        if cond.get("type") == c.ConditionType.READY or cond.get("status") != FALSE:
            continue
        before = get_condition(original, str(cond.get("type")))
        if before is not None and all(
            before.get(k) == cond.get(k) for k in ("status", "reason", "message")
        ):
            continue
        recorder.event(obj, WARNING, str(cond.get("reason")), str(cond.get("message")))


# -- delete ---------------------------------------------------------------------------


def report_removals(
    recorder: Recorder, obj: Obj, reports: Sequence[HostReport], *, network: str, pool: str
) -> None:
    """Normal events for the networks and pools a deletion removed."""
    for report in reports:
        where = report.plan.label
        if report.network_removed:
            recorder.event(obj, NORMAL, "NetworkDeleted", f"removed network {network} from {where}")
        if report.pool_removed:
            recorder.event(
                obj, NORMAL, "StoragePoolDeleted", f"removed storage pool {pool} from {where}"
            )
