"""The real Cluster API core manager against the session's kube-apiserver, acting on capl's CRDs.

capl's controllers do not run here: the test plays the infrastructure provider by writing
LibvirtCluster status itself, and asserts on what the Cluster API Cluster controller does with
it. That pins the contract capl relies on (the `cluster.x-k8s.io/v1beta2` CRD label, the v1beta2
status fields, owner references, deletion of the infrastructure object), with no imitation of
Cluster API anywhere.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, TypeVar

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from capl.testbed import AssetsMissing, ControlPlane, ProcessFailed, find_assets
from capl.testbed.capi import CapiAssets, CapiCore, CapiError
from capl.testbed.clusterctl import Clusterctl
from capl.testing.objects import condition_of
from tests.fixtures.capi import record_timing
from tests.fixtures.common import eventually, require_part

pytestmark = [pytest.mark.e2e, pytest.mark.apiserver]

CAPI = ("cluster.x-k8s.io", "v1beta2", "clusters")
INFRA = ("infrastructure.cluster.x-k8s.io", "v1alpha1", "libvirtclusters")
CLUSTER_FINALIZER = "cluster.cluster.x-k8s.io"
MERGE_PATCH = "application/merge-patch+json"

T = TypeVar("T")


def libvirt_cluster(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1",
        "kind": "LibvirtCluster",
        "metadata": {"name": name},
        "spec": {
            "hosts": [{"name": "host0", "uri": "test:///default"}],
            "network": {"cidr": "192.168.150.0/24", "mode": "isolated"},
        },
    }


def capi_cluster(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "cluster.x-k8s.io/v1beta2",
        "kind": "Cluster",
        "metadata": {"name": name},
        "spec": {
            "infrastructureRef": {
                "apiGroup": "infrastructure.cluster.x-k8s.io",
                "kind": "LibvirtCluster",
                "name": name,
            },
        },
    }


async def test_cluster_controller_adopts_and_follows_the_libvirt_cluster(
    running_capi_core: CapiCore, api_client: client.ApiClient, namespace: str
) -> None:
    api = client.CustomObjectsApi(api_client)
    name = "demo"

    async def get(kind: tuple[str, str, str]) -> dict[str, Any] | None:
        try:
            obj: dict[str, Any] = await api.get_namespaced_custom_object(
                kind[0], kind[1], namespace, kind[2], name
            )
            return obj
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    t0 = time.monotonic()
    await api.create_namespaced_custom_object(
        *INFRA[:2], namespace, INFRA[2], libvirt_cluster(name)
    )
    cluster = await api.create_namespaced_custom_object(
        *CAPI[:2], namespace, CAPI[2], capi_cluster(name)
    )

    # 1. The Cluster controller takes the Cluster and the LibvirtCluster over.
    async def adopted() -> tuple[dict[str, Any], dict[str, Any]] | None:
        c, lc = await get(CAPI), await get(INFRA)
        if c is None or lc is None:
            return None
        owners = lc["metadata"].get("ownerReferences") or []
        has_owner = any(
            o.get("kind") == "Cluster"
            and o.get("name") == name
            and o.get("uid") == cluster["metadata"]["uid"]
            and o.get("apiVersion") == "cluster.x-k8s.io/v1beta2"
            for o in owners
        )
        if CLUSTER_FINALIZER in (c["metadata"].get("finalizers") or []) and has_owner:
            return c, lc
        return None

    c, lc = await eventually(
        adopted, within=60, what="Cluster finalizer and LibvirtCluster owner reference"
    )
    record_timing("CAPI core: Cluster adopted (finalizer + ownerRef)", time.monotonic() - t0)
    assert lc["metadata"]["labels"]["cluster.x-k8s.io/cluster-name"] == name

    async def provisioning() -> dict[str, Any] | None:
        c = await get(CAPI)
        infra = condition_of(c or {}, "InfrastructureReady")
        if c and c.get("status", {}).get("phase") == "Provisioning" and infra:
            return c
        return None

    c = await eventually(provisioning, within=60, what="Cluster phase Provisioning")
    infra_ready = condition_of(c, "InfrastructureReady")
    assert infra_ready.get("status") == "False", infra_ready
    assert not c["status"].get("initialization", {}).get("infrastructureProvisioned")

    # 2. Play the provider: endpoint in spec, provisioned + failure domains in status
    #    (v1beta2 contract). Cluster API copies them to the Cluster.
    t1 = time.monotonic()
    await api.patch_namespaced_custom_object(
        *INFRA[:2], namespace, INFRA[2], name,
        {"spec": {"controlPlaneEndpoint": {"host": "192.168.150.10", "port": 6443}}},
        _content_type=MERGE_PATCH,
    )  # fmt: skip
    await api.patch_namespaced_custom_object_status(
        *INFRA[:2], namespace, INFRA[2], name,
        {
            "status": {
                "initialization": {"provisioned": True},
                "failureDomains": [
                    {"name": "host0", "controlPlane": True, "attributes": {"cpus": "2"}}
                ],
            }
        },
        _content_type=MERGE_PATCH,
    )  # fmt: skip

    async def provisioned() -> dict[str, Any] | None:
        c = await get(CAPI)
        if c and c.get("status", {}).get("initialization", {}).get("infrastructureProvisioned"):
            return c
        return None

    c = await eventually(
        provisioned, within=60, what="Cluster status.initialization.infrastructureProvisioned"
    )
    record_timing("CAPI core: infrastructure provisioned -> Cluster", time.monotonic() - t1)
    assert c["spec"]["controlPlaneEndpoint"] == {"host": "192.168.150.10", "port": 6443}
    domains = {d["name"]: d for d in c["status"].get("failureDomains") or []}
    assert domains["host0"]["controlPlane"] is True
    assert domains["host0"]["attributes"] == {"cpus": "2"}
    ready = condition_of(c, "InfrastructureReady")
    assert ready.get("status") == "True", ready
    assert c["status"]["phase"] == "Provisioned"

    # 3. Deleting the Cluster deletes the LibvirtCluster, then releases the Cluster.
    t2 = time.monotonic()
    await api.delete_namespaced_custom_object(*CAPI[:2], namespace, CAPI[2], name)

    async def both_gone() -> bool:
        return await get(INFRA) is None and await get(CAPI) is None

    await eventually(both_gone, within=60, what="LibvirtCluster and Cluster deleted")
    record_timing("CAPI core: Cluster deletion incl. LibvirtCluster", time.monotonic() - t2)


async def test_core_manager_restart_keeps_webhooks_working(
    running_capi_core: CapiCore,
) -> None:
    """Same ports and CA after a restart: the installed webhook objects stay valid."""
    core = running_capi_core
    port = core.webhook_port
    t0 = time.monotonic()
    await core.restart()
    record_timing("CAPI core: restart", time.monotonic() - t0)
    assert core.webhook_port == port
    assert core.running
    metrics = await core.metrics()
    assert "controller_runtime_reconcile_total" in metrics


async def test_a_manager_that_dies_is_reported_with_its_log(
    capi_assets: CapiAssets, tmp_path: Path
) -> None:
    try:
        assets = find_assets()
    except AssetsMissing as e:
        require_part("the Kubernetes control plane (kube-apiserver, etcd, kubectl)", str(e))
        return
    plane = ControlPlane(assets=assets, workdir=tmp_path / "plane")
    plane.prepare()  # a kubeconfig to point at; nothing runs
    core = CapiCore(
        plane=plane, capi=capi_assets, workdir=tmp_path / "core", extra_args=["--no-such-flag"]
    )
    try:
        with pytest.raises(ProcessFailed) as failure:
            await core.start_manager()
    finally:
        await core.stop()
        await plane.stop()
    message = str(failure.value)
    assert "cluster-api-manager exited with status" in message
    assert "unknown flag: --no-such-flag" in message
    assert str(core.log_path) in message


async def test_clusterctl_init_refuses_a_core_it_did_not_install(
    running_capi_core: CapiCore, capi_assets: CapiAssets, tmp_path: Path
) -> None:
    """Fails at once instead of clusterctl retrying a doomed merge for minutes."""
    plane = running_capi_core.plane
    clusterctl = Clusterctl(capi=capi_assets, kubectl=plane.assets.kubectl, workdir=tmp_path)
    with pytest.raises(CapiError, match=r"Run Clusterctl\.init before CapiCore\.start"):
        await clusterctl.init(plane)
