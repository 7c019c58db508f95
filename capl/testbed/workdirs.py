"""Temporary working directories of control planes, and removing those whose creating process
died without cleaning up (a SIGKILLed run): each holds an `owner` file with the creator's pid
and start time."""

from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path
from typing import Final

log = logging.getLogger(__name__)

WORKDIR_PREFIX: Final = "capl-controlplane-"
OWNER_FILE: Final = "owner"


def process_identity(pid: int) -> str | None:
    """`pid` plus its start time (tells a live process apart from a reused pid)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return f"{pid} {fields[19]}"  # field 22 of stat(5): starttime


def sweep_stale_workdirs() -> None:
    """Remove temporary workdirs left by control planes whose process was killed.

    A SIGKILLed test run cannot clean up; PR_SET_PDEATHSIG ends its etcd and kube-apiserver,
    and the next run removes the directory (etcd preallocates ~100 MB in it).
    """
    for path in Path(tempfile.gettempdir()).glob(f"{WORKDIR_PREFIX}*"):
        try:
            owner = (path / OWNER_FILE).read_text().strip()
        except OSError:
            continue  # not ours, or still being created
        pid = owner.split(" ", 1)[0]
        if owner and pid.isdigit() and process_identity(int(pid)) != owner:
            log.info("removing stale control-plane directory %s", path)
            shutil.rmtree(path, ignore_errors=True)
