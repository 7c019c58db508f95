"""Everything the demo prints: a terminal gets spinners and a live table, a pipe plain lines.

On a terminal (``rich``): each step is a spinner, then a line with its duration; the
machines are a ``rich.Live`` table. Otherwise: one line per step and one per change (of a
machine or of the caption), never redrawn, so logs and scripts can read it. A closed stdout
(``capl demo | head``) must not stop the clean-up: the first failed write sends all further
output to /dev/null.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Protocol

from capl.commands.demo.view import MachineRow, format_elapsed, render_table, row_line

if TYPE_CHECKING:
    from rich.console import Console


__all__ = ["Lines", "Ui", "View"]


class View(Protocol):
    def show(self, rows: Sequence[MachineRow], caption: str) -> None: ...


class Ui:
    """Everything the demo prints. On a terminal: spinners and a live table (rich);
    otherwise plain lines, one per step and one per change, never redrawn."""

    def __init__(self, *, tty: bool) -> None:
        self.tty = tty
        self.started = time.monotonic()
        self._console: Console | None = None
        if tty:
            from rich.console import Console

            self._console = Console(highlight=False)

    def say(self, text: str = "") -> None:
        self._emit(text)

    def warn(self, text: str) -> None:
        if self._console is not None:
            self._emit(f"[yellow]![/yellow] {text}", markup=True)
        else:
            self._emit(f"warning: {text}")

    def _emit(self, text: str, *, markup: bool = False) -> None:
        """Print a line. A closed stdout (``capl demo | head``) must not stop the clean-up:
        the first failed write sends all further output to /dev/null."""
        try:
            if self._console is not None:
                self._console.print(text, markup=markup, soft_wrap=True)
            else:
                print(text, flush=True)
        except OSError:  # BrokenPipeError and friends
            with contextlib.suppress(OSError):
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, sys.stdout.fileno())
                os.close(devnull)

    @contextlib.contextmanager
    def step(self, text: str) -> Iterator[Callable[[str], None]]:
        """A long operation: a spinner (terminal) or a start line; its duration at the end.
        Yields a function that updates the text (progress)."""
        t0 = time.monotonic()
        if self._console is not None:
            with self._console.status(text) as status:
                yield lambda more: status.update(f"{text} {more}")
            self._emit(
                f"[green]✓[/green] {text} [dim]({time.monotonic() - t0:.1f} s)[/dim]", markup=True
            )
        else:
            self._emit(f"==> {text}")
            last = [""]

            def progress(more: str) -> None:
                if more != last[0]:
                    last[0] = more
                    self._emit(f"    {more}")

            yield progress
            self._emit(f"    done in {time.monotonic() - t0:.1f} s")

    @contextlib.contextmanager
    def live(self, title: str, *, nodes: bool = False) -> Iterator[View]:
        if self._console is not None:
            from rich.live import Live

            with Live(
                render_table([], title=title, caption="", nodes=nodes),
                console=self._console,
                refresh_per_second=4,
                redirect_stdout=False,
                redirect_stderr=False,
            ) as live:

                class _Live:
                    def show(self, rows: Sequence[MachineRow], caption: str) -> None:
                        live.update(render_table(rows, title=title, caption=caption, nodes=nodes))

                yield _Live()
        else:
            self._emit(f"==> {title}")
            yield Lines(self)


class Lines:
    """The non-terminal view: one line per machine change and per caption change."""

    def __init__(self, ui: Ui) -> None:
        self._ui = ui
        self._seen: dict[str, tuple[str, ...]] = {}
        self._caption = ""

    def prime(self, rows: Sequence[MachineRow]) -> None:
        """Remember ``rows`` as shown already (they were, in the live table)."""
        self._seen = {row.name: row.key() for row in rows}

    def show(self, rows: Sequence[MachineRow], caption: str) -> None:
        since = time.monotonic() - self._ui.started
        for row in rows:
            if self._seen.get(row.name) != row.key():
                self._seen[row.name] = row.key()
                self._ui.say(row_line(row, since_start=since))
        for gone in sorted(set(self._seen) - {row.name for row in rows}):
            del self._seen[gone]
            self._ui.say(f"[{format_elapsed(since):>6}] {gone}: deleted")
        if caption != self._caption:
            self._caption = caption
            self._ui.say(f"[{format_elapsed(since):>6}] {caption}")
