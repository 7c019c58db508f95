"""ClusterClass end to end: capl's class (templates/clusterclass-libvirt.yaml) and its
"topology" flavor with Cluster API's real topology controller.

One management cluster for the module: `clusterctl init --bootstrap kubeadm --control-plane
kubeadm --infrastructure libvirt` from the local repositories, the Cluster API core, kubeadm
bootstrap and control-plane managers as local processes with the ClusterTopology feature gate
on (Cluster API v1.13 still gates ClusterClass: `feature.ClusterTopology`, Alpha, default
false), `capl manager` as a process with its webhooks. The host is libvirtd's shared test
driver (`test+unix:///default`), as in test_kubeadm_providers: no guest boots, what is
asserted is what the topology controller makes of the class and capl takes of it. Without a
workload API server the control plane never initializes, so the workers get no bootstrap data
(their LibvirtMachines wait for it); the rollouts are followed through the templates,
MachineSets and LibvirtMachines.

1. `clusterctl generate cluster --flavor topology` brings the ClusterClass and its templates
   along; a Cluster from it gets a LibvirtCluster shaped by the variables (hosts, CIDR, mode),
   a KubeadmControlPlane, machine templates sized by the variables; scaling the worker
   topology adds machines; changing a variable rotates the worker template (the topology
   controller's server-side dry run goes through capl's immutability webhook, which still
   refuses a direct change) and rolls the machines over to the new size.
2. Two clusters from the class on the same host: another CIDR works side by side; the same
   CIDR is refused by capl's webhook (the Cluster's TopologyReconciled condition says why,
   and no LibvirtCluster is made).
3. A variable out of range is refused by Cluster API's webhook, naming the variable.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from capl.kube import KubeClient
from capl.runtime.objects import Obj, ObjectKey
from capl.runtime.resources import (
    CAPI_GROUP,
    CLUSTER,
    LIBVIRT_CLUSTER,
    LIBVIRT_MACHINE,
    LIBVIRT_MACHINE_TEMPLATE,
    MACHINE,
    Resource,
)
from capl.testbed import ControlPlane
from capl.testbed.capi import CapiAssets, CapiCore
from capl.testbed.caplmanager import CaplManager
from capl.testbed.clusterctl import Clusterctl, LocalProvider
from capl.testbed.controlplane import ControlPlaneError
from capl.testbed.kubeadm_providers import CONTROL_PLANE_GROUP, KubeadmProviders
from capl.testing.objects import BASE_VOLUME, condition_of
from tests.e2e.harness import CAPL_E2E_ARGS, MACHINE_DEPLOYMENT, report
from tests.fixtures.capi import ControlPlaneFactory, new_clusterctl, record_timing
from tests.fixtures.capl import CaplManagerFactory
from tests.fixtures.common import eventually
from tests.fixtures.libvirt_direct import free_cidr, open_libvirt, put_base_volume, sweep_namespace

pytestmark = [pytest.mark.e2e, pytest.mark.apiserver]

KUBERNETES_VERSION = "v1.35.4"
CLASS = "libvirt"
CLUSTER_CLASS = Resource(CAPI_GROUP, "v1beta2", "ClusterClass", "clusterclasses")
KUBEADM_CONTROL_PLANE = Resource(
    CONTROL_PLANE_GROUP, "v1beta2", "KubeadmControlPlane", "kubeadmcontrolplanes"
)
TOPOLOGY_GATES = {"ClusterTopology": True}
MD_TOPOLOGY_LABEL = "topology.cluster.x-k8s.io/deployment-name"
CLUSTER_NAME_LABEL = "cluster.x-k8s.io/cluster-name"


@dataclass
class ClassBed:
    plane: ControlPlane
    clusterctl: Clusterctl
    core: CapiCore
    providers: KubeadmProviders
    capl: CaplManager
    api: KubeClient
    namespace: str
    host: str
    workdir: Path
    cidrs: list[str] = field(default_factory=list)
    clusters: list[str] = field(default_factory=list)

    def logs(self) -> str:
        managers: list[Any] = [self.core, *self.providers.managers, self.capl]
        return "\n".join(f"--- {m.name} (last lines)\n{m.log_text()[-2500:]}" for m in managers)

    async def get(self, resource: Resource, name: str) -> Obj | None:
        with contextlib.suppress(Exception):
            return await self.api.resource(resource).get(ObjectKey(self.namespace, name))
        return None

    async def list_objects(self, resource: Resource, selector: str | None = None) -> list[Obj]:
        listing = await self.api.resource(resource).list(
            namespace=self.namespace, label_selector=selector
        )
        return list(listing.items)

    async def kubectl_apply(self, docs: list[dict[str, Any]]) -> str:
        listing = json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}).encode()
        return await self.plane.kubectl(
            "apply", "--server-side", "--field-manager=capl-e2e", "-f", "-", stdin=listing
        )


def _free_cidr(uri: str) -> str:
    conn = open_libvirt(uri)
    try:
        return free_cidr(conn=conn)
    finally:
        conn.close()


@pytest.fixture(scope="module")
async def bed(
    control_plane_factory: ControlPlaneFactory,
    capi_assets: CapiAssets,
    libvirt_provider: LocalProvider,
    capl_manager_factory: CaplManagerFactory,
    shared_test_driver: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[ClassBed]:
    workdir = tmp_path_factory.mktemp("clusterclass")
    t0 = time.monotonic()
    plane = await control_plane_factory()
    clusterctl = new_clusterctl(
        capi=capi_assets, plane=plane, workdir=workdir / "clusterctl", providers=[libvirt_provider]
    )
    await clusterctl.init(plane, bootstrap=("kubeadm",), control_plane=("kubeadm",))
    t1 = time.monotonic()
    core = CapiCore(
        plane=plane, capi=capi_assets, workdir=workdir / "capi-core", feature_gates=TOPOLOGY_GATES
    )
    providers = KubeadmProviders.for_plane(
        plane=plane, capi=capi_assets, workdir=workdir, feature_gates=TOPOLOGY_GATES
    )
    api: KubeClient | None = None
    bed: ClassBed | None = None
    try:
        await asyncio.gather(core.start(), providers.start())
        t2 = time.monotonic()
        capl = await capl_manager_factory(
            plane, name="capl-clusterclass", extra_args=list(CAPL_E2E_ARGS)
        )
        await capl.install_webhooks()
        await capl.start()  # stopped by its factory
        t3 = time.monotonic()
        api = await KubeClient.connect(str(plane.kubeconfig))
        namespace = f"cc-{secrets.token_hex(3)}"
        await plane.kubectl("create", "namespace", namespace)
        bed = ClassBed(
            plane=plane, clusterctl=clusterctl, core=core, providers=providers, capl=capl,
            api=api, namespace=namespace, host=shared_test_driver, workdir=workdir,
        )  # fmt: skip
        for stage, seconds in (
            ("control plane + clusterctl init (kubeadm, libvirt)", t1 - t0),
            ("CAPI core + kubeadm providers (ClusterTopology on)", t2 - t1),
            ("capl manager with webhooks", t3 - t2),
        ):
            record_timing(f"clusterclass management: {stage}", seconds)
        yield bed
    finally:
        if bed is not None:
            await _delete_clusters(bed)
        if api is not None:
            await api.close()
        await providers.stop()
        await core.stop()


async def _delete_clusters(bed: ClassBed) -> None:
    """Delete every Cluster of the module and wait for capl to remove their LibvirtClusters
    (networks and pools on the test driver); sweep what is left if that does not happen."""
    t0 = time.monotonic()
    for name in bed.clusters:
        with contextlib.suppress(Exception):
            await bed.api.resource(CLUSTER).delete(ObjectKey(bed.namespace, name))
    try:
        await eventually(
            lambda: _none_left(bed), within=120, what="the clusters' LibvirtClusters deleted"
        )
        record_timing("clusterclass: delete the clusters", time.monotonic() - t0)
    except AssertionError:
        removed = await asyncio.to_thread(
            sweep_namespace, bed.host, namespace=bed.namespace, network=None, pool=None
        )
        report(f"clusterclass: clusters not deleted in time; swept {removed}")


async def _none_left(bed: ClassBed) -> bool:
    left = await bed.list_objects(LIBVIRT_CLUSTER)
    assert not left, [o["metadata"]["name"] for o in left]
    return True


# --- the class and clusters from it ------------------------------------------------------------


def topology_variables(cluster: Mapping[str, Any]) -> dict[str, Any]:
    return {v["name"]: v["value"] for v in cluster["spec"]["topology"].get("variables") or []}


def with_variables(cluster: dict[str, Any], **values: Any) -> dict[str, Any]:
    """The Cluster with these topology variables set (others kept)."""
    variables = {**topology_variables(cluster), **values}
    cluster["spec"]["topology"]["variables"] = [
        {"name": k, "value": v} for k, v in variables.items()
    ]
    return cluster


async def generate(bed: ClassBed, name: str, *, cidr: str) -> list[dict[str, Any]]:
    """`clusterctl generate cluster <name> --flavor topology` for the test driver host; the
    image variable becomes the test driver's base volume (the flavor takes a URL)."""
    manifest = await bed.clusterctl.generate_cluster(
        name,
        kubeconfig=bed.plane.kubeconfig,
        flavor="topology",
        target_namespace=bed.namespace,
        kubernetes_version=KUBERNETES_VERSION,
        control_plane_machine_count=1,
        worker_machine_count=1,
        variables={
            "LIBVIRT_URI": bed.host,
            "LIBVIRT_NETWORK_CIDR": cidr,
            "LIBVIRT_NETWORK_MODE": "isolated",
            "LIBVIRT_IMAGE_URL": "http://127.0.0.1:8/unused.qcow2",
            "LIBVIRT_DOMAIN_TYPE": "qemu",
            "LIBVIRT_ROOT_VOLUME_SIZE_GIB": "1",
            "LIBVIRT_CONTROL_PLANE_CPUS": "1",
            "LIBVIRT_CONTROL_PLANE_MEMORY_MIB": "256",
            "LIBVIRT_WORKER_CPUS": "1",
            "LIBVIRT_WORKER_MEMORY_MIB": "128",
        },
    )
    assert "${" not in manifest
    docs = [d for d in yaml.safe_load_all(manifest) if d]
    for doc in docs:
        if doc["kind"] == "Cluster":
            with_variables(doc, image={"volume": BASE_VOLUME, "format": "qcow2"})
            # every old worker may go at once: the workers never become available here
            # (no bootstrap data without an initialized control plane)
            for md in doc["spec"]["topology"]["workers"]["machineDeployments"]:
                md["rollout"] = {
                    "strategy": {
                        "type": "RollingUpdate",
                        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 4},
                    }
                }
    bed.clusters.append(name)
    return docs


