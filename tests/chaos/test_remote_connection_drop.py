"""Regression test: calls in flight on a remote libvirt connection whose link dies.

capl calls a libvirt host from up to 8 threads at once.
When the host's network link dies (tests/chaos/netns.py: a private libvirtd in a network
namespace, reached with TLS, its veth taken down), every call in flight must fail within
libvirt's keepalive window, and calls must work again once the link is back. The probe runs
capl's own adapter (`capl.virt.LibvirtHosts`) in a child process
(tests/chaos/connection_drop.py) with 4 concurrent `Host.info()` pollers, because what it
finds can kill the process; it runs twice at once, each against its own namespace: through
the test driver (`test+tls://<ip>/default`) and through the QEMU driver of the same kind of
private daemon (`qemu+tls://<ip>/session`), the transport every production TLS host uses.

Found by the host-unreachable chaos test (test_host_unreachable.py); both fixed in
capl.virt.connection (keepalive on every remote transport; a remote connection serves one
call at a time, from a small pool per host), and this test keeps them fixed. What it found:
1. capl.virt.connection enabled keepalive only for non-`test` drivers, also when the test
   driver is reached through a remote transport (`test+tls://`): calls on a dead link then
   hung until TCP gave up (minutes) and the host was never reported — the child reports
   `stuck_pollers` and fails;
2. with keepalive on (as for every `qemu+tls`/`qemu+ssh` host), libvirt 9.0's client wakes
   only one of the threads waiting on the connection when keepalive closes it: the others
   stay blocked, and when the link comes back the process dies with SIGSEGV inside
   `virConnectGetInfo` (exit status -11). With one connection per calling thread every call
   fails at the keepalive timeout and the process survives (checked with libvirt-python
   directly). So: never run two calls at once on one remote connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.chaos.bed import record
from tests.chaos.netns import NetnsLibvirtd, netns_libvirtd

pytestmark = [pytest.mark.libvirtd]

REPO = Path(__file__).resolve().parents[2]


def uri_of_test_driver(remote: NetnsLibvirtd) -> str:
    return remote.uri()


def uri_of_qemu_driver(remote: NetnsLibvirtd) -> str:
    return f"qemu+tls://{remote.ns_ip}:{remote.tls_port}/session"


URIS: dict[str, Callable[[NetnsLibvirtd], str]] = {
    "test": uri_of_test_driver,
    "qemu": uri_of_qemu_driver,
}


def write_credentials(remote: NetnsLibvirtd, workdir: Path) -> None:
    workdir.mkdir()
    for name, data in remote.credentials.items():
        (workdir / name).write_bytes(data)


async def probe(remote: NetnsLibvirtd, uri: str, workdir: Path) -> tuple[int | None, str]:
    await asyncio.to_thread(write_credentials, remote, workdir)
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.chaos.connection_drop",
        uri,
        str(workdir),
        remote.host_if,
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        out, _ = await asyncio.wait_for(child.communicate(), timeout=200)
    finally:
        if child.returncode is None:
            child.kill()
            await child.wait()
        remote.link_up()
    return child.returncode, out.decode(errors="replace")


def verdict(driver: str, code: int | None, text: str) -> str | None:
    last = text.strip().splitlines()[-1] if text.strip() else ""
    record(f"remote connection drop probe ({driver}+tls): exit {code}: {last[:240]}")
    if code == 0:
        return None
    if code == -11:
        return (
            f"{driver}+tls: the process died with SIGSEGV when the link came back (threads "
            f"left blocked on the connection keepalive closed):\n{text[-1500:]}"
        )
    return f"{driver}+tls: exit status {code}:\n{text[-1500:]}"


@pytest.mark.timeout(300)
async def test_calls_in_flight_fail_when_the_link_dies_and_work_after_it_returns(
    tmp_path: Path,
) -> None:
    with contextlib.ExitStack() as stack:
        remotes = {driver: stack.enter_context(netns_libvirtd()) for driver in URIS}
        results = await asyncio.gather(
            *(
                probe(remote, URIS[driver](remote), tmp_path / driver)
                for driver, remote in remotes.items()
            )
        )
    problems = [
        problem
        for driver, (code, text) in zip(remotes, results, strict=True)
        if (problem := verdict(driver, code, text)) is not None
    ]
    assert not problems, "\n\n".join(problems)
