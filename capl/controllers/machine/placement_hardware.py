"""Placement by hardware: only hosts that can give a new machine its CPU model, pinned
CPUs, NUMA cells, hugepages, devices, emulated TPM and secure boot are candidates
(`plan_hardware.refusal`, against `Host.hardware()`, asked concurrently). When none can,
DomainProvisioned is False with `HardwareUnavailable` naming each host and why; retried with
backoff (a device may be freed).
Machines without such demands skip this (no extra libvirt call)."""

from __future__ import annotations

import asyncio

from capl.api import constants as c
from capl.controllers.machine.indexes import INDEX_PENDING_HOST, host_index_value
from capl.controllers.machine.plan import Failure
from capl.controllers.machine.plan_hardware import domain_hardware, pending_selectors, refusal
from capl.controllers.machine.scope import MachineScope, Problem
from capl.controllers.machine.target import Target
from capl.ports.errors import VirtError
from capl.ports.virt import HostHardware, MdevSelector, PciSelector
from capl.runtime.resources import LIBVIRT_MACHINE

__all__ = ["check_hardware"]


async def check_hardware(scope: MachineScope, targets: list[Target]) -> list[Target]:
    """The targets that can give the machine its hardware (all, when it asks nothing of
    the host); raises `Problem` (HardwareUnavailable) when none can."""
    hw = domain_hardware(scope.lm.spec)
    if not hw.wants_host_check:
        return targets
    reports = await asyncio.gather(*(t.host.hardware() for t in targets), return_exceptions=True)
    fit: list[Target] = []
    reasons: list[str] = []
    for target, report in zip(targets, reports, strict=True):
        if isinstance(report, BaseException):
            if not isinstance(report, VirtError):
                raise report
            reasons.append(f"{target.name}: {report}")
            continue
        problem = refusal(
            hw,
            memory_mib=scope.lm.spec.memory_mib,
            host=report,
            pending=_pending(scope, target.name, report),
        )
        if problem is None:
            fit.append(target)
        else:
            reasons.append(f"{target.name}: {problem}")
    if not fit:
        which = "the machine's host cannot" if len(targets) == 1 else "no host can"
        raise Problem(
            Failure(
                c.Reason.HARDWARE_UNAVAILABLE,
                f"{which} give the machine its hardware: " + "; ".join(reasons),
                True,
            )
        )
    return fit


def _pending(
    scope: MachineScope, host: str, report: HostHardware
) -> tuple[list[PciSelector], list[MdevSelector]]:
    machines = scope.ctx.cache.by_index(
        LIBVIRT_MACHINE,
        INDEX_PENDING_HOST,
        host_index_value(scope.namespace, scope.cluster_name, host),
    )
    return pending_selectors(
        machines, skip_uid=scope.lm.metadata.uid or "", defined=report.domain_uuids
    )
