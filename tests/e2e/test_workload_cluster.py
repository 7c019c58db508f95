"""A workload cluster of real TCG guests driven by the real Cluster API and `capl manager`.

One management cluster for the module (`clusterctl init` + Cluster API core + `capl manager`
as processes, tests/e2e/harness/) and one workload cluster from the `testbed` flavor:
a stand-alone control-plane Machine (Ignition, with a hostname), MachineDeployment
`md-ignition` (a shared Ignition config, no hostname: the node name comes from DHCP) and
`md-cloud-config` (#cloud-config: the hostname from capl's NoCloud meta-data). The stand-in
kubelet registers a Node per booted guest in the management API server itself (the
`<cluster>-kubeconfig` Secret points there).

The tests run in order on that one cluster, each setting the replicas it needs first:
1. every Machine Running, providerIDs equal everywhere (guest SMBIOS, LibvirtMachine,
   Machine, Node, libvirt domain UUID), each Node labelled topology.kubernetes.io/zone with
   its machine's host (failure domain), addresses equal everywhere (guest lease, DHCP
   reservation, DNS record, LibvirtMachine/Machine status);
2. md-ignition 0 -> 3 -> 1 -> 0 with libvirt listed after each step, and the scale-up time
   set against the guests' own boot-to-lease time;
3. a rolling update to a new LibvirtMachineTemplate replaces every worker;
4. a MachineHealthCheck remediates a worker whose domain was destroyed out of band and whose
   Node is gone;
5. deleting the Cluster removes every domain, volume, DHCP/DNS entry, network and pool.
Guests at once: at most 4 (control plane + 3 workers).
"""

from __future__ import annotations

import hashlib
import ipaddress
import math
import secrets
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from capl.kube import KubeClient
from capl.runtime.errors import NotFound
from capl.runtime.objects import Obj, ObjectKey
from capl.runtime.resources import (
    CLUSTER,
    LIBVIRT_CLUSTER,
    LIBVIRT_MACHINE,
    LIBVIRT_MACHINE_TEMPLATE,
    MACHINE,
    NODE,
)
from capl.testing.objects import condition_of
from tests.e2e.harness import (
    CLONED_FROM_ANNOTATION,
    GUEST_MEMORY_MIB,
    MACHINE_DEPLOYMENT,
    MACHINE_HEALTH_CHECK,
    MACHINE_SET,
    GuestRecord,
    KubeletStandIn,
    LibvirtView,
    Management,
    ManagementParts,
    WorkloadCluster,
    delete_cluster,
    guest_summary,
    internal_ip,
    is_true,
    name_of,
    report,
    resolve_a,
    serving_kubelet,
    workload_cluster,
)
from tests.fixtures.capi import record_timing
from tests.fixtures.common import eventually

pytestmark = [pytest.mark.e2e, pytest.mark.apiserver, pytest.mark.libvirtd, pytest.mark.guest]

CLUSTER_NAME = "wl"
BOOT = 240.0  # generous: TCG guests on two shared cores
MIB = 1024


@pytest.fixture(scope="module")
async def management(management_parts: ManagementParts) -> AsyncIterator[Management]:
    async with management_parts.running("workload") as mgmt:
        yield mgmt


@pytest.fixture(scope="module")
async def kubelet(management: Management, view: LibvirtView) -> AsyncIterator[KubeletStandIn]:
    async with serving_kubelet(management.api, view) as stand_in:
        yield stand_in


@pytest.fixture(scope="module")
async def cluster(
    management: Management, kubelet: KubeletStandIn, guest_image: Path, libvirtd_uri: str
) -> AsyncIterator[WorkloadCluster]:
    async with workload_cluster(
        management,
        # unique per run: libvirt is shared by every test session on this machine
        namespace=f"e2e-wl-{secrets.token_hex(3)}",
        name=CLUSTER_NAME,
        kubelet=kubelet,
        guest_image=guest_image,
        uri=libvirtd_uri,
        ignition_workers=1,
        cloud_config_workers=1,
    ) as workload:
        yield workload


