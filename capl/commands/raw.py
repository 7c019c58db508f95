"""Readers of raw API objects (decoded JSON) that tolerate any shape: a missing or mistyped
part reads as None or empty, never as an exception. The report builders (``status_report``,
``hosts_report``) and the commands that act on objects use them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = [
    "CLUSTER_NAME_LABEL",
    "CONTROL_PLANE_LABEL",
    "dig",
    "has_label",
    "obj_label",
    "obj_meta",
    "obj_name",
    "obj_ns",
    "obj_owner",
    "text",
]

# The Cluster API labels of capl.api.constants, here without importing the API models.
CLUSTER_NAME_LABEL = "cluster.x-k8s.io/cluster-name"
CONTROL_PLANE_LABEL = "cluster.x-k8s.io/control-plane"


def obj_meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    value = obj.get("metadata")
    return value if isinstance(value, Mapping) else {}


def dig(obj: Any, *path: str) -> Any:
    """``obj[path[0]][path[1]]...``, None where a step is missing or not a mapping."""
    for part in path:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(part)
    return obj


def obj_ns(obj: Mapping[str, Any]) -> str:
    return str(obj_meta(obj).get("namespace") or "")


def obj_name(obj: Mapping[str, Any]) -> str:
    return str(obj_meta(obj).get("name") or "")


def obj_owner(obj: Mapping[str, Any], kind: str) -> str | None:
    """The name of the first owner reference of ``kind``."""
    for ref in obj_meta(obj).get("ownerReferences") or ():
        if isinstance(ref, Mapping) and ref.get("kind") == kind and ref.get("name"):
            return str(ref["name"])
    return None


def obj_label(obj: Mapping[str, Any], key: str) -> str | None:
    """A label's value (None when absent or empty)."""
    labels = obj_meta(obj).get("labels")
    value = labels.get(key) if isinstance(labels, Mapping) else None
    return str(value) if value else None


def has_label(obj: Mapping[str, Any] | None, key: str) -> bool:
    """Whether the object carries the label, whatever its value (also "")."""
    labels = obj_meta(obj).get("labels") if obj is not None else None
    return isinstance(labels, Mapping) and key in labels


def text(value: Any) -> str | None:
    """The value as a string, None for None and ""."""
    return str(value) if value not in (None, "") else None
