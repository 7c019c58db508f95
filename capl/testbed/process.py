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

Shared by every process of the test bed (etcd, kube-apiserver, the Cluster API manager,
`capl manager`, the test daemons):
- `wait_until_ready(proc, check, ...)`: poll a readiness check with a deadline; fail at once
  with the log tail when the process exits, or at the deadline with the last check's answer;
- `retry_lost_port(start, ...)`: a port picked free can be taken by another process before
  the child binds it; when the child's log says so, pick new ports and start again;
- `run_captured(argv, ...)`: a short-lived command (kubectl, clusterctl) with a deadline,
  its output captured, killed with its parent like the long-running ones.

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
import inspect
import logging
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Final

import aiohttp

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1
ADDRESS_IN_USE: Final = re.compile(r"address already in use", re.IGNORECASE)
"""What a child's log says when another process took the port it was given."""
# What a readiness check may raise while the process is still coming up.
_NOT_READY_YET = (aiohttp.ClientError, OSError, TimeoutError, ValueError)

ReadyCheck = Callable[[], Awaitable[tuple[bool, str]]]
"""A readiness check: (ready?, what it saw, for the error message at the deadline)."""

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


_CLONE_NEWNS = 0x00020000
_MS_BIND = 0x1000
_MS_REC = 0x4000
_MS_PRIVATE = 1 << 18
_libc.unshare.argtypes = [ctypes.c_int]
_libc.mount.argtypes = [
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_ulong,
    ctypes.c_void_p,
]


def own_resolver(resolv_conf: bytes) -> None:
    """`preexec_fn` step: a mount namespace of the child's own in which `resolv_conf` is
    bind-mounted over /etc/resolv.conf (the machine's file and every other process are
    untouched; the namespace ends with the child). Needs root (CAP_SYS_ADMIN).

    For managers that must resolve a workload cluster's endpoint the way a management cluster
    with split DNS would, through a libvirt network's dnsmasq. Runs between fork and exec.
    """
    if _libc.unshare(_CLONE_NEWNS) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS) for a resolver of its own")
    if _libc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None) != 0:
        raise OSError(ctypes.get_errno(), "making / private in the child's mount namespace")
    if _libc.mount(resolv_conf, b"/etc/resolv.conf", None, _MS_BIND, None) != 0:
        raise OSError(ctypes.get_errno(), "bind-mounting the child's resolv.conf")


def _child_setup(parent_pid: int, resolv_conf: bytes | None) -> None:
    die_with_parent(parent_pid)
    if resolv_conf is not None:
        own_resolver(resolv_conf)


def child_env(*, drop_prefixes: Sequence[str] = ()) -> dict[str, str]:
    """This process's environment for a child: without KUBECONFIG and variables starting
    with one of `drop_prefixes`."""
    return {
        k: v
        for k, v in os.environ.items()
        if not any(k.startswith(p) for p in drop_prefixes) and k != "KUBECONFIG"
    }


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


def file_size(path: Path) -> int:
    """The size of a (log) file; 0 if it does not exist."""
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def read_from(path: Path, offset: int = 0) -> str:
    """The text of a (log) file from byte `offset` on; empty if it does not exist."""
    try:
        with path.open("rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")
    except FileNotFoundError:
        return ""


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
        resolv_conf: Path | None = None,
    ) -> None:
        """resolv_conf: the child sees this file as /etc/resolv.conf (`own_resolver`)."""
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.env = dict(env) if env is not None else None
        self.cwd = cwd
        self.resolv_conf = resolv_conf
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

    def start(self) -> None:
        """Start the process; its output is appended to the log file."""
        if self.running:
            raise ProcessFailed(f"{self.name} is already running (pid {self.pid})")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        resolver = None if self.resolv_conf is None else os.fsencode(self.resolv_conf.resolve())
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
                    preexec_fn=functools.partial(_child_setup, os.getpid(), resolver),
                    close_fds=True,
                )
            except (OSError, subprocess.SubprocessError) as e:
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


async def wait_until_ready(
    proc: ManagedProcess,
    check: ReadyCheck,
    *,
    what: str,
    within: float,
    poll: float = 0.2,
    timeout_error: type[Exception] = ProcessFailed,
    show_log_path: bool = True,
) -> None:
    """Poll `check` until it says ready.

    Raises ProcessFailed at once when `proc` exits, `timeout_error` once `within` seconds
    passed; both messages carry the last lines of the process's log (and its path unless
    `show_log_path` is False: a log in a directory removed after a failed start).
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    last = "no answer yet"
    where = f" (log: {proc.log_path})" if show_log_path else ""
    while True:
        if not proc.running:
            raise ProcessFailed(
                f"{what} exited with status {proc.returncode} before it became ready"
                f"{where}\n--- last lines of its log ---\n{proc.log_tail()}"
            )
        try:
            ok, last = await check()
        except _NOT_READY_YET as e:
            ok, last = False, f"{type(e).__name__}: {e}"
        if ok:
            return
        if loop.time() >= deadline:
            raise timeout_error(
                f"{what} did not become ready within {within:g} s; last check: {last}"
                f"{where}\n--- last lines of its log ---\n{proc.log_tail()}"
            )
        await asyncio.sleep(poll)


async def retry_lost_port(
    start: Callable[[], Awaitable[None]],
    *,
    log_path: Path,
    repick: Callable[[], object],
    what: str,
    attempts: int = 3,
) -> None:
    """`start()`; when it fails with ProcessFailed and what the process logged meanwhile says
    its port was taken, `repick()` (new ports; may be a coroutine function) and start again."""
    for attempt in range(1, attempts + 1):
        offset = file_size(log_path)
        try:
            await start()
            return
        except ProcessFailed:
            if attempt == attempts or not ADDRESS_IN_USE.search(read_from(log_path, offset)):
                raise
        log.warning("%s lost a port to another process; retrying on new ports", what)
        result = repick()
        if inspect.isawaitable(result):
            await result


async def run_captured(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    stdin: bytes | None = None,
    cwd: Path | None = None,
    within: float,
) -> tuple[int, str, str]:
    """Run a command to completion within `within` seconds: (status, stdout, stderr).

    The command dies with this process (PR_SET_PDEATHSIG) and is killed when the deadline
    passes or the caller is cancelled.
    """
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=dict(env),
        cwd=cwd,
        preexec_fn=functools.partial(die_with_parent, os.getpid()),
    )
    try:
        async with asyncio.timeout(within):
            out, err = await proc.communicate(stdin)
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        raise
    assert proc.returncode is not None
    return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")


def _stop_all_at_exit() -> None:
    ManagedProcess.stop_all()


atexit.register(_stop_all_at_exit)