async def apply_class(bed: ClassBed, docs: list[dict[str, Any]]) -> None:
    """Apply the ClusterClass and its templates and wait until Cluster API reconciled the
    class (only then does its webhook check a Cluster's variables against it)."""
    await bed.kubectl_apply([d for d in docs if d["kind"] != "Cluster"])

    async def reconciled() -> bool:
        cc = await bed.get(CLUSTER_CLASS, CLASS)
        assert cc is not None, "no ClusterClass"
        status = cc.get("status") or {}
        assert status.get("observedGeneration") == cc["metadata"]["generation"], status
        assert status.get("variables"), status
        return True

    await eventually(reconciled, within=60, what="ClusterClass reconciled")


async def libvirt_cluster_of(bed: ClassBed, name: str) -> Obj:
    async def provisioned() -> Obj:
        cluster = await bed.get(CLUSTER, name)
        assert cluster is not None
        ref = cluster["spec"].get("infrastructureRef") or {}
        assert ref.get("name"), "no infrastructureRef yet"
        lc = await bed.get(LIBVIRT_CLUSTER, ref["name"])
        assert lc is not None, f"no LibvirtCluster {ref['name']}"
        assert (lc.get("status") or {}).get("initialization", {}).get("provisioned"), lc.get(
            "status"
        )
        return lc

    return await eventually(provisioned, within=90, what=f"{name}'s LibvirtCluster provisioned")


