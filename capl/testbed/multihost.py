"""A bed of three real libvirt/KVM hosts on one machine: `python -m capl.testbed.multihost
start|stop|status` (``hack/multihost.sh``, ``make multihost-bed``).

Each host is a libvirtd + virtlogd of its own, in privileged (system) mode, in a network
namespace and a mount namespace of its own (`capl.testbed.multihost_host`: the bind mounts
over /etc/libvirt, /run/libvirt, /var/lib/libvirt, /var/cache/libvirt, /var/log/libvirt, an
explicit distinct ``host_uuid``). The machine's own libvirtd (qemu:///system in the root
namespace, hack/libvirt-host.sh) is never touched: nothing here reads or writes the root
namespace's /etc/libvirt or signals a process that is not in one of the bed's namespaces.

The LAN (`capl.testbed.multihost_net`): bridge ``capllan0`` in the root namespace with
10.231.0.1/24, one veth per host; in each host namespace the veth end is a port of bridge
``br-lan``, which carries the host's address (10.231.0.11, .12, .13), so guests attached in
bridge mode to ``br-lan`` on any host share one L2. A DHCP-only dnsmasq on ``capllan0``
(range .100-.200, no router, no DNS) plays the site's DHCP server.

Transports: kvm1 and kvm2 listen on ``qemu+tls://<lan ip>/system`` (server certificates with
the LAN address as SAN, client certificates required, one CA from `capl.testbed.certs`);
kvm3 on ``qemu+ssh://root@<lan ip>/system`` (an sshd inside kvm3's namespaces, generated host
and client keys). The client side — what a credentials Secret of capl holds: ``ca.crt``,
``tls.crt``, ``tls.key``; ``ssh-privatekey``, ``known_hosts`` — is in ``<state>/client``
and in `MultihostBed.hosts[i].credentials`.

Migration-ready: each qemu.conf has ``migration_address``/``migration_host`` = the LAN
address; ``<state>/shared`` is mounted at /srv/capl-shared in every host namespace.

State lives in ``/var/lib/capl-multihost`` (``CAPL_MULTIHOST_DIR``); ``bed.json`` there is
written last and describes a complete bed. `start` on a healthy bed says so and changes
nothing; a partial or unhealthy one is stopped first. `stop` stops the daemons by their pid
files, then every other process in the bed's network namespaces (QEMU, libvirt's dnsmasq,
the holders), deletes the namespaces (their veths go with them), the LAN bridge, the LAN's
dnsmasq (by its pid file) and the state directory: nothing is left. A start that fails
stops what it made and raises `BedError` with the tail of the failing daemon's log.

Sharing (one bed per machine, fixed names; `capl.testbed.multihost_lock`): ``<state>/owner``
says who asked for the bed, ``hand`` (``make multihost-bed``, also when it asks for a bed that
runs already) or ``tests`` (a test session). A test session goes through `use`: under the admin
lock it starts the bed unless a healthy one runs, then holds the users lock shared until
`BedUse.release`, which stops the bed only when ``owner`` is ``tests`` and no other session
uses it — so a session never loses the bed to another one's teardown, and the last test
session out leaves nothing. Nor is a bed rebuilt while another session uses it: unhealthy
then (a test took a host's link down), `use` waits for it to be healthy again.
``hack/multihost.sh stop`` refuses while a session uses the bed (``--force`` stops it
anyway); `start` and `stop` themselves do not lock.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import pwd
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

from capl.testbed.certs import CertificateAuthority, write_file
from capl.testbed.multihost_host import (
    SHARED_MOUNT,
    HostDirs,
    HostPlan,
    host_problems,
    in_host,
    start_daemons,
    start_holder,
    stop_host,
    write_libvirt_config,
    write_server_pki,
    write_sshd_config,
)
from capl.testbed.multihost_lock import LOCK_WAIT, BedLocks
from capl.testbed.multihost_net import (
    BedError,
    Lan,
    dnsmasq_pid,
    link_exists,
    netns_exists,
    read_pid,
    run,
    start_dnsmasq,
    stop_pids,
)

__all__ = [
    "BedError",
    "BedHost",
    "BedUse",
    "MultihostBed",
    "load",
    "main",
    "owner",
    "start",
    "status",
    "stop",
    "use",
]

STATE_ENV: Final = "CAPL_MULTIHOST_DIR"
DEFAULT_STATE: Final = Path("/var/lib/capl-multihost")
LAN_BRIDGE: Final = "capllan0"
LAN_PREFIX: Final = "10.231.0"
LAN_PREFIX_LEN: Final = 24
GATEWAY: Final = f"{LAN_PREFIX}.1"
DHCP_RANGE: Final = (f"{LAN_PREFIX}.100", f"{LAN_PREFIX}.200")
HOST_BRIDGE: Final = "br-lan"
MARKER: Final = ".capl-multihost"
OWNER_FILE: Final = "owner"
BY_HAND: Final = "hand"
BY_TESTS: Final = "tests"
_USE_POLL: Final = 1.0
HOSTS: Final = (
    HostPlan(name="kvm1", index=1, transport="tls", lan_prefix=LAN_PREFIX),
    HostPlan(name="kvm2", index=2, transport="tls", lan_prefix=LAN_PREFIX),
    HostPlan(name="kvm3", index=3, transport="ssh", lan_prefix=LAN_PREFIX),
)
_MOUNTPOINTS: Final = ("/run/libvirt", "/var/lib/libvirt", "/var/cache/libvirt", "/var/log/libvirt")
_COMMANDS: Final = (
    "ip", "nsenter", "unshare", "setsid", "libvirtd", "virtlogd", "virsh", "dnsmasq",
    "sshd", "ssh-keygen", "qemu-system-x86_64",
)  # fmt: skip
_TLS_KEYS: Final = ("ca.crt", "tls.crt", "tls.key")
_SSH_KEYS: Final = ("ssh-privatekey", "known_hosts")


@dataclass(frozen=True, kw_only=True)
class BedHost:
    """One host as capl sees it: the URI for a LibvirtCluster, the Secret's data."""

    name: str
    uri: str
    lan_ip: str
    netns: str
    transport: str
    host_uuid: str
    credentials: dict[str, bytes] = field(repr=False, compare=False)
    local_uri: str = ""
    """The host's own UNIX socket, reachable by path from the root namespace: for a test's
    direct look at the host (no credentials involved)."""


