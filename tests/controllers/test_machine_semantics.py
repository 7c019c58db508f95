"""Cluster API semantics the machine and migration controllers must keep (issue 15).

- Pause means no writes: a paused cluster's new LibvirtMachine (and a migration of it) gets
  the `Paused` condition and nothing else — no finalizer, no identity or defaults, no domain;
  proven by the manager client's own request accounting (one status patch per object, no
  other request that writes), by the objects' metadata/spec being byte-for-byte what the
  test created, and by a reconcile forced while paused leaving the resourceVersion alone.
  Unpausing resumes.
- Failure domains are authoritative: a LibvirtMachine whose spec.hostName names another host
  than its Machine's spec.failureDomain is not placed (DomainProvisioned False/
  FailureDomainConflict naming both fields, a Warning Event, nothing created on any host);
  changing the Machine's failure domain resolves it, and such a machine is deleted at once.
- Workload Nodes get the zone: topology.kubernetes.io/zone = the machine's host (its failure
  domain), /region = the LibvirtCluster's spec.region; the zone follows spec.hostName.
"""

from __future__ import annotations

import functools
import secrets
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from capl.api import constants as c
from capl.controllers import machine as libvirtmachine
from capl.controllers import migration
from capl.controllers.common import Deps
from capl.ports.naming import machine_hostname
from capl.runtime.informer import Cache
from capl.runtime.objects import Obj, ObjectKey
from capl.runtime.resources import (
    CLUSTER,
    LIBVIRT_CLUSTER,
    LIBVIRT_MACHINE,
    LIBVIRT_MACHINE_MIGRATION,
    MACHINE,
    NODE,
    SECRET,
    Resource,
)
from capl.testing.harness import TEST_DRIVER, ControllerHarness
from capl.testing.objects import b64, condition, condition_of, libvirt_machine_spec
from capl.virt.migration import LibvirtMigrations
from tests.controllers.conftest import events_of, leftovers
from tests.fixtures.common import eventually

pytestmark = pytest.mark.apiserver

FAST = libvirtmachine.MachineOptions(address_poll=0.2, retry_first=0.2, retry_max=1.0)
MACHINES = functools.partial(libvirtmachine.setup, options=FAST)


def migrations_setup(manager: Any, deps: Any) -> object:
    return migration.setup(manager, deps, migrations=LibvirtMigrations())


def untouched(obj: Obj, created: Obj) -> None:
    """metadata (but the server's own fields) and spec exactly as the test created them."""
    server = {"resourceVersion", "managedFields", "generation", "creationTimestamp", "uid"}
    have = {k: v for k, v in obj["metadata"].items() if k not in server}
    want = {k: v for k, v in created["metadata"].items() if k not in server}
    assert have == want
    assert obj.get("spec") == created.get("spec")


async def test_paused_cluster_new_machine_gets_only_the_paused_condition(
    harness: ControllerHarness,
) -> None:
    h = harness
    cluster = await h.make_cluster(paused=True)
    await h.start(MACHINES, migrations_setup)
    m = await h.make_machine(cluster)
    mig_name = f"{m.name}-move"
    mig = await h.create(
        LIBVIRT_MACHINE_MIGRATION,
        {
            "apiVersion": c.API_VERSION,
            "kind": c.Kind.LIBVIRT_MACHINE_MIGRATION,
            "metadata": {"name": mig_name, "namespace": h.namespace},
            "spec": {"machineName": m.name},
        },
    )

    def paused(obj: Obj) -> bool:
        return condition(obj, c.ConditionType.PAUSED) == "True"

    lm = await h.wait_for(LIBVIRT_MACHINE, m.name, paused, what="Paused")
    mig_obj = await h.wait_for(LIBVIRT_MACHINE_MIGRATION, mig_name, paused, what="Paused")
    assert condition(lm, c.ConditionType.PAUSED, "reason") == c.Reason.PAUSED
    assert "is paused" in str(condition_of(mig_obj, c.ConditionType.PAUSED)["message"])

    # a reconcile forced while paused writes nothing more
    for name, key in (
        (libvirtmachine.CONTROLLER_NAME, ObjectKey(h.namespace, m.name)),
        (migration.CONTROLLER_NAME, ObjectKey(h.namespace, mig_name)),
    ):
        ctl = await h.settle(name)
        before = ctl.reconciles
        ctl.enqueue(key)
        await eventually(lambda ctl=ctl, before=before: ctl.reconciles > before, within=30)
        await h.settle(name)
    again = await h.get(LIBVIRT_MACHINE, m.name)
    mig_again = await h.get(LIBVIRT_MACHINE_MIGRATION, mig_name)
    assert again is not None
    assert mig_again is not None
    assert again["metadata"]["resourceVersion"] == lm["metadata"]["resourceVersion"]
    assert mig_again["metadata"]["resourceVersion"] == mig_obj["metadata"]["resourceVersion"]

    # only the Paused condition: no finalizer, no identity/defaults, no domain
    untouched(again, m.libvirt_machine)
    untouched(mig_again, mig)
    assert [cond["type"] for cond in again["status"]["conditions"]] == [c.ConditionType.PAUSED]
    assert [cond["type"] for cond in mig_again["status"]["conditions"]] == [c.ConditionType.PAUSED]
    assert set(again["status"]) == {"conditions"}
    assert set(mig_again["status"]) == {"conditions"}
    assert h.writes(LIBVIRT_MACHINE, m.name) == {"PATCH/status": 1}
    assert h.writes(LIBVIRT_MACHINE_MIGRATION, mig_name) == {"PATCH/status": 1}
    assert await leftovers(h, cluster, m.name) == []

    # unpaused: the machine is provisioned, the migration is looked at (and refused: one host)
    await h.patch(CLUSTER, cluster.name, {"spec": {"paused": False}})
    lm = await h.wait_ready(m.name)
    assert condition(lm, c.ConditionType.PAUSED, "reason") == c.Reason.NOT_PAUSED
    assert c.MACHINE_FINALIZER in lm["metadata"]["finalizers"]
    assert lm["spec"]["hostName"] == "h1"
    mig_obj = await h.wait_for(
        LIBVIRT_MACHINE_MIGRATION,
        mig_name,
        lambda o: (o.get("status") or {}).get("phase") == "Failed",
        what="scheduled (and failed: one host)",
    )
    assert mig_obj["status"]["message"]


