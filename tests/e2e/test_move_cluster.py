"""`clusterctl move` of a running workload cluster between two management clusters.

Three control planes: management clusters `source` and `target` (each with `clusterctl init`,
its own Cluster API core manager and its own `capl manager`, tests/e2e/harness/), and a
third API server that plays the workload cluster's (the stand-in kubelet registers the
guests' Nodes there; `<cluster>-kubeconfig` points at it), so after the move the source
management cluster holds nothing of the cluster at all.

The cluster (control plane + one md-ignition worker, real TCG guests) is created and runs on
the source. Both capl managers run during the move, as in a real pair of management clusters
(clusterctl needs the providers' webhooks on both sides): clusterctl pauses the Cluster,
creates every object on the target (statuses are not carried) and deletes them from the
source with the delete-for-move annotation, finalizers removed. Then the source's capl is
stopped and the target's capl owns the cluster. What must hold:

- libvirt: the same domains (names, UUIDs, runtime ids: never restarted), the same volumes,
  DHCP reservations and DNS records; no duplicate, nothing re-created;
- target: Cluster unpaused, Machines Running again, LibvirtMachines Ready with the addresses
  re-populated (status was not moved) and their identity (domainUUID, providerID, hostName)
  unchanged; no DomainCreated/DomainRecreated/DomainRestarted events;
- source: no Cluster API or capl object and no Secret of the cluster left; a Secret with only
  the `clusterctl.cluster.x-k8s.io/move` label (what capl adds to credentials Secrets, for
  where owner references are refused) is taken too;
- the target can run the cluster: a scale-up boots a new worker, and deleting the Cluster
  there removes every domain, volume, network and pool.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from capl.api.constants import CLUSTERCTL_MOVE_LABEL
from capl.kube import KubeClient
from capl.runtime.objects import Obj, ObjectKey
from capl.runtime.resources import (
    CLUSTER,
    EVENT,
    LIBVIRT_CLUSTER,
    LIBVIRT_MACHINE,
    LIBVIRT_MACHINE_TEMPLATE,
    MACHINE,
    SECRET,
    Resource,
)
from capl.testbed import ControlPlane
from tests.e2e.harness import (
    MACHINE_DEPLOYMENT,
    MACHINE_SET,
    DomainFacts,
    KubeletStandIn,
    LibvirtView,
    Management,
    ManagementParts,
    WorkloadCluster,
    delete_cluster,
    internal_ip,
    is_true,
    name_of,
    serving_kubelet,
    workload_cluster,
)
from tests.fixtures.capi import ControlPlaneFactory, record_timing
from tests.fixtures.common import eventually

pytestmark = [pytest.mark.e2e, pytest.mark.apiserver, pytest.mark.libvirtd, pytest.mark.guest]

BOOT = 240.0
LIVE_KINDS: tuple[Resource, ...] = (
    CLUSTER,
    MACHINE,
    MACHINE_SET,
    MACHINE_DEPLOYMENT,
    LIBVIRT_CLUSTER,
    LIBVIRT_MACHINE,
)
"""What a Cluster deletion removes (no garbage collector here: templates and Secrets owned by
the Cluster stay)."""
CLUSTER_KINDS: tuple[Resource, ...] = (*LIVE_KINDS, LIBVIRT_MACHINE_TEMPLATE)


@pytest.fixture(scope="module")
async def pair(management_parts: ManagementParts) -> AsyncIterator[tuple[Management, Management]]:
    async with (
        management_parts.running("source") as source,
        management_parts.running("target") as target,
    ):
        yield source, target


@pytest.fixture(scope="module")
async def workload_plane(control_plane_factory: ControlPlaneFactory) -> ControlPlane:
    t0 = time.monotonic()
    plane = await control_plane_factory()
    record_timing("move: the workload cluster's API server", time.monotonic() - t0)
    return plane


@pytest.fixture(scope="module")
async def kubelet(workload_plane: ControlPlane, view: LibvirtView) -> AsyncIterator[KubeletStandIn]:
    async with serving_kubelet(workload_plane, view) as stand_in:
        yield stand_in


@pytest.fixture(scope="module")
async def cluster(
    pair: tuple[Management, Management],
    kubelet: KubeletStandIn,
    workload_plane: ControlPlane,
    guest_image: Path,
    libvirtd_uri: str,
) -> AsyncIterator[WorkloadCluster]:
    source, _target = pair
    async with workload_cluster(
        source,
        namespace=f"e2e-move-{secrets.token_hex(3)}",
        name="mv",
        kubelet=kubelet,
        workload_plane=workload_plane,
        guest_image=guest_image,
        uri=libvirtd_uri,
        ignition_workers=1,
    ) as workload:
        yield workload


def fingerprint(facts: dict[str, DomainFacts]) -> dict[str, tuple[str, int, int]]:
    """name -> (UUID, runtime id, state): what a move must leave exactly as it was."""
    return {name: (f.uuid, f.id, f.state) for name, f in facts.items()}


async def left_on(
    api: KubeClient, namespace: str, cluster: str, kinds: tuple[Resource, ...] = CLUSTER_KINDS
) -> list[str]:
    """Every object of the cluster still in a management cluster (kind/name); with the
    default kinds also the cluster's Secrets."""
    found = []
    for resource in kinds:
        listing = await api.resource(resource).list(namespace=namespace)
        found += [f"{resource.kind}/{name_of(o)}" for o in listing.items]
    if kinds == CLUSTER_KINDS:
        for secret in (await api.resource(SECRET).list(namespace=namespace)).items:
            if name_of(secret).startswith(f"{cluster}-"):
                found.append(f"Secret/{name_of(secret)}")
    return found


