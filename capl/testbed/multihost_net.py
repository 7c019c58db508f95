"""The multi-host bed's plumbing: the LAN bridge, network namespaces, the LAN's DHCP server,
and processes found and stopped by PID (see `capl.testbed.multihost` for the whole picture).

- `Lan`: the shared "LAN" bridge in the root namespace with its address (`.1`), one veth per
  host namespace (the root end a port of the bridge, the other end moved into the namespace,
  renamed ``lan0`` and enslaved to the namespace's own bridge ``br-lan``, which carries the
  host's LAN address), loopback up in every namespace;
- `start_dnsmasq` / the pid file: a DHCP-only dnsmasq (``--port=0``) bound to the LAN bridge
  alone, handing out addresses of the DHCP range, no router and no DNS server (nothing on the
  LAN routes off this machine), with its own pid, lease and log files;
- `netns_pids(name)`: every process in a network namespace (its ``/proc/<pid>/ns/net`` is
  the namespace's inode): everything there was started by the bed, which is how `stop`
  finds QEMU processes and libvirt's own dnsmasq without guessing by name;
- `stop_pids`: SIGTERM, a deadline, SIGKILL — by PID only.

Everything goes through ``ip`` subprocesses; nothing here imports another capl layer.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Final

NETNS_DIR: Final = Path("/run/netns")
NS_LAN_IF: Final = "lan0"
"""The host namespace's end of its veth (enslaved to the namespace's bridge)."""


class BedError(RuntimeError):
    """The multi-host bed could not be started (the message says why, with log tails)."""


def run(argv: Sequence[str], *, timeout: float = 30.0, check: bool = True) -> str:
    """Run a short command; its stdout. A failure raises BedError with its stderr."""
    try:
        done = subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BedError(f"{' '.join(argv)}: {exc}") from exc
    if check and done.returncode != 0:
        raise BedError(
            f"{' '.join(argv)} exited with {done.returncode}: "
            f"{(done.stderr or done.stdout).strip()}"
        )
    return done.stdout


def ip(*args: str, netns: str | None = None, check: bool = True) -> str:
    prefix = ["ip", "-n", netns] if netns else ["ip"]
    return run([*prefix, *args], check=check)


def link_exists(name: str, *, netns: str | None = None) -> bool:
    prefix = ["ip", "-n", netns] if netns else ["ip"]
    done = subprocess.run([*prefix, "link", "show", "dev", name], capture_output=True, check=False)
    return done.returncode == 0


def netns_exists(name: str) -> bool:
    return (NETNS_DIR / name).exists()


# --- processes ---------------------------------------------------------------------------------


def pid_alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def read_pid(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def ns_inode(pid: int, kind: str) -> int | None:
    """The inode of a process's namespace of `kind` (``net``, ``mnt``)."""
    try:
        return os.stat(f"/proc/{pid}/ns/{kind}").st_ino
    except OSError:
        return None


def netns_inode(name: str) -> int | None:
    try:
        return os.stat(NETNS_DIR / name).st_ino
    except OSError:
        return None


def netns_pids(name: str) -> list[int]:
    """Every live process whose network namespace is `name`."""
    inode = netns_inode(name)
    if inode is None:
        return []
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and ns_inode(int(entry.name), "net") == inode:
            found.append(int(entry.name))
    return [pid for pid in found if pid_alive(pid)]


def stop_pids(pids: Iterable[int], *, grace: float = 10.0) -> list[int]:
    """SIGTERM each, wait up to `grace` seconds, SIGKILL what is left; the PIDs killed hard."""
    pending = [pid for pid in pids if pid_alive(pid)]
    for pid in pending:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while pending and time.monotonic() < deadline:
        time.sleep(0.05)
        pending = [pid for pid in pending if pid_alive(pid)]
    for pid in pending:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while any(pid_alive(p) for p in pending) and time.monotonic() < deadline:
        time.sleep(0.05)
    return pending


# --- the LAN -----------------------------------------------------------------------------------


class Lan:
    """The LAN bridge `bridge` with `gateway/prefix` in the root namespace."""

    def __init__(self, *, bridge: str, gateway: str, prefix: int, host_bridge: str) -> None:
        self.bridge = bridge
        self.gateway = gateway
        self.prefix = prefix
        self.host_bridge = host_bridge

    def create_bridge(self) -> None:
        if not link_exists(self.bridge):
            ip("link", "add", self.bridge, "type", "bridge")
        ip("addr", "replace", f"{self.gateway}/{self.prefix}", "dev", self.bridge)
        ip("link", "set", self.bridge, "up")

    def attach(self, *, netns: str, root_if: str, address: str) -> None:
        """The namespace `netns` (created if missing) on the LAN with `address`."""
        if not netns_exists(netns):
            run(["ip", "netns", "add", netns])
        ip("link", "set", "lo", "up", netns=netns)
        if not link_exists(root_if):
            ip("link", "add", root_if, "type", "veth", "peer", "name", NS_LAN_IF, "netns", netns)
        ip("link", "set", root_if, "master", self.bridge)
        ip("link", "set", root_if, "up")
        if not link_exists(self.host_bridge, netns=netns):
            ip("link", "add", self.host_bridge, "type", "bridge", netns=netns)
        ip("link", "set", NS_LAN_IF, "master", self.host_bridge, netns=netns)
        ip("link", "set", NS_LAN_IF, "up", netns=netns)
        ip("addr", "replace", f"{address}/{self.prefix}", "dev", self.host_bridge, netns=netns)
        ip("link", "set", self.host_bridge, "up", netns=netns)

    def remove(self, *, netns_names: Iterable[str], root_ifs: Iterable[str]) -> None:
        """Delete the namespaces (their veth pairs go with them), stray veths, the bridge."""
        for name in netns_names:
            if netns_exists(name):
                run(["ip", "netns", "del", name], check=False)
        for name in [*root_ifs, self.bridge]:
            if link_exists(name):
                ip("link", "del", name, check=False)


def start_dnsmasq(*, bridge: str, dhcp_range: tuple[str, str], netmask: str, workdir: Path) -> int:
    """The LAN's DHCP server (see the module docstring); its PID."""
    workdir.mkdir(parents=True, exist_ok=True)
    pid_file = workdir / "dnsmasq.pid"
    run(
        [
            "dnsmasq",
            "--conf-file=/dev/null",
            "--port=0",
            "--bind-interfaces",
            f"--interface={bridge}",
            "--except-interface=lo",
            f"--dhcp-range={dhcp_range[0]},{dhcp_range[1]},{netmask},1h",
            "--dhcp-option=3",  # no router: nothing on the LAN routes off this machine
            "--dhcp-option=6",  # no DNS server
            "--dhcp-authoritative",
            f"--dhcp-leasefile={workdir / 'leases'}",
            f"--pid-file={pid_file}",
            f"--log-facility={workdir / 'dnsmasq.log'}",
            "--log-dhcp",
            "--user=root",
            "--group=root",
        ]
    )
    deadline = time.monotonic() + 5.0
    while (pid := read_pid(pid_file)) is None or not pid_alive(pid):
        if time.monotonic() > deadline:
            raise BedError(f"the LAN's dnsmasq wrote no live pid to {pid_file}")
        time.sleep(0.05)
    return pid


def dnsmasq_pid(workdir: Path) -> int | None:
    """The LAN dnsmasq's PID when it runs (checked: the pid file's process is a dnsmasq)."""
    pid = read_pid(workdir / "dnsmasq.pid")
    if pid is None or not pid_alive(pid) or comm(pid) != "dnsmasq":
        return None
    return pid
