"""The LibvirtMachineTemplate controller: `status.capacity` and `status.nodeInfo` follow the spec.

The Cluster API autoscaler scales a MachineDeployment up from zero replicas only when it
knows what a node of it would offer: its clusterapi provider reads the infrastructure
template's `status.capacity` (`cpu`, `memory`, extended resources) and `status.nodeInfo`
(`architecture`, `operatingSystem`) — the "autoscaling from zero" part of the
InfraMachineTemplate contract. This controller keeps them equal to what the template's spec
says (`capl.api.templates.machine_template_status`).

One reconcile, level-based, no libvirt: read the template from the cache (or our own newer
write), compute the status from `spec.template.spec`, and send one status patch when it
differs; nothing when it is already in sync. It watches LibvirtMachineTemplates, every
change (a status change by anyone else is put right as well; our own write comes back as
one reconcile that finds nothing to do), and Clusters, mapped to the templates labelled with
their name (`cluster.x-k8s.io/cluster-name`, as the topology controller labels the templates
it makes), for pause. Pause means no writes: a template with the `cluster.x-k8s.io/paused`
annotation, or whose Cluster has `spec.paused` (e.g. during `clusterctl move`), or being
deleted, is not written; unpausing the Cluster brings its templates up to date. A template
this version cannot read (spec invalid for its model) is logged and left alone, not retried.
"""

from __future__ import annotations

import structlog

from capl.api.capi import Cluster, is_paused
from capl.api.constants import CLUSTER_NAME_LABEL
from capl.api.templates import LibvirtMachineTemplate, machine_template_status
from capl.controllers.common import Deps, InvalidObject, parse
from capl.runtime.controller import Controller, Result, Watch
from capl.runtime.handlers import map_cluster_members
from capl.runtime.manager import Manager
from capl.runtime.objects import Obj, ObjectKey, labels, meta
from capl.runtime.patch import Patcher, ReadYourWrites
from capl.runtime.resources import CLUSTER, LIBVIRT_MACHINE_TEMPLATE

__all__ = ["CONTROLLER_NAME", "MachineTemplateReconciler", "setup"]

log = structlog.get_logger("capl.controllers.machine_template")

CONTROLLER_NAME = "libvirtmachinetemplate"
DONE = Result()


class MachineTemplateReconciler:
    """Keeps a LibvirtMachineTemplate's status (capacity, nodeInfo) in sync with its spec."""

    def __init__(self, deps: Deps) -> None:
        self.deps = deps
        self.writes = ReadYourWrites()
        self.patches = 0
        """Status patches sent (tests, diagnostics)."""

    async def reconcile(self, key: ObjectKey) -> Result:
        obj = self.writes.read(key, self.deps.cache.get(LIBVIRT_MACHINE_TEMPLATE, key))
        if obj is None or meta(obj).get("deletionTimestamp"):
            return DONE
        try:
            template = parse(LibvirtMachineTemplate, obj)
        except InvalidObject as exc:
            log.warning(
                "template not readable; status left alone", template=str(key), error=str(exc)
            )
            return DONE
        if is_paused(cluster=self._cluster_of(obj), obj=template.metadata):
            return DONE
        desired = machine_template_status(template.spec.template.spec)
        current = obj.get("status") or {}
        if all(current.get(name) == value for name, value in desired.items()):
            return DONE
        patcher = Patcher(
            self.deps.client.resource(LIBVIRT_MACHINE_TEMPLATE), obj, writes=self.writes
        )
        patcher.obj["status"] = {**current, **desired}
        await patcher.apply()
        self.patches += 1
        log.info("template status updated", template=str(key), **desired["capacity"])
        return DONE

    def _cluster_of(self, obj: Obj) -> Cluster | None:
        """The Cluster the template is labelled with, from the cache (None: none, unknown)."""
        name = labels(obj).get(CLUSTER_NAME_LABEL)
        if not name:
            return None
        raw = self.deps.cache.get(CLUSTER, ObjectKey(meta(obj).get("namespace") or "", name))
        try:
            return parse(Cluster, raw) if raw is not None else None
        except InvalidObject:
            return None


def setup(manager: Manager, deps: Deps) -> Controller:
    """Register the LibvirtMachineTemplate controller (`deps.cache` is `manager.cache`)."""
    reconciler = MachineTemplateReconciler(deps)
    return manager.add_controller(
        CONTROLLER_NAME,
        for_=LIBVIRT_MACHINE_TEMPLATE,
        reconciler=reconciler,
        watches=(Watch(CLUSTER, map_cluster_members(manager.cache, LIBVIRT_MACHINE_TEMPLATE)),),
        predicates=(),
        concurrency=1,
    )
