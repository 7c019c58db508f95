"""Real nodes end to end: workers of capl's node image join a workload cluster with the kubeadm
bootstrap provider's Ignition and cloud-config, run a Pod, scale, get remediated, and leave
nothing in libvirt. The tests run in file order against one cluster (tests/nodes/bed.py).

What each boot costs is reported in the terminal summary (boot -> Node Ready per node).
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
import urllib.parse
from collections.abc import AsyncIterator
from typing import Any

import pytest

from capl.runtime.objects import ObjectKey
from capl.runtime.resources import (
    EVENT,
    LIBVIRT_MACHINE,
    LIBVIRT_MACHINE_TEMPLATE,
    MACHINE,
    SECRET,
)
from tests.e2e.harness import b64, is_true, report
from tests.fixtures.common import eventually
from tests.nodes.bed import KUBERNETES_VERSION, RealCluster, delete_real_cluster, guest_exec

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.apiserver,
    pytest.mark.libvirtd,
    pytest.mark.guest,
    pytest.mark.timeout(1800),
]

JOIN = 900.0  # TCG guests on two shared cores, several booting at once
BOOT_TO_READY: list[float] = []


def condition(obj: Any, type_: str) -> dict[str, Any] | None:
    for c in (obj.get("status") or {}).get("conditions") or ():
        if c.get("type") == type_:
            return dict(c)
    return None


# --- bad bootstrap data: created with the cluster, looked at once the workers joined -----------

BAD_TOKEN = "abcdef.0123456789abcdef"


def _bad_ignition() -> bytes:
    # capl accepts it (a JSON object with ignition.version); Ignition refuses a relative path
    return json.dumps(
        {
            "ignition": {"version": "2.3.0"},
            "storage": {
                "files": [
                    {
                        "filesystem": "root",
                        "path": "etc/not-absolute",
                        "contents": {"source": "data:," + urllib.parse.quote("x")},
                    }
                ]
            },
        }
    ).encode()


def _bad_cloud_config(endpoint: str) -> bytes:
    # a join with a token the cluster does not know: discovery never succeeds
    return (
        "#cloud-config\nruncmd:\n"
        f"  - kubeadm join {endpoint}:6443 --token {BAD_TOKEN}"
        " --discovery-token-unsafe-skip-ca-verification\n"
    ).encode()


async def _bad_machine(real: RealCluster, name: str, data: bytes, fmt: str) -> None:
    api, ns = real.api, real.namespace
    await api.resource(SECRET).create(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": f"{name}-bootstrap", "namespace": ns},
            "type": "cluster.x-k8s.io/secret",
            "data": {
                "value": b64(data),
                "format": b64(fmt.encode()),
            },
        }
    )
    template = await api.resource(LIBVIRT_MACHINE_TEMPLATE).get(
        ObjectKey(ns, f"{real.name}-worker")
    )
    spec = dict(template["spec"]["template"]["spec"])
    spec.update({"cpus": 1, "memoryMiB": 1024})
    await api.resource(LIBVIRT_MACHINE).create(
        {
            "apiVersion": LIBVIRT_MACHINE.api_version,
            "kind": "LibvirtMachine",
            "metadata": {
                "name": name,
                "namespace": ns,
                "labels": {"cluster.x-k8s.io/cluster-name": real.name},
            },
            "spec": spec,
        }
    )
    await api.resource(MACHINE).create(
        {
            "apiVersion": MACHINE.api_version,
            "kind": "Machine",
            "metadata": {
                "name": name,
                "namespace": ns,
                "labels": {"cluster.x-k8s.io/cluster-name": real.name},
            },
            "spec": {
                "clusterName": real.name,
                "version": KUBERNETES_VERSION,
                "bootstrap": {"dataSecretName": f"{name}-bootstrap"},
                "infrastructureRef": {
                    "apiGroup": LIBVIRT_MACHINE.group,
                    "kind": "LibvirtMachine",
                    "name": name,
                },
            },
        }
    )


BAD = {"rn-bad-ignition": "ignition", "rn-bad-cloud-config": "cloud-config"}


@pytest.fixture(scope="module")
async def bad_machines(real_cluster: RealCluster) -> AsyncIterator[dict[str, str]]:
    endpoint = real_cluster.control_plane.address
    await _bad_machine(real_cluster, "rn-bad-ignition", _bad_ignition(), "ignition")
    await _bad_machine(
        real_cluster, "rn-bad-cloud-config", _bad_cloud_config(endpoint), "cloud-config"
    )
    return BAD


# --- the tests, in order -------------------------------------------------------------------------


async def test_workers_join_through_ignition_and_cloud_config(
    real_cluster: RealCluster, bad_machines: dict[str, str]
) -> None:
    real = real_cluster
    t0 = time.monotonic()
    ignition = await real.wait_ready_nodes(real.md_ignition, 1, within=JOIN)
    cloud = await real.wait_ready_nodes(real.md_cloud_config, 1, within=JOIN)
    report(f"both workers Ready {time.monotonic() - t0:.0f} s after the control plane")
    for machine, node in {**ignition, **cloud}.items():
        info = node["status"]["nodeInfo"]
        assert info["kubeletVersion"] == KUBERNETES_VERSION, info
        assert info["containerRuntimeVersion"].startswith("containerd://2."), info
        lm = await real.libvirt_machine(machine)
        assert lm is not None
        assert node["spec"].get("providerID") == lm["spec"]["providerID"]
        await _zone_labelled(real, node["metadata"]["name"], lm["spec"]["hostName"])
        await _bootstrap_succeeded(real, machine)
        ready_at = _ready_since(node)
        started = _started(lm)
        if ready_at is not None and started is not None:
            BOOT_TO_READY.append(ready_at - started)
    if BOOT_TO_READY:
        report(
            f"boot -> Node Ready: median {statistics.median(BOOT_TO_READY):.0f} s,"
            f" max {max(BOOT_TO_READY):.0f} s over {len(BOOT_TO_READY)} nodes"
        )


async def _zone_labelled(real: RealCluster, node_name: str, host: str) -> None:
    """capl labels the Node topology.kubernetes.io/zone=<its machine's host> (the failure
    domain) through the workload kubeconfig, beside the providerID; a real kubelet that
    re-registers must not take it away."""

    async def probe() -> bool:
        node = (await real.nodes()).get(node_name) or {}
        labels = (node.get("metadata") or {}).get("labels") or {}
        assert labels.get("topology.kubernetes.io/zone") == host, labels
        return True

    await eventually(probe, within=120, interval=2, what=f"zone={host} on Node {node_name}")


async def _bootstrap_succeeded(real: RealCluster, machine: str) -> None:
    """capl read the success file through the guest agent (it asks every 15 s)."""

    async def probe() -> bool:
        lm = await real.libvirt_machine(machine)
        cond = condition(lm, "BootstrapSucceeded") if lm else None
        assert cond is not None, f"{machine}: no BootstrapSucceeded condition yet"
        assert cond["status"] == "True", f"{machine}: {cond}"
        return True

    await eventually(probe, within=120, interval=2, what=f"BootstrapSucceeded on {machine}")


def _ts(value: str | None) -> float | None:
    if not value:
        return None
    return time.mktime(time.strptime(value, "%Y-%m-%dT%H:%M:%SZ")) - time.timezone


def _ready_since(node: Any) -> float | None:
    cond = condition(node, "Ready")
    return _ts(cond.get("lastTransitionTime")) if cond else None


def _started(lm: Any) -> float | None:
    cond = condition(lm, "DomainProvisioned")
    return _ts(cond.get("lastTransitionTime")) if cond else None


async def test_bad_bootstrap_data_is_reported_with_the_console_tail(
    real_cluster: RealCluster, bad_machines: dict[str, str]
) -> None:
    real = real_cluster

    async def timed_out_with(name: str, *words: str) -> dict[str, Any]:
        lm = await real.libvirt_machine(name)
        cond = condition(lm, "BootstrapSucceeded") if lm else None
        if cond is None or cond.get("reason") != "BootstrapTimedOut":
            raise AssertionError(f"{name}: {cond}")
        if not any(w in cond["message"] for w in words):
            raise AssertionError(f"{name}: none of {words} in the console tail yet: {cond}")
        return cond

    # The deadline counts from each domain's start (10 min; this test runs right after the
    # workers joined, about then). The message follows the console (read again at every slow
    # poll): under load a guest reaches the line looked for only after the deadline.
    # Ignition's refusal from the initramfs, or as capl-ignition-report.service repeats it at
    # the end of the boot:
    await eventually(
        lambda: timed_out_with("rn-bad-ignition", "ignition: FAILED", "Ignition did not apply"),
        within=900,
        interval=5,
        what="Ignition refusal",
    )
    # kubeadm's own output: still retrying discovery ("[preflight] Running pre-flight
    # checks"; it gives up after 5 min) or its error ("error execution phase preflight:
    # couldn't validate the identity of the API Server: could not find a JWS signature ...")
    cloud = await eventually(
        lambda: timed_out_with("rn-bad-cloud-config", "preflight"),
        within=900,
        interval=5,
        what="failed join",
    )
    assert BAD_TOKEN not in cloud["message"]
    assert BAD_TOKEN.split(".")[1] not in cloud["message"]
    events = (await real.api.resource(EVENT).list(namespace=real.namespace)).items
    warnings = [
        e
        for e in events
        if e.get("type") == "Warning"
        and (e.get("involvedObject") or {}).get("name") in bad_machines
        and "BootstrapTimedOut" in (e.get("reason") or "")
    ]
    assert {e["involvedObject"]["name"] for e in warnings} >= set(bad_machines), warnings
    assert all(BAD_TOKEN not in (e.get("message") or "") for e in warnings)
    # no crash loop: the domains are running, nothing was re-created
    for name in bad_machines:
        lm = await real.libvirt_machine(name)
        assert lm is not None
        assert is_true(lm, "DomainProvisioned"), lm["status"]
    for name in bad_machines:
        await real.api.resource(MACHINE).delete(ObjectKey(real.namespace, name))

    async def gone() -> bool:
        domains = real.view.domains(real.domain_prefix)
        return not any(real.domain_of(n) in domains for n in bad_machines)

    await eventually(gone, within=300, interval=2, what="the bad machines' domains removed")


async def test_a_pod_of_a_local_image_runs_on_a_worker(real_cluster: RealCluster) -> None:
    real = real_cluster
    nodes = await real.nodes()
    worker = sorted(nodes)[0]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "hello", "namespace": "default"},
        "spec": {
            "nodeName": worker,
            "containers": [
                {
                    "name": "hello",
                    "image": "capl.local/busybox:1",
                    "imagePullPolicy": "Never",
                    "command": [
                        "/bin/busybox", "sh", "-c",
                        "echo hello from a capl node; exec /bin/busybox sleep 3600",
                    ],
                }
            ],
        },
    }  # fmt: skip
    await real.kubectl_workload("apply", "-f", "-", stdin=json.dumps(pod).encode())

    async def logs() -> str | None:
        try:
            out = await real.kubectl_workload("logs", "-n", "default", "hello")
        except Exception as exc:  # not running yet
            raise AssertionError(str(exc)) from exc
        return out if "hello from a capl node" in out else None

    await eventually(logs, within=300, interval=2, what="the Pod's log line")


async def test_machine_deployment_scales_up_and_down(real_cluster: RealCluster) -> None:
    real = real_cluster
    before = set(await real.machines(real.md_ignition))
    t0 = time.monotonic()
    await real.scale(real.md_ignition, 2)
    two = await real.wait_ready_nodes(real.md_ignition, 2, within=JOIN)
    report(f"scale 1 -> 2: new Node Ready after {time.monotonic() - t0:.0f} s")
    (added,) = set(two) - before
    added_node = two[added]["metadata"]["name"]
    t1 = time.monotonic()
    await real.scale(real.md_ignition, 1)

    async def one_left() -> bool:
        machines = await real.machines(real.md_ignition)
        nodes = await real.nodes()
        return (
            len(machines) == 1
            and len(nodes) == len(set(nodes))
            and _count_md_nodes(nodes, machines) == 1
        )

    await eventually(one_left, within=600, interval=2, what="one md-ignition machine and node")
    report(f"scale 2 -> 1: machine and Node gone after {time.monotonic() - t1:.0f} s")
    # the Machine controller drained and deleted the Node of the machine it removed
    remaining = await real.nodes()
    removed = [n for n in two.values() if n["metadata"]["name"] not in remaining]
    assert len(removed) == 1, sorted(remaining)
    assert added_node in remaining or added_node in {n["metadata"]["name"] for n in removed}


def _count_md_nodes(nodes: dict[str, Any], machines: dict[str, Any]) -> int:
    refs = {((m.get("status") or {}).get("nodeRef") or {}).get("name") for m in machines.values()}
    return len([n for n in nodes if n in refs])


async def test_health_check_replaces_a_node_whose_kubelet_stopped(
    real_cluster: RealCluster,
) -> None:
    real = real_cluster
    ns = real.namespace
    mhc = {
        "apiVersion": "cluster.x-k8s.io/v1beta2",
        "kind": "MachineHealthCheck",
        "metadata": {"name": f"{real.name}-cloud-config", "namespace": ns},
        "spec": {
            "clusterName": real.name,
            "selector": {"matchLabels": {"cluster.x-k8s.io/deployment-name": real.md_cloud_config}},
            "checks": {
                "nodeStartupTimeoutSeconds": 1200,
                "unhealthyNodeConditions": [
                    {"type": "Ready", "status": "Unknown", "timeoutSeconds": 30},
                    {"type": "Ready", "status": "False", "timeoutSeconds": 30},
                ],
            },
        },
    }
    await real.management.plane.kubectl(
        "apply", "--server-side", "-f", "-", stdin=json.dumps(mhc).encode()
    )
    (victim,) = (await real.machines(real.md_cloud_config)).keys()
    code, out = await asyncio.to_thread(
        guest_exec, real.uri, real.domain_of(victim), ["/bin/systemctl", "stop", "kubelet"]
    )
    assert code == 0, out
    t0 = time.monotonic()

    async def replaced() -> bool:
        machines = await real.machines(real.md_cloud_config)
        return victim not in machines and len(machines) == 1

    await eventually(replaced, within=600, interval=2, what=f"{victim} remediated")
    report(f"MachineHealthCheck: {victim} replaced after {time.monotonic() - t0:.0f} s")
    await real.wait_ready_nodes(real.md_cloud_config, 1, within=JOIN)
    report(f"MachineHealthCheck: replacement Ready after {time.monotonic() - t0:.0f} s")


async def test_deleting_the_cluster_leaves_nothing_in_libvirt(real_cluster: RealCluster) -> None:
    real = real_cluster
    seconds = await delete_real_cluster(real)
    report(f"cluster deletion: {seconds:.0f} s")
    assert real.view.domains(real.domain_prefix) == {}
    assert real.view.network(real.network) is None
    assert not real.view.pool_exists(real.pool)
