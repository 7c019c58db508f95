"""The pieces around the machine reconciler: the port extension it needed (find_domain, a
full pool as StorageFull), the workload-cluster adapter, and the event -> key mapping."""

from __future__ import annotations

import functools
import secrets
import uuid
from pathlib import Path

import libvirt
import pytest
import yaml

from capl.controllers import machine as libvirtmachine
from capl.kube import KubeClient
from capl.kube.workload import KubeWorkloadClusters
from capl.ports.errors import StorageFull
from capl.ports.virt import (
    ClusterOwner,
    DomainEvent,
    DomainEventKind,
    HostEvent,
    HostEventKind,
    NetworkMode,
    NetworkSpec,
)
from capl.runtime.objects import ObjectKey
from capl.runtime.resources import NODE
from capl.testing.harness import TEST_DRIVER, ControllerHarness
from capl.virt import LibvirtHosts
from capl.virt.errors import translate

SETUP = functools.partial(libvirtmachine.setup, options=libvirtmachine.MachineOptions())


async def test_find_domain_by_name(hosts: LibvirtHosts) -> None:
    host = hosts.get(uri=TEST_DRIVER)
    assert await host.find_domain("capl-no-such-domain") is None
    conn = libvirt.open(TEST_DRIVER)
    try:
        name = "capl-test-" + secrets.token_hex(4)
        dom = conn.defineXML(
            f"<domain type='test'><name>{name}</name><memory unit='MiB'>64</memory>"
            "<os><type>hvm</type></os></domain>"
        )
        found = await host.find_domain(name)
        assert found is not None
        assert found.uuid == dom.UUIDString()
        assert found.owner is None  # not capl's
        dom.undefine()
    finally:
        conn.close()


def test_storage_drivers_capacity_check_is_storage_full() -> None:
    conn = libvirt.open(TEST_DRIVER)
    try:
        name = "capl-test-" + secrets.token_hex(4)
        pool = conn.storagePoolDefineXML(
            f"<pool type='dir'><name>{name}</name><target><path>/tmp/{name}</path></target></pool>",
            0,
        )
        pool.create(0)
        with pytest.raises(libvirt.libvirtError) as info:
            pool.createXML(
                "<volume><name>big</name><capacity unit='T'>1000</capacity>"
                "<allocation unit='T'>1000</allocation><target><format type='raw'/></target>"
                "</volume>",
                0,
            )
        error = translate(info.value, host="test:///default", action="create volume big")
        assert isinstance(error, StorageFull)
        assert "Not enough free space" in str(error)
        pool.destroy()
        pool.undefine()
    finally:
        conn.close()


@pytest.mark.apiserver
async def test_workload_clusters_adapter(kubeconfig: Path, control_plane: object) -> None:
    config = kubeconfig.read_bytes()  # noqa: ASYNC240 - a small local file
    workload = KubeWorkloadClusters()
    admin = await KubeClient.connect(str(kubeconfig))
    name = "node-" + secrets.token_hex(3)
    provider_id = f"libvirt:///{uuid.uuid4()}"
    try:
        assert not await workload.ensure_node_provider_id(
            cluster="ns/c", kubeconfig=config, node_name=name, provider_id=provider_id
        )
        await admin.resource(NODE).create({"metadata": {"name": name}})
        assert await workload.ensure_node_provider_id(
            cluster="ns/c", kubeconfig=config, node_name=name, provider_id=provider_id
        )
        node = await admin.resource(NODE).get(ObjectKey("", name))
        assert node["spec"]["providerID"] == provider_id
        # idempotent; a different providerID is never overwritten
        assert await workload.ensure_node_provider_id(
            cluster="ns/c", kubeconfig=config, node_name=name, provider_id=provider_id
        )
        assert not await workload.ensure_node_provider_id(
            cluster="ns/c", kubeconfig=config, node_name=name, provider_id="libvirt:///other"
        )
        # the topology labels: set, changed (the zone follows a live migration), others kept
        zone, region = "topology.kubernetes.io/zone", "topology.kubernetes.io/region"
        await admin.resource(NODE).patch(
            ObjectKey("", name), {"metadata": {"labels": {"kubernetes.io/os": "linux"}}}
        )
        for host in ("kvm1", "kvm2"):
            assert await workload.ensure_node_provider_id(
                cluster="ns/c",
                kubeconfig=config,
                node_name=name,
                provider_id=provider_id,
                labels={zone: host, region: "eu"},
            )
            node = await admin.resource(NODE).get(ObjectKey("", name))
            labels = node["metadata"]["labels"]
            assert (labels[zone], labels[region], labels["kubernetes.io/os"]) == (
                host,
                "eu",
                "linux",
            )
        # a Node of someone else's machine gets no labels either
        assert not await workload.ensure_node_provider_id(
            cluster="ns/c",
            kubeconfig=config,
            node_name=name,
            provider_id="libvirt:///other",
            labels={zone: "kvm3"},
        )
        node = await admin.resource(NODE).get(ObjectKey("", name))
        assert node["metadata"]["labels"][zone] == "kvm2"
        # a rotated kubeconfig replaces the client; a broken one is a False, not an error
        rotated = yaml.safe_dump(yaml.safe_load(config)).encode()
        assert rotated != config
        assert await workload.ensure_node_provider_id(
            cluster="ns/c", kubeconfig=rotated, node_name=name, provider_id=provider_id
        )
        assert not await workload.ensure_node_provider_id(
            cluster="ns/c",
            kubeconfig=b"not: [a kubeconfig",
            node_name=name,
            provider_id=provider_id,
        )
        unreachable = yaml.safe_load(config)
        unreachable["clusters"][0]["cluster"]["server"] = "https://127.0.0.1:1"
        assert not await workload.ensure_node_provider_id(
            cluster="ns/down",
            kubeconfig=yaml.safe_dump(unreachable).encode(),
            node_name=name,
            provider_id=provider_id,
        )
        await workload.forget(cluster="ns/c")
    finally:
        await admin.resource(NODE).delete(ObjectKey("", name))
        await admin.close()
        await workload.close()


