"""Managed child processes: stopped in order, and never outliving their parent.

Uses only `sleep`, `sh` and the test's own Python, no test-bed binaries.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from capl.testbed.process import ManagedProcess, ProcessFailed, tail

DEADLINE = 30.0  # seconds: a failure bound, never a synchronisation device

REPO = Path(__file__).resolve().parents[3]


def alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie (orphans may stay unreaped here)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.02)


def test_output_goes_to_the_log_and_survives_restarts(tmp_path: Path) -> None:
    log = tmp_path / "logs" / "p.log"
    proc = ManagedProcess(name="echo", argv=["sh", "-c", "echo hello"], log_path=log)
    for _ in range(2):
        proc.start()
        wait_until(lambda: not proc.running, "the process to exit")
    assert proc.returncode == 0
    assert tail(log).count("hello") == 2
    assert "starting echo" in proc.log_tail()
    proc.stop_sync()


@pytest.mark.skipif(os.geteuid() != 0, reason="a mount namespace needs root")
def test_a_child_can_have_a_resolver_of_its_own(tmp_path: Path) -> None:
    """The child reads its own resolv.conf; this process (and so the machine) still reads
    the real one."""
    mine = tmp_path / "resolv.conf"
    mine.write_text("nameserver 192.0.2.53\n")
    before = Path("/etc/resolv.conf").read_bytes()
    log = tmp_path / "resolver.log"
    proc = ManagedProcess(
        name="resolver", argv=["cat", "/etc/resolv.conf"], log_path=log, resolv_conf=mine
    )
    proc.start()
    wait_until(lambda: not proc.running, "the process to exit")
    assert proc.returncode == 0
    assert "nameserver 192.0.2.53" in tail(log)
    assert Path("/etc/resolv.conf").read_bytes() == before
    proc.stop_sync()


def test_tail_of_a_missing_file_is_empty(tmp_path: Path) -> None:
    assert tail(tmp_path / "absent.log") == ""


def test_tail_returns_the_last_lines(tmp_path: Path) -> None:
    path = tmp_path / "x.log"
    path.write_text("".join(f"line {i}\n" for i in range(100)))
    assert tail(path, lines=2) == "line 98\nline 99"


def test_start_fails_clearly_for_a_missing_binary(tmp_path: Path) -> None:
    proc = ManagedProcess(
        name="ghost", argv=[str(tmp_path / "no-such-binary")], log_path=tmp_path / "g.log"
    )
    with pytest.raises(ProcessFailed, match="cannot start ghost"):
        proc.start()


def test_cannot_start_twice(tmp_path: Path) -> None:
    proc = ManagedProcess(name="sleeper", argv=["sleep", "300"], log_path=tmp_path / "s.log")
    proc.start()
    try:
        with pytest.raises(ProcessFailed, match="already running"):
            proc.start()
    finally:
        proc.stop_sync(grace=5)
    assert not proc.running


def test_stop_terminates_gracefully(tmp_path: Path) -> None:
    proc = ManagedProcess(name="sleeper", argv=["sleep", "300"], log_path=tmp_path / "s.log")
    proc.start()
    assert proc.stop_sync(grace=10) == -signal.SIGTERM


def test_stop_kills_what_ignores_sigterm(tmp_path: Path) -> None:
    script = (
        "import signal, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print('armed', flush=True)\n"
        "time.sleep(300)\n"
    )
    log = tmp_path / "stubborn.log"
    proc = ManagedProcess(name="stubborn", argv=[sys.executable, "-c", script], log_path=log)
    proc.start()
    wait_until(lambda: "armed" in tail(log), "the SIGTERM handler to be installed")
    assert proc.stop_sync(grace=0.2) == -signal.SIGKILL


def test_stop_reaches_the_whole_process_group(tmp_path: Path) -> None:
    log = tmp_path / "group.log"
    proc = ManagedProcess(
        name="group", argv=["sh", "-c", "sleep 300 & echo child=$!; wait"], log_path=log
    )
    proc.start()
    wait_until(lambda: "child=" in tail(log), "the child's pid")
    child = int(tail(log).split("child=")[1].split()[0])
    assert os.getpgid(child) == proc.pid  # its own group, led by the managed process
    assert os.getpgid(child) != os.getpgrp()
    proc.stop_sync(grace=10)
    wait_until(lambda: not alive(child), "the grandchild to die with its group")


async def test_async_stop(tmp_path: Path) -> None:
    proc = ManagedProcess(name="sleeper", argv=["sleep", "300"], log_path=tmp_path / "s.log")
    proc.start()
    assert await proc.stop(grace=10) == -signal.SIGTERM


_TERM_REPORTER = (
    "import signal, sys, time\n"
    "def on_term(*_):\n"
    "    print('got SIGTERM', flush=True)\n"
    "    sys.exit(0)\n"
    "signal.signal(signal.SIGTERM, on_term)\n"
    "print('armed', flush=True)\n"
    "time.sleep(300)\n"
)


def _spawn_parent(tmp_path: Path, ending: str) -> tuple[subprocess.Popen[str], int]:
    """A Python process that starts a managed child and prints its pid, then `ending`.

    The child reports SIGTERM in its log, which tells an orderly stop (atexit) apart from
    the kernel's PR_SET_PDEATHSIG (SIGKILL, nothing logged).
    """
    script = textwrap.dedent(
        f"""
        import pathlib, sys, time
        from capl.testbed.process import ManagedProcess
        log = pathlib.Path({str(tmp_path / "child.log")!r})
        p = ManagedProcess(name="child", argv=[sys.executable, "-c", {_TERM_REPORTER!r}],
                           log_path=log)
        p.start()
        deadline = time.monotonic() + {DEADLINE}
        while "armed" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.02)
        print(p.pid, flush=True)
        {ending}
        """
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", script], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    assert parent.stdout is not None
    line = parent.stdout.readline()
    assert line.strip().isdigit(), f"parent did not report a pid: {line!r}"
    return parent, int(line)


def test_child_dies_when_the_parent_is_killed(tmp_path: Path) -> None:
    parent, child = _spawn_parent(tmp_path, "time.sleep(300)")
    try:
        assert alive(child)
        parent.kill()  # no atexit, no cleanup code: only the kernel can help now
        parent.wait()
        wait_until(lambda: not alive(child), "PR_SET_PDEATHSIG to kill the orphan")
        assert "got SIGTERM" not in tail(tmp_path / "child.log")
    finally:
        parent.kill()
        parent.wait()
        if alive(child):
            os.kill(child, signal.SIGKILL)


@pytest.mark.parametrize(
    "ending", ["sys.exit(0)", "raise KeyboardInterrupt"], ids=["exit", "interrupt"]
)
def test_child_is_stopped_at_interpreter_exit(tmp_path: Path, ending: str) -> None:
    parent, child = _spawn_parent(tmp_path, ending)
    try:
        parent.wait(timeout=DEADLINE)
        # atexit stopped it in order (SIGTERM) before the parent finished exiting.
        assert not alive(child)
        assert "got SIGTERM" in tail(tmp_path / "child.log")
    finally:
        parent.kill()
        parent.wait()
        if alive(child):
            os.kill(child, signal.SIGKILL)
