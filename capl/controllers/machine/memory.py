"""What the machine controller remembers between reconciles, in one place.

Level-based reconciles read the world each time; a few things are remembered because the
world cannot tell them, or not cheaply. Per key (namespace/name) one `MachineMemory` record
holds all of it (after kopf's ResourceMemory), and `Memory.forget(key)` drops it in one
place when the object is gone or lost our finalizer:

- `settled`: the resourceVersion the machine reached Ready with, and when: an unchanged
  object (no event for it since: `epoch`) returns without calling libvirt for `settled_ttl`;
- `failures`, `api_failures`: failures in a row, for the backoffs;
- `shutdown_requested`: the ACPI shutdown of a deletion was sent (once);
- `nodes_done`: the providerID and topology labels given to the workload Node (the last);
- `made`: the incarnation (UID) this process created or found a domain for, and where:
  removed if that incarnation vanishes (`capl.controllers.machine.cleanup`);
- `orphans`: domains of other incarnations the sweep confirmed, by domain UUID, until
  removed (kept when the rest is forgotten: they belong to no live object);
- `bootstrap`: the BootstrapSucceeded check's memory (`capl.controllers.machine.bootstrap`).

Besides the records: the read-your-writes overlay (`writes`, `capl.runtime.patch`), the
domains this process is starting (`own_starts`: their STARTED event is our own echo), the
orphan sweep's sightings (`orphans`) and what clean-ups removed (`removed`, diagnostics).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from capl.controllers.machine.bootstrap import BootstrapMemory
from capl.controllers.machine.plan_orphans import OrphanTracker
from capl.controllers.machine.target import Leftover
from capl.runtime.objects import ObjectKey
from capl.runtime.patch import ReadYourWrites

__all__ = ["MachineMemory", "Memory", "OwnStarts"]


@dataclass(slots=True)
class MachineMemory:
    """Everything remembered about one key (see the module docstring)."""

    settled: tuple[str, float] | None = None
    """(resourceVersion, monotonic time) of the reconcile that left the machine Ready."""
    epoch: int = 0
    """Bumped by every event about the key from outside the object (`Memory.touch`)."""
    failures: int = 0
    api_failures: int = 0
    shutdown_requested: bool = False
    nodes_done: set[str] = field(default_factory=set)
    made: Leftover | None = None
    orphans: dict[str, Leftover] = field(default_factory=dict)
    bootstrap: BootstrapMemory | None = None
    day2: tuple[Any, ...] | None = None
    """The spec fingerprint (`day2_plan.fingerprint`) the domain was last found to match."""


class OwnStarts:
    """Domains this process is starting (by UUID, with a deadline): the next STARTED event
    of one is the echo of our own start_domain."""

    def __init__(self) -> None:
        self._deadlines: dict[str, float] = {}

    def add(self, domain_uuid: str, *, now: float, within: float = 30.0) -> None:
        if len(self._deadlines) > 1024:
            self._deadlines = {u: d for u, d in self._deadlines.items() if d >= now}
        self._deadlines[domain_uuid] = now + within

    def discard(self, domain_uuid: str) -> None:
        self._deadlines.pop(domain_uuid, None)

    def echo(self, domain_uuid: str, *, now: float) -> bool:
        """Whether a STARTED event of the domain is our own (forgotten once seen)."""
        deadline = self._deadlines.pop(domain_uuid, None)
        return deadline is not None and deadline >= now


class Memory:
    """The controller's memory: one record per key, and the process-wide parts."""

    def __init__(self, *, orphan_grace: float) -> None:
        self._records: dict[ObjectKey, MachineMemory] = {}
        self.writes = ReadYourWrites()
        self.own_starts = OwnStarts()
        self.orphans = OrphanTracker(grace=orphan_grace)
        self.removed: list[str] = []
        """What vanished-object clean-ups removed (diagnostics, tests), newest last."""

    def of(self, key: ObjectKey) -> MachineMemory:
        """The record of `key` (created empty)."""
        record = self._records.get(key)
        if record is None:
            record = self._records[key] = MachineMemory()
        return record

    def get(self, key: ObjectKey) -> MachineMemory | None:
        return self._records.get(key)

    def touch(self, key: ObjectKey) -> None:
        """Something about `key` changed outside the object: forget that it had settled."""
        record = self.of(key)
        record.settled = None
        record.epoch += 1

    def has_leftovers(self, key: ObjectKey) -> bool:
        """Whether something made for an incarnation of `key` may have to be removed."""
        record = self._records.get(key)
        return record is not None and (record.made is not None or bool(record.orphans))

    def forget(self, key: ObjectKey) -> None:
        """The one place a key is forgotten: its record (but orphans the sweep confirmed
        meanwhile, which the next reconcile of the key removes) and our last write."""
        self.writes.forget(key)
        record = self._records.pop(key, None)
        if record is not None and record.orphans:
            self._records[key] = MachineMemory(orphans=record.orphans)

    def note_removed(self, message: str) -> None:
        self.removed.append(message)
        if len(self.removed) > 256:
            del self.removed[:128]

    def __len__(self) -> int:
        return len(self._records)