@dataclass(frozen=True, kw_only=True)
class MultihostBed:
    root: Path
    hosts: tuple[BedHost, ...]
    lan_bridge: str = LAN_BRIDGE
    gateway: str = GATEWAY
    prefix_len: int = LAN_PREFIX_LEN
    dhcp_range: tuple[str, str] = DHCP_RANGE
    host_bridge: str = HOST_BRIDGE
    shared_mount: str = SHARED_MOUNT

    def host(self, name: str) -> BedHost:
        return next(h for h in self.hosts if h.name == name)

    @property
    def shared_dir(self) -> Path:
        return self.root / "shared"

    def in_host(self, name: str, argv: Sequence[str]) -> list[str]:
        """`argv` run in host `name`'s namespaces (e.g. ``virsh -c qemu:///system ...``)."""
        holder = read_pid(HostDirs(self.root / name).holder_pid)
        if holder is None:
            raise BedError(f"host {name} of the multi-host bed is not running")
        return in_host(holder, list(argv))

    def client_uri(self, name: str) -> str:
        """Host `name`'s URI with the bed's client certificate as libvirt's ``pkipath`` URI
        parameter (the ``client/pki`` files): what virsh or ``libvirt.open`` in the root
        namespace connect with, as capl does with its credentials Secret. TLS hosts only."""
        host = self.host(name)
        if host.transport != "tls":
            raise BedError(f"host {name} is reached over {host.transport}, not TLS")
        return f"{host.uri}?pkipath={self.root / 'client' / 'pki'}"

    def leases(self) -> str:
        """The LAN dnsmasq's lease file (one line per lease: expiry, MAC, IP, name, id)."""
        path = self.root / "lan" / "leases"
        return path.read_text() if path.exists() else ""


def state_root(root: Path | None = None) -> Path:
    return root or Path(os.environ.get(STATE_ENV) or DEFAULT_STATE)


# --- credentials -------------------------------------------------------------------------------