class LaggingCache(Cache):
    """The manager's cache (its informers shared) with one LibvirtMachine's watch event late:
    `get` misses that machine, as a cache does for a moment after a create."""

    def __init__(self, inner: Cache, late: ObjectKey) -> None:
        self.__dict__.update(inner.__dict__)
        self.late = late

    def get(self, resource: Resource, key: ObjectKey) -> Obj | None:
        if resource == LIBVIRT_MACHINE and key == self.late:
            return None
        return super().get(resource, key)


async def test_a_migration_of_a_machine_the_cache_does_not_hold_yet_is_not_failed_as_missing(
    harness: ControllerHarness,
) -> None:
    """A migration created with its machine, whose watch event is not in yet, looks the machine
    up on the API server (and is refused for the machine's own state, not as "not found")."""
    h = harness
    cluster = await h.make_cluster()
    m = await h.make_machine(cluster)
    late = ObjectKey(h.namespace, m.name)

    def lagging(manager: Any, deps: Deps) -> object:
        return migrations_setup(manager, replace(deps, cache=LaggingCache(deps.cache, late)))

    await h.start(lagging)
    mig_name = f"{m.name}-move"
    await h.create(
        LIBVIRT_MACHINE_MIGRATION,
        {
            "apiVersion": c.API_VERSION,
            "kind": c.Kind.LIBVIRT_MACHINE_MIGRATION,
            "metadata": {"name": mig_name, "namespace": h.namespace},
            "spec": {"machineName": m.name},
        },
    )
    mig = await h.wait_for(
        LIBVIRT_MACHINE_MIGRATION,
        mig_name,
        lambda o: (o.get("status") or {}).get("phase") == "Failed",
        what="refused",
    )
    assert mig["status"]["message"] == (
        f"LibvirtMachine {m.name} has no domain yet (nothing to migrate)"
    )


