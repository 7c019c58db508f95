"""One host of the multi-host bed: its state directories, configuration, mount namespace and
daemons (see `capl.testbed.multihost` for the whole bed).

A host is a network namespace ``capl-<name>`` plus a mount namespace (and a UTS namespace:
its own host name) owned by a small *holder* process (``sleep infinity``, started as ``ip
netns exec <ns> unshare --mount --uts --propagation private sh -c '<bind mounts>; exec sleep
infinity'`` under ``setsid --fork``, so it belongs to no caller). In that mount namespace
the host's state directory is bind-mounted over the paths a privileged libvirtd has
compiled in:

    <state>/<host>/etc    -> /etc/libvirt        (libvirtd.conf, qemu.conf, virtlogd.conf, pki/)
    <state>/<host>/run    -> /run/libvirt        (sockets, the daemons' pid files)
    <state>/<host>/lib    -> /var/lib/libvirt    (pools, dnsmasq, qemu state)
    <state>/<host>/cache  -> /var/cache/libvirt
    <state>/<host>/log    -> /var/log/libvirt    (libvirtd.log, virtlogd.log, qemu/)
    tmpfs                 -> /srv, with <state>/shared -> /srv/capl-shared (the same
                             directory on every host, for shared-storage migration)

virtlogd, libvirtd (``--listen`` for TLS) and, on an ssh host, sshd are started with
``nsenter --target <holder> --mount --uts --net``: all daemons of a host share the holder's mount
namespace, so libvirtd finds its virtlogd, and the shell sshd starts for libvirt's ssh
transport reaches this host's /run/libvirt/libvirt-sock. Each daemonizes with an explicit
pid file inside /run/libvirt (libvirtd's default, /run/libvirtd.pid, is the machine's own
daemon's). ``ip netns exec`` remounted /sys for the namespace, so cgroups are not there and
libvirt runs without them.

qemu.conf carries the quirks hack/libvirt-host.sh applies to the system daemon (QEMU as
root, no security driver, no dynamic ownership) plus the migration address and host: the
host's LAN address (the migration ports 49152-49215 are per namespace).
"""

from __future__ import annotations

import shlex
import socket
import subprocess
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final, TypeVar

from capl.testbed.certs import write_file
from capl.testbed.multihost_net import (
    BedError,
    comm,
    netns_inode,
    netns_pids,
    ns_inode,
    pid_alive,
    read_pid,
    run,
    stop_pids,
)
from capl.testbed.process import tail
from capl.testbed.sshd import sshd_config

SHARED_MOUNT: Final = "/srv/capl-shared"
TLS_PORT: Final = 16514
SSH_PORT: Final = 22
SSHD: Final = "/usr/sbin/sshd"
START_TIMEOUT: Final = 60.0
_UUID_NAMESPACE: Final = uuid.UUID("6f1c3c1e-3a52-4d1f-9d55-0c0ffee0ca91")
_ENV: Final = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root", "LANG": "C.UTF-8"}
_NS_PID_DIR: Final = "/run/libvirt"
T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class HostPlan:
    """What a host is: its name, its place on the LAN and how capl reaches it."""

    name: str
    index: int
    transport: str
    """``tls`` (qemu+tls, client certificates) or ``ssh`` (qemu+ssh as root)."""
    lan_prefix: str
    """The LAN's first three octets; the host is ``<prefix>.<10 + index>``."""

    @property
    def netns(self) -> str:
        return f"capl-{self.name}"

    @property
    def root_if(self) -> str:
        """The root namespace's end of the host's veth (a port of the LAN bridge)."""
        return f"capl-{self.name}"

    @property
    def lan_ip(self) -> str:
        return f"{self.lan_prefix}.{10 + self.index}"

    @property
    def host_uuid(self) -> str:
        """Explicit and distinct per host (migration refuses equal host UUIDs)."""
        return str(uuid.uuid5(_UUID_NAMESPACE, self.name))

    @property
    def uri(self) -> str:
        if self.transport == "ssh":
            return f"qemu+ssh://root@{self.lan_ip}/system"
        return f"qemu+tls://{self.lan_ip}/system"

    @property
    def port(self) -> int:
        return SSH_PORT if self.transport == "ssh" else TLS_PORT


