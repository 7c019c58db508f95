"""Exit codes of the `capl` command and the one-line error type (imports nothing of capl)."""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_NOT_FOUND = 3
EXIT_UNREACHABLE = 4
EXIT_INTERRUPTED = 130


class CliError(Exception):
    """A failure reported to the user as one line, with an exit code."""

    def __init__(self, message: str, *, code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.code = code
