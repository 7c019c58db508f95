"""The operator subcommands of `capl` (status, console, demo, images); `capl.cli` mounts them.

Each command (``demo``, a package, and ``status``, ``console``, ``images``) exposes
`register(subparsers)`; `REGISTRARS` lists them in help order. What they share:
``shared`` (argparse look, API flags, ``connect``, the default namespace, API errors as exit
codes), ``status_report`` (the join of `capl status`, also the demo's live view) and
``target`` (a machine's domain and how to reach its host, for `console` and `images`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from capl.commands import console, demo, images, status

REGISTRARS: list[Callable[[Any], None]] = [
    demo.register,
    status.register,
    console.register,
    images.register,
]