# --- helpers -----------------------------------------------------------------------------------


def describe(cluster: WorkloadCluster, machine: str) -> str:
    return f"{machine} ({cluster.domain_of(machine)})"


async def reset(cluster: WorkloadCluster, *, ignition: int, cloud_config: int) -> None:
    """Bring both MachineDeployments to the given sizes and wait for it."""
    for md, replicas in ((cluster.md_ignition, ignition), (cluster.md_cloud_config, cloud_config)):
        await cluster.scale(md, replicas)
    for md, replicas in ((cluster.md_ignition, ignition), (cluster.md_cloud_config, cloud_config)):
        if replicas:
            await cluster.wait_running(md, replicas, within=BOOT)
        else:
            await cluster.wait_gone(md)


async def node_of(api: KubeClient, name: str) -> Obj | None:
    try:
        return await api.resource(NODE).get(ObjectKey("", name))
    except NotFound:
        return None


async def assert_machine_consistent(
    cluster: WorkloadCluster, machine: Obj, *, bootstrap_secret: str, fmt: str
) -> GuestRecord:
    """One Machine against everything that describes it: LibvirtMachine, the domain, the
    guest's serial markers, the Node, the DHCP reservation, the lease and the DNS record."""
    name = name_of(machine)
    lm = await cluster.get(LIBVIRT_MACHINE, name)
    assert lm is not None, f"LibvirtMachine {name} missing"
    domain = cluster.view.domain(cluster.domain_of(name))
    assert domain is not None, f"no domain for {describe(cluster, name)}"
    guest = cluster.guest(name)
    assert guest is not None, f"the kubelet never saw the console of {name}"

    # one identity everywhere: SMBIOS UUID = domain UUID = providerID
    provider_id = f"libvirt:///{domain.uuid}"
    assert machine["status"]["phase"] == "Running"
    assert machine["spec"]["providerID"] == provider_id
    assert lm["spec"]["providerID"] == provider_id
    assert lm["spec"]["domainUUID"] == domain.uuid
    assert guest.provider_id == provider_id
    uuid_marker = guest.marker("uuid")
    assert uuid_marker is not None
    assert uuid_marker.value == domain.uuid
    node_name = machine["status"]["nodeRef"]["name"]
    assert node_name == guest.node
    node = await node_of(cluster.api, node_name)
    assert node is not None, f"Node {node_name} missing"
    assert node["spec"]["providerID"] == provider_id

    # the Node carries its failure domain as a cloud provider would set it: the zone is the
    # machine's host (capl patches it through <cluster>-kubeconfig beside the providerID)
    host = lm["spec"]["hostName"]
    assert lm["status"]["failureDomain"] == host

    async def zoned() -> Obj | None:
        found = await node_of(cluster.api, node_name)
        labels = ((found or {}).get("metadata") or {}).get("labels") or {}
        return found if labels.get("topology.kubernetes.io/zone") == host else None

    await eventually(zoned, within=60, what=f"Node {node_name} labelled zone={host}")

    # the domain as the template asked
    assert domain.running
    assert domain.domain_type == "qemu"
    assert domain.vcpus == 1
    assert domain.owner.get("namespace") == cluster.namespace
    assert domain.owner.get("name") == name
    assert domain.owner.get("cluster") == cluster.name

    # one address everywhere: guest lease = DHCP reservation = DNS = status
    network = cluster.network_facts()
    assert network is not None
    reservation = [h for h in network.dhcp_hosts if h.name == name]
    assert len(reservation) == 1, network.dhcp_hosts
    assert reservation[0].mac == guest.mac
    assert reservation[0].ip == guest.ip
    leases = [le for le in cluster.view.leases(cluster.network) if le["mac"].lower() == guest.mac]
    assert [le["ipaddr"] for le in leases] == [guest.ip]
    assert network.dns_names().get(f"{name}.{cluster.dns_domain}") == {guest.ip}
    assert internal_ip(lm) == guest.ip
    assert internal_ip(machine) == guest.ip
    assert internal_ip(node) == guest.ip

    # the bootstrap data the guest read is the Secret's
    data = cluster.secrets[bootstrap_secret]
    source = guest.marker("source")
    assert source is not None
    assert source.value == ("ignition" if fmt == "ignition" else "cloud-init")
    assert source.fields["sha256"] == hashlib.sha256(data).hexdigest()

    # its volumes
    volumes = cluster.view.volumes(cluster.pool) or set()
    prefix = cluster.volume_prefix(name)
    bootstrap_volume = prefix + ("ignition.ign" if fmt == "ignition" else "cidata.iso")
    assert {prefix + "root.qcow2", bootstrap_volume, prefix + "console.log"} <= volumes
    return guest