async def worker_machines(bed: ClassBed, cluster: str) -> list[Obj]:
    """The LibvirtMachines of the cluster's md-0 Machines that are not being deleted."""
    machines = await bed.list_objects(
        MACHINE, f"{CLUSTER_NAME_LABEL}={cluster},{MD_TOPOLOGY_LABEL}=md-0"
    )
    found = []
    for machine in machines:
        if machine["metadata"].get("deletionTimestamp"):
            continue
        infra = await bed.get(LIBVIRT_MACHINE, machine["spec"]["infrastructureRef"]["name"])
        if infra is not None and not infra["metadata"].get("deletionTimestamp"):
            found.append(infra)
    return found


async def md_of(bed: ClassBed, cluster: str) -> Obj:
    async def one() -> Obj:
        mds = await bed.list_objects(
            MACHINE_DEPLOYMENT, f"{CLUSTER_NAME_LABEL}={cluster},{MD_TOPOLOGY_LABEL}=md-0"
        )
        assert len(mds) == 1, [m["metadata"]["name"] for m in mds]
        return mds[0]

    return await eventually(one, within=90, what=f"{cluster}'s MachineDeployment md-0")


def sized(cpus: int, memory_mib: int, count: int) -> Any:
    def check(machines: list[Obj]) -> bool:
        shapes = [(m["spec"]["cpus"], m["spec"]["memoryMiB"]) for m in machines]
        assert shapes == [(cpus, memory_mib)] * count, shapes
        return True

    return check