@pytest.mark.timeout(1200)
async def test_clusterctl_move_hands_the_running_domains_to_the_target(
    pair: tuple[Management, Management], cluster: WorkloadCluster, kubelet: KubeletStandIn
) -> None:
    source, target = pair
    ns, name = cluster.namespace, cluster.name
    machines = await cluster.wait_running(None, 2, within=BOOT)

    async def available() -> bool:
        md = await cluster.get(MACHINE_DEPLOYMENT, cluster.md_ignition)
        return ((md or {}).get("status") or {}).get("availableReplicas") == 1

    await eventually(available, within=60, what="the worker available on the source")
    before_domains = fingerprint(cluster.domains())
    assert set(before_domains) == {cluster.domain_of(m) for m in machines}
    before_volumes = cluster.view.volumes(cluster.pool)
    network = cluster.network_facts()
    assert network is not None
    before_dhcp, before_dns = set(network.dhcp_hosts), set(network.dns_hosts)
    identity: dict[str, tuple[str, str, str, str | None]] = {}
    for lm in await cluster.objects(LIBVIRT_MACHINE):
        spec = lm["spec"]
        identity[name_of(lm)] = (
            spec["domainUUID"],
            spec["providerID"],
            spec["hostName"],
            internal_ip(lm),
        )
    assert set(identity) == set(machines)
    # a Secret that only carries the label capl puts on credentials Secrets (where an owner
    # reference is refused, e.g. OwnerReferencesPermissionEnforcement): no owner reference,
    # clusterctl move must take it on the label alone
    labelled = f"{name}-labelled-credentials"
    await source.api.resource(SECRET).create(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": labelled,
                "namespace": ns,
                "labels": {CLUSTERCTL_MOVE_LABEL: ""},
            },
            "data": {"known_hosts": "AAAA"},
        }
    )

    # move, with both managers running (clusterctl talks to both providers' webhooks)
    t0 = time.monotonic()
    await source.clusterctl.run(
        "move",
        f"--to-kubeconfig={target.plane.kubeconfig}",
        f"--namespace={ns}",
        kubeconfig=source.plane.kubeconfig,
        within=300,
    )
    moved = time.monotonic() - t0
    record_timing("clusterctl move (control plane + 1 worker)", moved)
    await source.capl.stop()
    cluster.management = target
    kubelet.retarget(namespace=ns, name=name, management=target.api)

    # the source keeps nothing of the cluster (the labelled Secret included)
    assert await left_on(source.api, ns, name) == []
    taken = await target.api.resource(SECRET).get(ObjectKey(ns, labelled))
    assert taken["data"] == {"known_hosts": "AAAA"}
    assert not taken["metadata"].get("ownerReferences")

    # the target runs it again: unpaused, every Machine Running, every LibvirtMachine Ready
    # with its identity unchanged and its addresses found again (status was not moved)
    t1 = time.monotonic()

    async def settled() -> dict[str, Obj] | None:
        c = await cluster.get(CLUSTER, name)
        if c is None or c["spec"].get("paused") or not is_true(c, "ControlPlaneInitialized"):
            return None
        lms = {name_of(lm): lm for lm in await cluster.objects(LIBVIRT_MACHINE)}
        if set(lms) != set(identity) or not all(is_true(lm, "Ready") for lm in lms.values()):
            return None
        current = await cluster.machines()
        if set(current) != set(machines):
            return None
        if any(m.get("status", {}).get("phase") != "Running" for m in current.values()):
            return None
        return lms

    lms = await eventually(
        settled, within=180, what="the moved cluster Running on the target", explain=cluster.explain
    )
    record_timing("move: target capl + Cluster API re-adopt the cluster", time.monotonic() - t1)
    domains = cluster.domains()
    for lm_name, lm in lms.items():
        spec = lm["spec"]
        assert (spec["domainUUID"], spec["providerID"], spec["hostName"], internal_ip(lm)) == (
            identity[lm_name]
        )
        assert lm["status"]["initialization"]["provisioned"] is True
        # the target's capl took the domain over: its ownership tag names the new object
        owner = domains[cluster.domain_of(lm_name)].owner
        assert owner["uid"] == lm["metadata"]["uid"], owner
        assert (owner["namespace"], owner["name"]) == (ns, lm_name)
    lcluster = await cluster.get(LIBVIRT_CLUSTER, name)
    assert lcluster is not None
    assert is_true(lcluster, "Ready"), lcluster.get("status")

    # libvirt: exactly the same domains, not restarted, nothing new; same volumes and entries
    assert fingerprint(cluster.domains()) == before_domains
    assert cluster.view.volumes(cluster.pool) == before_volumes
    network = cluster.network_facts()
    assert network is not None
    assert set(network.dhcp_hosts) == before_dhcp
    assert set(network.dns_hosts) == before_dns
    events = (await target.api.resource(EVENT).list(namespace=ns)).items
    reasons = {str(e.get("reason")) for e in events}
    assert not reasons & {"DomainCreated", "DomainRecreated", "DomainRestarted"}, reasons

    # the target's capl runs the cluster: a new worker, then the whole cluster deleted
    t2 = time.monotonic()
    await cluster.scale(cluster.md_ignition, 2)
    workers = await cluster.wait_running(cluster.md_ignition, 2, within=BOOT)
    record_timing("move: scale-up on the target", time.monotonic() - t2)
    assert set(cluster.domains()) == {cluster.domain_of(m) for m in [*workers, *machines]}
    assert kubelet.errors == []

    took = await delete_cluster(cluster)
    record_timing("move: Cluster deletion on the target", took)
    assert await left_on(target.api, ns, name, LIVE_KINDS) == []
    assert cluster.domains() == {}
    assert not cluster.view.pool_exists(cluster.pool)
    assert cluster.network_facts() is None