def assert_only_control_plane_left(cluster: WorkloadCluster) -> None:
    """libvirt holds the control plane's things and nothing of any worker."""
    cp = cluster.control_plane_machine
    assert set(cluster.domains()) == {cluster.domain_of(cp)}
    volumes = cluster.view.volumes(cluster.pool) or set()
    machine_volumes = {v for v in volumes if v.startswith(cluster.domain_prefix)}
    assert all(v.startswith(cluster.volume_prefix(cp)) for v in machine_volumes), volumes
    network = cluster.network_facts()
    assert network is not None
    assert network.dhcp_names() == {cp}
    assert set(network.dns_names()) == {f"{cp}.{cluster.dns_domain}", "api", "api-int"}


def report_scale_up(label: str, started: float, running: float, guests: list[GuestRecord]) -> None:
    """Scale-up (MachineDeployment patched at `started`, all Running at `running`, both
    time.monotonic()) against the guests' own start -> lease times, measured in the same run:
    printed in the terminal summary with their ratio and where the rest of the time went."""
    seconds = running - started
    summary = guest_summary(guests)
    boot = summary["start_to_lease_max"]
    ratio = seconds / boot if boot and not math.isnan(boot) else float("nan")
    first_start = min(g.first_seen for g in guests) - started
    last_start = max(g.first_seen for g in guests) - started
    last_lease = max(g.marks["ip"] for g in guests) - started
    record_timing(f"{label}: MachineDeployment scaled -> all Machines Running", seconds)
    record_timing(f"{label}: guests' domain start -> DHCP lease (slowest)", boot)
    report(
        f"{label}: MachineDeployment scaled -> all {len(guests)} Machines Running {seconds:.1f} s; "
        f"guests' own domain start -> DHCP lease max {boot:.1f} s, mean "
        f"{summary['start_to_lease_mean']:.1f} s (guest init -> lease max "
        f"{summary['init_to_lease_max']:.1f} s); ratio {ratio:.2f}"
    )
    report(
        f"{label}: after the scale-up: domains started at {first_start:.1f} .. "
        f"{last_start:.1f} s, last lease at {last_lease:.1f} s, all Running at {seconds:.1f} s"
    )


# --- the tests ---------------------------------------------------------------------------------