async def patch_cluster(bed: ClassBed, name: str, change: Mapping[str, Any]) -> None:
    await bed.api.resource(CLUSTER).patch(ObjectKey(bed.namespace, name), change)


async def test_cluster_from_the_class_scales_and_rolls_out(bed: ClassBed) -> None:
    t0 = time.monotonic()
    cluster = await _create_from_the_class(bed, "alpha")
    kcp_name, cp_template = await _control_plane_of(bed, "alpha", cpus=1, memory_mib=256)

    # The workers: md-0 once the control plane has a machine; its template carries the
    # autoscaler's capacity (capl's template controller).
    t1 = time.monotonic()
    first_template = await _worker_template(bed, "alpha", capacity=("1", "128Mi"))
    await eventually(
        lambda: _check(worker_machines(bed, "alpha"), sized(1, 128, 1)),
        within=90, what="one worker LibvirtMachine of 1 vCPU, 128 MiB",
    )  # fmt: skip
    record_timing("clusterclass: LibvirtCluster -> worker LibvirtMachine", time.monotonic() - t1)

    # Scale the worker topology: 1 -> 2.
    t2 = time.monotonic()
    mds = cluster["spec"]["topology"]["workers"]["machineDeployments"]
    mds[0]["replicas"] = 2
    await patch_cluster(
        bed, "alpha", {"spec": {"topology": {"workers": {"machineDeployments": mds}}}}
    )
    await eventually(
        lambda: _check(worker_machines(bed, "alpha"), sized(1, 128, 2)),
        within=90, what="two worker LibvirtMachines",
    )  # fmt: skip
    record_timing("clusterclass: scale md-0 1 -> 2", time.monotonic() - t2)

    # Change variables: the templates are rotated and the workers rolled over.
    t3 = time.monotonic()
    with_variables(cluster, workerCPUs=2, workerMemoryMiB=192, controlPlaneCPUs=2)
    variables = cluster["spec"]["topology"]["variables"]
    await patch_cluster(bed, "alpha", {"spec": {"topology": {"variables": variables}}})
    try:
        await eventually(
            lambda: _check(worker_machines(bed, "alpha"), sized(2, 192, 2)),
            within=120, what="the workers rolled over to 2 vCPUs, 192 MiB",
        )  # fmt: skip
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{bed.logs()}") from None
    record_timing(
        "clusterclass: workerCPUs/workerMemoryMiB changed -> rolled out", time.monotonic() - t3
    )
    new_template = await _worker_template(bed, "alpha", capacity=("2", "192Mi"))
    assert new_template != first_template, "the worker template was not rotated"
    await _control_plane_rotated(bed, kcp_name, old=cp_template, cpus=2)
    report(
        f"clusterclass: Cluster applied -> workers rolled out to the new size in "
        f"{time.monotonic() - t0:.1f} s"
    )

    # capl's webhook let the topology controller's dry run through, yet still refuses a
    # direct change of a template's spec.
    with pytest.raises(Exception, match="immutable"):
        await bed.api.resource(LIBVIRT_MACHINE_TEMPLATE).patch(
            ObjectKey(bed.namespace, new_template),
            {"spec": {"template": {"spec": {"cpus": 3}}}},
        )