async def test_failure_domain_conflict_is_refused_until_resolved(
    harness: ControllerHarness,
) -> None:
    h = harness
    hosts = [
        {"name": "h1", "uri": TEST_DRIVER},
        {"name": "h2", "uri": "qemu+unix:///system?socket=/nonexistent/capl.sock"},
    ]
    # several hosts: an adopted network (nat/isolated created on several hosts is refused);
    # h2 is never reached: a conflict is decided before any host is asked
    cluster = await h.make_cluster(hosts=hosts, adopt_network=True, prepare=False)
    await h.prepare_hosts(cluster, only=["h1"])
    await h.start(MACHINES)
    a = await h.make_machine(cluster, spec=libvirt_machine_spec(hostName="h1"), failure_domain="h2")
    b = await h.make_machine(cluster, spec=libvirt_machine_spec(hostName="h2"), failure_domain="h1")

    def conflict(obj: Obj) -> bool:
        reason = condition(obj, c.ConditionType.DOMAIN_PROVISIONED, "reason")
        return reason == c.Reason.FAILURE_DOMAIN_CONFLICT

    obj = await h.wait_for(LIBVIRT_MACHINE, a.name, conflict, what="FailureDomainConflict")
    message = condition_of(obj, c.ConditionType.DOMAIN_PROVISIONED)["message"]
    assert message.startswith(
        f"spec.hostName 'h1' conflicts with Machine {h.namespace}/{a.name}'s "
        "spec.failureDomain 'h2'"
    )
    assert condition(obj, c.ConditionType.READY) == "False"
    # nothing made: no identity, no domain, no volume, no DHCP or DNS entry
    assert not obj["spec"].get("domainUUID")
    assert not obj["spec"].get("providerID")
    assert await leftovers(h, cluster, a.name) == []
    events = await events_of(h, a.name)
    assert [e for e in events if e[1] == c.Reason.FAILURE_DOMAIN_CONFLICT] == [
        ("Warning", c.Reason.FAILURE_DOMAIN_CONFLICT, message)
    ]
    await h.wait_for(LIBVIRT_MACHINE, b.name, conflict, what="FailureDomainConflict")

    # resolved from the Machine's side (as Cluster API would re-spread it)
    await h.patch(MACHINE, a.name, {"spec": {"failureDomain": "h1"}})
    obj = await h.wait_ready(a.name)
    assert obj["spec"]["hostName"] == "h1"
    assert obj["status"]["failureDomain"] == "h1"
    # the other one is replaced (hostName is immutable): nothing to clean, it goes at once
    await h.delete_machine(b.name, within=30)
    assert await leftovers(h, cluster, b.name) == []


async def test_workload_node_gets_the_zone_of_its_host(
    harness: ControllerHarness, kubeconfig: Path, shared_test_driver: str
) -> None:
    """The session API server doubles as the workload cluster (its admin kubeconfig in
    `<cluster>-kubeconfig`). The Node gets topology.kubernetes.io/zone = the machine's host
    and /region = the LibvirtCluster's spec.region; when spec.hostName changes the way a
    completed live migration writes it (migrationTarget set, then hostName with
    migrationTarget cleared in one write), the zone follows. The test driver cannot migrate,
    so here the domain is re-created on the new host instead of moved; the labels only
    depend on spec.hostName."""
    h = harness
    hosts = [{"name": "h1", "uri": TEST_DRIVER}, {"name": "h2", "uri": shared_test_driver}]
    cluster = await h.make_cluster(hosts=hosts, adopt_network=True)
    await h.patch(LIBVIRT_CLUSTER, cluster.name, {"spec": {"region": "lab-1"}})
    name = f"zone-{secrets.token_hex(2)}"
    node_name = machine_hostname(name)
    await h.api.resource(NODE).create({"metadata": {"name": node_name}})
    try:
        await h.create(
            SECRET,
            {
                "metadata": {"name": f"{cluster.name}-kubeconfig", "namespace": h.namespace},
                "data": {"value": b64(kubeconfig.read_bytes())},  # noqa: ASYNC240 - small file
            },
        )
        await h.start(MACHINES)
        await h.make_machine(cluster, name, failure_domain="h1")
        await h.wait_ready(name)

        async def labelled(zone: str) -> Obj | None:
            node = await h.api.resource(NODE).get(ObjectKey("", node_name))
            labels = node["metadata"].get("labels") or {}
            return node if labels.get(c.ZONE_LABEL) == zone else None

        node = await eventually(lambda: labelled("h1"), within=30, what="zone h1")
        assert node["metadata"]["labels"][c.REGION_LABEL] == "lab-1"
        assert node["spec"]["providerID"].startswith(c.PROVIDER_ID_PREFIX)

        await h.patch(LIBVIRT_MACHINE, name, {"spec": {"migrationTarget": "h2"}})
        await h.wait_for(
            LIBVIRT_MACHINE,
            name,
            lambda o: condition(o, c.ConditionType.MIGRATING) == "True",
            what="Migrating",
        )
        await h.patch(LIBVIRT_MACHINE, name, {"spec": {"hostName": "h2", "migrationTarget": None}})
        obj = await h.wait_for(
            LIBVIRT_MACHINE,
            name,
            lambda o: (o.get("status") or {}).get("failureDomain") == "h2",
            what="on h2",
        )
        node = await eventually(lambda: labelled("h2"), within=30, what="zone h2")
        assert node["metadata"]["labels"][c.REGION_LABEL] == "lab-1"
        assert node["spec"]["providerID"] == obj["spec"]["providerID"]
    finally:
        await h.api.resource(NODE).delete(ObjectKey("", node_name))
