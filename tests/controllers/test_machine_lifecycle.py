"""After creation: domains that stop or vanish out of band, and deletion in all its shapes."""

from __future__ import annotations

import asyncio
import functools
import xml.etree.ElementTree as ET

import libvirt
import pytest

from capl.api import constants as c
from capl.controllers import machine as libvirtmachine
from capl.ports.virt import CAPL_XML_NAMESPACE, DomainState
from capl.runtime.resources import CLUSTER, LIBVIRT_CLUSTER, LIBVIRT_MACHINE, MACHINE
from capl.testing.harness import TEST_DRIVER, ControllerHarness
from capl.testing.objects import condition
from tests.controllers.conftest import domain_owner, events_of, leftovers

pytestmark = pytest.mark.apiserver

FAST = libvirtmachine.MachineOptions(
    address_poll=0.2, shutdown_timeout=3, shutdown_poll=0.2, retry_first=0.2, retry_max=1.0
)
SETUP = functools.partial(libvirtmachine.setup, options=FAST)


async def _warning(harness: ControllerHarness, name: str, reason: str) -> str:
    for _ in range(200):
        for type_, why, message in await events_of(harness, name):
            if type_ == "Warning" and why == reason:
                return message
        await asyncio.sleep(0.05)
    raise AssertionError(f"no Warning event {reason} for {name}")


async def test_stopped_domain_is_started_again(harness: ControllerHarness) -> None:
    cluster = await harness.make_cluster()
    await harness.start(SETUP)
    m = await harness.make_machine(cluster)
    obj = await harness.wait_ready(m.name)
    domain_uuid = obj["spec"]["domainUUID"]
    host = harness.host()
    assert await host.destroy_domain(domain_uuid, owner=domain_owner(obj))

    obj = await harness.wait_for(
        LIBVIRT_MACHINE,
        m.name,
        lambda o: (
            condition(o, c.ConditionType.DOMAIN_PROVISIONED, "reason") == c.Reason.DOMAIN_RESTARTED
        ),
        what="restarted",
    )
    assert condition(obj, c.ConditionType.DOMAIN_PROVISIONED) == "True"
    info = await host.get_domain(domain_uuid)
    assert info is not None
    assert info.state is DomainState.RUNNING
    message = await _warning(harness, m.name, c.Reason.DOMAIN_RESTARTED)
    assert "shutoff" in message


async def test_domain_deleted_out_of_band_is_recreated(harness: ControllerHarness) -> None:
    cluster = await harness.make_cluster()
    await harness.start(SETUP)
    m = await harness.make_machine(cluster)
    obj = await harness.wait_ready(m.name)
    domain_uuid = obj["spec"]["domainUUID"]
    host = harness.host()
    assert await host.undefine_domain(domain_uuid, owner=domain_owner(obj))

    await harness.wait_for(
        LIBVIRT_MACHINE,
        m.name,
        lambda o: (
            condition(o, c.ConditionType.DOMAIN_PROVISIONED, "reason") == c.Reason.DOMAIN_RECREATED
        ),
        what="recreated",
    )
    info = await host.get_domain(domain_uuid)
    assert info is not None
    assert info.state is DomainState.RUNNING
    assert info.owner == domain_owner(obj)
    await _warning(harness, m.name, c.Reason.DOMAIN_RECREATED)
    assert len(await host.list_domains(cluster=cluster.name)) == 1


async def test_delete_removes_everything(harness: ControllerHarness) -> None:
    cluster = await harness.make_cluster(dns_domain="del.example")
    await harness.start(SETUP)
    m = await harness.make_machine(cluster, "gone-soon")
    keep = await harness.make_machine(cluster, "stays")
    await harness.wait_ready(m.name)
    await harness.wait_ready(keep.name)
    assert await leftovers(harness, cluster, m.name)  # sanity: there is something to remove

    await harness.delete_machine(m.name)
    assert await leftovers(harness, cluster, m.name) == []
    # the other machine is untouched
    assert len(await leftovers(harness, cluster, keep.name)) == 5  # domain, 2 volumes, dhcp, dns
    assert (await harness.get(MACHINE, m.name)) is not None  # deletion is the infra object's


async def test_delete_with_owner_cluster_and_libvirt_cluster_gone(
    harness: ControllerHarness,
) -> None:
    """A missing Machine, Cluster and LibvirtCluster do not block deletion: the host and
    names come from the placement annotation."""
    cluster = await harness.make_cluster(dns_domain="orphan.example")
    await harness.start(SETUP)
    m = await harness.make_machine(cluster, "orphan")
    await harness.wait_ready(m.name)
    await harness.delete(MACHINE, m.name)
    await harness.delete(CLUSTER, cluster.name)
    await harness.delete(LIBVIRT_CLUSTER, cluster.name)
    await harness.wait_gone(LIBVIRT_CLUSTER, cluster.name)
    await harness.wait_gone(CLUSTER, cluster.name)

    await harness.delete_machine(m.name)
    assert await leftovers(harness, cluster, m.name) == []


