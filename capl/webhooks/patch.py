"""RFC 6902 JSON patches for mutating admission responses.

A mutating webhook must answer with a patch against the object *as the API server sent it*.
Our models ignore unknown fields, so a patch computed between two model dumps could name
paths that do not exist in the raw object, and a whole-object replacement would drop fields
the models do not know. `json_patch(raw, before, after)` therefore walks the raw object
alongside the two dumps and only emits operations for what the defaulting changed:

- a changed or new object member -> `add` (which replaces an existing member);
- a member the defaulting removed -> `remove` (only if the raw object has it);
- lists of unchanged length whose raw counterpart has the same length -> per element, so
  unknown fields inside list items survive; otherwise the whole list is replaced.

`apply_patch` is a minimal applier for the operations this module emits (add, replace,
remove), used by tests and as a self-check.
"""

from __future__ import annotations

import copy
from typing import Any

JSONPatch = list[dict[str, Any]]


def _escape(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


def _unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def json_patch(raw: Any, before: Any, after: Any, path: str = "") -> JSONPatch:
    """Operations that turn `raw` into `raw` + (the changes from `before` to `after`)."""
    if before == after:
        return []
    if isinstance(raw, dict) and isinstance(before, dict) and isinstance(after, dict):
        ops: JSONPatch = []
        for key, value in after.items():
            member = f"{path}/{_escape(key)}"
            if key in before and before[key] == value:
                continue
            if key in raw and key in before:
                ops.extend(_member(raw[key], before[key], value, member))
            else:
                ops.append({"op": "add", "path": member, "value": copy.deepcopy(value)})
        for key in before:
            if key not in after and key in raw:
                ops.append({"op": "remove", "path": f"{path}/{_escape(key)}"})
        return ops
    return [{"op": "replace" if path else "add", "path": path, "value": copy.deepcopy(after)}]


def _member(raw: Any, before: Any, after: Any, path: str) -> JSONPatch:
    if isinstance(raw, dict) and isinstance(before, dict) and isinstance(after, dict):
        return json_patch(raw, before, after, path)
    if (
        isinstance(raw, list)
        and isinstance(before, list)
        and isinstance(after, list)
        and len(raw) == len(before) == len(after)
    ):
        ops: JSONPatch = []
        for i, (r, b, a) in enumerate(zip(raw, before, after, strict=True)):
            if b == a:
                continue
            if isinstance(r, dict) and isinstance(b, dict) and isinstance(a, dict):
                ops.extend(json_patch(r, b, a, f"{path}/{i}"))
            else:
                ops.append({"op": "replace", "path": f"{path}/{i}", "value": copy.deepcopy(a)})
        return ops
    return [{"op": "add", "path": path, "value": copy.deepcopy(after)}]


def apply_patch(document: Any, patch: JSONPatch) -> Any:
    """Apply add/replace/remove operations to a copy of `document`."""
    result = copy.deepcopy(document)
    for op in patch:
        tokens = [_unescape(t) for t in op["path"].split("/")[1:]]
        if not tokens:
            if op["op"] == "remove":
                raise ValueError("cannot remove the whole document")
            result = copy.deepcopy(op["value"])
            continue
        parent = result
        for token in tokens[:-1]:
            parent = parent[int(token)] if isinstance(parent, list) else parent[token]
        last = tokens[-1]
        if isinstance(parent, list):
            index = len(parent) if last == "-" else int(last)
            if op["op"] == "add":
                parent.insert(index, copy.deepcopy(op["value"]))
            elif op["op"] == "replace":
                parent[index] = copy.deepcopy(op["value"])
            elif op["op"] == "remove":
                del parent[index]
            else:
                raise ValueError(f"unsupported op {op['op']}")
        else:
            if op["op"] in ("add", "replace"):
                if op["op"] == "replace" and last not in parent:
                    raise KeyError(op["path"])
                parent[last] = copy.deepcopy(op["value"])
            elif op["op"] == "remove":
                del parent[last]
            else:
                raise ValueError(f"unsupported op {op['op']}")
    return result
