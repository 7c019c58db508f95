"""`capl demo` end to end on the libvirt test driver, run as a user runs it.

The command runs as a subprocess — in a pseudo-terminal (the live view) or with pipes (line
output) — with its real control plane, the real Cluster API core manager and capl's manager
in process. The tests wait for the one `N/N machines Ready` line, stop it with a signal and
check that it exits 0 and leaves nothing behind: every process it started (by the PIDs it
printed) is gone, its work directory is gone, and it says it cleaned up. On the test driver
the libvirt state dies with the process, so the demo's own check of the host (which it
reports) is what can be asserted.

`DemoRun` is also used by tests/libvirtd/test_demo_real.py.
"""

from __future__ import annotations

import contextlib
import os
import pty
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from capl.testbed import AssetsMissing, find_assets
from capl.testbed.capi import CapiMissing, find_capi
from tests.fixtures.common import require_part

pytestmark = [pytest.mark.apiserver]

CAPL = str(Path(sys.executable).with_name("capl"))
ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07]*\x07|\x1b[()][0-9A-Za-z]|\r")
START_DEADLINE = 180.0
"""Set-up (control plane, Cluster API) and the machines on the test driver."""


def plain(text: str) -> str:
    """Terminal output without escape sequences and carriage returns."""
    return ANSI.sub("", text)


class DemoRun:
    """`capl demo ...` as a child process, in a pty (``tty=True``) or with a pipe."""

    def __init__(self, args: Sequence[str], *, tty: bool, env: dict[str, str] | None = None):
        self.argv = [CAPL, "demo", *args]
        self.tty = tty
        self.env = {**os.environ, **(env or {}), "COLUMNS": "160", "LINES": "50"}
        self.env.setdefault("TERM", "xterm-256color")
        self.raw = b""
        self.pid = 0
        self._fd = -1
        self._proc: subprocess.Popen[bytes] | None = None
        self.returncode: int | None = None

    def start(self) -> DemoRun:
        if self.tty:
            pid, fd = pty.fork()
            if pid == 0:  # the child: become the command
                try:
                    os.execve(self.argv[0], self.argv, self.env)
                finally:
                    os._exit(127)
            self.pid, self._fd = pid, fd
        else:
            self._proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env={k: v for k, v in self.env.items() if k != "TERM"},
            )
            assert self._proc.stdout is not None
            self.pid, self._fd = self._proc.pid, self._proc.stdout.fileno()
        return self

    @property
    def text(self) -> str:
        return plain(self.raw.decode(errors="replace"))

    def _read(self, timeout: float) -> bool:
        """Read what is there (waiting up to ``timeout``); False at end of output."""
        ready, _, _ = select.select([self._fd], [], [], timeout)
        if not ready:
            return True
        try:
            data = os.read(self._fd, 65536)
        except OSError:  # EIO: the pty's other side closed
            return False
        self.raw += data
        return bool(data)

    def wait_for(self, pattern: str, *, within: float) -> re.Match[str]:
        """The first match of ``pattern`` (multiline) in the output; fails at the deadline."""
        regex = re.compile(pattern, re.MULTILINE)
        deadline = time.monotonic() + within
        while True:
            match = regex.search(self.text)
            if match:
                return match
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"no {pattern!r} within {within:.0f} s; output:\n{self.text[-6000:]}"
                )
            if not self._read(0.5) and not regex.search(self.text):
                raise AssertionError(f"exited without {pattern!r}; output:\n{self.text[-6000:]}")

    def signal(self, signum: int) -> None:
        os.kill(self.pid, signum)

    def wait(self, *, within: float) -> int:
        deadline = time.monotonic() + within
        while self._read(0.5):
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"still running after {within:.0f} s; output:\n{self.text[-6000:]}"
                )
        return self._reap(deadline)

    def _reap(self, deadline: float) -> int:
        while True:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
                if self._proc is not None:
                    self._proc.returncode = self.returncode
                return self.returncode
            if time.monotonic() > deadline:
                raise AssertionError(f"output ended but the process still runs: {self.text}")
            select.select([], [], [], 0.1)

    def close(self, *, grace: float = 240.0) -> None:
        """After a failed test: stop it the way a user would (it cleans up), kill at last."""
        if self.returncode is None and self.pid:
            with contextlib.suppress(ProcessLookupError):
                self.signal(signal.SIGINT)
            try:
                self.wait(within=grace)
            except AssertionError:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGKILL)
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(self.pid, 0)
        if self._proc is not None and self._proc.stdout is not None:
            self._proc.stdout.close()
        elif self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
        self._fd = -1

    # -- what it printed ------------------------------------------------------------------

    def workdir(self) -> Path:
        return Path(self.wait_for(r"^work directory: (\S+)", within=60).group(1))

    def started_pids(self) -> dict[str, int]:
        line = self.wait_for(r"^processes: (.*)$", within=START_DEADLINE).group(1)
        return {name: int(pid) for name, pid in re.findall(r"([\w-]+) pid (\d+)", line)}

    def lines(self, text: str) -> list[str]:
        return [line for line in self.text.splitlines() if line.strip() == text]