async def _create_from_the_class(bed: ClassBed, name: str) -> dict[str, Any]:
    """The first Cluster: generated with the class, the class applied and reconciled, the
    Cluster applied, its LibvirtCluster shaped by hosts, networkCIDR, networkMode and
    provisioned (the base volume put into its pool). Returns the Cluster as applied."""
    t0 = time.monotonic()
    cidr = await asyncio.to_thread(_free_cidr, bed.host)
    bed.cidrs.append(cidr)
    docs = await generate(bed, name, cidr=cidr)
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == sorted(
        [
            "ClusterClass", "LibvirtClusterTemplate", "LibvirtMachineTemplate",
            "LibvirtMachineTemplate", "KubeadmControlPlaneTemplate", "KubeadmConfigTemplate",
            "Cluster",
        ]
    ), kinds  # fmt: skip
    await apply_class(bed, docs)
    (cluster,) = [d for d in docs if d["kind"] == "Cluster"]
    await bed.kubectl_apply([cluster])
    try:
        lc = await libvirt_cluster_of(bed, name)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{bed.logs()}") from None
    record_timing(
        "clusterclass: Cluster applied -> LibvirtCluster provisioned", time.monotonic() - t0
    )
    assert [(h["name"], h["uri"]) for h in lc["spec"]["hosts"]] == [("host0", bed.host)]
    assert (lc["spec"]["network"]["cidr"], lc["spec"]["network"]["mode"]) == (cidr, "isolated")
    pool = lc["spec"]["storagePool"]["name"]
    await asyncio.to_thread(put_base_volume, bed.host, pool, BASE_VOLUME)
    return cluster


async def _control_plane_of(
    bed: ClassBed, name: str, *, cpus: int, memory_mib: int
) -> tuple[str, str]:
    """The Cluster's KubeadmControlPlane and its machine template (of the class's size):
    their names."""
    kcp_ref = (await bed.get(CLUSTER, name) or {})["spec"]["controlPlaneRef"]
    kcp = await bed.get(KUBEADM_CONTROL_PLANE, kcp_ref["name"])
    assert kcp is not None
    assert kcp["spec"]["version"] == KUBERNETES_VERSION
    template_name = kcp["spec"]["machineTemplate"]["spec"]["infrastructureRef"]["name"]
    template = await bed.get(LIBVIRT_MACHINE_TEMPLATE, template_name)
    assert template is not None
    spec = template["spec"]["template"]["spec"]
    assert (spec["cpus"], spec["memoryMiB"]) == (cpus, memory_mib)
    return str(kcp_ref["name"]), str(template_name)


async def _worker_template(bed: ClassBed, name: str, *, capacity: tuple[str, str]) -> str:
    """The name of md-0's LibvirtMachineTemplate once its status shows `capacity` (cpu,
    memory): capl's template controller, from the size the variables gave it."""

    async def current() -> str:
        md = await md_of(bed, name)
        template = md["spec"]["template"]["spec"]["infrastructureRef"]["name"]
        status = await _template_status(bed, template)
        assert status["capacity"] == {"cpu": capacity[0], "memory": capacity[1]}, status
        assert status["nodeInfo"] == {"architecture": "amd64", "operatingSystem": "linux"}
        return str(template)

    return await eventually(current, within=60, what=f"md-0's template with {capacity}")


