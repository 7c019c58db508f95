"""`capl console`'s terminal side without libvirt: the bridge between a terminal and a
console channel (a socket pair stands in for the libvirt stream pump), following a log file,
and raw mode that is restored on every way out. Waits are on conditions with deadlines."""

from __future__ import annotations

import contextlib
import os
import pty
import select
import signal
import socket
import termios
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from capl.commands.console import ESCAPE, _Signalled, bridge, follow_log, raw_terminal

DEADLINE = 10.0


class Pipe:
    def __init__(self) -> None:
        self.r, self.w = os.pipe()

    def close(self) -> None:
        for fd in (self.r, self.w):
            with contextlib.suppress(OSError):
                os.close(fd)


@pytest.fixture
def pipes() -> Iterator[tuple[Pipe, Pipe]]:
    stdin, stdout = Pipe(), Pipe()
    yield stdin, stdout
    stdin.close()
    stdout.close()


def read_until(fd: int, expected: bytes, seen: bytearray) -> None:
    deadline = time.monotonic() + DEADLINE
    while expected not in seen:
        left = deadline - time.monotonic()
        assert left > 0, f"no {expected!r}; got {bytes(seen)!r}"
        if select.select([fd], [], [], left)[0]:
            seen += os.read(fd, 65536)


class Background:
    """Runs a blocking call in a thread; `result()` joins it with a deadline."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.value: Any = None
        self.error: BaseException | None = None

        def target() -> None:
            try:
                self.value = fn()
            except BaseException as exc:
                self.error = exc

        self.thread = threading.Thread(target=target, daemon=True)
        self.thread.start()

    def result(self) -> Any:
        self.thread.join(DEADLINE)
        assert not self.thread.is_alive(), "still running"
        if self.error is not None:
            raise self.error
        return self.value


def test_bridge_copies_both_ways_and_leaves_on_escape(pipes: tuple[Pipe, Pipe]) -> None:
    stdin, stdout = pipes
    ours, guest = socket.socketpair()
    with ours, guest:
        job = Background(lambda: bridge(ours, stdin_fd=stdin.r, stdout_fd=stdout.w))
        guest.sendall(b"login: ")
        read_until(stdout.r, b"login: ", bytearray())
        os.write(stdin.w, b"root\r")
        received = bytearray()
        read_until(guest.fileno(), b"root\r", received)
        os.write(stdin.w, b"ls" + ESCAPE + b"never sent")
        assert job.result() == "escape"
        guest.setblocking(False)
        received += guest.recv(100)
        assert bytes(received) == b"root\rls"


def test_bridge_ends_with_the_console_or_the_input(pipes: tuple[Pipe, Pipe]) -> None:
    stdin, stdout = pipes
    ours, guest = socket.socketpair()
    with ours:
        job = Background(lambda: bridge(ours, stdin_fd=stdin.r, stdout_fd=stdout.w))
        guest.sendall(b"bye\r\n")
        guest.close()
        assert job.result() == "console-closed"
        assert os.read(stdout.r, 100) == b"bye\r\n"
    ours, guest = socket.socketpair()
    with ours, guest:
        job = Background(lambda: bridge(ours, stdin_fd=stdin.r, stdout_fd=stdout.w))
        os.close(stdin.w)
        assert job.result() == "input-closed"


def test_follow_log_tails_follows_and_survives_truncation(
    pipes: tuple[Pipe, Pipe], tmp_path: Path
) -> None:
    stdin, stdout = pipes
    log = tmp_path / "console.log"
    log.write_bytes(b"old-old-old\n" + b"x" * 20 + b"LAST-LINE\n")
    job = Background(
        lambda: follow_log(str(log), stdin_fd=stdin.r, stdout_fd=stdout.w, interval=0.01, tail=16)
    )
    seen = bytearray()
    read_until(stdout.r, b"LAST-LINE\n", seen)
    assert b"old" not in seen  # only the tail of what was there
    with log.open("ab") as handle:
        handle.write(b"appended\n")
    read_until(stdout.r, b"appended\n", seen)
    log.write_bytes(b"restarted\n")  # truncated: followed from its start
    read_until(stdout.r, b"restarted\n", seen)
    log.unlink()
    log.write_bytes(b"replaced\n")  # a new file under the same name
    read_until(stdout.r, b"replaced\n", seen)
    os.write(stdin.w, b"typing is ignored" + ESCAPE)
    assert job.result() == "escape"
    assert b"typing" not in seen


def test_follow_log_waits_for_the_file_and_ctrl_c_leaves(
    pipes: tuple[Pipe, Pipe], tmp_path: Path
) -> None:
    stdin, stdout = pipes
    log = tmp_path / "later.log"
    missing = threading.Event()
    job = Background(
        lambda: follow_log(
            str(log),
            stdin_fd=stdin.r,
            stdout_fd=stdout.w,
            interval=0.01,
            on_missing=missing.set,
        )
    )
    assert missing.wait(DEADLINE)
    log.write_bytes(b"first words\n")
    read_until(stdout.r, b"first words\n", bytearray())
    os.write(stdin.w, b"\x03")
    assert job.result() == "escape"


def test_raw_terminal_is_restored_after_errors_and_signals() -> None:
    master, slave = pty.openpty()
    try:
        before = termios.tcgetattr(slave)

        def fail_in_raw_mode() -> None:
            with raw_terminal(slave) as is_tty:
                assert is_tty
                assert not termios.tcgetattr(slave)[3] & termios.ECHO
                raise RuntimeError("boom")

        def signalled_in_raw_mode() -> None:
            with raw_terminal(slave):
                os.kill(os.getpid(), signal.SIGTERM)
                select.select([], [], [], DEADLINE)  # the handler interrupts this wait

        with pytest.raises(RuntimeError):
            fail_in_raw_mode()
        assert termios.tcgetattr(slave) == before
        handler = signal.getsignal(signal.SIGTERM)
        with pytest.raises(_Signalled) as stopped:
            signalled_in_raw_mode()
        assert stopped.value.signum == signal.SIGTERM
        assert termios.tcgetattr(slave) == before
        assert signal.getsignal(signal.SIGTERM) is handler
    finally:
        os.close(master)
        os.close(slave)


def test_raw_terminal_leaves_pipes_alone(pipes: tuple[Pipe, Pipe]) -> None:
    stdin, _ = pipes
    with raw_terminal(stdin.r) as is_tty:
        assert not is_tty