@pytest.mark.timeout(900)
async def test_workload_cluster_of_real_guests_runs(
    cluster: WorkloadCluster, kubelet: KubeletStandIn
) -> None:
    machines = await cluster.wait_running(None, 3, within=BOOT)
    took = time.monotonic() - cluster.created_at
    record_timing("workload cluster: created -> 3 Machines Running", took)
    cp = cluster.control_plane_machine
    guests = [g for m in machines if (g := cluster.guest(m)) is not None]
    report(
        f"workload cluster: created -> control plane + 2 workers Running {took:.1f} s "
        f"(guests' start -> lease max {guest_summary(guests)['start_to_lease_max']:.1f} s; "
        "may include up to 30 s of ClusterCache's connection retry, see harness)"
    )

    # the Cluster: infrastructure from capl, control plane initialized by the stand-alone
    # control-plane Machine's nodeRef
    async def initialized() -> Obj | None:
        obj = await cluster.get(CLUSTER, cluster.name)
        return obj if obj is not None and is_true(obj, "ControlPlaneInitialized") else None

    obj = await eventually(initialized, within=60, what="Cluster ControlPlaneInitialized")
    assert obj["status"]["phase"] == "Provisioned"
    assert is_true(obj, "InfrastructureReady"), condition_of(obj, "InfrastructureReady")
    assert is_true(obj, "ControlPlaneInitialized"), condition_of(obj, "ControlPlaneInitialized")
    # status.initialization.controlPlaneInitialized is only ever set from a controlPlaneRef;
    # for stand-alone control-plane Machines the condition is the signal (clusterctl move
    # checks the same)
    assert obj["status"]["initialization"]["infrastructureProvisioned"] is True
    endpoint = {"host": f"api.{cluster.dns_domain}", "port": 6443}
    assert obj["spec"]["controlPlaneEndpoint"] == endpoint
    lcluster = await cluster.get(LIBVIRT_CLUSTER, cluster.name)
    assert lcluster is not None
    assert lcluster["spec"]["controlPlaneEndpoint"] == endpoint

    by_md: dict[str, list[str]] = {}
    for name, m in machines.items():
        md = (m["metadata"].get("labels") or {}).get("cluster.x-k8s.io/deployment-name", "")
        by_md.setdefault(md, []).append(name)
    assert set(by_md) == {"", cluster.md_ignition, cluster.md_cloud_config}
    assert by_md[""] == [cp]
    assert len(by_md[cluster.md_ignition]) == len(by_md[cluster.md_cloud_config]) == 1
    assert "cluster.x-k8s.io/control-plane" in machines[cp]["metadata"]["labels"]

    ign = by_md[cluster.md_ignition][0]
    cc = by_md[cluster.md_cloud_config][0]
    cp_guest, ign_guest, cc_guest = [
        await assert_machine_consistent(
            cluster, machines[name], bootstrap_secret=f"{cluster.name}-bootstrap-{data}", fmt=fmt
        )
        for name, data, fmt in (
            (cp, "control-plane", "ignition"),
            (ign, "ignition", "ignition"),
            (cc, "cloud-config", "cloud-config"),
        )
    ]
    # node names: the control plane's from its Ignition hostname, the shared Ignition
    # config sets none (DHCP name), cloud-init's from capl's meta-data
    assert cp_guest.hostname == cp
    assert ign_guest.hostname == "localhost"
    assert ign_guest.node == ign
    assert cc_guest.hostname == cc
    for name in (cp, ign, cc):
        domain = cluster.view.domain(cluster.domain_of(name))
        assert domain is not None
        assert domain.memory_kib == GUEST_MEMORY_MIB * MIB

    # the control-plane endpoint follows the control-plane machine; the network is isolated
    # capl keeps `api` and `api-int` on the control-plane machine's address in the network's
    # dnsmasq (short names, expanded with the network's domain): ask that dnsmasq
    gateway = str(ipaddress.IPv4Network(cluster.cidr).network_address + 1)
    api_names = [f"api.{cluster.dns_domain}", f"api-int.{cluster.dns_domain}"]

    async def endpoint_resolves() -> bool:
        return all(resolve_a(gateway, n) == {cp_guest.ip} for n in api_names)

    await eventually(
        endpoint_resolves, within=60, what=f"{api_names} resolve to {cp_guest.ip} at {gateway}"
    )
    assert resolve_a(gateway, f"{ign}.{cluster.dns_domain}") == {ign_guest.ip}
    assert resolve_a(gateway, f"{cc}.{cluster.dns_domain}") == {cc_guest.ip}
    network = cluster.network_facts()
    assert network is not None
    assert network.forward is None
    assert set(cluster.domains()) == {cluster.domain_of(n) for n in (cp, ign, cc)}

    nodes = (await cluster.api.resource(NODE).list()).items
    assert {name_of(n) for n in nodes} == {cp, ign, cc}

    # Cluster API's own verdict: the workers are available (Node healthy), which the
    # MachineDeployments report
    async def available() -> bool:
        for md in (cluster.md_ignition, cluster.md_cloud_config):
            obj = await cluster.get(MACHINE_DEPLOYMENT, md)
            if ((obj or {}).get("status") or {}).get("availableReplicas") != 1:
                return False
        return True

    await eventually(available, within=60, what="both MachineDeployments 1/1 available")
    for m in (await cluster.machines()).values():
        for type_ in ("Ready", "Available", "NodeHealthy", "InfrastructureReady"):
            assert is_true(m, type_), (name_of(m), condition_of(m, type_))
    assert kubelet.errors == []