async def _control_plane_rotated(bed: ClassBed, kcp_name: str, *, old: str, cpus: int) -> None:
    """The KubeadmControlPlane points at a new machine template of `cpus` (its own rollout
    waits for a healthy workload control plane, which does not exist here)."""

    async def rotated() -> bool:
        kcp = await bed.get(KUBEADM_CONTROL_PLANE, kcp_name)
        assert kcp is not None
        ref = kcp["spec"]["machineTemplate"]["spec"]["infrastructureRef"]["name"]
        assert ref != old, "the control-plane template was not rotated"
        template = await bed.get(LIBVIRT_MACHINE_TEMPLATE, ref)
        assert template is not None
        assert template["spec"]["template"]["spec"]["cpus"] == cpus
        return True

    await eventually(rotated, within=30, what="control-plane template rotated")


async def _check(coro: Any, check: Any) -> bool:
    return bool(check(await coro))


async def _template_status(bed: ClassBed, name: str) -> dict[str, Any]:
    template = await bed.get(LIBVIRT_MACHINE_TEMPLATE, name)
    assert template is not None, f"no LibvirtMachineTemplate {name}"
    status: dict[str, Any] = template.get("status") or {}
    assert status.get("capacity"), status
    return status


async def test_two_clusters_from_one_class_on_one_host(bed: ClassBed) -> None:
    """Another CIDR: side by side. The same CIDR: refused, nothing made."""
    assert bed.cidrs, "runs after test_cluster_from_the_class_scales_and_rolls_out"
    t0 = time.monotonic()
    cidr = await asyncio.to_thread(_free_cidr, bed.host)
    docs = await generate(bed, "beta", cidr=cidr)
    (beta,) = [d for d in docs if d["kind"] == "Cluster"]
    await bed.kubectl_apply([beta])
    lc_beta = await libvirt_cluster_of(bed, "beta")
    record_timing(
        "clusterclass: second cluster -> LibvirtCluster provisioned", time.monotonic() - t0
    )
    lc_alpha = await libvirt_cluster_of(bed, "alpha")
    assert lc_beta["spec"]["network"]["cidr"] == cidr != lc_alpha["spec"]["network"]["cidr"]
    assert lc_beta["spec"]["network"]["name"] != lc_alpha["spec"]["network"]["name"]
    assert lc_beta["spec"]["storagePool"]["name"] != lc_alpha["spec"]["storagePool"]["name"]

    docs = await generate(bed, "gamma", cidr=bed.cidrs[0])
    (gamma,) = [d for d in docs if d["kind"] == "Cluster"]
    await bed.kubectl_apply([gamma])

    async def refused() -> str:
        cluster = await bed.get(CLUSTER, "gamma")
        assert cluster is not None
        condition = condition_of(cluster, "TopologyReconciled")
        assert condition.get("status") == "False", condition
        message = str(condition.get("message"))
        assert "spec.network.cidr" in message, message
        return message

    message = await eventually(refused, within=60, what="gamma refused for its CIDR")
    report(f"clusterclass: gamma's TopologyReconciled: {message[:200]}")
    assert f"{bed.cidrs[0]} overlaps {bed.cidrs[0]}" in message, message
    owned = [
        o
        for o in await bed.list_objects(LIBVIRT_CLUSTER)
        if o["metadata"]["name"].startswith("gamma")
    ]
    assert owned == [], [o["metadata"]["name"] for o in owned]


async def test_variable_out_of_range_is_refused(bed: ClassBed) -> None:
    cidr = await asyncio.to_thread(_free_cidr, bed.host)
    docs = await generate(bed, "delta", cidr=cidr)
    (delta,) = [d for d in docs if d["kind"] == "Cluster"]
    with_variables(delta, workerCPUs=0)
    with pytest.raises(ControlPlaneError) as refused:
        await bed.kubectl_apply([delta])
    message = str(refused.value)
    assert "spec.topology.variables[workerCPUs]" in message, message
    report("clusterclass: refused: " + message[message.index("spec.topology.variables") :][:160])
    assert await bed.get(CLUSTER, "delta") is None

    # the same on an update of a running cluster
    alpha = await bed.get(CLUSTER, "alpha")
    assert alpha is not None
    variables = [
        {"name": v["name"], "value": 600 if v["name"] == "controlPlaneCPUs" else v["value"]}
        for v in alpha["spec"]["topology"]["variables"]
    ]
    with pytest.raises(Exception, match="controlPlaneCPUs"):
        await patch_cluster(bed, "alpha", {"spec": {"topology": {"variables": variables}}})
