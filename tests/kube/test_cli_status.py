"""`capl status` and `capl console` (lookups) against the real kube-apiserver.

The objects are created by hand in a fresh namespace and their status is patched by the test
(there is no manager here), so every value the command prints is one the test wrote. The
Cluster API CRDs are not installed in this stage's API server: the command must show capl's
objects and say that Cluster API is absent.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

pytestmark = pytest.mark.apiserver

CAPL = str(Path(sys.executable).with_name("capl"))
GROUP, VERSION = "infrastructure.cluster.x-k8s.io", "v1alpha1"
UUID_A = "0b7e3d1a-2c4f-4a6b-8c9d-1e2f3a4b5c6d"
UUID_B = "6f1c8c52-1d7a-4c2e-9d4e-0a1b2c3d4e5f"
T = "2026-01-02T03:04:05Z"


async def capl(*args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        CAPL,
        *args,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def condition(type_: str, status: str, reason: str, message: str = "") -> dict[str, str]:
    return {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": T,
    }


async def create(
    objs: client.CustomObjectsApi,
    namespace: str,
    plural: str,
    body: dict[str, Any],
    status: dict[str, Any] | None = None,
) -> None:
    await objs.create_namespaced_custom_object(GROUP, VERSION, namespace, plural, body)
    if status is not None:
        await objs.patch_namespaced_custom_object_status(
            GROUP,
            VERSION,
            namespace,
            plural,
            body["metadata"]["name"],
            {"status": status},
            _content_type="application/merge-patch+json",
        )


def libvirt_cluster(name: str, *, uri: str = "qemu:///system") -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "LibvirtCluster",
        "metadata": {"name": name, "labels": {"cluster.x-k8s.io/cluster-name": name}},
        "spec": {
            "controlPlaneEndpoint": {"host": f"api.{name}.test", "port": 6443},
            "hosts": [{"name": "kvm1", "uri": uri}, {"name": "kvm2", "uri": "qemu+ssh://k/system"}],
            "network": {"name": "default"},
        },
    }


def libvirt_machine(
    name: str, cluster: str, *, uuid: str | None = None, host: str = "kvm1"
) -> dict[str, Any]:
    spec: dict[str, Any] = {"image": {"volume": "base.qcow2"}, "hostName": host}
    if uuid:
        spec |= {"domainUUID": uuid, "providerID": f"libvirt:///{uuid}"}
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "LibvirtMachine",
        "metadata": {"name": name, "labels": {"cluster.x-k8s.io/cluster-name": cluster}},
        "spec": spec,
    }


@pytest.fixture
async def populated(api_client: client.ApiClient, namespace: str) -> str:
    """Cluster "alpha" (one Ready machine, one not) and cluster "beta" (no machines)."""
    objs = client.CustomObjectsApi(api_client)
    await create(
        objs,
        namespace,
        "libvirtclusters",
        libvirt_cluster("alpha"),
        {
            "hosts": [{"name": "kvm1", "reachable": True}, {"name": "kvm2", "reachable": False}],
            "conditions": [
                condition("Ready", "False", "HostsUnreachable", "host kvm2: connection refused"),
                condition("HostsReachable", "False", "HostsUnreachable", "1 of 2 hosts"),
                condition("Paused", "False", "NotPaused"),
            ],
        },
    )
    await create(objs, namespace, "libvirtclusters", libvirt_cluster("beta"))
    await create(
        objs,
        namespace,
        "libvirtmachines",
        libvirt_machine("alpha-0", "alpha", uuid=UUID_A),
        {
            "host": "kvm1",
            "domainState": "Running",
            "addresses": [
                {"type": "InternalIP", "address": "10.17.0.10"},
                {"type": "Hostname", "address": "alpha-0"},
            ],
            "conditions": [condition("Ready", "True", "Ready"), condition("Paused", "False", "x")],
        },
    )
    await create(
        objs,
        namespace,
        "libvirtmachines",
        libvirt_machine("alpha-1", "alpha", uuid=UUID_B),
        {
            "host": "kvm1",
            "domainState": "Running",
            "conditions": [
                condition("Ready", "False", "WaitingForAddress", "no DHCP lease for 52:54:00:aa"),
                condition("AddressAssigned", "Unknown", "WaitingForAddress"),
            ],
        },
    )
    return namespace


async def test_status_shows_clusters_machines_and_bad_conditions(
    populated: str, kubeconfig: Path
) -> None:
    code, out, err = await capl("status", "-n", populated, "--kubeconfig", str(kubeconfig))
    assert code == 0, err
    assert "Cluster API CRDs are not installed" in err
    lines = out.splitlines()
    header = lines[0].split()
    assert header == ["CLUSTER", "READY", "ENDPOINT", "HOSTS", "MACHINES", "AGE"]  # no PHASE
    alpha = next(line.split() for line in lines if line.startswith("alpha "))
    assert alpha[:5] == ["alpha", "False", "api.alpha.test:6443", "1/2", "1/2"]
    beta = next(line.split() for line in lines if line.startswith("beta "))
    assert beta[:5] == ["beta", "-", "api.beta.test:6443", "0/2", "0/0"]
    # the columns line up: every row of a table starts its columns at the header's offsets
    machine_header = next(i for i, line in enumerate(lines) if line.startswith("CLUSTER   MACHINE"))
    m0 = lines[machine_header + 1]
    assert m0.index("alpha-0") == lines[machine_header].index("MACHINE")
    m0_cells = m0.split()
    assert m0_cells[:7] == [
        "alpha",
        "alpha-0",
        "kvm1",
        "Running",
        "10.17.0.10",
        f"libvirt:///{UUID_A}",
        "True",
    ]
    assert "NODE" not in lines[machine_header]  # Cluster API columns only with Cluster API
    m1_cells = lines[machine_header + 2].split()
    assert m1_cells[1] == "alpha-1"
    assert m1_cells[4] == "-"  # no address
    assert m1_cells[6] == "False"
    conditions = out[out.index("CONDITIONS NOT IN THEIR GOOD STATE") :]
    assert (
        "LibvirtCluster alpha: Ready=False HostsUnreachable: host kvm2: connection refused"
    ) in conditions
    assert (
        "LibvirtMachine alpha-1: Ready=False WaitingForAddress: no DHCP lease for 52:54:00:aa"
    ) in conditions
    assert "LibvirtMachine alpha-1: AddressAssigned=Unknown WaitingForAddress" in conditions
    assert "Paused" not in conditions  # good when False
    assert "alpha-0:" not in conditions


async def test_status_one_cluster_json_and_all_namespaces(populated: str, kubeconfig: Path) -> None:
    code, out, err = await capl(
        "status", "alpha", "-n", populated, "-o", "json", "--kubeconfig", str(kubeconfig)
    )
    assert code == 0, err
    data = json.loads(out)
    assert [c["name"] for c in data["clusters"]] == ["alpha"]
    assert [m["name"] for m in data["machines"]] == ["alpha-0", "alpha-1"]
    first = data["machines"][0]
    assert first["addresses"] == ["10.17.0.10"]
    assert first["provider_id"] == f"libvirt:///{UUID_A}"
    assert first["ready"] == "True"
    assert first["age"] != "-"
    assert {(c["name"], c["type"]) for c in data["conditions"]} == {
        ("alpha", "Ready"),
        ("alpha", "HostsReachable"),
        ("alpha-1", "Ready"),
        ("alpha-1", "AddressAssigned"),
    }

    code, out, err = await capl("status", "-A", "--kubeconfig", str(kubeconfig))
    assert code == 0, err
    assert out.splitlines()[0].split()[:2] == ["NAMESPACE", "CLUSTER"]
    assert any(line.split()[:2] == [populated, "alpha"] for line in out.splitlines())


async def test_status_honours_kubeconfig_context_namespace(
    populated: str, kubeconfig: Path, tmp_path: Path
) -> None:
    """Without -n, the kubeconfig context's namespace is shown (KUBECONFIG honoured)."""
    import os

    import yaml

    config = yaml.safe_load(await asyncio.to_thread(kubeconfig.read_text))
    for entry in config["contexts"]:
        entry["context"]["namespace"] = populated
    scoped = tmp_path / "scoped.kubeconfig"
    await asyncio.to_thread(scoped.write_text, yaml.safe_dump(config))
    proc = await asyncio.create_subprocess_exec(
        CAPL,
        "status",
        "beta",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "KUBECONFIG": str(scoped)},
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    assert out.decode().splitlines()[1].startswith("beta ")


