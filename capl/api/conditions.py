"""Pure helpers for metav1.Condition lists, with the semantics of Go's meta.SetStatusCondition.

`lastTransitionTime` changes only when `status` changes, so that a reconcile that recomputes
the same state produces the same status (and the status patch diff stays empty).
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence

from capl.api.meta import Condition


def get_condition(conditions: Sequence[Condition] | None, type_: str) -> Condition | None:
    for condition in conditions or ():
        if condition.type == type_:
            return condition
    return None


def is_true(conditions: Sequence[Condition] | None, type_: str) -> bool:
    condition = get_condition(conditions, type_)
    return condition is not None and condition.status == "True"


def set_condition(
    conditions: Sequence[Condition] | None,
    *,
    type_: str,
    status: bool | str,
    reason: str,
    message: str = "",
    observed_generation: int | None = None,
    now: datetime.datetime,
) -> list[Condition]:
    """A new list with the condition of `type_` set; others (and their order) unchanged."""
    text = ("True" if status else "False") if isinstance(status, bool) else status
    if text not in ("True", "False", "Unknown"):
        raise ValueError(f"condition status must be True, False or Unknown, not {text!r}")
    result = list(conditions or ())
    old = get_condition(result, type_)
    transition = old.last_transition_time if old is not None and old.status == text else now
    new = Condition.model_validate(
        {
            "type": type_,
            "status": text,
            "reason": reason,
            "message": message,
            "observedGeneration": observed_generation,
            "lastTransitionTime": transition,
        }
    )
    if old is None:
        result.append(new)
    else:
        result[result.index(old)] = new
    return result


def remove_condition(conditions: Sequence[Condition] | None, type_: str) -> list[Condition]:
    return [c for c in conditions or () if c.type != type_]
