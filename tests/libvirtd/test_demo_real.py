"""`capl demo --vm-only` with the real libvirtd and three real TCG guests of the test image.

(The default mode, real Kubernetes nodes of the node image, is tests/demo/test_demo_nodes.py:
it needs the node image and takes minutes, so it is a stage of its own, `make demo-e2e`.)

In a pseudo-terminal: wait for `3/3 machines Ready`, check with virsh that three capl
domains run on the demo's network (so the view is not lying), press Ctrl-C, and then ask
libvirt directly — `virsh list --all`, `virsh net-list --all`, `virsh pool-list --all` and
`virsh vol-list` of every pool — that nothing of the demo is left, and the process table
that no process it started (by PID), no QEMU of its domains and no dnsmasq of its network
survived.
"""

from __future__ import annotations

import ipaddress
import re
import secrets
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.controllers.test_demo_testdriver import alive, assert_nothing_left, demo_run
from tests.fixtures.libvirt import record_timing

pytestmark = [pytest.mark.apiserver, pytest.mark.libvirtd, pytest.mark.guest]

READY_DEADLINE = 480.0
"""Set-up plus three TCG guests booting side by side on a shared 2-core machine."""


def virsh(uri: str, *args: str) -> list[str]:
    out = subprocess.run(
        ["virsh", "-c", uri, *args], capture_output=True, text=True, check=False, timeout=60
    )
    if out.returncode != 0:
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.strip()]


def volumes_everywhere(uri: str) -> list[str]:
    found = []
    for pool in virsh(uri, "pool-list", "--all", "--name"):
        for line in virsh(uri, "vol-list", pool)[2:]:  # skip the header and the rule
            found.append(f"{pool}/{line.split()[0]}")
    return found


def processes_mentioning(*needles: str) -> list[str]:
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if any(n in cmdline for n in needles) and alive(int(proc.name)):
            found.append(f"{proc.name}: {cmdline[:200]}")
    return found


@pytest.mark.timeout(900)
def test_three_real_vms_become_ready_and_ctrl_c_leaves_nothing(
    libvirtd_uri: str, guest_image: Path
) -> None:
    name = f"demo-{secrets.token_hex(2)}"
    domain_prefix = f"capl-default-{name}-"
    network = pool = f"capl-default.{name}"
    args = ["--vm-only", "--libvirt-uri", libvirtd_uri, "--image", str(guest_image)]
    args += ["--name", name]
    t0 = time.monotonic()
    with demo_run(args, tty=True) as run:
        workdir = run.workdir()
        pids = run.started_pids()
        run.wait_for(r"^3/3 machines Ready$", within=READY_DEADLINE)
        record_timing(
            "capl demo: start to 3/3 machines Ready (3 TCG guests)", time.monotonic() - t0
        )

        running = [d for d in virsh(libvirtd_uri, "list", "--name") if d.startswith(domain_prefix)]
        assert len(running) == 3, virsh(libvirtd_uri, "list", "--all")
        assert network in virsh(libvirtd_uri, "net-list", "--name")
        cidr = ipaddress.IPv4Network(
            run.wait_for(r"isolated network ([0-9./]+)", within=5).group(1)
        )
        addresses = {
            ip
            for ip in re.findall(r"\b(\d+\.\d+\.\d+\.\d+)\b", run.text)
            if ipaddress.IPv4Address(ip) in cidr
        }
        assert len(addresses) >= 3, run.text[-4000:]
        assert processes_mentioning(domain_prefix), "no QEMU process for the demo's domains"

        t1 = time.monotonic()
        run.signal(signal.SIGINT)
        assert run.wait(within=300) == 0
        record_timing("capl demo: Ctrl-C to exit (3 TCG guests)", time.monotonic() - t1)

    assert len(run.lines("3/3 machines Ready")) == 1
    assert_nothing_left(run, workdir=workdir, pids=pids)
    assert not [d for d in virsh(libvirtd_uri, "list", "--all", "--name") if name in d]
    assert network not in virsh(libvirtd_uri, "net-list", "--all", "--name")
    assert pool not in virsh(libvirtd_uri, "pool-list", "--all", "--name")
    assert not [v for v in volumes_everywhere(libvirtd_uri) if name in v]
    assert not processes_mentioning(domain_prefix, f"/{network}.conf", str(workdir))
    assert "force-removed" not in run.text, "capl's own clean-up should have removed everything"


@pytest.mark.timeout(900)
def test_a_killed_demo_is_cleaned_up_by_the_next_one(libvirtd_uri: str, guest_image: Path) -> None:
    name = f"killed-{secrets.token_hex(2)}"
    network = f"capl-default.{name}"
    args = ["--vm-only", "--libvirt-uri", libvirtd_uri, "--image", str(guest_image)]
    args += ["--name", name]
    with demo_run([*args, "--machines", "1"], tty=False) as run:
        workdir = run.workdir()
        pids = run.started_pids()
        run.wait_for(r"^1/1 machines Ready$", within=READY_DEADLINE)
        run.signal(signal.SIGKILL)  # no chance to clean up
        assert run.wait(within=60) == -signal.SIGKILL
    # its children died with it (the kernel's PR_SET_PDEATHSIG SIGKILL reaches them just
    # after it died); what it made on the host and its work directory did not
    deadline = time.monotonic() + 15
    while [p for p in pids.values() if alive(p)] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not {n: p for n, p in pids.items() if alive(p)}
    assert [d for d in virsh(libvirtd_uri, "list", "--all", "--name") if name in d]
    assert network in virsh(libvirtd_uri, "net-list", "--all", "--name")
    assert (workdir / "demo.json").is_file()

    with demo_run(["--libvirt-uri", "test:///default", "--exit-when-ready"], tty=False) as next_:
        assert next_.wait(within=300) == 0
    assert f"removed what an earlier, killed demo left on {libvirtd_uri} (cluster {name})" in (
        next_.text
    )
    assert not [d for d in virsh(libvirtd_uri, "list", "--all", "--name") if name in d]
    assert network not in virsh(libvirtd_uri, "net-list", "--all", "--name")
    assert network not in virsh(libvirtd_uri, "pool-list", "--all", "--name")
    assert not [v for v in volumes_everywhere(libvirtd_uri) if name in v]
    assert not workdir.exists()