async def test_status_unknown_cluster_exits_3(populated: str, kubeconfig: Path) -> None:
    code, out, err = await capl("status", "gamma", "-n", populated, "--kubeconfig", str(kubeconfig))
    assert code == 3
    assert out == ""
    assert err.strip().splitlines()[-1] == (
        f"capl: error: cluster 'gamma' not found in namespace {populated} "
        "(no Cluster, LibvirtCluster or LibvirtMachine belongs to it)"
    )


async def test_status_empty_namespace(namespace: str, kubeconfig: Path) -> None:
    code, out, err = await capl("status", "-n", namespace, "--kubeconfig", str(kubeconfig))
    assert code == 0
    assert out == ""
    assert f"No clusters or machines found in namespace {namespace}." in err


async def test_console_unknown_machine_exits_3(populated: str, kubeconfig: Path) -> None:
    code, _, err = await capl("console", "nosuch", "-n", populated, "--kubeconfig", str(kubeconfig))
    assert code == 3
    assert err.strip() == (
        f"capl: error: machine {populated}/nosuch not found "
        "(no LibvirtMachine or Machine of that name)"
    )
    assert "Traceback" not in err


async def test_console_machine_without_domain_or_host(
    api_client: client.ApiClient, populated: str, kubeconfig: Path
) -> None:
    objs = client.CustomObjectsApi(api_client)
    await create(objs, populated, "libvirtmachines", libvirt_machine("alpha-2", "alpha"))
    code, _, err = await capl(
        "console", "alpha-2", "-n", populated, "--kubeconfig", str(kubeconfig)
    )
    assert code == 1
    assert "has no domain yet" in err
    assert len(err.strip().splitlines()) == 1

    orphan = libvirt_machine("alpha-3", "alpha", uuid=UUID_A, host="kvm9")
    await create(objs, populated, "libvirtmachines", orphan)
    code, _, err = await capl(
        "console", "alpha-3", "-n", populated, "--kubeconfig", str(kubeconfig)
    )
    assert code == 3
    assert f"LibvirtCluster {populated}/alpha has no host 'kvm9'" in err

    lost = libvirt_machine("delta-0", "delta", uuid=UUID_B)
    await create(objs, populated, "libvirtmachines", lost)
    code, _, err = await capl(
        "console", "delta-0", "-n", populated, "--kubeconfig", str(kubeconfig)
    )
    assert code == 3
    assert "no LibvirtCluster of cluster 'delta'" in err


async def test_console_unreachable_libvirt_host_exits_4(
    api_client: client.ApiClient, namespace: str, kubeconfig: Path, tmp_path: Path
) -> None:
    objs = client.CustomObjectsApi(api_client)
    socket_path = tmp_path / "no-daemon.sock"
    await create(
        objs,
        namespace,
        "libvirtclusters",
        libvirt_cluster("epsilon", uri=f"qemu+unix:///system?socket={socket_path}"),
    )
    await create(
        objs, namespace, "libvirtmachines", libvirt_machine("eps-0", "epsilon", uuid=UUID_A)
    )
    code, _, err = await capl("console", "eps-0", "-n", namespace, "--kubeconfig", str(kubeconfig))
    assert code == 4, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("capl: error: ")
    assert "qemu+unix:///system" in lines[0]
    assert str(socket_path) in lines[0]  # libvirt's own reason: the socket it could not reach
