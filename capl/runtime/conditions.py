"""metav1.Condition helpers on the plain list of condition dicts in status.conditions.

A condition: type, status ("True" | "False" | "Unknown"), reason (CamelCase, required),
message, observedGeneration, lastTransitionTime (RFC 3339, UTC, seconds). `set_condition` keeps
lastTransitionTime when the status did not change, so re-setting an identical condition changes
nothing and the status patch stays empty. `summarize` computes Ready from other conditions: the
first one (in the given order) that is not True lends its reason and message.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, MutableMapping
from typing import Any, Literal, TypedDict

Status = Literal["True", "False", "Unknown"]
TRUE: Status = "True"
FALSE: Status = "False"
UNKNOWN: Status = "Unknown"

READY = "Ready"
PAUSED = "Paused"

_REASON = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")


class Condition(TypedDict, total=False):
    type: str
    status: Status
    reason: str
    message: str
    observedGeneration: int
    lastTransitionTime: str


def rfc3339(seconds: float | None = None) -> str:
    """UTC timestamp with second precision, as metav1.Time serialises."""
    return time.strftime(
        "%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() if seconds is None else seconds)
    )


def _conditions(obj_or_status: MutableMapping[str, Any], create: bool) -> list[dict[str, Any]]:
    # an object has metadata; anything else is taken to be the status dict itself
    status: MutableMapping[str, Any] = obj_or_status
    if "metadata" in obj_or_status or "kind" in obj_or_status:
        if create:
            status = obj_or_status.setdefault("status", {})
        else:
            status = obj_or_status.get("status") or {}
    conditions = status.get("conditions")
    if not isinstance(conditions, list):
        conditions = []
        if create:
            status["conditions"] = conditions
    return conditions


def get_condition(obj: MutableMapping[str, Any], type_: str) -> dict[str, Any] | None:
    """The condition of `type_` from an object (or its status dict), None if absent."""
    for cond in _conditions(obj, create=False):
        if cond.get("type") == type_:
            return cond
    return None


def is_true(obj: MutableMapping[str, Any], type_: str) -> bool:
    cond = get_condition(obj, type_)
    return cond is not None and cond.get("status") == TRUE


def is_false(obj: MutableMapping[str, Any], type_: str) -> bool:
    cond = get_condition(obj, type_)
    return cond is not None and cond.get("status") == FALSE


def set_condition(
    obj: MutableMapping[str, Any],
    type_: str,
    status: Status | bool,
    *,
    reason: str,
    message: str = "",
    observed_generation: int | None = None,
    now: Callable[[], str] = rfc3339,
) -> bool:
    """Set a condition on an object (or its status dict); True if anything changed.

    observed_generation defaults to the object's metadata.generation when `obj` is an object.
    """
    if isinstance(status, bool):
        status = TRUE if status else FALSE
    if status not in (TRUE, FALSE, UNKNOWN):
        raise ValueError(f"condition status must be True/False/Unknown, not {status!r}")
    if not reason or not _REASON.match(reason):
        raise ValueError(f"condition reason must be CamelCase, not {reason!r}")
    if observed_generation is None:
        generation = (obj.get("metadata") or {}).get("generation")
        observed_generation = generation if isinstance(generation, int) else None
    conditions = _conditions(obj, create=True)
    new: dict[str, Any] = {"type": type_, "status": status, "reason": reason, "message": message}
    if observed_generation is not None:
        new["observedGeneration"] = observed_generation
    for i, cond in enumerate(conditions):
        if cond.get("type") != type_:
            continue
        if cond.get("status") == status and cond.get("lastTransitionTime"):
            new["lastTransitionTime"] = cond["lastTransitionTime"]
        else:
            new["lastTransitionTime"] = now()
        if cond == new:
            return False
        conditions[i] = new
        return True
    new["lastTransitionTime"] = now()
    conditions.append(new)
    return True


def remove_condition(obj: MutableMapping[str, Any], type_: str) -> bool:
    conditions = _conditions(obj, create=False)
    for i, cond in enumerate(conditions):
        if cond.get("type") == type_:
            del conditions[i]
            return True
    return False


def summarize(
    obj: MutableMapping[str, Any],
    order: Iterable[str],
    *,
    type_: str = READY,
    true_reason: str = "Ready",
    true_message: str = "",
    missing_reason: str = "NotReported",
    observed_generation: int | None = None,
    now: Callable[[], str] = rfc3339,
) -> bool:
    """Set `type_` (Ready) from the conditions in `order`: True when all are True; otherwise the
    status, reason and message of the first that is not True (Unknown, with `missing_reason`,
    for one that is absent). Returns True if anything changed."""
    for name in order:
        cond = get_condition(obj, name)
        if cond is None:
            return set_condition(
                obj,
                type_,
                UNKNOWN,
                reason=missing_reason,
                message=f"{name} condition not yet reported",
                observed_generation=observed_generation,
                now=now,
            )
        if cond.get("status") != TRUE:
            return set_condition(
                obj,
                type_,
                FALSE if cond.get("status") == FALSE else UNKNOWN,
                reason=str(cond.get("reason") or missing_reason),
                message=str(cond.get("message") or ""),
                observed_generation=observed_generation,
                now=now,
            )
    return set_condition(
        obj,
        type_,
        TRUE,
        reason=true_reason,
        message=true_message,
        observed_generation=observed_generation,
        now=now,
    )
