"""The LibvirtMachine controller: one libvirt domain per Cluster API Machine.

A package of small services around one scope per reconcile (after the layout of Cluster API
providers such as CAPMOX: a thin controller, a scope, services by concern):

    reconciler   watches, setup, API-error backoff; the order of the steps (`_provision`)
    gates        owner Machine, pause, finalizer, infrastructure, migration; the identity patch
    scope        MachineScope: the objects of one reconcile, their patcher, one status write
    memory       MachineMemory: everything remembered per key, forgotten in one place
    options      MachineOptions (timings)
    indexes      the cache indexes a reconcile reads instead of scanning
    target       Identity, Target, Leftover: what a machine is and where it lives
    placement    which host (chosen, pinned, or recorded for deletion)
    domain       the domain found by UUID, created when missing, started when stopped
    create       creating storage, reservations and the domain; rollback; removal
    network      DHCP reservations and DNS records: made, restored, removed
    guest        addresses, the workload Node's providerID, bootstrap success
    bootstrap    BootstrapSucceeded through the guest agent
    cleanup      what vanished objects left, the orphan sweep
    delete       the deletion steps (`delete_steps`): move, pause, shutdown, undefine,
                 volumes, network entries, IPAM addresses
    day2         a spec changed after creation applied to the domain (day2_plan: what)
    plan*        the pure planning core: no I/O, no clock (plan, plan_placement,
                 plan_addresses, plan_orphans)

Services import `scope`, `memory`, the `plan*` modules and each other, never the reconciler
(import-linter holds that). Every reconcile is level-based and costs at most one spec patch
(the identity, before anything is created) and one status patch; decisions without I/O live in
the `plan*` modules. Nothing in a reconcile scans every LibvirtMachine (`indexes`).
"""

from __future__ import annotations

from capl.controllers.machine.cleanup import (
    DELETE_FOR_MOVE_ANNOTATION,
    ORPHAN_REMOVED_REASON,
    ROLLED_BACK_REASON,
)
from capl.controllers.machine.indexes import (
    INDEX_BOOTSTRAP_SECRET,
    INDEX_DOMAIN_UUID,
    INDEX_HOST,
    INDEX_INTERNAL_IP,
    INDEX_PENDING_HOST,
)
from capl.controllers.machine.network import (
    NETWORK_RESTORE_FAILED_REASON,
    NETWORK_RESTORED_REASON,
)
from capl.controllers.machine.options import MachineOptions
from capl.controllers.machine.reconciler import CONTROLLER_NAME, LibvirtMachineReconciler, setup

__all__ = [
    "CONTROLLER_NAME",
    "DELETE_FOR_MOVE_ANNOTATION",
    "INDEX_BOOTSTRAP_SECRET",
    "INDEX_DOMAIN_UUID",
    "INDEX_HOST",
    "INDEX_INTERNAL_IP",
    "INDEX_PENDING_HOST",
    "NETWORK_RESTORED_REASON",
    "NETWORK_RESTORE_FAILED_REASON",
    "ORPHAN_REMOVED_REASON",
    "ROLLED_BACK_REASON",
    "LibvirtMachineReconciler",
    "MachineOptions",
    "setup",
]
