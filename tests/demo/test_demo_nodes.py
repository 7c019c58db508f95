"""`capl demo` in its default mode, as `make demo` runs it: real Kubernetes nodes.

In a pseudo-terminal: wait for `2/2 Nodes Ready` (one worker bootstrapped with Ignition, one
with cloud-config, both by the kubeadm bootstrap provider, joined to the workload control
plane the demo runs on this machine), check that the live view had its NODE column, use the
`kubectl --kubeconfig <workdir>/workload.kubeconfig get nodes` line it printed (two Ready
nodes with capl's providerIDs, containerd 2), check with virsh that two domains of the demo
run, press Ctrl-C, and then ask libvirt and the process table that nothing of the demo is
left: no domain, network, pool or volume, no process it started (management side and
workload control plane, by PID), no QEMU of its domains.

The management-side machinery is the demo's own (its processes, not the bed of
tests/nodes/bed.py); what the two share is the node image.
"""

from __future__ import annotations

import json
import re
import secrets
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.controllers.test_demo_testdriver import alive, assert_nothing_left, demo_run
from tests.fixtures.libvirt import record_timing
from tests.libvirtd.test_demo_real import processes_mentioning, virsh, volumes_everywhere

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.apiserver,
    pytest.mark.libvirtd,
    pytest.mark.guest,
    pytest.mark.timeout(2400),
]

READY_DEADLINE = 1500.0
"""Set-up plus two TCG guests of the node image booting and joining side by side on a
shared 2-core machine (idle: about 3 minutes; under another suite's guests: many more)."""
GET_NODES = re.compile(r"^\s+(\S+) --kubeconfig (\S+/workload\.kubeconfig) get nodes$", re.M)


def all_pids(text: str) -> dict[str, int]:
    """Every `processes:` line the demo printed (management side, workload control plane)."""
    found: dict[str, int] = {}
    for line in re.findall(r"^processes: (.*)$", text, re.M):
        found.update({n: int(p) for n, p in re.findall(r"([\w-]+) pid (\d+)", line)})
    return found


def test_two_real_nodes_join_and_ctrl_c_leaves_nothing(libvirtd_uri: str, node_image: Path) -> None:
    name = f"demo-{secrets.token_hex(2)}"
    domain_prefix = f"capl-default-{name}-"
    network = pool = f"capl-default.{name}"
    args = ["--libvirt-uri", libvirtd_uri, "--node-image", str(node_image), "--name", name]
    t0 = time.monotonic()
    with demo_run(args, tty=True) as run:
        workdir = run.workdir()
        pids = run.started_pids()
        assert "kubeadm-bootstrap-manager" in pids, pids
        run.wait_for(r"^processes: workload-etcd pid \d+", within=600)
        run.wait_for(r"^2/2 Nodes Ready$", within=READY_DEADLINE)
        record_timing("capl demo: start to 2/2 Nodes Ready (2 TCG nodes)", time.monotonic() - t0)
        pids = all_pids(run.text)
        assert {"workload-etcd", "workload-kube-apiserver"} <= set(pids), pids
        assert "NODE" in run.text  # the live view's column

        get_nodes = run.wait_for(GET_NODES.pattern, within=30)
        kubectl, kubeconfig = get_nodes.group(1), Path(get_nodes.group(2))
        assert kubeconfig == workdir / "workload.kubeconfig"
        out = subprocess.run(
            [kubectl, "--kubeconfig", str(kubeconfig), "get", "nodes", "-o", "json"],
            capture_output=True, text=True, check=True, timeout=60,
        ).stdout  # fmt: skip
        nodes = json.loads(out)["items"]
        assert len(nodes) == 2, out[:2000]
        for node in nodes:
            ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
            assert ready[0]["status"] == "True", node["status"]["conditions"]
            assert node["spec"]["providerID"].startswith("libvirt:///")
            assert node["status"]["nodeInfo"]["containerRuntimeVersion"].startswith(
                "containerd://2."
            )
        names = sorted(n["metadata"]["name"] for n in nodes)
        assert names[0].startswith(f"{name}-md-cloud-config-"), names
        assert names[1].startswith(f"{name}-md-ignition-"), names

        running = [d for d in virsh(libvirtd_uri, "list", "--name") if d.startswith(domain_prefix)]
        assert len(running) == 2, virsh(libvirtd_uri, "list", "--all")
        assert network in virsh(libvirtd_uri, "net-list", "--name")
        run.wait_for(r"^Ctrl-C stops the demo", within=30)

        t1 = time.monotonic()
        run.signal(signal.SIGINT)
        assert run.wait(within=600) == 0
        record_timing("capl demo: Ctrl-C to exit (2 TCG nodes)", time.monotonic() - t1)

    assert len(run.lines("2/2 Nodes Ready")) == 1
    assert_nothing_left(run, workdir=workdir, pids=pids)
    assert not [n for n, pid in pids.items() if alive(pid)]
    assert not [d for d in virsh(libvirtd_uri, "list", "--all", "--name") if name in d]
    assert network not in virsh(libvirtd_uri, "net-list", "--all", "--name")
    assert pool not in virsh(libvirtd_uri, "pool-list", "--all", "--name")
    assert not [v for v in volumes_everywhere(libvirtd_uri) if name in v]
    assert not processes_mentioning(domain_prefix, f"/{network}.conf", str(workdir))
    assert "force-removed" not in run.text, "capl's own clean-up should have removed everything"
