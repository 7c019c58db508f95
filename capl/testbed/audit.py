"""kube-apiserver's audit log on the test bed: the default policy (Metadata for everything)
and an incremental reader of the JSON-lines file."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

DEFAULT_AUDIT_POLICY: Mapping[str, Any] = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [{"level": "Metadata"}],
}


def read_audit_events(path: Path, *, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
    """Parse the JSON-lines audit log from byte `offset`.

    Returns the complete events and the offset just after the last complete line, to pass
    back next time (a line still being written is left for the next read).
    """
    try:
        with path.open("rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return [], offset
    end = data.rfind(b"\n") + 1
    events = [json.loads(line) for line in data[:end].splitlines() if line.strip()]
    return events, offset + end
