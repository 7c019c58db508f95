"""`clusterctl upgrade` of capl under a running workload cluster: machines kept.

The local repository of `make release-manifests` carries two release series of capl: this
version vX.Y.Z and the next minor vX.(Y+1).0, both made from this tree (the next one differs
in its version only: image tag, metadata.yaml; hack/release-manifests.sh). One management
cluster (tests/e2e/harness/ `start_management`: `clusterctl init --infrastructure libvirt`
installs vX.Y.Z, the version its clusterctl.yaml URL names) runs a cluster of the testbed
flavor: a control-plane Machine and one md-ignition worker, real TCG guests of the test
image. Then, as an operator would:

- `clusterctl upgrade plan` offers vX.(Y+1).0 for infrastructure-libvirt (and nothing for the
  core provider);
- the running capl manager stops (what clusterctl's scale-down of the Deployment does to its
  Pod; the managers are local processes here, there is no kubelet);
- `clusterctl upgrade apply --infrastructure libvirt:vX.(Y+1).0` deletes capl's components
  but its CRDs, Namespace and inventory entry, creates the new ones and patches the
  inventory (cluster-api v1.13 upgrader.go `doUpgrade`);
- the manager of the new version starts (the same code staged with the new `__version__`,
  `stage_capl_source`: it reports vX.(Y+1).0 in its start log line), and the webhook
  configurations clusterctl re-created are pointed at it.

What must hold: the inventory says vX.(Y+1).0; the CRDs and ClusterRoles are the same
objects (same UIDs), the webhook configurations, the ServiceAccount and the Deployment new
ones (the Deployment with the new image tag); the Cluster,
LibvirtCluster, Machines and LibvirtMachines are the same objects (UIDs) and Ready/Running
again under the new manager; libvirt has exactly the same domains, none restarted (same
UUIDs, same runtime ids) and the guests did not boot again (their console logs show one
boot each); no DomainCreated/DomainRecreated/DomainRestarted event; `upgrade plan` then
says up to date; and the upgraded capl still makes machines (md-ignition scaled 1 -> 2).
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from capl.runtime.resources import (
    CLUSTER,
    EVENT,
    LIBVIRT_CLUSTER,
    LIBVIRT_MACHINE,
    MACHINE,
    Resource,
)
from capl.testbed import ControlPlane
from capl.testbed.capi import CapiMissing
from capl.testbed.caplmanager import INFRA_PROVIDER, REPO, CaplManager
from capl.testbed.clusterctl import (
    LocalProvider,
    find_local_provider,
    next_minor,
    stage_capl_source,
)
from tests.e2e.harness import (
    CAPL_E2E_ARGS,
    MACHINE_DEPLOYMENT,
    MACHINE_SET,
    DomainFacts,
    KubeletStandIn,
    LibvirtView,
    Management,
    ManagementParts,
    WorkloadCluster,
    is_true,
    name_of,
    report,
    serving_kubelet,
    workload_cluster,
)
from tests.fixtures.capi import ControlPlaneFactory, record_timing
from tests.fixtures.capl import CaplManagerFactory
from tests.fixtures.common import eventually, require_part

pytestmark = [pytest.mark.e2e, pytest.mark.apiserver, pytest.mark.libvirtd, pytest.mark.guest]

BOOT = 240.0
KEPT_KINDS: tuple[Resource, ...] = (
    CLUSTER,
    LIBVIRT_CLUSTER,
    MACHINE,
    LIBVIRT_MACHINE,
    MACHINE_SET,
    MACHINE_DEPLOYMENT,
)
"""The cluster's objects an upgrade must leave as they are (compared by UID)."""
BAD_EVENTS = frozenset({"DomainCreated", "DomainRecreated", "DomainRestarted"})
PROVIDER_SELECTOR = f"cluster.x-k8s.io/provider={INFRA_PROVIDER}"
WEBHOOK_KINDS = ("validatingwebhookconfigurations", "mutatingwebhookconfigurations")


@pytest.fixture(scope="module")
def next_release(release_dir: Path, libvirt_provider: LocalProvider) -> LocalProvider:
    """The next minor release beside `libvirt_provider` in the same local repository."""
    try:
        return find_local_provider(release_dir, version=next_minor(libvirt_provider.version))
    except CapiMissing as e:
        require_part("capl's next minor in the clusterctl repository", str(e))
        raise  # not reached


