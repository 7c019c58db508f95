"""The operator subcommands of `capl`; `capl.cli` mounts them.

Each command (``demo``, a package, and ``status``, ``console``, ``vnc``, ``snapshot``,
``images``, ``hosts``, ``maintenance``, ``migrate``) exposes `register(subparsers)`;
`REGISTRARS` lists them in help order. What they share: ``shared`` (argparse look, API
flags, durations, ``connect``, the default namespace, API errors as exit codes, plain
tables), ``raw`` (readers of raw objects), ``status_report`` (the join of `capl status`,
also the demo's live view), ``hosts_report`` (the join of `capl hosts`), ``target`` (a
machine's domain and how to reach its host, for `console` and `images`; a machine's
LibvirtCluster, for `migrate`), ``onhost`` (that host connected, errors as exit codes, for
`vnc` and `snapshot`) and ``follow`` (list+watch until a condition holds: the ``--wait`` of
`maintenance` and `migrate`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from capl.commands import (
    console,
    demo,
    hosts,
    images,
    maintenance,
    migrate,
    snapshot,
    status,
    vnc,
)

REGISTRARS: list[Callable[[Any], None]] = [
    demo.register,
    status.register,
    console.register,
    vnc.register,
    snapshot.register,
    images.register,
    hosts.register,
    maintenance.register,
    migrate.register,
]