@pytest.mark.timeout(900)
async def test_machine_deployment_scales_0_3_1_0(
    cluster: WorkloadCluster, kubelet: KubeletStandIn
) -> None:
    md = cluster.md_ignition
    t0 = time.monotonic()
    await reset(cluster, ignition=0, cloud_config=0)
    assert_only_control_plane_left(cluster)
    record_timing("scaling: both MachineDeployments -> 0", time.monotonic() - t0)

    # 0 -> 3
    t1 = time.monotonic()
    await cluster.scale(md, 3)
    machines = await cluster.wait_running(md, 3, within=BOOT, interval=0.2)
    t_running = time.monotonic()
    guests = [g for m in machines if (g := cluster.guest(m)) is not None]
    assert len(guests) == 3
    report_scale_up("scaling 0 -> 3", t1, t_running, guests)
    domains = cluster.domains()
    assert set(domains) == {
        cluster.domain_of(m) for m in [*machines, cluster.control_plane_machine]
    }
    for machine in machines.values():
        await assert_machine_consistent(
            cluster, machine, bootstrap_secret=f"{cluster.name}-bootstrap-ignition", fmt="ignition"
        )

    # 3 -> 1: two machines go, completely; the one that stays is not touched
    t2 = time.monotonic()
    await cluster.scale(md, 1)
    kept = await cluster.wait_running(md, 1, within=BOOT)
    record_timing("scaling 3 -> 1", time.monotonic() - t2)
    (survivor,) = kept
    assert survivor in machines
    gone = [m for m in machines if m != survivor]
    assert cluster.leftovers_of(gone) == []
    after = cluster.domain_of(survivor)
    assert cluster.domains()[after].uuid == domains[after].uuid
    assert cluster.domains()[after].id == domains[after].id  # not restarted
    for name in gone:
        assert await node_of(cluster.api, name) is None

    # 1 -> 0: nothing of the MachineDeployment's machines is left in libvirt
    t3 = time.monotonic()
    await cluster.scale(md, 0)
    await cluster.wait_gone(md)
    record_timing("scaling 1 -> 0", time.monotonic() - t3)
    assert cluster.leftovers_of(machines) == []
    assert_only_control_plane_left(cluster)
    ms = [
        s
        for s in await cluster.objects(MACHINE_SET)
        if s["spec"].get("clusterName") == cluster.name
    ]
    assert all(s["spec"]["replicas"] == 0 for s in ms if md in name_of(s))
    assert kubelet.errors == []