class HostDirs:
    """The state directory of one host (see the module docstring for the mounts)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.etc = root / "etc"
        self.run = root / "run"
        self.lib = root / "lib"
        self.cache = root / "cache"
        self.log = root / "log"
        self.ssh = root / "ssh"
        self.holder_pid = root / "holder.pid"
        self.holder_log = root / "holder.log"

    def mounts(self) -> list[tuple[Path, str]]:
        return [
            (self.etc, "/etc/libvirt"),
            (self.run, "/run/libvirt"),
            (self.lib, "/var/lib/libvirt"),
            (self.cache, "/var/cache/libvirt"),
            (self.log, "/var/log/libvirt"),
        ]

    def pid_file(self, daemon: str) -> Path:
        """Where `daemon` writes its pid, seen from the root namespace."""
        if daemon == "sshd":
            return self.ssh / "sshd.pid"
        return self.run / f"{daemon}.pid"

    def log_file(self, daemon: str) -> Path:
        if daemon == "sshd":
            return self.ssh / "sshd.log"
        return self.log / f"{daemon}.log"

    def create(self) -> None:
        for path in (self.etc / "pki", self.run, self.lib / "qemu", self.lib / "images"):
            path.mkdir(parents=True, exist_ok=True)
        for path in (self.lib / "dnsmasq", self.cache, self.log / "qemu", self.ssh):
            path.mkdir(parents=True, exist_ok=True)
        self.ssh.chmod(0o700)


# --- configuration -----------------------------------------------------------------------------


def _conf(path: Path, settings: dict[str, str | int]) -> None:
    lines = ["# Written by capl.testbed.multihost for one host of the multi-host bed."]
    for key, value in settings.items():
        lines.append(f"{key} = {value}" if isinstance(value, int) else f'{key} = "{value}"')
    write_file(path, ("\n".join(lines) + "\n").encode(), mode=0o644)


def write_libvirt_config(plan: HostPlan, dirs: HostDirs) -> None:
    """libvirtd.conf, virtlogd.conf and qemu.conf of the host (paths as seen inside it)."""
    libvirtd: dict[str, str | int] = {
        "host_uuid": plan.host_uuid,
        "log_outputs": "3:file:/var/log/libvirt/libvirtd.log",
        "listen_tcp": 0,
        "listen_tls": 1 if plan.transport == "tls" else 0,
    }
    if plan.transport == "tls":
        libvirtd |= {
            "listen_addr": plan.lan_ip,
            "auth_tls": "none",
            "tls_no_verify_certificate": 0,
            "ca_file": "/etc/libvirt/pki/cacert.pem",
            "cert_file": "/etc/libvirt/pki/servercert.pem",
            "key_file": "/etc/libvirt/pki/serverkey.pem",
        }
    _conf(dirs.etc / "libvirtd.conf", libvirtd)
    _conf(dirs.etc / "virtlogd.conf", {"log_outputs": "3:file:/var/log/libvirt/virtlogd.log"})
    _conf(
        dirs.etc / "qemu.conf",
        {
            "user": "root",
            "group": "root",
            "dynamic_ownership": 0,
            "security_driver": "none",
            "migration_address": plan.lan_ip,
            "migration_host": plan.lan_ip,
        },
    )


def write_server_pki(dirs: HostDirs, *, ca_pem: bytes, cert_pem: bytes, key_pem: bytes) -> None:
    write_file(dirs.etc / "pki" / "cacert.pem", ca_pem, mode=0o644)
    write_file(dirs.etc / "pki" / "servercert.pem", cert_pem, mode=0o644)
    write_file(dirs.etc / "pki" / "serverkey.pem", key_pem, mode=0o600)


def write_sshd_config(plan: HostPlan, dirs: HostDirs, *, authorized_key: str) -> str:
    """sshd_config, a fresh host key and authorized_keys; the host key's known_hosts line."""
    host_key = dirs.ssh / "host_key"
    for path in (host_key, host_key.with_suffix(".pub")):
        path.unlink(missing_ok=True)
    run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", plan.name, "-f", str(host_key)])
    write_file(dirs.ssh / "authorized_keys", (authorized_key + "\n").encode(), mode=0o600)
    config = sshd_config(
        listen=f"{plan.lan_ip}:{SSH_PORT}",
        host_key=host_key,
        authorized_keys=dirs.ssh / "authorized_keys",
        pid_file=dirs.pid_file("sshd"),
    )
    write_file(dirs.ssh / "sshd_config", config, mode=0o600)
    public = " ".join(host_key.with_suffix(".pub").read_text().split()[:2])
    return f"{plan.lan_ip} {public}"