@contextlib.contextmanager
def demo_run(args: Sequence[str], *, tty: bool) -> Iterator[DemoRun]:
    run = DemoRun(args, tty=tty).start()
    try:
        yield run
    finally:
        run.close()


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def assert_nothing_left(run: DemoRun, *, workdir: Path, pids: dict[str, int]) -> None:
    assert {"etcd", "kube-apiserver", "cluster-api-manager"} <= set(pids), pids
    assert not [name for name, pid in pids.items() if alive(pid)], run.text[-3000:]
    assert not alive(run.pid)
    assert not workdir.exists(), f"{workdir} is still there"
    assert re.search(r"^cleaned up: nothing of cluster \S+ is left on ", run.text, re.M), run.text


@pytest.fixture(scope="module", autouse=True)
def binaries() -> None:
    """The demo needs the control-plane binaries and the Cluster API build."""
    try:
        find_assets()
    except AssetsMissing as exc:
        require_part("the control-plane binaries", str(exc))
    try:
        find_capi()
    except CapiMissing as exc:
        require_part("the Cluster API build", str(exc))


def test_live_view_until_ready_then_ctrl_c_removes_everything() -> None:
    with demo_run(["--libvirt-uri", "test:///default"], tty=True) as run:
        workdir = run.workdir()
        pids = run.started_pids()
        run.wait_for(r"^3/3 machines Ready$", within=START_DEADLINE)
        # the live table was drawn (box drawing, the columns), then what to try
        text = run.text
        for column in ("MACHINE", "HOST", "STATE", "ADDRESS", "READY", "ELAPSED"):
            assert column in text
        run.wait_for(r"^Ctrl-C stops the demo", within=30)
        assert "no real nodes: VM-only mode (as with --vm-only)" in run.text
        assert f"status --kubeconfig {workdir}/kubeconfig" in run.text
        assert "scale machinedeployment demo-workers" in run.text

        run.signal(signal.SIGINT)
        assert run.wait(within=120) == 0
    assert len(run.lines("3/3 machines Ready")) == 1
    assert "SIGINT: stopping the demo" in run.text
    assert_nothing_left(run, workdir=workdir, pids=pids)


def test_without_a_terminal_it_prints_a_line_per_change_and_stops_on_sigterm() -> None:
    with demo_run(["--libvirt-uri", "test:///default", "--machines", "2"], tty=False) as run:
        workdir = run.workdir()
        pids = run.started_pids()
        run.wait_for(r"^2/2 machines Ready$", within=START_DEADLINE)
        run.wait_for(r"^Ctrl-C stops the demo", within=30)
        run.signal(signal.SIGTERM)
        assert run.wait(within=120) == 0
    raw = run.raw.decode()
    assert "\x1b[" not in raw, "escape sequences without a terminal"
    assert len(run.lines("2/2 machines Ready")) == 1
    changes = re.findall(r"^\[ *\d+\S*\] (demo-\S+): host=(\S+) state=(\S+)", raw, re.M)
    assert {name for name, _, _ in changes} >= {"demo-control-plane-0"}
    assert ("demo-control-plane-0", "local", "Running") in changes
    assert "SIGTERM: stopping the demo" in raw
    assert_nothing_left(run, workdir=workdir, pids=pids)