@pytest.fixture(scope="module")
async def management(
    management_parts: ManagementParts, next_release: LocalProvider
) -> AsyncIterator[Management]:
    async with management_parts.running("upgrade") as mgmt:
        yield mgmt


@pytest.fixture(scope="module")
async def workload_plane(control_plane_factory: ControlPlaneFactory) -> ControlPlane:
    t0 = time.monotonic()
    plane = await control_plane_factory()
    record_timing("upgrade: the workload cluster's API server", time.monotonic() - t0)
    return plane


@pytest.fixture(scope="module")
async def kubelet(workload_plane: ControlPlane, view: LibvirtView) -> AsyncIterator[KubeletStandIn]:
    async with serving_kubelet(workload_plane, view) as stand_in:
        yield stand_in


@pytest.fixture(scope="module")
async def cluster(
    management: Management,
    kubelet: KubeletStandIn,
    workload_plane: ControlPlane,
    guest_image: Path,
    libvirtd_uri: str,
) -> AsyncIterator[WorkloadCluster]:
    async with workload_cluster(
        management,
        namespace=f"e2e-upgrade-{secrets.token_hex(3)}",
        name="up",
        kubelet=kubelet,
        workload_plane=workload_plane,
        guest_image=guest_image,
        uri=libvirtd_uri,
        ignition_workers=1,
    ) as workload:
        yield workload


async def kubectl_json(plane: ControlPlane, *args: str) -> dict[str, Any]:
    parsed: dict[str, Any] = json.loads(await plane.kubectl("get", *args, "-o", "json"))
    return parsed


async def provider_inventory(plane: ControlPlane) -> dict[str, Any]:
    return await kubectl_json(
        plane, "providers.clusterctl.cluster.x-k8s.io", "-n", "capl-system", INFRA_PROVIDER
    )


async def uids(plane: ControlPlane, kind: str, *args: str) -> dict[str, str]:
    """name -> UID of capl's objects of one kind (selected by clusterctl's provider label)."""
    listing = await kubectl_json(plane, kind, "-l", PROVIDER_SELECTOR, *args)
    return {o["metadata"]["name"]: o["metadata"]["uid"] for o in listing["items"]}


async def webhook_urls(plane: ControlPlane) -> list[str]:
    urls = []
    for kind in WEBHOOK_KINDS:
        for config in (await kubectl_json(plane, kind, "-l", PROVIDER_SELECTOR))["items"]:
            urls += [str(w["clientConfig"].get("url")) for w in config["webhooks"]]
    return urls


async def cluster_uids(workload: WorkloadCluster) -> dict[str, str]:
    """Kind/name -> UID of every object of the cluster that must be kept."""
    found = {}
    for resource in KEPT_KINDS:
        for obj in await workload.objects(resource):
            found[f"{resource.kind}/{name_of(obj)}"] = obj["metadata"]["uid"]
    return found


def fingerprint(facts: dict[str, DomainFacts]) -> dict[str, tuple[str, int, int]]:
    """name -> (UUID, runtime id, state): a restart changes the runtime id."""
    return {name: (f.uuid, f.id, f.state) for name, f in facts.items()}


async def domain_events(workload: WorkloadCluster) -> dict[str, tuple[str, int]]:
    """Event UID -> (reason, count) of capl's domain lifecycle events in the namespace."""
    events = (await workload.api.resource(EVENT).list(namespace=workload.namespace)).items
    return {
        e["metadata"]["uid"]: (str(e.get("reason")), int(e.get("count") or 1))
        for e in events
        if e.get("reason") in BAD_EVENTS
    }


def guest_boots(workload: WorkloadCluster, machines: list[str]) -> dict[str, int]:
    """Machine -> boots its guest printed on its serial console (the test image's marker)."""
    boots = {}
    for machine in machines:
        record = workload.guest(machine)
        assert record is not None, f"no console log of {machine}"
        boots[machine] = record.boots
    return boots


async def successful_reconciles(manager: CaplManager, controller: str) -> float:
    """controller_runtime_reconcile_total of `controller`, every result but "error" (a
    provisioned machine's reconcile ends with requeue_after: its next look)."""
    total = 0.0
    for line in (await manager.metrics()).splitlines():
        if not line.startswith("controller_runtime_reconcile_total{"):
            continue
        labels, value = line.rsplit(None, 1)
        if f'controller="{controller}"' in labels and 'result="error"' not in labels:
            total += float(value)
    return total


