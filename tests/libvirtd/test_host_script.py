"""hack/libvirt-host.sh: idempotent on a healthy host, and one clear error line (plus the
daemon's log tail) instead of a trace when the set-up is wrong."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.libvirtd

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "hack" / "libvirt-host.sh"


def _run(
    *argv: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(argv), capture_output=True, text=True, timeout=timeout, env=env, check=False
    )


def _assert_clean_failure(result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode == 1, result
    assert "Traceback" not in result.stderr
    assert ": line " not in result.stderr  # no bash error with a line number
    assert "command not found" not in result.stderr


def _require_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to fake a broken host (drop privileges / a mount namespace)")


def test_second_run_is_a_noop(libvirtd_uri: str) -> None:
    result = _run(str(SCRIPT))
    assert result.returncode == 0, result.stderr
    assert "already running and healthy" in result.stderr
    assert "starting" not in result.stderr


def test_missing_package_is_one_clear_line(tmp_path: Path) -> None:
    # a PATH with every system command except virsh
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for d in ("/usr/local/bin", "/usr/bin", "/usr/sbin", "/bin", "/sbin"):
        if not os.path.isdir(d):
            continue
        for entry in os.scandir(d):
            target = bindir / entry.name
            if entry.name != "virsh" and not target.exists():
                target.symlink_to(entry.path)
    result = _run("bash", str(SCRIPT), env={**os.environ, "PATH": str(bindir)})
    _assert_clean_failure(result)
    assert result.stderr.strip() == "error: virsh not found: install libvirt-clients (make deps)"


def test_no_root_and_no_sudo_is_one_clear_line(libvirtd_uri: str) -> None:
    _require_root()
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is missing")
    result = _run(
        "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
        "bash", str(SCRIPT),
        env={"PATH": os.environ["PATH"], "HOME": "/nonexistent"},
    )  # fmt: skip
    _assert_clean_failure(result)
    assert result.stderr.strip().splitlines()[-1] == (
        "error: starting libvirtd needs root: run as root or give this user passwordless sudo"
    )


FAKE_VIRTLOGD = """#!/bin/sh
exit 0
"""

# exits at once: `libvirtd -d` reports the failure itself
FAKE_LIBVIRTD_FAILS = """#!/bin/sh
echo "1: error : fake-libvirtd: cannot bind the socket (capl test)" >>/var/log/libvirt/libvirtd.log
echo "fake-libvirtd: failed to initialize" >&2
exit 1
"""

# daemonizes "successfully" and then dies: the script notices while it waits
FAKE_LIBVIRTD_DIES = """#!/bin/sh
echo "1: error : fake-libvirtd: the QEMU driver failed (capl test)" >>/var/log/libvirt/libvirtd.log
while [ $# -gt 0 ]; do [ "$1" = -p ] && echo $$ >"$2"; shift; done
exit 0
"""


@pytest.mark.parametrize(
    ("fake", "message"),
    [
        (FAKE_LIBVIRTD_FAILS, "error: libvirtd -d failed to start"),
        (FAKE_LIBVIRTD_DIES, "error: libvirtd exited during start-up"),
    ],
    ids=["start-fails", "dies-after-start"],
)
def test_libvirtd_that_will_not_start_shows_its_log_tail(
    tmp_path: Path, fake: str, message: str
) -> None:
    """Runs the script in a private mount namespace where /run, /etc/libvirt and
    /var/log/libvirt are scratch copies, so the real daemon is neither seen nor touched, with
    fake libvirtd/virtlogd first in PATH."""
    _require_root()
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is missing")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name, text in (("virtlogd", FAKE_VIRTLOGD), ("libvirtd", fake)):
        (bindir / name).write_text(text)
        (bindir / name).chmod(0o755)
    etc, log = tmp_path / "etc-libvirt", tmp_path / "log-libvirt"
    shutil.copytree("/etc/libvirt", etc)
    log.mkdir()
    inner = (
        "set -e; mount -t tmpfs tmpfs /run; "
        f"mount --bind {etc} /etc/libvirt; mount --bind {log} /var/log/libvirt; "
        f'exec env PATH="{bindir}:$PATH" TMPDIR={tmp_path} CAPL_LIBVIRTD_START_TIMEOUT=10 '
        f"bash {SCRIPT}"
    )
    probe = _run("unshare", "-m", "--propagation", "private", "true")
    if probe.returncode != 0:
        pytest.skip(f"cannot make a mount namespace here: {probe.stderr.strip()}")
    result = _run("unshare", "-m", "--propagation", "private", "sh", "-c", inner)
    _assert_clean_failure(result)
    assert message in result.stderr
    assert "--- last lines of /var/log/libvirt/libvirtd.log ---" in result.stderr
    assert "fake-libvirtd:" in result.stderr  # the log tail is shown
