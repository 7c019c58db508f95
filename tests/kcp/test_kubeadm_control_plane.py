"""A KubeadmControlPlane of one machine comes up in a TCG guest (`kubeadm init` from the
kubeadm bootstrap provider's Ignition), a worker joins it, and deleting the cluster leaves
nothing in libvirt. The tests run in file order against one cluster (tests/kcp/conftest.py).

The figures (`kubeadm init` in the guest, apply -> control plane initialized, worker Ready)
are in the terminal summary.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from capl.ports.naming import machine_names
from capl.runtime.objects import ObjectKey
from capl.runtime.resources import LIBVIRT_MACHINE
from tests.e2e.harness import is_true, report
from tests.fixtures.common import eventually
from tests.kcp.bed import KcpCluster
from tests.nodes.bed import KUBERNETES_VERSION, delete_real_cluster, guest_exec, node_ready

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.apiserver,
    pytest.mark.libvirtd,
    pytest.mark.guest,
    pytest.mark.timeout(2700),
]

INIT = 1500.0  # the control plane: boot + kubeadm init under TCG, measured 4-8 min
JOIN = 900.0


def _kubeadm_init_times(uri: str, domain: str) -> tuple[float, float]:
    """When kubeadm.service began and when `kubeadm init` said it succeeded, in seconds since
    the guest's boot (the journal's monotonic clock)."""
    argv = ["/bin/journalctl", "-u", "kubeadm.service", "-o", "short-monotonic", "--no-pager"]
    code, out = guest_exec(uri, domain, argv)
    assert code == 0, out
    stamps = [
        (float(line[1 : line.index("]")]), line)
        for line in out.splitlines()
        if line.startswith("[") and "]" in line
    ]
    assert stamps, f"no journal of kubeadm.service in {domain}: {out[-500:]}"
    done = [t for t, line in stamps if "control-plane has initialized successfully" in line]
    assert done, f"kubeadm init did not succeed in {domain}: {out[-1500:]}"
    return stamps[0][0], done[0]


async def test_control_plane_initializes_in_a_guest(kcp_cluster: KcpCluster) -> None:
    kcp = kcp_cluster

    async def initialized() -> dict[str, Any] | None:
        obj = await kcp.kubeadm_control_plane()
        status = obj.get("status") or {}
        return obj if (status.get("initialization") or {}).get("controlPlaneInitialized") else None

    await eventually(initialized, within=INIT, what="KubeadmControlPlane initialized")
    to_initialized = time.monotonic() - kcp.applied_at
    (machine,) = (await kcp.machines(control_plane=True)).values()
    lm = await kcp.api.resource(LIBVIRT_MACHINE).get(
        ObjectKey(kcp.namespace, machine["spec"]["infrastructureRef"]["name"])
    )
    domain = machine_names(namespace=kcp.namespace, name=lm["metadata"]["name"]).domain
    began, succeeded = _kubeadm_init_times(kcp.uri, domain)
    kcp.timings["kubeadm init"] = succeeded - began
    report(
        f"KubeadmControlPlane {kcp.name}: kubeadm init {succeeded - began:.0f} s in the guest"
        f" (kubeadm.service started {began:.0f} s after its boot); apply -> initialized"
        f" {to_initialized:.0f} s"
    )


async def test_the_nodes_are_ready(kcp_cluster: KcpCluster, tmp_path: Path) -> None:
    kcp = kcp_cluster
    await kcp.connect_workload(workdir=tmp_path)

    async def all_ready() -> dict[str, Any] | None:
        machines = {
            **(await kcp.machines(control_plane=True)),
            **(await kcp.machines(control_plane=False)),
        }
        nodes = await kcp.nodes()
        found: dict[str, Any] = {}
        for name, m in machines.items():
            node = nodes.get(((m.get("status") or {}).get("nodeRef") or {}).get("name", ""))
            if node is None or not node_ready(node):
                return None
            found[name] = (m, node)
        return found if len(found) == 2 else None

    found = await eventually(all_ready, within=JOIN, what="2 Ready nodes (control plane + worker)")
    ready = time.monotonic() - kcp.applied_at
    report(f"KubeadmControlPlane {kcp.name}: apply -> 2 Nodes Ready {ready:.0f} s")
    for machine, node in found.values():
        lm = await kcp.api.resource(LIBVIRT_MACHINE).get(
            ObjectKey(kcp.namespace, machine["spec"]["infrastructureRef"]["name"])
        )
        assert node["spec"]["providerID"] == lm["spec"]["providerID"]
        info = node["status"]["nodeInfo"]
        assert info["kubeletVersion"] == KUBERNETES_VERSION
        assert info["containerRuntimeVersion"].startswith("containerd://2.")
        is_cp = "cluster.x-k8s.io/control-plane" in machine["metadata"].get("labels", {})
        assert ("node-role.kubernetes.io/control-plane" in node["metadata"]["labels"]) == is_cp
    kcp_obj = await kcp.kubeadm_control_plane()
    assert is_true(kcp_obj, "Available"), kcp_obj.get("status")


async def test_deleting_the_cluster_leaves_nothing(kcp_cluster: KcpCluster) -> None:
    kcp = kcp_cluster
    seconds = await delete_real_cluster(kcp, within=600)
    report(f"KubeadmControlPlane {kcp.name}: cluster deleted in {seconds:.0f} s")
    await kcp.close()
    assert kcp.view.domains(kcp.domain_prefix) == {}
    assert kcp.view.network(kcp.network) is None
    assert not kcp.view.pool_exists(kcp.pool)
