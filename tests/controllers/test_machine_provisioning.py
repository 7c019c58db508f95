"""LibvirtMachine provisioning on the libvirt test driver against the real API server.

The happy path (Ready, identity, addresses, what exists in libvirt, API writes), Ignition vs
cloud-config delivery, the gates in contract order, placement, MAC/IP choices, bootstrap data
changing later, a clusterctl-move style re-creation of the object, and the workload Node's
providerID.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import json
import uuid
from pathlib import Path
from xml.etree import ElementTree

import libvirt
import pytest

from capl.api import constants as c
from capl.controllers import machine as libvirtmachine
from capl.controllers.machine.plan import nic_mac
from capl.controllers.machine.plan_placement import PLACEMENT_ANNOTATION, Placement
from capl.ports.naming import machine_hostname, machine_names
from capl.runtime.objects import ObjectKey
from capl.runtime.resources import CLUSTER, LIBVIRT_MACHINE, MACHINE, NODE, SECRET
from capl.testing.harness import TEST_DRIVER, ControllerHarness
from capl.testing.objects import b64, condition, is_ready, libvirt_machine_spec
from tests.controllers.conftest import domain_owner

pytestmark = pytest.mark.apiserver

FAST = libvirtmachine.MachineOptions(address_poll=0.2, shutdown_timeout=5, shutdown_poll=0.2)
SETUP = functools.partial(libvirtmachine.setup, options=FAST)
CONTROLLER = libvirtmachine.CONTROLLER_NAME


def _xml(uuid_: str) -> ElementTree.Element:
    conn = libvirt.open(TEST_DRIVER)
    try:
        return ElementTree.fromstring(conn.lookupByUUIDString(uuid_).XMLDesc(0))
    finally:
        conn.close()


async def test_cloud_config_machine_becomes_ready(harness: ControllerHarness) -> None:
    cluster = await harness.make_cluster(dns_domain="lab.example")
    # The objects exist before the manager starts, so its first reconcile sees all three
    # (the write count below is exact). Created after the start, the LibvirtMachine's watch
    # event can overtake the bootstrap Secret's on a loaded machine: that reconcile then
    # rightly writes the finalizer and WaitingForBootstrapData first (CI of stop 23 saw it).
    m = await harness.make_machine(cluster, "worker-0", bootstrap=b"#cloud-config\nhostname: x\n")
    await harness.start(SETUP)
    obj = await harness.wait_ready(m.name)

    spec, status = obj["spec"], obj["status"]
    domain_uuid = spec["domainUUID"]
    assert uuid.UUID(domain_uuid).version == 4
    assert spec["providerID"] == f"libvirt:///{domain_uuid}"
    assert spec["hostName"] == "h1"
    assert c.MACHINE_FINALIZER in obj["metadata"]["finalizers"]
    placement = Placement.decode(obj["metadata"]["annotations"][PLACEMENT_ANNOTATION])
    assert placement is not None
    assert (placement.host, placement.uri) == ("h1", TEST_DRIVER)
    assert status["initialization"]["provisioned"] is True
    assert status["host"] == status["failureDomain"] == "h1"
    assert status["domainState"] == "Running"
    types = {a["type"]: a["address"] for a in status["addresses"]}
    assert types["Hostname"] == "worker-0"
    assert types["InternalDNS"] == "worker-0.lab.example"
    ipaddress.IPv4Address(types["InternalIP"])
    for cond in (
        c.ConditionType.DOMAIN_PROVISIONED,
        c.ConditionType.BOOTSTRAP_DATA_DELIVERED,
        c.ConditionType.ADDRESS_ASSIGNED,
    ):
        assert condition(obj, cond) == "True", cond
    assert condition(obj, c.ConditionType.PAUSED) == "False"
    assert condition(obj, c.ConditionType.READY, "observedGeneration") == str(
        obj["metadata"]["generation"]
    )

    # what exists in libvirt
    host = harness.host()
    info = await host.get_domain(domain_uuid)
    assert info is not None
    assert info.state.value == "running"
    assert info.autostart
    assert info.persistent
    assert info.owner == domain_owner(obj)
    names = machine_names(namespace=harness.namespace, name="worker-0")
    assert info.name == names.domain
    lay = cluster.layout_model()
    pool = str(lay.spec.storage_pool.name)  # type: ignore[union-attr]
    volumes = {v.name for v in await host.list_volumes(pool=pool, prefix=names.prefix)}
    assert volumes == {names.root_volume, names.cidata_volume}
    network = await host.get_network(str(lay.spec.network.name))
    assert network is not None
    mine = [h for h in network.dhcp_hosts if h.name == "worker-0"]
    expected_mac = nic_mac(
        cluster=cluster.name, namespace=harness.namespace, name="worker-0", index=0, attempt=0
    )
    assert [(h.mac, h.name) for h in mine] == [(expected_mac, "worker-0")]
    assert any(
        d.ip == mine[0].ip and d.hostnames == ("worker-0.lab.example",) for d in network.dns_hosts
    )

    xml = _xml(domain_uuid)
    cdrom = xml.find("./devices/disk[@device='cdrom']")
    assert cdrom is not None
    assert cdrom.find("target").get("bus") == "scsi"  # type: ignore[union-attr]
    assert cdrom.find("readonly") is not None
    assert xml.find("./devices/interface/mac").get("address") == expected_mac  # type: ignore[union-attr]
    assert xml.find("./devices/serial/log").get("file").endswith(names.console_log)  # type: ignore[union-attr]
    assert xml.findtext("uuid") == domain_uuid
    assert xml.get("type") == "qemu"

    # API writes: one spec patch (finalizer + identity), at most two status patches
    writes = harness.writes(LIBVIRT_MACHINE, m.name)
    assert writes.get("PATCH", 0) == 1, writes
    assert writes.get("PATCH/status", 0) <= 2, writes
    assert sum(writes.values()) <= 3, writes


async def test_ignition_machine_gets_fw_cfg_entry(harness: ControllerHarness) -> None:
    cluster = await harness.make_cluster()
    await harness.start(SETUP)
    config = json.dumps({"ignition": {"version": "3.4.0"}, "secret": "s3cr3t-token"}).encode()
    m = await harness.make_machine(cluster, bootstrap=config, format="ignition")
    obj = await harness.wait_ready(m.name)
    names = machine_names(namespace=harness.namespace, name=m.name)
    lay = cluster.layout_model()
    pool = str(lay.spec.storage_pool.name)  # type: ignore[union-attr]
    volumes = {v.name: v for v in await harness.host().list_volumes(pool=pool, prefix=names.prefix)}
    assert set(volumes) == {names.root_volume, names.ignition_volume}

    xml = _xml(obj["spec"]["domainUUID"])
    entry = xml.find("./sysinfo[@type='fwcfg']/entry")
    assert entry is not None
    assert entry.get("name") == "opt/com.coreos/config"
    assert entry.get("file") == volumes[names.ignition_volume].path
    assert xml.find("./devices/disk[@device='cdrom']") is None
    assert "s3cr3t-token" not in ElementTree.tostring(xml, encoding="unicode")
    assert "s3cr3t-token" not in json.dumps(obj)


async def test_gates_in_contract_order(harness: ControllerHarness) -> None:
    cluster = await harness.make_cluster(provisioned=False)
    await harness.start(SETUP)
    # owned by a MachineSet only: not adopted yet -> nothing happens
    m = await harness.make_machine(cluster, owned=False, bootstrap=None)
    await harness.reconciled_after(
        CONTROLLER,
        harness.patch(
            LIBVIRT_MACHINE,
            m.name,
            {
                "metadata": {
                    "ownerReferences": [
                        {
                            "apiVersion": c.CAPI_API_VERSION,
                            "kind": "MachineSet",
                            "name": "ms",
                            "uid": str(uuid.uuid4()),
                        }
                    ]
                }
            },
        ),
    )
    obj = await harness.get(LIBVIRT_MACHINE, m.name)
    assert obj is not None
    assert not obj["metadata"].get("finalizers")
    assert "status" not in obj or not obj["status"]

    # the Machine adopts it -> finalizer, waits for the cluster's infrastructure
    machine = m.machine
    await harness.patch(
        LIBVIRT_MACHINE,
        m.name,
        {
            "metadata": {
                "ownerReferences": [
                    {
                        "apiVersion": c.CAPI_API_VERSION,
                        "kind": "Machine",
                        "name": machine["metadata"]["name"],
                        "uid": machine["metadata"]["uid"],
                        "controller": True,
                    }
                ]
            }
        },
    )
    obj = await harness.wait_for(
        LIBVIRT_MACHINE,
        m.name,
        lambda o: (
            condition(o, c.ConditionType.DOMAIN_PROVISIONED, "reason")
            == c.Reason.WAITING_FOR_CLUSTER_INFRASTRUCTURE
        ),
    )
    assert c.MACHINE_FINALIZER in obj["metadata"]["finalizers"]
    assert condition(obj, c.ConditionType.READY) == "False"

    # paused: Paused True, nothing else
    await harness.patch(
        LIBVIRT_MACHINE, m.name, {"metadata": {"annotations": {c.PAUSED_ANNOTATION: ""}}}
    )
    obj = await harness.wait_for(
        LIBVIRT_MACHINE, m.name, lambda o: condition(o, c.ConditionType.PAUSED) == "True"
    )
    await harness.reconciled_after(CONTROLLER, harness.mark_provisioned(cluster))
    obj = await harness.get(LIBVIRT_MACHINE, m.name)
    assert obj is not None
    assert "domainUUID" not in obj["spec"]
    await harness.patch(
        LIBVIRT_MACHINE, m.name, {"metadata": {"annotations": {c.PAUSED_ANNOTATION: None}}}
    )

    # infrastructure ready, no bootstrap data yet
    obj = await harness.wait_for(
        LIBVIRT_MACHINE,
        m.name,
        lambda o: (
            condition(o, c.ConditionType.BOOTSTRAP_DATA_DELIVERED, "reason")
            == c.Reason.WAITING_FOR_BOOTSTRAP_DATA
        ),
    )
    assert condition(obj, c.ConditionType.PAUSED) == "False"
    assert "domainUUID" not in obj["spec"]

    # the bootstrap provider writes the Secret and sets dataSecretName -> created
    await harness.create(
        SECRET,
        {
            "metadata": {"name": f"{m.name}-data", "namespace": harness.namespace},
            "data": {"value": b64(b"#cloud-config\n")},
        },
    )
    await harness.patch(
        MACHINE,
        m.name,
        {"spec": {"bootstrap": {"configRef": None, "dataSecretName": f"{m.name}-data"}}},
    )
    await harness.wait_ready(m.name)


async def test_cluster_pause_blocks_creation(harness: ControllerHarness) -> None:
    cluster = await harness.make_cluster(paused=True)
    await harness.start(SETUP)
    m = await harness.make_machine(cluster)
    obj = await harness.wait_for(
        LIBVIRT_MACHINE, m.name, lambda o: condition(o, c.ConditionType.PAUSED) == "True"
    )
    assert condition(obj, c.ConditionType.PAUSED, "observedGeneration") == str(
        obj["metadata"]["generation"]
    )
    assert "domainUUID" not in obj["spec"]
    assert await harness.host().list_domains(cluster=cluster.name) == []
    await harness.patch(CLUSTER, cluster.name, {"spec": {"paused": None}})
    await harness.wait_ready(m.name)


async def test_bootstrap_data_change_never_recreates(harness: ControllerHarness) -> None:
    cluster = await harness.make_cluster()
    controller_box: list[object] = []

    def setup(manager: object, deps: object) -> object:
        ctl = SETUP(manager, deps)  # type: ignore[arg-type]
        controller_box.append(ctl)
        return ctl

    await harness.start(setup)
    m = await harness.make_machine(cluster)
    obj = await harness.wait_ready(m.name)
    before = await harness.host().get_domain(obj["spec"]["domainUUID"])
    secret_name = m.secret["metadata"]["name"]  # type: ignore[index]
    await harness.reconciled_after(
        CONTROLLER,
        harness.patch(SECRET, secret_name, {"data": {"value": b64(b"#cloud-config\nnew: 1\n")}}),
    )
    after = await harness.host().get_domain(obj["spec"]["domainUUID"])
    assert before is not None
    assert after is not None
    assert after.uuid == before.uuid
    assert after.state.value == "running"
    assert (await harness.get(LIBVIRT_MACHINE, m.name))["spec"] == obj["spec"]  # type: ignore[index]


async def test_placement(harness: ControllerHarness, shared_test_driver: str) -> None:
    hosts = [
        {"name": "small", "uri": "qemu+unix:///system?socket=/nonexistent/capl.sock"},
        {"name": "cp", "uri": TEST_DRIVER},
        {"name": "workers", "uri": shared_test_driver, "controlPlane": False},
    ]
    # several hosts: an adopted network (nat/isolated created on several hosts is refused)
    cluster = await harness.make_cluster(hosts=hosts, adopt_network=True, prepare=False)
    await harness.prepare_hosts(cluster, only=["cp", "workers"])
    await harness.start(SETUP)
    cp = await harness.make_machine(cluster, "cp-0", control_plane=True)
    pinned = await harness.make_machine(
        cluster, "pinned", spec=libvirt_machine_spec(hostName="workers")
    )
    fd = await harness.make_machine(cluster, "fd", failure_domain="workers")
    for m, host in ((cp, "cp"), (pinned, "workers"), (fd, "workers")):
        obj = await harness.wait_ready(m.name)
        assert obj["spec"]["hostName"] == host, m.name
        assert obj["status"]["failureDomain"] == host
    # unplaced workers avoid the unreachable host and spread by committed memory
    a = await harness.make_machine(cluster, "w-a", spec=libvirt_machine_spec(memoryMiB=2048))
    obj = await harness.wait_ready(a.name)
    assert obj["spec"]["hostName"] in ("cp", "workers")


async def test_mac_collision_and_recorded_ips(harness: ControllerHarness) -> None:
    cluster = await harness.make_cluster(dns_domain="lab.example")
    lay = cluster.layout_model()
    network = str(lay.spec.network.name)
    host = harness.host()
    taken_mac = nic_mac(
        cluster=cluster.name, namespace=harness.namespace, name="m1", index=0, attempt=0
    )
    foreign = await host.ensure_dhcp_host(network=network, mac=taken_mac, name="someone-else")
    # another machine reports the next free address: it must not be handed out
    net_info = await host.get_network(network)
    assert net_info is not None
    assert net_info.dhcp_start
    start = ipaddress.IPv4Address(net_info.dhcp_start)
    recorded = str(start + 1) if foreign.ip == str(start) else str(start)
    other = await harness.make_machine(cluster, "other", owned=False)
    await harness.patch_status(
        LIBVIRT_MACHINE,
        other.name,
        {"status": {"addresses": [{"type": "InternalIP", "address": recorded}]}},
    )
    await harness.start(SETUP)
    m = await harness.make_machine(cluster, "m1")
    obj = await harness.wait_ready(m.name)
    net_info = await host.get_network(network)
    assert net_info is not None
    mine = [h for h in net_info.dhcp_hosts if h.name == "m1"]
    assert len(mine) == 1
    assert mine[0].mac == nic_mac(
        cluster=cluster.name, namespace=harness.namespace, name="m1", index=0, attempt=1
    )
    assert mine[0].ip not in (recorded, foreign.ip)
    xml = _xml(obj["spec"]["domainUUID"])
    assert xml.find("./devices/interface/mac").get("address") == mine[0].mac  # type: ignore[union-attr]

    await harness.delete_machine(m.name)
    net_info = await host.get_network(network)
    assert net_info is not None
    assert [h.name for h in net_info.dhcp_hosts] == ["someone-else"]


async def test_moved_object_adopts_its_domain(harness: ControllerHarness) -> None:
    """clusterctl move: the object comes back with its spec and annotations (no status, a new
    UID); the controller finds the domain by UUID, retags it and creates nothing."""
    cluster = await harness.make_cluster()
    await harness.start(SETUP)
    m = await harness.make_machine(cluster, "mover")
    obj = await harness.wait_ready(m.name)
    domain_uuid = obj["spec"]["domainUUID"]
    await harness.stop()

    # the "source" object disappears without the controller running
    await harness.patch(LIBVIRT_MACHINE, m.name, {"metadata": {"finalizers": None}})
    await harness.delete(LIBVIRT_MACHINE, m.name)
    await harness.wait_gone(LIBVIRT_MACHINE, m.name)
    copy = {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "metadata": {
            "name": m.name,
            "namespace": harness.namespace,
            "labels": obj["metadata"]["labels"],
            "annotations": obj["metadata"]["annotations"],
            "ownerReferences": obj["metadata"]["ownerReferences"],
        },
        "spec": obj["spec"],
    }
    moved = await harness.create(LIBVIRT_MACHINE, copy)
    assert moved["metadata"]["uid"] != obj["metadata"]["uid"]

    harness2 = ControllerHarness(
        client=harness.client,
        api=harness.api,
        hosts=harness.hosts,
        observer=harness.observer,
        namespace=harness.namespace,
    )
    await harness2.start(SETUP)
    try:
        obj2 = await harness2.wait_ready(m.name)
        assert obj2["spec"]["domainUUID"] == domain_uuid
        domains = await harness.host().list_domains(cluster=cluster.name)
        assert [d.uuid for d in domains] == [domain_uuid]
        assert domains[0].owner is not None
        assert domains[0].owner.uid == moved["metadata"]["uid"]
    finally:
        await harness2.stop()


async def test_workload_node_gets_provider_id(harness: ControllerHarness, kubeconfig: Path) -> None:
    """The session API server doubles as the workload cluster: its admin kubeconfig goes into
    `<cluster>-kubeconfig` and a Node named like the machine waits for its providerID."""
    kubeconfig_bytes = kubeconfig.read_bytes()  # noqa: ASYNC240 - a small local file
    cluster = await harness.make_cluster()
    node_name = machine_hostname("node-m")
    await harness.api.resource(NODE).create(
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node_name}}
    )
    try:
        await harness.create(
            SECRET,
            {
                "metadata": {"name": f"{cluster.name}-kubeconfig", "namespace": harness.namespace},
                "data": {"value": b64(kubeconfig_bytes)},
            },
        )
        await harness.start(SETUP)
        m = await harness.make_machine(cluster, "node-m")
        obj = await harness.wait_ready(m.name)
        deadline = asyncio.get_running_loop().time() + 30
        while True:
            node = await harness.api.resource(NODE).get(ObjectKey("", node_name))
            if (node.get("spec") or {}).get("providerID"):
                break
            assert asyncio.get_running_loop().time() < deadline, "Node got no providerID"
            await asyncio.sleep(0.1)
        assert node["spec"]["providerID"] == obj["spec"]["providerID"]
    finally:
        await harness.api.resource(NODE).delete(ObjectKey("", node_name))


def test_ready_helper() -> None:
    assert not is_ready({"status": {}})