def test_what_capl_did_not_remove_in_time_is_removed_directly_and_reported() -> None:
    args = ["--libvirt-uri", "test:///default", "--machines", "2", "--cleanup-timeout", "0"]
    with demo_run(args, tty=False) as run:
        workdir = run.workdir()
        pids = run.started_pids()
        run.wait_for(r"^2/2 machines Ready$", within=START_DEADLINE)
        run.signal(signal.SIGINT)
        assert run.wait(within=120) == 0
    assert "capl did not finish within 0 s" in run.text
    assert re.search(r"removing it directly: domain capl-default-demo-", run.text), run.text
    assert "force-removed what capl left of cluster demo on test:///default" in run.text
    assert_nothing_left(run, workdir=workdir, pids=pids)


def test_a_second_ctrl_c_skips_the_wait_and_still_cleans_up() -> None:
    with demo_run(["--libvirt-uri", "test:///default", "--machines", "2"], tty=True) as run:
        workdir = run.workdir()
        pids = run.started_pids()
        run.wait_for(r"^2/2 machines Ready$", within=START_DEADLINE)
        run.signal(signal.SIGINT)
        run.wait_for(r"SIGINT: stopping the demo", within=30)
        run.signal(signal.SIGINT)
        assert run.wait(within=120) == 0
    assert "SIGINT again: not waiting for capl any longer" in run.text
    assert_nothing_left(run, workdir=workdir, pids=pids)


def test_ctrl_c_during_set_up_stops_what_was_started() -> None:
    with demo_run(["--libvirt-uri", "test:///default"], tty=False) as run:
        workdir = run.workdir()
        run.wait_for(r"^==> Starting a local control plane", within=60)
        run.signal(signal.SIGINT)
        code = run.wait(within=120)
    assert code == 130, run.text
    assert "machines Ready" not in run.text
    assert not workdir.exists()
    assert "cleaned up:" in run.text
    started = re.search(r"^processes: (.*)$", run.text, re.M)
    if started:  # the signal came after the control plane was up
        for pid in re.findall(r"pid (\d+)", started.group(1)):
            assert not alive(int(pid))


def test_an_unreachable_libvirt_host_is_one_line_and_exit_4() -> None:
    uri = "qemu+unix:///system?socket=/nonexistent/capl-demo.sock"
    image = "http://127.0.0.1:9/never-fetched.qcow2"
    with demo_run(["--vm-only", "--libvirt-uri", uri, "--image", image], tty=False) as run:
        workdir = run.workdir()
        code = run.wait(within=60)
    assert code == 4, run.text
    last = run.text.strip().splitlines()[-1]
    assert last.startswith(f"capl: error: cannot reach the libvirt host {uri}"), run.text
    assert "Traceback" not in run.text
    assert not workdir.exists()


def test_machines_not_ready_in_time_fail_after_clean_up_and_keep_keeps_the_logs() -> None:
    args = ["--libvirt-uri", "test:///default", "--ready-timeout", "0", "--keep"]
    workdir: Path | None = None
    try:
        with demo_run(args, tty=False) as run:
            workdir = run.workdir()
            pids = run.started_pids()
            code = run.wait(within=180)
        assert code == 1, run.text
        last = run.text.strip().splitlines()[-1]
        assert re.match(r"capl: error: \d of 3 machines Ready after 0 s \(--ready-timeout\)", last)
        assert "machines Ready\n" not in run.text
        assert f"kept the work directory with every log: {workdir}" in run.text
        assert not [name for name, pid in pids.items() if alive(pid)]
        assert (workdir / "logs" / "capl-manager.log").stat().st_size > 0
        assert (workdir / "control-plane" / "logs" / "kube-apiserver.log").is_file()
        assert (workdir / "kubeconfig").is_file()
        assert not (workdir / "demo.json").exists(), "a kept directory is not a leftover"
    finally:
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)