def _write_files(root: Path) -> None:
    """Every host's configuration; one CA: server certificates for the TLS hosts, a client
    certificate; ssh host and client keys."""
    client = root / "client"
    client.mkdir(parents=True, exist_ok=True)
    client.chmod(0o700)
    ca = CertificateAuthority(common_name="capl-multihost-ca", key_encipherment=True)
    pair = ca.issue_client(user="capl-multihost-client")
    for name, data in (
        ("ca.crt", ca.cert_pem),
        ("tls.crt", pair.cert_pem),
        ("tls.key", pair.key_pem),
    ):
        write_file(client / name, data, mode=0o600)
    # the same files as libvirt's pkipath wants them, for virsh from the root namespace
    for name, data in (
        ("cacert.pem", ca.cert_pem),
        ("clientcert.pem", pair.cert_pem),
        ("clientkey.pem", pair.key_pem),
    ):
        write_file(client / "pki" / name, data, mode=0o600)
    key = client / "ssh-privatekey"
    key.unlink(missing_ok=True)
    run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "capl-multihost", "-f", str(key)])
    public = " ".join(Path(f"{key}.pub").read_text().split()[:2])
    known = []
    for plan in HOSTS:
        dirs = HostDirs(root / plan.name)
        dirs.create()
        write_libvirt_config(plan, dirs)
        if plan.transport == "tls":
            server = ca.issue_serving(hosts=(plan.lan_ip,))
            write_server_pki(
                dirs, ca_pem=ca.cert_pem, cert_pem=server.cert_pem, key_pem=server.key_pem
            )
        else:
            known.append(write_sshd_config(plan, dirs, authorized_key=public))
    write_file(client / "known_hosts", "".join(f"{k}\n" for k in known).encode(), mode=0o600)


def _credentials(root: Path, transport: str) -> dict[str, bytes]:
    keys = _TLS_KEYS if transport == "tls" else _SSH_KEYS
    return {k: (root / "client" / k).read_bytes() for k in keys}


# --- the bed -----------------------------------------------------------------------------------


def _lan() -> Lan:
    return Lan(bridge=LAN_BRIDGE, gateway=GATEWAY, prefix=LAN_PREFIX_LEN, host_bridge=HOST_BRIDGE)


def _describe(root: Path) -> MultihostBed:
    hosts = tuple(
        BedHost(
            name=p.name,
            uri=p.uri,
            lan_ip=p.lan_ip,
            netns=p.netns,
            transport=p.transport,
            host_uuid=p.host_uuid,
            credentials=_credentials(root, p.transport),
            local_uri=f"qemu+unix:///system?socket={HostDirs(root / p.name).run}/libvirt-sock",
        )
        for p in HOSTS
    )
    return MultihostBed(root=root, hosts=hosts)


def load(root: Path | None = None) -> MultihostBed | None:
    """The bed described by ``bed.json`` (None: no complete bed was started)."""
    root = state_root(root)
    if not (root / "bed.json").exists():
        return None
    try:
        return _describe(root)
    except OSError:
        return None


def status(root: Path | None = None) -> tuple[MultihostBed | None, list[str]]:
    """The bed (None when none was started) and what is wrong with it (empty: healthy)."""
    root = state_root(root)
    bed = load(root)
    if bed is None:
        return None, []
    problems = []
    if not link_exists(LAN_BRIDGE):
        problems.append(f"the LAN bridge {LAN_BRIDGE} is missing")
    if dnsmasq_pid(root / "lan") is None:
        problems.append("the LAN's dnsmasq is not running")
    for plan in HOSTS:
        problems += host_problems(plan, HostDirs(root / plan.name))
    return bed, problems


def _leftovers(root: Path) -> bool:
    return (
        root.exists()
        or link_exists(LAN_BRIDGE)
        or any(netns_exists(p.netns) or link_exists(p.root_if) for p in HOSTS)
    )


def _preflight(root: Path) -> None:
    if os.geteuid() != 0:
        raise BedError("the multi-host bed needs root (network and mount namespaces)")
    missing = [
        c for c in _COMMANDS if shutil.which(c, path="/usr/sbin:/usr/bin:/sbin:/bin") is None
    ]
    if missing:
        raise BedError(f"missing commands: {' '.join(missing)} (make deps)")
    try:
        pwd.getpwnam("libvirt-qemu")
    except KeyError:
        raise BedError(
            "libvirtd's QEMU driver needs the user libvirt-qemu: run make libvirt-host"
        ) from None
    if not Path("/etc/libvirt").is_dir() or not Path("/srv").is_dir():
        raise BedError("/etc/libvirt and /srv must exist (mount points inside the host namespaces)")
    if root.resolve().is_relative_to(Path("/srv")):
        raise BedError(f"the state directory {root} must not be under /srv")
    for path in (*_MOUNTPOINTS, "/run/sshd"):
        Path(path).mkdir(parents=True, exist_ok=True)  # what hack/libvirt-host.sh creates too


