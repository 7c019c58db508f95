"""Pure decisions about orphans: whether a LibvirtMachine accounts for a domain tagged with
its name (`accounts_for`), and when a domain nothing accounts for has been seen long enough to
be removed (`OrphanTracker`; time is passed in: the caller owns the clock).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["OrphanTracker", "accounts_for"]


def accounts_for(obj: Mapping[str, Any] | None, *, owner_uid: str, domain_uuid: str) -> bool:
    """Whether LibvirtMachine `obj` (None: there is none) accounts for a domain whose owner
    tag names it with `owner_uid`: the same object (UID), or an object of the same name that
    records the domain's UUID (after `clusterctl move`: its next reconcile retags the domain).
    A same-name object with another UID and another domain is a new incarnation: the domain
    belonged to a deleted one."""
    if obj is None:
        return False
    md = obj.get("metadata") or {}
    if owner_uid and md.get("uid") == owner_uid:
        return True
    recorded = str((obj.get("spec") or {}).get("domainUUID") or "").lower()
    return bool(recorded) and recorded == domain_uuid.lower()


class OrphanTracker:
    """When a domain no LibvirtMachine accounts for may be removed by the orphan sweep.

    The informer cache may lag behind the API server (an object just created, a relist in
    progress), so a domain becomes a removal candidate only once it was reported orphaned by
    two consecutive sweeps of its scope (one host of one cluster) *and* at least `grace`
    seconds after it was first reported. A domain missing from a sweep's report, or a scope
    swept with an error, starts over. Pure bookkeeping: the caller passes the time.
    """

    def __init__(self, *, grace: float) -> None:
        self.grace = grace
        self._first_seen: dict[str, dict[str, float]] = {}

    def observe(self, scope: str, orphans: Iterable[str], *, now: float) -> set[str]:
        """Record one complete sweep of `scope` that found `orphans` (domain UUIDs); returns
        the ones confirmed for removal."""
        before = self._first_seen.get(scope, {})
        current = {u.lower() for u in orphans}
        confirmed = {u for u in current if u in before and now - before[u] >= self.grace}
        self._first_seen[scope] = {u: before.get(u, now) for u in current}
        return confirmed

    def reset(self, scope: str) -> None:
        """Forget what was seen in `scope` (it could not be swept completely)."""
        self._first_seen.pop(scope, None)

    def forget(self, domain_uuid: str) -> None:
        """The domain is gone or accounted for again."""
        for seen in self._first_seen.values():
            seen.pop(domain_uuid.lower(), None)

    def pending(self) -> int:
        """Domains seen orphaned once, not confirmed yet."""
        return sum(len(seen) for seen in self._first_seen.values())

    def retain(self, scopes: Iterable[str]) -> None:
        """Drop the state of scopes that no longer exist (a deleted cluster or host)."""
        keep = set(scopes)
        for scope in list(self._first_seen):
            if scope not in keep:
                del self._first_seen[scope]
