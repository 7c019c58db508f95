"""`capl console` end to end: a real API server, the real libvirtd, a real TCG test guest.

The LibvirtCluster/LibvirtMachine objects are created by hand and point at a guest booted by
the `libvirt_bed` fixture (no manager runs). The CLI runs as a subprocess on a pseudo
terminal, driven like a user would: wait for the banner, press Enter, read the guest's shell
prompt, run a command whose answer can only come from the guest's shell, press Ctrl-] and
check that the command exits 0 and left the terminal settings as it found them.

The fallback path uses libvirtd's shared test driver (``test+unix:///default``), which cannot
open consoles: the CLI must say so and follow the domain's console log file instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pty
import secrets
import select
import subprocess
import sys
import termios
import time
import uuid as uuidlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import libvirt
import pytest
from kubernetes_asyncio import client

from tests.fixtures.libvirt import LibvirtBed, record_timing

pytestmark = [pytest.mark.libvirtd, pytest.mark.apiserver]

CAPL = str(Path(sys.executable).with_name("capl"))
GROUP, VERSION = "infrastructure.cluster.x-k8s.io", "v1alpha1"
ESCAPE = b"\x1d"
BOOT_TIMEOUT = 120


class Terminal:
    """`capl ...` on a pseudo terminal; the test holds the master side."""

    def __init__(self, *args: str) -> None:
        self.master, self.slave = pty.openpty()
        self.initial = termios.tcgetattr(self.slave)
        self.proc = subprocess.Popen(
            [CAPL, *args],
            stdin=self.slave,
            stdout=self.slave,
            stderr=self.slave,
            start_new_session=True,
            close_fds=True,
        )
        self.seen = b""

    def read_until(self, *expected: bytes, timeout: float = 30) -> bytes:
        """Read until one of `expected` has appeared (anywhere in the output so far)."""
        deadline = time.monotonic() + timeout
        while not any(e in self.seen for e in expected):
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {expected!r} on the terminal; got {self.seen[-600:]!r}")
            if self.proc.poll() is not None and not select.select([self.master], [], [], 0)[0]:
                raise AssertionError(
                    f"capl exited ({self.proc.returncode}) before {expected!r}: "
                    f"{self.seen[-600:]!r}"
                )
            ready, _, _ = select.select([self.master], [], [], min(left, 0.5))
            if ready:
                self.seen += os.read(self.master, 65536)
        return self.seen

    def send(self, data: bytes) -> None:
        os.write(self.master, data)

    def wait(self, *, timeout: float = 30) -> int:
        code = self.proc.wait(timeout=timeout)
        while select.select([self.master], [], [], 0)[0]:  # drain what it printed last
            try:
                chunk = os.read(self.master, 65536)
            except OSError:
                break
            if not chunk:
                break
            self.seen += chunk
        return code

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        os.close(self.master)
        os.close(self.slave)


@contextmanager
def terminal(*args: str) -> Iterator[Terminal]:
    term = Terminal(*args)
    try:
        yield term
    finally:
        term.close()


def console(
    machine: str, namespace: str, kubeconfig: Path, *extra: str
) -> contextlib.AbstractContextManager[Terminal]:
    """`capl console <machine> -n <namespace> --kubeconfig <file> [extra]` in a terminal."""
    return terminal("console", machine, "-n", namespace, "--kubeconfig", str(kubeconfig), *extra)


async def console_without_terminal(
    machine: str, namespace: str, kubeconfig: Path
) -> tuple[int | None, str]:
    """`capl console` with stdin not a terminal, for the ways it refuses: (status, stderr)."""
    proc = await asyncio.create_subprocess_exec(
        CAPL,
        "console",
        machine,
        "-n",
        namespace,
        "--kubeconfig",
        str(kubeconfig),
        stdin=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode, err.decode()


async def create_objects(
    api_client: client.ApiClient,
    namespace: str,
    *,
    uri: str,
    domain_uuid: str,
    machine: str,
    network: str = "default",
    host: str = "local",
    credentials: str | None = None,
) -> None:
    """A LibvirtCluster with one host (`host` at `uri`; `credentials`: the name of its
    credentials Secret) and a LibvirtMachine `machine` on it, pointing at `domain_uuid`."""
    objs = client.CustomObjectsApi(api_client)
    cluster = f"{machine}-cluster"
    host_ref: dict[str, Any] = {"name": host, "uri": uri}
    if credentials is not None:
        host_ref["credentialsRef"] = {"name": credentials}
    await objs.create_namespaced_custom_object(
        GROUP,
        VERSION,
        namespace,
        "libvirtclusters",
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "LibvirtCluster",
            "metadata": {"name": cluster, "labels": {"cluster.x-k8s.io/cluster-name": cluster}},
            "spec": {"hosts": [host_ref], "network": {"name": network}},
        },
    )
    await objs.create_namespaced_custom_object(
        GROUP,
        VERSION,
        namespace,
        "libvirtmachines",
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "LibvirtMachine",
            "metadata": {"name": machine, "labels": {"cluster.x-k8s.io/cluster-name": cluster}},
            "spec": {
                "image": {"volume": "base.qcow2"},
                "hostName": host,
                "domainUUID": domain_uuid,
                "providerID": f"libvirt:///{domain_uuid}",
            },
        },
    )


def _interactive_session(namespace: str, kubeconfig: Path, guest_uuid: str) -> dict[str, Any]:
    timings: dict[str, Any] = {}
    with console("vm-0", namespace, kubeconfig) as term:
        t0 = time.monotonic()
        banner = (
            f"Connected to {namespace}/vm-0 (domain {guest_uuid} on local). Escape character is ^]"
        ).encode()
        term.read_until(banner)
        timings["banner"] = time.monotonic() - t0
        # the terminal is in raw mode while the session runs
        assert not termios.tcgetattr(term.slave)[3] & termios.ECHO
        term.send(b"\r")
        term.read_until(b":/# ")  # the guest's shell prompt (PS1='\h:\w\$ ')
        term.send(b"echo CAPL-CONSOLE-$((6*7))\r")
        term.read_until(b"CAPL-CONSOLE-42")  # computed by the guest's shell
        t1 = time.monotonic()
        term.send(ESCAPE)
        code = term.wait()
        timings["exit"] = time.monotonic() - t1
        assert code == 0, term.seen[-600:]
        assert termios.tcgetattr(term.slave) == term.initial, "terminal settings not restored"
        assert b"Traceback" not in term.seen
    return timings


async def test_console_reaches_the_guest_shell_and_leaves_with_ctrl_bracket(
    libvirt_bed: LibvirtBed,
    guest_image: Path,
    api_client: client.ApiClient,
    namespace: str,
    kubeconfig: Path,
) -> None:
    guest = libvirt_bed.boot_guest(guest_image)
    await asyncio.to_thread(guest.wait_for_marker, "ready", timeout=BOOT_TIMEOUT)
    await create_objects(
        api_client,
        namespace,
        uri="qemu:///system",
        domain_uuid=guest.uuid,
        machine="vm-0",
        network=libvirt_bed.name,
    )
    timings = await asyncio.to_thread(_interactive_session, namespace, kubeconfig, guest.uuid)
    record_timing("capl console: start to banner", timings["banner"])
    record_timing("capl console: Ctrl-] to exit", timings["exit"])

    # the console is free again: a second session works (the stream was released)
    def second() -> bytes:
        with console("vm-0", namespace, kubeconfig) as t:
            t.read_until(b"Escape character is ^]")
            t.send(b"\r")
            t.read_until(b":/# ")
            t.send(b"x" + ESCAPE + b"ignored")  # bytes before ^] go to the guest, after do not
            assert t.wait() == 0
            return t.seen

    await asyncio.to_thread(second)

    # another client holds the console: refused with a hint, taken over with --force
    holder = libvirt_bed.conn.newStream(libvirt.VIR_STREAM_NONBLOCK)
    guest.domain.openConsole(None, holder, 0)
    try:
        code, err = await console_without_terminal("vm-0", namespace, kubeconfig)
        assert code == 1
        assert "is in use by another client" in err
        assert "--force" in err

        def forced() -> None:
            with console("vm-0", namespace, kubeconfig, "--force") as t:
                t.read_until(b"Escape character is ^]")
                t.send(b"\r")
                t.read_until(b":/# ")
                t.send(ESCAPE)
                assert t.wait() == 0

        await asyncio.to_thread(forced)
    finally:
        with contextlib.suppress(libvirt.libvirtError):
            holder.abort()

    # --log follows the console log file (this host is local): the boot markers are in it
    def follow() -> None:
        with console("vm-0", namespace, kubeconfig, "--log") as t:
            t.read_until(b"following the console log")
            t.read_until(b"CAPL-GUEST: ready")
            t.send(ESCAPE)
            assert t.wait() == 0
            assert termios.tcgetattr(t.slave) == t.initial

    await asyncio.to_thread(follow)


async def test_console_reports_the_end_when_the_domain_stops(
    libvirt_bed: LibvirtBed,
    guest_image: Path,
    api_client: client.ApiClient,
    namespace: str,
    kubeconfig: Path,
) -> None:
    guest = libvirt_bed.boot_guest(guest_image)
    await create_objects(
        api_client,
        namespace,
        uri="qemu:///system",
        domain_uuid=guest.uuid,
        machine="vm-1",
        network=libvirt_bed.name,
    )

    def session() -> None:
        with console("vm-1", namespace, kubeconfig) as t:
            t.read_until(b"Escape character is ^]")
            t.send(b"\r")  # live output arrives: boot markers, or the prompt if already up
            t.read_until(b"CAPL-GUEST: ", b":/# ", timeout=BOOT_TIMEOUT)
            guest.domain.destroy()
            assert t.wait() == 0
            assert b"the console closed" in t.seen
            assert termios.tcgetattr(t.slave) == t.initial

    await asyncio.to_thread(session)

    # a stopped domain: a clear one-line error, no console
    code, err = await console_without_terminal("vm-1", namespace, kubeconfig)
    assert code == 1
    assert err.strip().endswith("is not running (state shutoff); --log shows its console log")


@pytest.fixture
def test_driver_domain(shared_test_driver: str, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A running domain on libvirtd's shared test driver whose serial port logs to a file."""
    conn = libvirt.open(shared_test_driver)
    uuid = str(uuidlib.uuid4())
    log = tmp_path / "console.log"
    log.write_bytes(b"line before the session\r\n")
    xml = f"""<domain type='test'>
      <name>capl-test-console-{secrets.token_hex(4)}</name><uuid>{uuid}</uuid>
      <memory unit='MiB'>64</memory><os><type>hvm</type></os>
      <devices>
        <serial type='pty'><log file='{log}'/><target port='0'/></serial>
        <console type='pty'><target type='serial' port='0'/></console>
      </devices></domain>"""
    domain = conn.defineXML(xml)
    domain.create()
    try:
        yield uuid, log
    finally:
        if domain.isActive():
            domain.destroy()
        domain.undefine()
        conn.close()


