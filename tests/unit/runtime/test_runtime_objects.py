"""copy_obj: a private copy, through orjson for plain JSON, through deep_copy otherwise."""

from __future__ import annotations

import datetime
import enum

from capl.runtime.objects import copy_obj


class Phase(enum.StrEnum):
    READY = "Ready"


def test_the_copy_shares_nothing_mutable() -> None:
    original = {"metadata": {"labels": {"a": "b"}}, "status": {"conditions": [{"type": "R"}]}}
    copied = copy_obj(original)
    copied["metadata"]["labels"]["a"] = "c"
    copied["status"]["conditions"][0]["type"] = "X"
    copied["status"]["conditions"].append({})
    assert original == {
        "metadata": {"labels": {"a": "b"}},
        "status": {"conditions": [{"type": "R"}]},
    }


def test_json_values_come_back_as_json() -> None:
    copied = copy_obj({"spec": {"ports": (1, 2)}, "status": {"phase": Phase.READY}})
    assert copied == {"spec": {"ports": [1, 2]}, "status": {"phase": "Ready"}}
    assert type(copied["spec"]["ports"]) is list


def test_values_json_cannot_hold_are_copied_unchanged() -> None:
    when = datetime.datetime(2026, 12, 3, tzinfo=datetime.UTC)
    original = {"metadata": {"created": when}, "data": {1: "x"}, "spec": {"items": [{"a": 1}]}}
    copied = copy_obj(original)
    assert copied["metadata"]["created"] is when  # not turned into a string
    assert copied["data"] == {1: "x"}
    copied["spec"]["items"][0]["a"] = 2
    assert original["spec"]["items"][0]["a"] == 1
