"""`capl manager`: the product wiring of the generic runtime (being wired to the controllers)."""

from __future__ import annotations

import argparse

from capl.errors import CliError


def run_from_args(args: argparse.Namespace) -> int:
    raise CliError("capl manager: the controllers are not wired in yet")