async def test_console_falls_back_to_the_log_on_the_test_driver(
    test_driver_domain: tuple[str, Path],
    shared_test_driver: str,
    api_client: client.ApiClient,
    namespace: str,
    kubeconfig: Path,
) -> None:
    uuid, log = test_driver_domain
    await create_objects(
        api_client, namespace, uri=shared_test_driver, domain_uuid=uuid, machine="td-0"
    )

    def session() -> None:
        with console("td-0", namespace, kubeconfig) as t:
            t.read_until(
                f"capl: the test driver of {shared_test_driver} cannot open consoles: "
                f"following the console log {log} of {namespace}/td-0".encode()
            )
            t.read_until(b"line before the session")
            with log.open("ab") as handle:
                handle.write(b"CAPL-GUEST: written while following\r\n")
            t.read_until(b"CAPL-GUEST: written while following")
            log.write_bytes(b"after truncation\r\n")  # a restarted domain truncates its log
            t.read_until(b"after truncation")
            t.send(ESCAPE)
            assert t.wait() == 0
            assert termios.tcgetattr(t.slave) == t.initial

    await asyncio.to_thread(session)


async def test_console_domain_missing_on_the_host_exits_3(
    shared_test_driver: str, api_client: client.ApiClient, namespace: str, kubeconfig: Path
) -> None:
    missing = str(uuidlib.uuid4())
    await create_objects(
        api_client, namespace, uri=shared_test_driver, domain_uuid=missing, machine="gone-0"
    )
    code, err = await console_without_terminal("gone-0", namespace, kubeconfig)
    assert code == 3
    assert err.strip() == (
        f"capl: error: the domain {missing} of LibvirtMachine {namespace}/gone-0 does not "
        f"exist on host local ({shared_test_driver})"
    )