@pytest.mark.apiserver
async def test_libvirt_events_map_to_machines(harness: ControllerHarness) -> None:
    cluster = await harness.make_cluster()
    await harness.start(SETUP)
    m = await harness.make_machine(cluster, "evented")
    obj = await harness.wait_ready(m.name)
    controller = harness.controller(libvirtmachine.CONTROLLER_NAME)
    reconciler = controller.reconciler
    assert isinstance(reconciler, libvirtmachine.LibvirtMachineReconciler)
    key = ObjectKey(harness.namespace, m.name)
    host_id = harness.hosts.host_id(TEST_DRIVER)
    assert reconciler._keys_on_host(host_id) == [key]
    assert reconciler._keys_on_host(harness.hosts.host_id("test+unix:///default")) == []

    before = controller.reconciles
    reconciler.on_virt_event(
        DomainEvent(
            host_id=host_id,
            uuid=obj["spec"]["domainUUID"].upper(),
            name="x",
            kind=DomainEventKind.STOPPED,
            detail="destroyed",
        )
    )
    reconciler.on_virt_event(HostEvent(host_id=host_id, kind=HostEventKind.CONNECTED))
    deadline = controller.clock.now() + 10
    while controller.reconciles == before:
        assert controller.clock.now() < deadline
        await controller.clock.sleep(0.02)


async def test_dhcp_reservation_carries_the_dns_name(hosts: LibvirtHosts) -> None:
    """The port extension the machine controller uses: DHCP host and DNS name in one locked
    update, and no DNS name on a reservation that belongs to another host name."""
    host = hosts.get(uri=TEST_DRIVER)
    owner = ClusterOwner(namespace="ns", name="c-" + secrets.token_hex(3))
    name = "capl-test-" + secrets.token_hex(4)
    await host.ensure_network(
        NetworkSpec(
            name=name,
            mode=NetworkMode.ISOLATED,
            owner=owner,
            cidr=f"10.{secrets.randbelow(200) + 20}.{secrets.randbelow(250)}.0/24",
        )
    )
    try:
        mine = await host.ensure_dhcp_host(
            network=name, mac="52:54:00:00:00:aa", name="m1", dns_hostnames=["m1.lab.example"]
        )
        again = await host.ensure_dhcp_host(
            network=name, mac="52:54:00:00:00:aa", name="m1", dns_hostnames=["m1.lab.example"]
        )
        assert again == mine
        other = await host.ensure_dhcp_host(
            network=name, mac="52:54:00:00:00:aa", name="m2", dns_hostnames=["m2.lab.example"]
        )
        assert other.name == "m1"  # found under its own name, returned untouched
        info = await host.get_network(name)
        assert info is not None
        assert [(d.ip, d.hostnames) for d in info.dns_hosts] == [(mine.ip, ("m1.lab.example",))]
    finally:
        await host.delete_network(name=name, owner=owner)