@pytest.mark.timeout(900)
async def test_rolling_update_replaces_every_worker(
    cluster: WorkloadCluster, kubelet: KubeletStandIn
) -> None:
    md = cluster.md_ignition
    await reset(cluster, ignition=2, cloud_config=0)
    old = await cluster.machines(md)
    old_domains = {cluster.domain_of(m): cluster.view.domain(cluster.domain_of(m)) for m in old}

    # a new template (more memory), referenced by the MachineDeployment
    template = await cluster.get(LIBVIRT_MACHINE_TEMPLATE, md)
    assert template is not None
    new_spec: dict[str, Any] = dict(template["spec"]["template"]["spec"])
    new_spec["memoryMiB"] = GUEST_MEMORY_MIB + 64
    new_name = f"{md}-v2"
    await cluster.api.resource(LIBVIRT_MACHINE_TEMPLATE).create(
        {
            "apiVersion": template["apiVersion"],
            "kind": "LibvirtMachineTemplate",
            "metadata": {"name": new_name, "namespace": cluster.namespace},
            "spec": {"template": {"spec": new_spec}},
        }
    )
    t0 = time.monotonic()
    await cluster.api.resource(MACHINE_DEPLOYMENT).patch(
        ObjectKey(cluster.namespace, md),
        {"spec": {"template": {"spec": {"infrastructureRef": {"name": new_name}}}}},
    )

    async def explain_rollout() -> str:
        md_obj = await cluster.get(MACHINE_DEPLOYMENT, md)
        sets = [
            f"MachineSet {name_of(s)}: spec={s.get('spec', {}).get('replicas')} "
            f"status={ {k: v for k, v in (s.get('status') or {}).items() if 'eplicas' in k} }"
            for s in await cluster.objects(MACHINE_SET)
        ]
        return (
            "\n".join([f"MachineDeployment status: {(md_obj or {}).get('status')}", *sets])
            + "\n"
            + await cluster.explain()
        )

    async def rolled_out() -> dict[str, Obj] | None:
        machines = await cluster.machines(md)
        if len(machines) != 2 or set(machines) & set(old):
            return None
        if any(m.get("status", {}).get("phase") != "Running" for m in machines.values()):
            return None
        return machines

    new = await eventually(
        rolled_out, within=1.5 * BOOT, what="every worker replaced", explain=explain_rollout
    )
    record_timing(
        "rolling update of 2 workers to a new LibvirtMachineTemplate", time.monotonic() - t0
    )
    assert cluster.leftovers_of(old) == []
    for name, machine in new.items():
        lm = await cluster.get(LIBVIRT_MACHINE, name)
        assert lm is not None
        assert lm["metadata"]["annotations"][CLONED_FROM_ANNOTATION] == new_name
        assert lm["spec"]["memoryMiB"] == GUEST_MEMORY_MIB + 64
        domain = cluster.view.domain(cluster.domain_of(name))
        assert domain is not None
        assert domain.memory_kib == (GUEST_MEMORY_MIB + 64) * MIB
        assert domain.uuid not in {d.uuid for d in old_domains.values() if d is not None}
        await assert_machine_consistent(
            cluster, machine, bootstrap_secret=f"{cluster.name}-bootstrap-ignition", fmt="ignition"
        )
    assert set(cluster.domains()) == {
        cluster.domain_of(m) for m in [*new, cluster.control_plane_machine]
    }
    assert kubelet.errors == []


