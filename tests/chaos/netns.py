"""A libvirt host behind a network link the test can cut: a private libvirtd in a netns.

`netns_libvirtd()` (a context manager) builds:

- a network namespace ``capl-chaos-<hex>`` joined to the host by a veth pair: the host end
  ``cch<hex>`` gets ``10.a.b.1/30``, the namespace end ``ccn<hex>`` ``10.a.b.2/30`` (a /30
  that overlaps nothing on this machine); no forwarding, no default route: only this
  machine and that namespace talk over it;
- inside the namespace, an unprivileged libvirtd (``nobody``, session mode, private state
  and config directories: tests/fixtures/transports.py `private_libvirtd`, as for
  `tls_libvirtd`, with the same certificate helpers) listening with TLS (client
  certificates required) on ``10.a.b.2``; the manager reaches its test driver as
  ``test+tls://10.a.b.2:<port>/default`` with the Secret keys ``ca.crt``, ``tls.crt``,
  ``tls.key`` (`credentials`);
- the daemon's UNIX socket lives in its private directory on the shared filesystem, so this
  test reaches the same test driver as ``test+unix:///default?socket=...`` (`local_uri`)
  whatever happens to the link: a holder connection on it keeps the test driver's state
  alive while the manager's TLS connection is cut, and the inventory lists it directly.

`link_down()` / `link_up()` set the host end of the veth down/up: packets to the namespace
are dropped (established TCP connections hang until keepalive gives up; new ones fail at once
with "no route to host"), what a host that fell off the network looks like. An `unreachable`
route for the /30 (metric 4242, below the connected route while the link is up) makes sure
that nothing meant for the namespace leaves this machine by the default route meanwhile.
Everything is removed on exit: the daemon (by PID), the namespace, the veth, the route, the
files. A run that died too hard for that (SIGKILL, a segfault) leaves an owner file naming
its PID and what it made; the next run removes those whose process is gone (`sweep_stale`).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import libvirt

from capl.testbed.process import ManagedProcess
from tests.fixtures.common import require_part
from tests.fixtures.libvirt_direct import free_cidr, open_libvirt
from tests.fixtures.transports import (
    _daemon_identity,
    libvirt_ca,
    private_libvirtd,
    wait_for_port,
)

LIBVIRTD = Path("/usr/sbin/libvirtd")
START_TIMEOUT = 30.0


def _ip(*args: str) -> None:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {result.stderr.strip()}")


@dataclass
class NetnsLibvirtd:
    """See the module docstring."""

    netns: str
    host_if: str
    ns_if: str
    host_ip: str
    ns_ip: str
    tls_port: int
    workdir: Path
    credentials: dict[str, bytes] = field(repr=False)
    process: ManagedProcess = field(repr=False)
    holder: libvirt.virConnect | None = field(default=None, repr=False)

    def uri(self) -> str:
        """How the manager reaches the test driver: through the link."""
        return f"test+tls://{self.ns_ip}:{self.tls_port}/default"

    @property
    def socket_path(self) -> Path:
        return self.workdir / "run" / "libvirt-sock"

    def local_uri(self) -> str:
        """How this test reaches the same test driver without the link (UNIX socket)."""
        return f"test+unix:///default?socket={self.socket_path}"

    def link_down(self) -> None:
        _ip("link", "set", self.host_if, "down")

    def link_up(self) -> None:
        _ip("link", "set", self.host_if, "up")

    def log_tail(self) -> str:
        return self.process.log_tail()


_OWNER_FILE = "owner.json"
_WORKDIR_PREFIX = "capl-chaos-netns-"


def _remove(netns: str, host_if: str, net: str) -> None:
    for args in (
        ("link", "del", host_if),
        ("netns", "del", netns),
        ("route", "del", "unreachable", net, "metric", "4242"),
    ):
        with contextlib.suppress(RuntimeError):
            _ip(*args)


def sweep_stale() -> list[str]:
    """Remove what runs that died hard (SIGKILL, a segfault) left: namespaces, veths and
    routes recorded in the owner file of a work directory whose process is gone."""
    removed = []
    for owner in Path(tempfile.gettempdir()).glob(f"{_WORKDIR_PREFIX}*/{_OWNER_FILE}"):
        try:
            record = json.loads(owner.read_text())
            os.kill(int(record["pid"]), 0)
            continue  # its process lives: not stale
        except ProcessLookupError:
            pass
        except (OSError, ValueError, KeyError):
            continue
        _remove(record["netns"], record["host_if"], record["net"])
        shutil.rmtree(owner.parent, ignore_errors=True)
        owner.parent.with_name(owner.parent.name + ".log").unlink(missing_ok=True)
        removed.append(record["netns"])
    return removed


@contextlib.contextmanager
def netns_libvirtd() -> Iterator[NetnsLibvirtd]:
    if os.geteuid() != 0:
        require_part("root (network namespaces, veth pairs)", "run the chaos tests as root")
    if not LIBVIRTD.exists() or shutil.which("ip") is None:
        require_part("libvirtd and iproute2", "apt-get install libvirt-daemon iproute2")
    prefix, uid, gid = _daemon_identity()
    tag = secrets.token_hex(4)
    netns, host_if, ns_if = f"capl-chaos-{tag}", f"cch{tag}", f"ccn{tag}"
    net = ipaddress.IPv4Network(free_cidr(prefix=30))
    host_ip, ns_ip = str(net.network_address + 1), str(net.network_address + 2)
    sweep_stale()
    workdir = Path(tempfile.mkdtemp(prefix=_WORKDIR_PREFIX))
    (workdir / _OWNER_FILE).write_text(
        json.dumps({"pid": os.getpid(), "netns": netns, "host_if": host_if, "net": str(net)})
    )
    process: ManagedProcess | None = None
    made_ns = made_link = made_route = False
    bed: NetnsLibvirtd | None = None
    try:
        # a safety net first: with the link down, traffic for the /30 must fail here instead
        # of following the default route off this machine (the connected route, metric 0,
        # wins while the link is up)
        _ip("route", "add", "unreachable", str(net), "metric", "4242")
        made_route = True
        _ip("netns", "add", netns)
        made_ns = True
        _ip("link", "add", host_if, "type", "veth", "peer", "name", ns_if)
        made_link = True
        _ip("link", "set", ns_if, "netns", netns)
        _ip("addr", "add", f"{host_ip}/30", "dev", host_if)
        _ip("link", "set", host_if, "up")
        _ip("-n", netns, "addr", "add", f"{ns_ip}/30", "dev", ns_if)
        _ip("-n", netns, "link", "set", ns_if, "up")
        _ip("-n", netns, "link", "set", "lo", "up")

        ca = libvirt_ca("capl-chaos-netns-ca")
        server = ca.issue_serving(hosts=(ns_ip,))
        client = ca.issue_client(user="capl-chaos-client")
        port = 16514
        process = private_libvirtd(
            workdir,
            name="libvirtd (netns, TLS)",
            argv_prefix=["ip", "netns", "exec", netns, *prefix],
            owner=(uid, gid),
            pki=(ca.cert_pem, server.cert_pem, server.key_pem),
            settings=[
                f'listen_addr = "{ns_ip}"',
                f'tls_port = "{port}"',
                "listen_tcp = 0",
                'auth_unix_rw = "none"',
                'unix_sock_rw_perms = "0777"',
            ],
        )
        process.start()
        wait_for_port(port, host=ns_ip, process=process, timeout=START_TIMEOUT)
        bed = NetnsLibvirtd(
            netns=netns,
            host_if=host_if,
            ns_if=ns_if,
            host_ip=host_ip,
            ns_ip=ns_ip,
            tls_port=port,
            workdir=workdir,
            credentials={
                "ca.crt": ca.cert_pem,
                "tls.crt": client.cert_pem,
                "tls.key": client.key_pem,
            },
            process=process,
        )
        deadline = time.monotonic() + START_TIMEOUT
        while not bed.socket_path.exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"no UNIX socket {bed.socket_path}:\n{process.log_tail()}")
            time.sleep(0.05)
        bed.holder = open_libvirt(bed.local_uri())
        yield bed
    finally:
        if bed is not None and bed.holder is not None:
            with contextlib.suppress(libvirt.libvirtError):
                bed.holder.close()
        if process is not None:
            process.stop_sync(grace=5)
        workdir.with_name(workdir.name + ".log").unlink(missing_ok=True)
        if made_route or made_ns or made_link:
            _remove(netns, host_if, str(net))
        shutil.rmtree(workdir, ignore_errors=True)
