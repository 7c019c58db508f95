"""Long-running child processes that cannot outlive the process that started them.

Three layers make sure no etcd or kube-apiserver survives a crashed or interrupted run:

1. Orderly stop: SIGTERM to the child's process group, then SIGKILL once a grace period has
   passed (`ManagedProcess.stop` / `stop_sync`).
2. `atexit`: every process still running when the interpreter exits normally (including
   after KeyboardInterrupt) is stopped the same way, with a short grace.
3. The kernel: each child is started with PR_SET_PDEATHSIG=SIGKILL, so when the parent dies
   by any means (SIGKILL, OOM, a segfault) the kernel kills the child. Two caveats: the
   signal fires when the *thread* that forked the child ends, so start children from a
   thread that lives as long as they do (the main thread / event-loop thread, which is
   what asyncio code does naturally); and the child checks after prctl that its parent is
   still the one that forked it, closing the race where the parent dies before prctl runs.

Each child gets its own session and process group (setsid): a Ctrl-C in the terminal reaches
only the parent, which then stops its children in order, instead of every process at once.

Output (stdout and stderr) goes to a log file, appended across restarts, whose tail is put
into error messages when a child dies or never becomes ready.

Children are started with subprocess.Popen rather than asyncio subprocesses so that the
synchronous paths (atexit, emergency close) work without an event loop; the async `stop`
waits in a worker thread.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import ctypes
import ctypes.util
import errno
import functools
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1

# Resolved once at import: loading a library after fork() in a child is not safe.
_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
_prctl = _libc.prctl
_prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
_prctl.restype = ctypes.c_int


class ProcessFailed(RuntimeError):
    """A managed process could not be started or exited when it should be running."""


def die_with_parent(parent_pid: int) -> None:
    """`preexec_fn` for children that must die with this process (see the module docstring).

    Runs in the child between fork and exec: keep it tiny (no imports, no locks).
    """
    if _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        os._exit(126)
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(126)


def tail(path: Path, *, lines: int = 40, max_bytes: int = 64 * 1024) -> str:
    """The last `lines` lines of a (log) file; empty if it does not exist."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read()
    except FileNotFoundError:
        return ""
    text = data.decode("utf-8", errors="replace")
    return "\n".join(text.splitlines()[-lines:])


class ManagedProcess:
    """One child process with a log file, restartable, killed with its parent."""

    _live: set[ManagedProcess] = set()
    _live_lock = threading.Lock()

    def __init__(
        self,
        *,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.env = dict(env) if env is not None else None
        self.cwd = cwd
        self._proc: subprocess.Popen[bytes] | None = None

    def __repr__(self) -> str:
        return f"<ManagedProcess {self.name} pid={self.pid} running={self.running}>"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def returncode(self) -> int | None:
        return self._proc.poll() if self._proc is not None else None

    def log_tail(self, *, lines: int = 40) -> str:
        return tail(self.log_path, lines=lines)

    def log_offset(self) -> int:
        """The current size of the log (to read only what a later start writes)."""
        try:
            return self.log_path.stat().st_size
        except FileNotFoundError:
            return 0

    def start(self) -> None:
        """Start the process; its output is appended to the log file."""
        if self.running:
            raise ProcessFailed(f"{self.name} is already running (pid {self.pid})")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as logfile:
            logfile.write(f"==> {time.strftime('%H:%M:%S')} starting {self.name}\n".encode())
            logfile.flush()
            try:
                self._proc = subprocess.Popen(
                    self.argv,
                    stdin=subprocess.DEVNULL,
                    stdout=logfile,
                    stderr=subprocess.STDOUT,
                    env=self.env,
                    cwd=self.cwd,
                    start_new_session=True,
                    preexec_fn=functools.partial(die_with_parent, os.getpid()),
                    close_fds=True,
                )
            except OSError as e:
                raise ProcessFailed(f"cannot start {self.name} ({self.argv[0]}): {e}") from e
        with self._live_lock:
            self._live.add(self)
        log.debug("started %s pid=%s: %s", self.name, self._proc.pid, " ".join(self.argv))

    def _signal_group(self, sig: int) -> None:
        assert self._proc is not None
        try:
            # setsid made the child a group leader: its pgid is its pid. Never look the group
            # up after the child may have been reaped (the id could be reused).
            os.killpg(self._proc.pid, sig)
        except ProcessLookupError:
            pass
        except PermissionError as e:  # pragma: no cover - would mean pid reuse by another user
            if e.errno != errno.EPERM:
                raise

    def stop_sync(self, *, grace: float = 10.0) -> int | None:
        """SIGTERM, wait up to `grace` seconds, then SIGKILL. Returns the exit status."""
        proc = self._proc
        if proc is None:
            return None
        try:
            if proc.poll() is None:
                self._signal_group(signal.SIGTERM)
                try:
                    proc.wait(timeout=grace)
                except subprocess.TimeoutExpired:
                    log.warning("%s did not stop within %.0f s, killing it", self.name, grace)
                    self._signal_group(signal.SIGKILL)
                    proc.wait()
            else:
                # The leader is gone; make sure nothing else of its group lingers.
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
        finally:
            with self._live_lock:
                self._live.discard(self)
        return proc.returncode

    async def stop(self, *, grace: float = 10.0) -> int | None:
        """`stop_sync` without blocking the event loop."""
        return await asyncio.to_thread(self.stop_sync, grace=grace)

    def kill(self) -> None:
        """SIGKILL right away (simulates a crash)."""
        if self._proc is not None and self._proc.poll() is None:
            self._signal_group(signal.SIGKILL)
            self._proc.wait()
        with self._live_lock:
            self._live.discard(self)

    @classmethod
    def stop_all(cls, *, grace: float = 3.0) -> None:
        """Stop every process still running (used at interpreter exit)."""
        with cls._live_lock:
            live = list(cls._live)
        for proc in live:
            with contextlib.suppress(Exception):
                proc.stop_sync(grace=grace)


def _stop_all_at_exit() -> None:
    ManagedProcess.stop_all()


atexit.register(_stop_all_at_exit)