# --- the holder and the daemons ----------------------------------------------------------------


def holder_script(dirs: HostDirs, shared: Path, hostname: str) -> str:
    q = shlex.quote
    lines = ["set -e", f"hostname {q(hostname)}"]
    lines += [f"mount --bind {q(str(src))} {q(dst)}" for src, dst in dirs.mounts()]
    lines += [
        "mount -t tmpfs -o mode=0755 capl-srv /srv",
        f"mkdir -p {SHARED_MOUNT}",
        f"mount --bind {q(str(shared))} {SHARED_MOUNT}",
        f"echo $$ >{q(str(dirs.holder_pid))}.tmp",
        f"mv {q(str(dirs.holder_pid))}.tmp {q(str(dirs.holder_pid))}",
        "exec sleep infinity",
    ]
    return "\n".join(lines)


def start_holder(plan: HostPlan, dirs: HostDirs, *, shared: Path) -> int:
    """The process that owns the host's mount namespace (inside its netns); its PID."""
    dirs.holder_pid.unlink(missing_ok=True)
    argv = ["setsid", "--fork", "ip", "netns", "exec", plan.netns]
    argv += ["unshare", "--mount", "--uts", "--propagation", "private"]
    argv += ["sh", "-c", holder_script(dirs, shared, plan.name)]
    with dirs.holder_log.open("ab") as log:
        subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=_ENV,
            check=False,
        )
    pid = wait_until(
        lambda: read_pid(dirs.holder_pid),
        within=10.0,
        what=f"{plan.name}: the mount-namespace holder wrote its pid",
        logs=[dirs.holder_log],
    )
    return pid


def in_host(holder: int, argv: list[str]) -> list[str]:
    """`argv` run in the host's mount and network namespaces."""
    return ["nsenter", f"--target={holder}", "--mount", "--uts", "--net", "--", *argv]


def wait_until(
    probe: Callable[[], T | None],
    *,
    within: float,
    what: str,
    logs: list[Path],
    alive: Callable[[], bool] | None = None,
) -> T:
    """Poll `probe` until it returns a value; BedError with the tails of `logs` when
    `alive` says the process died, or at the deadline."""
    deadline = time.monotonic() + within
    while True:
        value = probe()
        if value is not None and value is not False:
            return value
        dead = alive is not None and not alive()
        if dead or time.monotonic() > deadline:
            why = "the process exited" if dead else f"not within {within:g} s"
            raise BedError(f"{what}: {why}" + "".join(_log_tail(p) for p in logs))
        time.sleep(0.1)


def _log_tail(path: Path) -> str:
    text = tail(path, lines=25)
    return f"\n--- last lines of {path} ---\n{text}" if text else ""


def _daemon_pid(dirs: HostDirs, daemon: str, holder: int) -> int | None:
    """The daemon's PID when its pid file names a live process in the holder's namespaces."""
    pid = read_pid(dirs.pid_file(daemon))
    if pid is None or not pid_alive(pid) or comm(pid) != daemon:
        return None
    if ns_inode(pid, "mnt") != ns_inode(holder, "mnt"):
        return None
    return pid


def _start_daemon(dirs: HostDirs, daemon: str, holder: int, argv: list[str]) -> int:
    who = f"{dirs.root.name}: {daemon}"
    dirs.pid_file(daemon).unlink(missing_ok=True)
    done = subprocess.run(
        in_host(holder, argv), capture_output=True, text=True, env=_ENV, check=False, timeout=60
    )
    if done.returncode != 0:
        raise BedError(
            f"{who} did not start ({done.returncode}): {(done.stderr or done.stdout).strip()}"
            + _log_tail(dirs.log_file(daemon))
        )
    return wait_until(
        lambda: _daemon_pid(dirs, daemon, holder),
        within=10.0,
        what=f"{who} wrote its pid file",
        logs=[dirs.log_file(daemon)],
    )


