"""Demo work directories and who owns them: how a demo finds those of killed demos.

Each demo runs in a fresh ``$TMPDIR/capl-demo-XXXX``; its ``demo.json`` records the owner
(pid and start time, which tells a live process from a reused pid), the libvirt URI and,
once known, the namespace, cluster, network and pool. ``other_demos`` lists every such
directory with whether its owner still runs: a live one on the same URI and cluster name
stops a second demo, a dead one is swept (``capl.commands.demo.leftovers.sweep_stale``).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Final

__all__ = ["other_demos", "pid_alive", "process_identity", "read_state", "write_state"]

WORKDIR_PREFIX: Final = "capl-demo-"
STATE_FILE: Final = "demo.json"


def process_identity(pid: int) -> str | None:
    """``pid`` plus its start time, which tells a live process from a reused pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return f"{pid} {stat.rsplit(')', 1)[1].split()[19]}"


def write_state(workdir: Path, state: Mapping[str, Any]) -> None:
    tmp = workdir / f".{STATE_FILE}.tmp"
    tmp.write_text(json.dumps(dict(state), indent=2))
    tmp.replace(workdir / STATE_FILE)


def read_state(workdir: Path) -> dict[str, Any] | None:
    try:
        value = json.loads((workdir / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def other_demos() -> Iterator[tuple[Path, dict[str, Any], bool]]:
    """(work directory, state, owner alive) of every demo work directory on this machine."""
    for workdir in sorted(Path(tempfile.gettempdir()).glob(f"{WORKDIR_PREFIX}*")):
        state = read_state(workdir)
        if state is None:
            continue
        owner = str(state.get("owner") or "")
        pid = owner.split(" ", 1)[0]
        alive = bool(owner) and pid.isdigit() and process_identity(int(pid)) == owner
        yield workdir, state, alive


def pid_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"
