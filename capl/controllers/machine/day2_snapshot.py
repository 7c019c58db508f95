"""The snapshot a day-2 change is made under: taken before, reverted if the change fails,
merged away once it worked (issue 17 item 6). `day2.apply_changes` drives it through the
`day2.Snapshots` seam; the manager plugs `DiskSnapshots` in through `Deps.snapshots`.

Disk-only, not with memory. A disk-only external snapshot of a running guest is
crash-consistent (a revert is like a power cut at the moment the snapshot was taken: the
guest boots from its disks as they were, its journaling file systems recover), and it costs
nothing worth mentioning on the path that matters, a change that works: a new empty qcow2
overlay per disk, no pause of the guest, no copy of its RAM (a memory snapshot saves the
whole RAM to disk before every change and pauses or slows the guest while it does; a node
whose memory comes back from minutes ago has stale leases and clocks anyway). The price is
that a failed change restarts the guest.

Where it lives. One snapshot named `capl-day2` per domain: an overlay
`<domain>-<target>-snap-capl-day2.qcow2` beside each disk (`capl.virt.snapshot`), in the
machine's pool and with the machine's volume prefix, so deleting the machine removes it
with its volumes (and undefining the domain its metadata). Disks the change removes are
left out of it (their volume is deleted only once the change worked, `day2._Undo`).

After the change:
- it worked: the snapshot is deleted, which merges each overlay into the image below it
  (a block commit), so chains never grow; a disk grown meanwhile was grown on the overlay
  (QEMU's block resize of the active image: the guest sees it at once) and the commit
  grows the image below to the overlay's size;
- it failed: the disks go back to the snapshot (what was written after it is discarded,
  the domain is restarted when it ran) with the persistent definition saved before the
  change (devices, vCPUs and memory as they were), volumes the change created are deleted,
  then the (empty) snapshot is merged away. `day2` reports HardwareUpdated False/
  HardwareReverted with a Warning event and does not retry this generation (a retry
  would fail and restart the guest again): a changed spec tries again.

Never leaked, level-based: a change interrupted by a manager restart (or a failed merge)
leaves the domain on a `capl-day2` overlay; the next reconcile that reads the domain's
hardware sees it in the disks' paths (no extra call) and merges it (`finish_leftover`:
what the interrupted change did is kept, the rest is planned again, under a new snapshot).
A stale snapshot with the same name found when taking one is merged first. A domain that
cannot have one (no file-backed disk, a driver without disk-only snapshots such as libvirt's
test driver) is changed without a snapshot, as before (a warning in the log).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import structlog

from capl.controllers.machine.day2_plan import DayTwoPlan, RemoveDisk
from capl.controllers.machine.options import LOGGER
from capl.controllers.machine.scope import MachineScope
from capl.ports.errors import AlreadyExists, InvalidSpec, Unsupported
from capl.ports.virt import DomainResources
from capl.ports.virt.snapshots import DAY2_SNAPSHOT, SnapshotsOf
from capl.ports.virt.snapshots import Snapshots as HostSnapshots

__all__ = ["DAY2_SNAPSHOT", "DiskSnapshots", "Taken", "on_leftover"]

log = structlog.get_logger(LOGGER)

_OVERLAY_SUFFIX = f"-snap-{DAY2_SNAPSHOT}.qcow2"


@dataclass(frozen=True, slots=True)
class Taken:
    """The token of a snapshot taken before a change."""

    snapshots: HostSnapshots
    uuid: str
    definition: str = field(repr=False)
    """The persistent definition before the change (may hold secrets: never logged)."""


def on_leftover(hardware: DomainResources) -> bool:
    """The domain's disks sit on a `capl-day2` overlay: an interrupted change left it."""
    return any(disk.path.endswith(_OVERLAY_SUFFIX) for disk in hardware.disks)


class DiskSnapshots:
    """`day2.Snapshots` with disk-only external snapshots (see the module docstring)."""

    def __init__(self, snapshots_of: SnapshotsOf) -> None:
        self._of = snapshots_of

    def _snapshots(self, scope: MachineScope) -> HostSnapshots:
        return self._of(scope.on.target.host)

    async def finish_leftover(self, scope: MachineScope, hardware: DomainResources) -> bool:
        """Merge the snapshot an interrupted change left; True when there was one."""
        if not on_leftover(hardware):
            return False
        uuid = scope.on.domain_uuid
        merged = await self._snapshots(scope).delete_snapshot(uuid, DAY2_SNAPSHOT)
        log.info("merged the snapshot of an interrupted day-2 change", domain=uuid, found=merged)
        return True

    async def before(
        self, scope: MachineScope, plan: DayTwoPlan, hardware: DomainResources
    ) -> Taken | None:
        snapshots, uuid = self._snapshots(scope), scope.on.domain_uuid
        removed = {change.path for change in plan.changes if isinstance(change, RemoveDisk)}
        exclude = [disk.target for disk in hardware.disks if disk.path in removed]
        definition = await snapshots.persistent_definition(uuid)

        async def take() -> None:
            await snapshots.create_snapshot(
                uuid,
                DAY2_SNAPSHOT,
                description="taken by capl before an in-place change",
                exclude=exclude,
            )

        try:
            try:
                await take()
            except AlreadyExists:  # stale, its disks not in the definition: merge it first
                await snapshots.delete_snapshot(uuid, DAY2_SNAPSHOT)
                await take()
        except (InvalidSpec, Unsupported) as exc:  # no file-backed disk, a driver without
            # disk-only snapshots (libvirt's test driver): the change is made without one
            log.warning("day-2 change made without a snapshot", domain=uuid, reason=str(exc))
            return None
        return Taken(snapshots, uuid, definition)

    async def revert(self, scope: MachineScope, token: object) -> None:
        assert isinstance(token, Taken)
        await token.snapshots.revert_snapshot(
            token.uuid, DAY2_SNAPSHOT, definition=token.definition
        )
        await token.snapshots.delete_snapshot(token.uuid, DAY2_SNAPSHOT)

    async def drop(self, scope: MachineScope, token: object) -> None:
        assert isinstance(token, Taken)
        await token.snapshots.delete_snapshot(token.uuid, DAY2_SNAPSHOT)