def _virsh_answers(holder: int) -> bool:
    argv = in_host(holder, ["virsh", "-q", "-c", "qemu:///system", "version"])
    done = subprocess.run(argv, capture_output=True, env=_ENV, check=False, timeout=30)
    return done.returncode == 0


def _port_open(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=1.0):
            return True
    except OSError:
        return False


def start_daemons(plan: HostPlan, dirs: HostDirs, holder: int) -> None:
    """virtlogd, libvirtd (and sshd): started, answering, listening on the LAN."""
    _start_daemon(dirs, "virtlogd", holder, ["virtlogd", "-d", "-p", f"{_NS_PID_DIR}/virtlogd.pid"])
    dirs.log_file("libvirtd").unlink(missing_ok=True)  # its tail shows this start only
    argv = ["libvirtd", "-d", "-p", f"{_NS_PID_DIR}/libvirtd.pid"]
    libvirtd = _start_daemon(
        dirs, "libvirtd", holder, argv + (["--listen"] if plan.transport == "tls" else [])
    )
    wait_until(
        lambda: _virsh_answers(holder),
        within=START_TIMEOUT,
        what=f"{plan.name}: libvirtd answers on qemu:///system",
        logs=[dirs.log_file("libvirtd")],
        alive=lambda: pid_alive(libvirtd),
    )
    if plan.transport == "ssh":
        sshd = _start_daemon(
            dirs,
            "sshd",
            holder,
            [SSHD, "-f", str(dirs.ssh / "sshd_config"), "-E", str(dirs.log_file("sshd"))],
        )
        alive: Callable[[], bool] = lambda: pid_alive(sshd)  # noqa: E731
    else:
        alive = lambda: pid_alive(libvirtd)  # noqa: E731
    wait_until(
        lambda: _port_open(plan.lan_ip, plan.port),
        within=START_TIMEOUT,
        what=f"{plan.name}: {plan.transport} listens on {plan.lan_ip}:{plan.port}",
        logs=[dirs.log_file("sshd" if plan.transport == "ssh" else "libvirtd")],
        alive=alive,
    )


DAEMONS: Final = ("sshd", "libvirtd", "virtlogd")


def host_problems(plan: HostPlan, dirs: HostDirs) -> list[str]:
    """What is wrong with a running host (empty: healthy)."""
    holder = read_pid(dirs.holder_pid)
    inode = netns_inode(plan.netns)
    if inode is None:
        return [f"{plan.name}: network namespace {plan.netns} is missing"]
    if holder is None or not pid_alive(holder) or ns_inode(holder, "net") != inode:
        return [f"{plan.name}: the mount-namespace holder is not running"]
    problems = []
    for daemon in DAEMONS:
        if daemon == "sshd" and plan.transport != "ssh":
            continue
        if _daemon_pid(dirs, daemon, holder) is None:
            problems.append(f"{plan.name}: {daemon} is not running")
    if not problems and not _virsh_answers(holder):
        problems.append(f"{plan.name}: libvirtd does not answer on qemu:///system")
    if not problems and not _port_open(plan.lan_ip, plan.port):
        problems.append(f"{plan.name}: nothing listens on {plan.lan_ip}:{plan.port}")
    return problems


def stop_host(plan: HostPlan, dirs: HostDirs) -> list[int]:
    """The daemons by their pid files first (libvirtd gets to save its state), then every
    other process of the host's namespace (QEMU, libvirt's dnsmasq, the holder); the PIDs
    stopped."""
    inode = netns_inode(plan.netns)
    if inode is None:
        return []
    daemons = []
    for daemon in DAEMONS:
        pid = read_pid(dirs.pid_file(daemon))
        if pid is not None and pid_alive(pid) and ns_inode(pid, "net") == inode:
            daemons.append(pid)
    stop_pids(daemons)
    rest = netns_pids(plan.netns)
    stop_pids(rest)
    return daemons + rest