async def start_upgraded_capl(
    management: Management,
    factory: CaplManagerFactory,
    *,
    version: str,
    workdir: Path,
) -> CaplManager:
    """capl of `version` as a process (the tree staged with that __version__), its webhook
    configurations (re-created by clusterctl, Service-based again) pointed at it; checks it
    is a new process that says it is `version` and that every webhook goes to it."""
    old_pid = management.capl.pid
    staged = stage_capl_source(REPO / "capl", workdir, version=version.lstrip("v"))
    capl = await factory(
        management.plane,
        name="capl-upgraded",
        extra_args=list(CAPL_E2E_ARGS),
        env={"PYTHONPATH": str(staged)},
    )
    capl.resolv_conf = management.capl.resolv_conf
    await capl.install_webhooks()
    await capl.start()
    management.capl = capl
    assert capl.pid != old_pid
    (started,) = [r for r in capl.log_records() if r.get("event") == "starting capl manager"]
    assert (started["version"], started["pid"]) == (version.lstrip("v"), capl.pid)
    urls = await webhook_urls(management.plane)
    assert urls
    assert all(u.startswith(capl.webhook_url + "/") for u in urls), urls
    return capl


@dataclass(frozen=True)
class Before:
    """The management cluster and the workload cluster just before the upgrade."""

    inventory_uid: str
    crds: dict[str, str]
    cluster_roles: dict[str, str]
    replaced: dict[str, dict[str, str]]
    """kind -> name -> UID of capl's objects clusterctl must re-create."""
    objects: dict[str, str]
    domains: dict[str, tuple[str, int, int]]
    boots: dict[str, int]
    events: dict[str, tuple[str, int]]


REPLACED_KINDS: tuple[tuple[str, ...], ...] = (
    *((kind,) for kind in WEBHOOK_KINDS),
    ("deployments", "-n", "capl-system"),
    ("serviceaccounts", "-n", "capl-system"),
)


async def snapshot(plane: ControlPlane, cluster: WorkloadCluster, machines: list[str]) -> Before:
    inventory = await provider_inventory(plane)
    before = Before(
        inventory_uid=inventory["metadata"]["uid"],
        crds=await uids(plane, "customresourcedefinitions"),
        cluster_roles=await uids(plane, "clusterroles"),
        replaced={args[0]: await uids(plane, *args) for args in REPLACED_KINDS},
        objects=await cluster_uids(cluster),
        domains=fingerprint(cluster.domains()),
        boots=guest_boots(cluster, machines),
        events=await domain_events(cluster),
    )
    assert before.crds
    assert before.cluster_roles
    assert all(before.replaced.values()), before.replaced
    assert len(before.replaced["deployments"]) == 1, before.replaced
    assert set(before.domains) == {cluster.domain_of(m) for m in machines}
    assert set(before.boots.values()) == {1}, before.boots
    return before


async def assert_components_replaced(plane: ControlPlane, before: Before, version: str) -> None:
    """The inventory and the CRDs and ClusterRoles kept, the rest re-created; the Deployment
    of the new version."""
    inventory = await provider_inventory(plane)
    assert inventory["version"] == version
    assert inventory["metadata"]["uid"] == before.inventory_uid
    assert await uids(plane, "customresourcedefinitions") == before.crds
    assert await uids(plane, "clusterroles") == before.cluster_roles
    for args in REPLACED_KINDS:
        kind, old = args[0], before.replaced[args[0]]
        new = await uids(plane, *args)
        assert set(new) == set(old), kind
        assert not set(new.values()) & set(old.values()), f"{kind} not re-created"
    (name,) = before.replaced["deployments"]
    deployment = await kubectl_json(plane, "deployments", "-n", "capl-system", name)
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"].endswith(f":{version}"), container["image"]


async def assert_cluster_untouched(cluster: WorkloadCluster, before: Before) -> None:
    """Same objects, same domains never restarted, no second boot, no domain event."""
    assert await cluster_uids(cluster) == before.objects
    assert fingerprint(cluster.domains()) == before.domains
    assert guest_boots(cluster, list(before.boots)) == before.boots
    assert await domain_events(cluster) == before.events
    lcluster = await cluster.get(LIBVIRT_CLUSTER, cluster.name)
    assert lcluster is not None
    assert is_true(lcluster, "Ready"), lcluster.get("status")