async def test_delete_before_anything_was_created(harness: ControllerHarness) -> None:
    cluster = await harness.make_cluster()
    await harness.start(SETUP)
    m = await harness.make_machine(cluster, bootstrap=None)
    await harness.wait_for(
        LIBVIRT_MACHINE,
        m.name,
        lambda o: c.MACHINE_FINALIZER in (o["metadata"].get("finalizers") or ()),
    )
    await harness.delete_machine(m.name, within=10)
    assert await harness.host().list_domains(cluster=cluster.name) == []


async def test_delete_for_move_and_pause_leave_the_domain(harness: ControllerHarness) -> None:
    cluster = await harness.make_cluster()
    await harness.start(SETUP)
    moving = await harness.make_machine(cluster, "moving")
    obj = await harness.wait_ready(moving.name)
    await harness.patch(
        LIBVIRT_MACHINE,
        moving.name,
        {"metadata": {"annotations": {"clusterctl.cluster.x-k8s.io/delete-for-move": ""}}},
    )
    await harness.delete_machine(moving.name, within=10)
    info = await harness.host().get_domain(obj["spec"]["domainUUID"])
    assert info is not None
    assert info.state is DomainState.RUNNING

    paused = await harness.make_machine(cluster, "paused")
    await harness.wait_ready(paused.name)
    await harness.patch(CLUSTER, cluster.name, {"spec": {"paused": True}})
    await harness.delete(LIBVIRT_MACHINE, paused.name)
    obj = await harness.wait_for(
        LIBVIRT_MACHINE,
        paused.name,
        lambda o: condition(o, c.ConditionType.PAUSED) == "True",
        what="Paused while deleting",
    )
    assert (await harness.host().get_domain(obj["spec"]["domainUUID"])) is not None
    await harness.patch(CLUSTER, cluster.name, {"spec": {"paused": None}})
    await harness.wait_gone(LIBVIRT_MACHINE, paused.name)
    assert await leftovers(harness, cluster, paused.name) == []

    # what clusterctl move does: pause, annotate, delete, then strip the finalizers itself,
    # faster than a reconcile may see the annotation; the domain stays, untouched
    moved = await harness.make_machine(cluster, "moved")
    obj = await harness.wait_ready(moved.name)
    await harness.patch(CLUSTER, cluster.name, {"spec": {"paused": True}})
    await harness.patch(
        LIBVIRT_MACHINE,
        moved.name,
        {"metadata": {"annotations": {"clusterctl.cluster.x-k8s.io/delete-for-move": ""}}},
    )
    await harness.delete(LIBVIRT_MACHINE, moved.name)
    await harness.patch(LIBVIRT_MACHINE, moved.name, {"metadata": {"finalizers": None}})
    await harness.wait_gone(LIBVIRT_MACHINE, moved.name)
    await harness.settle(libvirtmachine.CONTROLLER_NAME)
    info = await harness.host().get_domain(obj["spec"]["domainUUID"])
    assert info is not None
    assert info.state is DomainState.RUNNING
    assert len(await leftovers(harness, cluster, moved.name)) > 1  # domain, volumes, entries


async def test_foreign_tag_on_our_uuid_blocks_deletion(harness: ControllerHarness) -> None:
    """A domain carrying the machine's UUID but someone else's tag is never destroyed."""
    cluster = await harness.make_cluster()
    await harness.start(SETUP)
    m = await harness.make_machine(cluster, "victim")
    obj = await harness.wait_ready(m.name)
    domain_uuid = obj["spec"]["domainUUID"]
    conn = libvirt.open(TEST_DRIVER)
    try:
        dom = conn.lookupByUUIDString(domain_uuid)
        tag = ET.Element("machine")
        for key, value in (("cluster", "x"), ("namespace", "other"), ("name", "y"), ("uid", "z")):
            ET.SubElement(tag, key).text = value
        dom.setMetadata(
            libvirt.VIR_DOMAIN_METADATA_ELEMENT,
            ET.tostring(tag, encoding="unicode"),
            "capl",
            CAPL_XML_NAMESPACE,
            libvirt.VIR_DOMAIN_AFFECT_LIVE | libvirt.VIR_DOMAIN_AFFECT_CONFIG,
        )
        await harness.delete(LIBVIRT_MACHINE, m.name)
        obj = await harness.wait_for(
            LIBVIRT_MACHINE,
            m.name,
            lambda o: (
                condition(o, c.ConditionType.DOMAIN_PROVISIONED, "reason")
                == c.Reason.FOREIGN_DOMAIN
            ),
            what="blocked by a foreign tag",
        )
        assert condition(obj, c.ConditionType.READY, "reason") == c.Reason.DELETING
        assert "left untouched" in (condition(obj, c.ConditionType.READY, "message") or "")
        assert dom.isActive()
        dom.destroy()
        dom.undefine()
    finally:
        conn.close()
    await harness.wait_gone(LIBVIRT_MACHINE, m.name)