def owner(root: Path | None = None) -> str | None:
    """Who asked for the running bed: ``hand`` or ``tests`` (None: no bed). A bed that
    says nothing (started before beds had owners) counts as started by hand."""
    root = state_root(root)
    try:
        return (root / OWNER_FILE).read_text().strip() or BY_HAND
    except OSError:
        return BY_HAND if (root / "bed.json").exists() else None


def _set_owner(root: Path, who: str) -> None:
    (root / OWNER_FILE).write_text(f"{who}\n")


def start(
    root: Path | None = None, *, say: Any = print, by: str | None = None
) -> tuple[MultihostBed, bool]:
    """Start the bed unless a healthy one runs: (the bed, whether this call started it).
    `by` (``hand`` or ``tests``) is recorded as its owner when it starts it; ``hand`` on a
    running bed makes it the owner too (a person asked for it: no test session stops it)."""
    root = state_root(root)
    bed, problems = status(root)
    if bed is not None and not problems:
        if by == BY_HAND:
            _set_owner(root, BY_HAND)
        say(f"multi-host bed already running and healthy ({root}): nothing to do")
        return bed, False
    _preflight(root)
    if _leftovers(root):
        say(
            "removing a partial or unhealthy multi-host bed first: "
            + ("; ".join(problems) or "leftovers")
        )
        stop(root, say=say)
    try:
        _build(root)
    except BaseException:
        stop(root, say=lambda _msg: None)
        raise
    _set_owner(root, by or BY_HAND)
    say(f"multi-host bed up ({root})")
    return _describe(root), True


@dataclass
class BedUse:
    """A test session's use of the bed (`use`), until `release`."""

    bed: MultihostBed
    started: bool
    """Whether this session started the bed."""
    locks: BedLocks = field(repr=False)
    root: Path

    def release(self, *, say: Any = print, within: float = LOCK_WAIT) -> bool:
        """Stop using the bed; stop it too when test sessions own it and no other session
        uses it. Whether this call stopped it (idempotent: False the second time)."""
        if not self.locks.joined:
            return False
        with self.locks.admin(within=within):
            self.locks.leave()
            who = owner(self.root)
            if who is None:
                say(f"the multi-host bed was stopped already ({self.root})")
                return False
            if who != BY_TESTS:
                say(f"multi-host bed left running: started by {who} ({self.root})")
                return False
            with self.locks.alone() as alone:
                if not alone:
                    say(f"multi-host bed left running: another session uses it ({self.root})")
                    return False
                stop(self.root, say=say)
                return True


def use(root: Path | None = None, *, say: Any = print, within: float = LOCK_WAIT) -> BedUse:
    """The bed for a test session: started unless a healthy one runs, held until
    `BedUse.release` (see the module docstring). A bed that is unhealthy while another
    session uses it is not rebuilt under that session (its tests may have taken a host's
    link down on purpose): this waits up to `within` seconds for it to be healthy again."""
    root = state_root(root)
    locks = BedLocks(root)
    deadline = time.monotonic() + within
    while True:
        with locks.admin(within=max(deadline - time.monotonic(), 0.0)):
            bed, problems = status(root)
            if bed is None or not problems:
                in_use = False
            else:
                with locks.alone() as alone:
                    in_use = not alone
            if not in_use:
                bed, started = start(root, say=say, by=BY_TESTS)
                locks.join()
                return BedUse(bed=bed, started=started, locks=locks, root=root)
        if time.monotonic() >= deadline:
            raise BedError(
                f"the multi-host bed is unhealthy ({'; '.join(problems)}) and another session "
                f"uses it: not rebuilt under it; waited {within:g} s"
            )
        time.sleep(_USE_POLL)  # the other session's tests may bring it back