@pytest.mark.timeout(1200)
async def test_upgrade_to_the_next_minor_keeps_the_machines(
    management: Management,
    cluster: WorkloadCluster,
    libvirt_provider: LocalProvider,
    next_release: LocalProvider,
    capl_manager_factory: CaplManagerFactory,
    tmp_path: Path,
) -> None:
    t_test = time.monotonic()
    plane = management.plane
    old, new = libvirt_provider.version, next_release.version
    machines = await cluster.wait_running(None, 2, within=BOOT)

    async def available(replicas: int) -> bool:
        md = await cluster.get(MACHINE_DEPLOYMENT, cluster.md_ignition)
        return ((md or {}).get("status") or {}).get("availableReplicas") == replicas

    await eventually(lambda: available(1), within=60, what="the worker available")
    record_timing("upgrade: cluster Running (control plane + 1 worker)", time.monotonic() - t_test)
    assert (await provider_inventory(plane))["version"] == old
    before = await snapshot(plane, cluster, list(machines))
    plan = await management.clusterctl.upgrade_plan(plane)
    assert (plan[INFRA_PROVIDER].current, plan[INFRA_PROVIDER].next) == (old, new)
    assert plan["cluster-api"].next is None

    # the upgrade: old manager down, clusterctl upgrade apply, new manager up
    t0 = time.monotonic()
    await management.capl.stop()
    t1 = time.monotonic()
    applied = await management.clusterctl.upgrade_apply(plane, infrastructure=[f"libvirt:{new}"])
    t2 = time.monotonic()
    assert "Deleting" in applied, applied
    assert "Installing" in applied, applied
    await assert_components_replaced(plane, before, new)
    capl = await start_upgraded_capl(
        management, capl_manager_factory, version=new, workdir=tmp_path / "capl-next"
    )
    t3 = time.monotonic()

    # the new manager runs the same cluster: same objects, Ready again, nothing touched
    async def settled() -> bool:
        lms = await cluster.objects(LIBVIRT_MACHINE)
        if {name_of(lm) for lm in lms} != set(machines):
            return False
        if not all(is_true(lm, "Ready") for lm in lms):
            return False
        # the new manager went through them (its informers list every object at start)
        if await successful_reconciles(capl, "libvirtmachine") < len(machines):
            return False
        current = await cluster.machines()
        return all(m.get("status", {}).get("phase") == "Running" for m in current.values())

    await eventually(
        settled, within=120, what="the cluster Ready under the new capl", explain=cluster.explain
    )
    t4 = time.monotonic()
    assert [r for r in capl.log_records() if r.get("level") == "error"] == []
    await assert_cluster_untouched(cluster, before)
    plan = await management.clusterctl.upgrade_plan(plane)
    assert (plan[INFRA_PROVIDER].current, plan[INFRA_PROVIDER].next) == (new, None)

    # the upgraded capl makes machines: md-ignition 1 -> 2
    t5 = time.monotonic()
    await cluster.scale(cluster.md_ignition, 2)
    workers = await cluster.wait_running(cluster.md_ignition, 2, within=BOOT)
    await eventually(lambda: available(2), within=60, what="both workers available")
    t6 = time.monotonic()
    (added,) = set(workers) - set(machines)
    assert cluster.domains()[cluster.domain_of(added)].running
    kept = {name: facts for name, facts in cluster.domains().items() if name in before.domains}
    assert fingerprint(kept) == before.domains
    assert cluster.kubelet.errors == []

    timings = {
        "old capl stopped": t1 - t0,
        "clusterctl upgrade apply": t2 - t1,
        "new capl started, webhooks re-pointed": t3 - t2,
        "cluster Ready under the new capl": t4 - t3,
        "scale-up 1 -> 2 after the upgrade": t6 - t5,
        "whole test (cluster creation included)": time.monotonic() - t_test,
    }
    for stage, seconds in timings.items():
        record_timing(f"upgrade {old} -> {new}: {stage}", seconds)
    report(
        f"clusterctl upgrade {old} -> {new}: apply {t2 - t1:.1f} s, capl down "
        f"{t3 - t0:.1f} s, machines Ready again {t4 - t3:.1f} s after"
    )
