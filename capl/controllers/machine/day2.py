"""Day-2 changes: a changed spec applied to the existing domain instead of being ignored.

Step 8b of the reconcile (after `domain.ensure_domain`): when the spec's day-2 fingerprint
(`day2_plan.fingerprint`: cpus, memory, maxima, disk sizes, extra disks, NICs) differs from
the one the domain was last found to match (`MachineMemory.day2`; nothing after a process
start), the domain's hardware is read once (`Host.domain_hardware`) and `plan_changes` lists
what to do:

- a grown root or extra disk: `Host.grow_disk` (QEMU's block resize while it runs);
- an added extra disk: its volume (`day2_plan.added_disk_volume`), then hot-plugged with its
  name as serial; if plugging fails the new volume is deleted again (nothing half-made);
- a removed extra disk: unplugged, then its volume deleted;
- an added NIC: its MAC (a DHCP reservation on the cluster network, as at creation), then
  hot-plugged; a removed NIC: unplugged, its reservation removed;
- vCPUs and memory: `Host.set_vcpus` / `set_memory` (live up to the maxima the domain was
  started with, else persistent only).

A freshly created domain was made from the spec: its fingerprint is recorded without a read;
so is that of a machine whose status shows this generation observed with HardwareUpdated
absent or True (after a manager restart: no libvirt call per machine). Settled machines make
no call (the fingerprint only changes with the object).

The HardwareUpdated condition (absent until the first day-2 change) says what happened:
True/HardwareApplied; False/RestartRequired naming what waits for the next power cycle (a
shutdown and start: a reboot from inside the guest keeps the QEMU process); False/NotInPlace
naming a change that cannot be made in place (a rollout replaces the machine); False/
HardwareUpdateFailed with libvirt's error (a Warning event; retried with backoff). While
something waits or failed the domain is read again on the next reconcile.

Snapshots: every change is made under a disk-only snapshot when the manager injects one
(`Deps.snapshots`; `day2_snapshot` says how, and why disk-only): merged away once the change
worked; when it fails the domain is reverted to it (disks, definition, a restart of the
guest), volumes it created are deleted, HardwareUpdated False/HardwareReverted and a
Warning event say so, and this generation is not tried again. Deleting what a change
removes (a disk's volume, a NIC's reservation) waits until the change is kept.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

import structlog

from capl.api import constants as c
from capl.controllers.machine.day2_plan import (
    AddDisk,
    AddNic,
    Change,
    DayTwoPlan,
    GrowDisk,
    RemoveDisk,
    RemoveNic,
    SetMemory,
    SetVcpus,
    added_disk_volume,
    fingerprint,
    plan_changes,
)
from capl.controllers.machine.day2_snapshot import DiskSnapshots
from capl.controllers.machine.domain import DomainOutcome
from capl.controllers.machine.network import reserve_nic
from capl.controllers.machine.options import LOGGER
from capl.controllers.machine.plan import classify
from capl.controllers.machine.scope import MachineScope
from capl.ports.errors import VirtError
from capl.ports.virt import DiskBus, DiskSpec, DomainResources, NicSpec, VolumeFormat
from capl.runtime.conditions import get_condition
from capl.runtime.controller import Result

__all__ = [
    "ChangeReverted",
    "NoSnapshots",
    "Snapshots",
    "apply_changes",
    "describe",
    "snapshots_for",
]

log = structlog.get_logger(LOGGER)

GIB = 1024**3


class Snapshots(Protocol):
    """Taken before a day-2 change, reverted if it fails, dropped once it worked
    (`day2_snapshot.DiskSnapshots`; `NoSnapshots` when `Deps.snapshots` is None)."""

    async def finish_leftover(self, scope: MachineScope, hardware: DomainResources) -> bool:
        """Merge what an interrupted change left; True when it did (read the domain again)."""
        ...

    async def before(
        self, scope: MachineScope, plan: DayTwoPlan, hardware: DomainResources
    ) -> object | None: ...

    async def revert(self, scope: MachineScope, token: object) -> None: ...

    async def drop(self, scope: MachineScope, token: object) -> None: ...


class NoSnapshots:
    """No snapshot: a failed change is reported and retried."""

    async def finish_leftover(self, scope: MachineScope, hardware: DomainResources) -> bool:
        return False

    async def before(
        self, scope: MachineScope, plan: DayTwoPlan, hardware: DomainResources
    ) -> object | None:
        return None

    async def revert(self, scope: MachineScope, token: object) -> None:
        return None

    async def drop(self, scope: MachineScope, token: object) -> None:
        return None


def snapshots_for(scope: MachineScope) -> Snapshots:
    """What the manager injected (`Deps.snapshots`), else no snapshots."""
    of = scope.ctx.deps.snapshots
    return NoSnapshots() if of is None else DiskSnapshots(of)


class ChangeReverted(Exception):
    """The change failed and the domain was reverted to the snapshot taken before it."""

    def __init__(self, cause: VirtError) -> None:
        super().__init__(str(cause))
        self.cause = cause


async def apply_changes(
    scope: MachineScope, outcome: DomainOutcome, *, snapshots: Snapshots | None = None
) -> Result | None:
    """Step 8b (see the module docstring): a retry Result after a failure, else None."""
    spec = scope.lm.spec
    wanted = fingerprint(spec)
    record = scope.record
    if outcome.created:
        record.day2 = wanted  # made from this spec
        return None
    if record.day2 == wanted or _reverted_this_generation(scope):
        return None
    if record.day2 is None and _settled_before(scope):
        record.day2 = wanted  # e.g. after a restart: no libvirt call for what was done
        return None
    on = scope.on
    target = on.target
    guard = snapshots or snapshots_for(scope)
    try:
        hardware = await target.host.domain_hardware(on.domain_uuid)
        if await guard.finish_leftover(scope, hardware):
            hardware = await target.host.domain_hardware(on.domain_uuid)
        plan = plan_changes(
            spec,
            hardware,
            cluster_network=target.network or "",
            bridge_mode=target.bridge_mode,
        )
        if not plan.changes and not plan.not_in_place:
            record.day2 = wanted
            _report_in_sync(scope)
            return None
        pending = await _apply_with_snapshot(scope, plan, hardware, guard)
    except ChangeReverted as exc:
        _report_reverted(scope, exc.cause)
        return None
    except VirtError as exc:
        failure = classify(exc)
        message = f"applying the changed spec to the domain failed: {failure.message}"
        previous = get_condition(scope.current, c.ConditionType.HARDWARE_UPDATED)
        scope.set(c.ConditionType.HARDWARE_UPDATED, False, c.Reason.HARDWARE_UPDATE_FAILED, message)
        if previous is None or previous.get("message") != message:
            scope.event("Warning", c.Reason.HARDWARE_UPDATE_FAILED, message)
        delay = scope.ctx.options.backoff(record.failures)
        record.failures += 1
        return Result(requeue_after=delay)
    _report(scope, plan, pending)
    if not pending and not plan.not_in_place:
        record.day2 = wanted
    return None


def _settled_before(scope: MachineScope) -> bool:
    """A reconcile (of this process or an earlier one) observed this generation and left
    HardwareUpdated absent or True: the domain matched the spec then."""
    lm = scope.lm
    if lm.metadata.generation is None or lm.status.observed_generation != lm.metadata.generation:
        return False
    condition = get_condition(scope.current, c.ConditionType.HARDWARE_UPDATED)
    return condition is None or condition.get("status") == "True"


def _reverted_this_generation(scope: MachineScope) -> bool:
    """This generation's change failed and was reverted: not tried again (a retry would fail
    and restart the guest again) until the spec changes. Read from the status: level-based,
    also after a restart."""
    condition = get_condition(scope.current, c.ConditionType.HARDWARE_UPDATED)
    generation = scope.lm.metadata.generation
    return bool(
        condition is not None
        and condition.get("reason") == c.Reason.HARDWARE_REVERTED
        and generation is not None
        and condition.get("observedGeneration") == generation
    )


@dataclass
class _Undo:
    """What a change defers or takes back: volumes it created (deleted after a revert) and
    deletions of what it removed (made once the change is kept: a revert brings the removed
    disk or NIC back, its volume and DHCP reservation must still be there)."""

    created: list[str] = field(default_factory=list)
    deferred: list[Callable[[], Awaitable[object]]] = field(default_factory=list)

    async def finish(self) -> None:
        for step in self.deferred:
            await step()

    async def take_back(self, scope: MachineScope) -> None:
        on = scope.on
        for name in self.created:
            await on.target.host.delete_volume(pool=on.target.pool, name=name)


async def _apply_with_snapshot(
    scope: MachineScope, plan: DayTwoPlan, hardware: DomainResources, snapshots: Snapshots
) -> list[str]:
    token = await snapshots.before(scope, plan, hardware) if plan.changes else None
    undo = _Undo()
    try:
        pending = await _apply(scope, plan, undo)
    except Exception as exc:
        if token is None:
            await undo.finish()  # nothing brings the removed devices back
            raise
        log.warning("day-2 change failed, reverting to the snapshot", error=str(exc))
        await snapshots.revert(scope, token)
        await undo.take_back(scope)
        if isinstance(exc, VirtError):
            raise ChangeReverted(exc) from exc
        raise
    if token is not None:
        await snapshots.drop(scope, token)
    await undo.finish()
    return pending


async def _apply(scope: MachineScope, plan: DayTwoPlan, undo: _Undo) -> list[str]:
    """Make the changes in order; what waits for a power cycle, by field."""
    pending: list[str] = []
    done: list[str] = []
    for change in plan.changes:
        waiting = await _one(scope, change, undo)
        if waiting:
            pending.append(waiting)
        else:
            done.append(describe(change))
    if done:
        log.info("day-2 changes applied", changes=done)
        scope.event("Normal", c.Reason.HARDWARE_APPLIED, "applied in place: " + "; ".join(done))
    return pending


async def _one(scope: MachineScope, change: Change, undo: _Undo) -> str | None:
    """One change; a text when it waits for the next power cycle."""
    on = scope.on
    host, owner, uuid = on.target.host, on.ident.owner(), on.domain_uuid
    if isinstance(change, GrowDisk):
        await host.grow_disk(
            uuid, owner=owner, target=change.target, capacity_bytes=change.capacity_bytes
        )
    elif isinstance(change, AddDisk):
        await _add_disk(scope, change, undo)
    elif isinstance(change, RemoveDisk):
        await host.detach_disk(uuid, owner=owner, serial=change.serial)
        volume = change.path.rsplit("/", 1)[-1]
        if on.ident.names.owns_volume(volume):
            pool = on.target.pool
            undo.deferred.append(lambda: host.delete_volume(pool=pool, name=volume))
    elif isinstance(change, AddNic):
        mac = await reserve_nic(scope.ctx, on.target, change.nic, on.ident)
        network = None if change.nic.bridge else change.nic.network
        await host.attach_nic(
            uuid, owner=owner, nic=NicSpec(mac=mac, network=network, bridge=change.nic.bridge)
        )
    elif isinstance(change, RemoveNic):
        await host.detach_nic(uuid, owner=owner, mac=change.mac)
        if change.network and change.network == on.target.network:
            network, mac = change.network, change.mac
            undo.deferred.append(lambda: host.remove_dhcp_host(network=network, mac=mac))
    elif isinstance(change, SetVcpus):
        applied = await host.set_vcpus(
            uuid, owner=owner, count=change.count, maximum=change.maximum
        )
        if not applied.live:
            return f"cpus={change.count}"
    elif isinstance(change, SetMemory):
        applied = await host.set_memory(uuid, owner=owner, mib=change.mib, maximum=change.maximum)
        if not applied.live:
            return f"memoryMiB={change.mib}"
    return None


async def _add_disk(scope: MachineScope, change: AddDisk, undo: _Undo) -> None:
    """The volume, then the hot-plug; a failed hot-plug deletes the new volume again."""
    on = scope.on
    host, pool = on.target.host, on.target.pool
    name = added_disk_volume(on.ident.names, change.name)
    existed = await host.get_volume(pool=pool, name=name) is not None
    volume = await host.create_volume(pool=pool, name=name, capacity_bytes=change.size_gib * GIB)
    disk = DiskSpec(
        path=volume.path, format=VolumeFormat.QCOW2, bus=DiskBus.VIRTIO, serial=change.name
    )
    try:
        await host.attach_disk(on.domain_uuid, owner=on.ident.owner(), disk=disk)
    except VirtError:
        if not existed:
            await host.delete_volume(pool=pool, name=name)
        raise
    if not existed:
        undo.created.append(name)


def describe(change: Change) -> str:
    """A change in the words of the spec (events, conditions)."""
    if isinstance(change, GrowDisk):
        return f"{change.field} grown to {change.capacity_bytes // GIB} GiB ({change.target})"
    if isinstance(change, AddDisk):
        return f"extra disk {change.name} ({change.size_gib} GiB) added"
    if isinstance(change, RemoveDisk):
        return f"extra disk {change.serial} removed"
    if isinstance(change, AddNic):
        return f"networkInterfaces[{change.nic.index}] added"
    if isinstance(change, RemoveNic):
        return f"NIC {change.mac} removed"
    if isinstance(change, SetVcpus):
        return f"cpus set to {change.count}"
    return f"memoryMiB set to {change.mib}"


def _report(scope: MachineScope, plan: DayTwoPlan, pending: list[str]) -> None:
    if plan.not_in_place:
        scope.set(
            c.ConditionType.HARDWARE_UPDATED,
            False,
            c.Reason.NOT_IN_PLACE,
            "cannot change in place (replace the machine): " + "; ".join(plan.not_in_place),
        )
    elif pending:
        scope.set(
            c.ConditionType.HARDWARE_UPDATED,
            False,
            c.Reason.RESTART_REQUIRED,
            f"{', '.join(pending)} take(s) effect at the next power cycle of the domain (above"
            " the maximum it was started with, or fewer vCPUs; a reboot inside the guest"
            " is not enough)",
        )
    else:
        _report_in_sync(scope, force=True)


def _report_reverted(scope: MachineScope, cause: VirtError) -> None:
    """HardwareUpdated False/HardwareReverted and a Warning event (libvirt's words only)."""
    message = (
        f"the change failed ({classify(cause).message}) and the domain was reverted to the"
        " disk-only snapshot taken before it: its disks and definition are as they were and"
        " it was restarted from its disks; not retried until the spec changes again"
    )
    scope.set(c.ConditionType.HARDWARE_UPDATED, False, c.Reason.HARDWARE_REVERTED, message)
    scope.event("Warning", c.Reason.HARDWARE_REVERTED, message)


def _report_in_sync(scope: MachineScope, *, force: bool = False) -> None:
    """HardwareUpdated True: only once it exists (a machine never changed has none)."""
    if force or get_condition(scope.current, c.ConditionType.HARDWARE_UPDATED) is not None:
        scope.set(
            c.ConditionType.HARDWARE_UPDATED,
            True,
            c.Reason.HARDWARE_APPLIED,
            "the domain matches the spec",
        )