@pytest.mark.timeout(900)
async def test_machine_health_check_remediates_a_dead_worker(
    cluster: WorkloadCluster, kubelet: KubeletStandIn
) -> None:
    md = cluster.md_cloud_config
    await reset(cluster, ignition=0, cloud_config=2)
    machines = await cluster.machines(md)
    mhc_name = f"{cluster.name}-workers"
    await cluster.api.resource(MACHINE_HEALTH_CHECK).create(
        {
            "apiVersion": MACHINE_HEALTH_CHECK.api_version,
            "kind": "MachineHealthCheck",
            "metadata": {"name": mhc_name, "namespace": cluster.namespace},
            "spec": {
                "clusterName": cluster.name,
                "selector": {"matchLabels": {"cluster.x-k8s.io/deployment-name": md}},
                "checks": {
                    "nodeStartupTimeoutSeconds": 600,
                    "unhealthyNodeConditions": [
                        {"type": "Ready", "status": "Unknown", "timeoutSeconds": 300},
                        {"type": "Ready", "status": "False", "timeoutSeconds": 300},
                    ],
                },
                "remediation": {"triggerIf": {"unhealthyLessThanOrEqualTo": "100%"}},
            },
        }
    )

    async def watching() -> bool:
        mhc = await cluster.get(MACHINE_HEALTH_CHECK, mhc_name)
        status = (mhc or {}).get("status") or {}
        return status.get("expectedMachines") == 2 and status.get("currentHealthy") == 2

    await eventually(watching, within=120, what="the MachineHealthCheck sees 2 healthy workers")

    victim, survivor = sorted(machines)
    victim_domain = cluster.domain_of(victim)
    victim_node = machines[victim]["status"]["nodeRef"]["name"]
    victim_provider = machines[victim]["spec"]["providerID"]
    survivor_before = cluster.view.domain(cluster.domain_of(survivor))
    assert survivor_before is not None

    # the worker dies out of band and its Node is gone; capl starts the domain again (it
    # runs machines like runStrategy Always), but no kubelet registers that node again
    victim_before = cluster.view.domain(victim_domain)
    assert victim_before is not None
    t0 = time.monotonic()
    cluster.view.destroy(victim_domain)
    await cluster.api.resource(NODE).delete(ObjectKey("", victim_node))
    seen: set[str] = set()
    restarted: list[float] = []

    async def remediated() -> dict[str, Obj] | None:
        facts = cluster.view.domain(victim_domain)
        if facts is not None and facts.running and facts.id != victim_before.id and not restarted:
            restarted.append(time.monotonic() - t0)
        current = await cluster.machines(md)
        if victim in current:
            health = condition_of(current[victim], "HealthCheckSucceeded")
            if health is not None and health.get("status") == "False":
                seen.add(str(health.get("reason")))
            return None
        if len(current) != 2 or survivor not in current:
            return None
        if any(m.get("status", {}).get("phase") != "Running" for m in current.values()):
            return None
        return current

    after = await eventually(
        remediated,
        within=2 * BOOT,
        what=f"{victim} remediated and replaced",
        explain=cluster.explain,
    )
    record_timing("MachineHealthCheck: Node deleted -> replacement Running", time.monotonic() - t0)
    (replacement,) = set(after) - {survivor}
    report(
        "MachineHealthCheck: worker destroyed + Node deleted -> replacement Running "
        f"{time.monotonic() - t0:.1f} s; capl restarted the destroyed domain "
        + (f"after {restarted[0]:.1f} s" if restarted else "(not observed before its deletion)")
        + f"; health check reasons seen: {sorted(seen) or 'none (too quick to observe)'}"
    )
    if seen:
        assert seen == {"NodeDeleted"}, seen
    assert cluster.leftovers_of([victim]) == []
    assert [p for p, _n, _t in kubelet.registrations if p == victim_provider] == [victim_provider]
    assert await node_of(cluster.api, victim_node) is None
    survivor_after = cluster.view.domain(cluster.domain_of(survivor))
    assert survivor_after is not None
    assert (survivor_after.uuid, survivor_after.id) == (survivor_before.uuid, survivor_before.id)
    await assert_machine_consistent(
        cluster,
        after[replacement],
        bootstrap_secret=f"{cluster.name}-bootstrap-cloud-config",
        fmt="cloud-config",
    )
    assert set(cluster.domains()) == {
        cluster.domain_of(m) for m in [*after, cluster.control_plane_machine]
    }
    assert kubelet.errors == []


async def test_deleting_the_cluster_removes_everything(
    cluster: WorkloadCluster, management: Management
) -> None:
    machines = await cluster.machines()
    assert len(machines) == 3  # the control plane and the health-checked workers
    assert cluster.domains()
    assert cluster.view.pool_exists(cluster.pool)
    assert cluster.network_facts() is not None

    took = await delete_cluster(cluster)
    record_timing("Cluster deletion (control plane + 2 workers)", took)

    # Cluster API: nothing of the cluster is left
    for resource in (MACHINE, MACHINE_SET, MACHINE_DEPLOYMENT, LIBVIRT_MACHINE, LIBVIRT_CLUSTER):
        left = [name_of(o) for o in await cluster.objects(resource)]
        assert left == [], f"{resource.kind}: {left}"
    # libvirt: no domain, no pool (volumes, directory), no network (DHCP and DNS entries)
    assert cluster.domains() == {}
    assert not cluster.view.pool_exists(cluster.pool)
    assert not cluster.pool_path.exists()
    assert cluster.network_facts() is None
    assert cluster.network not in {n.name() for n in cluster.view.conn.listAllNetworks(0)}
    # the manager's log holds none of the bootstrap data
    text = management.capl.log_text()
    assert text
    for token in cluster.tokens:
        assert token not in text
