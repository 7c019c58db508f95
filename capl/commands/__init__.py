"""The operator subcommands of `capl` (status, console, demo, images); `capl.cli` mounts them.

Each module exposes `register(subparsers)`; `REGISTRARS` lists them in help order.
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
