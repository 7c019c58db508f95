"""The `capl` command."""

from __future__ import annotations

import sys

from capl import __version__


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["version"]:
        print(f"capl {__version__}")
        return 0
    print("usage: capl version", file=sys.stderr)
    return 2