def _build(root: Path) -> None:
    root.mkdir(parents=True, exist_ok=True)
    (root / MARKER).write_text("state of capl.testbed.multihost; `stop` removes it\n")
    (root / "shared").mkdir(exist_ok=True)
    _write_files(root)
    lan = _lan()
    lan.create_bridge()
    for plan in HOSTS:
        lan.attach(netns=plan.netns, root_if=plan.root_if, address=plan.lan_ip)
    start_dnsmasq(
        bridge=LAN_BRIDGE, dhcp_range=DHCP_RANGE, netmask="255.255.255.0", workdir=root / "lan"
    )
    # the hosts start side by side (each libvirtd probes QEMU for a few seconds)
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(HOSTS)) as pool:
        for job in [pool.submit(_start_host, plan, root) for plan in HOSTS]:
            job.result()
    description = {"hosts": [asdict(p) | {"uri": p.uri, "lan_ip": p.lan_ip} for p in HOSTS]}
    (root / "bed.json").write_text(json.dumps(description, indent=2) + "\n")


def _start_host(plan: HostPlan, root: Path) -> None:
    dirs = HostDirs(root / plan.name)
    holder = start_holder(plan, dirs, shared=root / "shared")
    start_daemons(plan, dirs, holder)


def stop(root: Path | None = None, *, say: Any = print) -> list[str]:
    """Remove the bed completely (see the module docstring); what it stopped or removed."""
    root = state_root(root)
    done: list[str] = []
    for plan in HOSTS:
        pids = stop_host(plan, HostDirs(root / plan.name))
        if pids:
            done.append(f"{plan.name}: stopped pids {' '.join(map(str, pids))}")
    names = [p.netns for p in HOSTS if netns_exists(p.netns)]
    _lan().remove(netns_names=names, root_ifs=[p.root_if for p in HOSTS])
    done += [f"deleted network namespace {n}" for n in names]
    pid = dnsmasq_pid(root / "lan")
    if pid is not None:
        stop_pids([pid])
        done.append(f"stopped the LAN's dnsmasq (pid {pid})")
    if root.exists() and ((root / MARKER).exists() or not any(root.iterdir())):
        shutil.rmtree(root)
        done.append(f"removed {root}")
    for line in done:
        say(line)
    return done


# --- the command -------------------------------------------------------------------------------


def _print_bed(bed: MultihostBed) -> None:
    for host in bed.hosts:
        print(f"  {host.name:5} {host.uri:38} netns {host.netns}  host_uuid {host.host_uuid}")
    print(
        f"  LAN {bed.lan_bridge} {bed.gateway}/{bed.prefix_len}, guests bridge to {bed.host_bridge}"
    )
    print(f"  credentials: {bed.root / 'client'}; shared directory {bed.shared_mount}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m capl.testbed.multihost", description=__doc__.split("\n")[0]
    )
    parser.add_argument("action", choices=("start", "stop", "status"))
    parser.add_argument(
        "--force",
        action="store_true",
        help="stop, or rebuild an unhealthy bed on start, even while a test session uses it",
    )
    parser.add_argument(
        "--state-dir", type=Path, default=None, help=f"default ${STATE_ENV} or {DEFAULT_STATE}"
    )
    args = parser.parse_args(argv)
    t0 = time.monotonic()
    try:
        root = state_root(args.state_dir)
        locks = BedLocks(root)
        if args.action == "start":
            with locks.admin():
                found, problems = status(root)
                if found is not None and problems and not args.force:
                    with locks.alone() as alone:
                        if not alone:
                            raise BedError(
                                f"the multi-host bed is unhealthy ({'; '.join(problems)}) and "
                                "a test session uses it: not rebuilt under it (start --force "
                                "rebuilds it anyway)"
                            )
                bed, _ = start(root, by=BY_HAND)
            _print_bed(bed)
        elif args.action == "stop":
            with locks.admin(), locks.alone() as alone:
                if not alone and not args.force:
                    raise BedError(
                        f"a test session uses the multi-host bed (it holds {locks.users_path} "
                        "shared): stop --force stops it anyway"
                    )
                if not stop(root):
                    print("no multi-host bed: nothing to do")
        else:
            found, problems = status(root)
            if found is None:
                print("no multi-host bed running")
                return 3
            for problem in problems:
                print(f"unhealthy: {problem}")
            if problems:
                return 1
            print(f"multi-host bed running and healthy (started by {owner(root)})")
            _print_bed(found)
    except BedError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"({args.action}: {time.monotonic() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
