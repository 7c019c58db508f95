"""The LibvirtCluster controller against the real apiserver and the libvirt test driver.

The main paths and their API write counts: gates, spec defaults, network/pool creation and
removal, failure domains, unreachable hosts, endpoint records following control-plane
machines, bad input, deletion order. Real-daemon behaviour (dnsmasq answers, pool paths,
two URIs of one daemon, real guests) is in tests/libvirtd/test_cluster_*.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from capl.api import constants as c
from capl.ports.virt import ClusterOwner, NetworkMode
from capl.runtime.objects import ObjectKey, get_path
from capl.runtime.resources import CLUSTER, LIBVIRT_CLUSTER, SECRET
from capl.testing.harness import TEST_DRIVER, ControllerHarness
from capl.testing.objects import BRIDGE_ENDPOINT, TEST_DRIVER_BRIDGE
from tests.controllers.test_cluster_support import (
    cached,
    caught_up,
    clusters,
    condition_of,
    conditions_of,
    create_cluster,
    create_machine,
    create_secret,
    delete_machine,
    has_condition,
    random_cidr,
    reconcile_again,
    set_addresses,
    settle,
    unique,
    wait_condition,
    wait_provisioned,
    writes,
)

__all__ = ["clusters"]  # the fixture this module uses

pytestmark = pytest.mark.apiserver

UNREACHABLE_URI = "qemu+unix:///session?socket=/nonexistent/capl-test.sock"
UNREACHABLE_ID = "qemu+unix:///session"
GONE_URI = "qemu+unix:///gone?socket=/nonexistent/capl-gone.sock"


def isolated(cidr: str | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "hosts": [{"name": "kvm1", "uri": TEST_DRIVER}],
        "network": {"mode": "isolated", "cidr": cidr or random_cidr(), **extra},
    }


def endpoint_message(h: ControllerHarness, name: str) -> str:
    return str(
        condition_of(cached(h, name), c.ConditionType.CONTROL_PLANE_ENDPOINT_READY).get("message")
    )


async def test_creates_network_and_pool_publishes_failure_domain_and_endpoint(
    clusters: ControllerHarness,
) -> None:
    h = clusters
    name = unique("c")
    cidr = random_cidr()
    await create_cluster(h, name, isolated(cidr))
    await wait_provisioned(h, name)
    obj = await h.wait_for(LIBVIRT_CLUSTER, name, lambda o: has_condition(o, "Ready", "True"))
    spec, status = obj["spec"], obj["status"]
    ns = h.namespace
    derived = f"capl-{ns}.{name}"
    domain = f"{name}.{ns}.capl.internal"
    # defaults written into spec, with the finalizer
    assert spec["network"]["name"] == derived
    assert spec["network"]["dnsDomain"] == domain
    assert spec["storagePool"] == {"name": derived, "path": f"/var/lib/libvirt/images/{derived}"}
    assert spec["controlPlaneEndpoint"] == {"host": f"api.{domain}", "port": 6443}
    assert obj["metadata"]["finalizers"] == [c.CLUSTER_FINALIZER]
    # failure domain and host status
    assert status["failureDomains"] == [
        {
            "name": "kvm1",
            "controlPlane": True,
            "attributes": {
                "cpus": "16",
                "memoryMiB": "3072",
                "libvirtVersion": "9.0.0",
                "uri": TEST_DRIVER,
            },
        }
    ]
    # (the test driver assigns no bridge name; the real daemon does)
    assert status["hosts"] == [
        {
            "name": "kvm1",
            "reachable": True,
            "libvirtVersion": "9.0.0",
            "network": derived,
            "networkCreated": True,
            "networkUUID": status["hosts"][0].get("networkUUID"),
            "storagePool": derived,
            "storagePoolCreated": True,
        }
    ]
    assert status["observedGeneration"] == obj["metadata"]["generation"]
    assert conditions_of(obj) == {
        "Paused": ("False", "NotPaused"),
        "HostsReachable": ("True", "Reachable"),
        "NetworkReady": ("True", "Ready"),
        "StorageReady": ("True", "Ready"),
        "ControlPlaneEndpointReady": ("True", "Ready"),
        "Ready": ("True", "Ready"),
    }
    # what libvirt holds
    host = h.host()
    network = await host.get_network(derived)
    assert network is not None
    assert status["hosts"][0]["networkUUID"] == network.uuid
    assert (network.mode, network.cidr, network.dns_domain) == (NetworkMode.ISOLATED, cidr, domain)
    assert (network.active, network.persistent, network.autostart) == (True, True, True)
    assert network.owner == ClusterOwner(namespace=ns, name=name, uid=obj["metadata"]["uid"])
    pool = await host.get_pool(derived)
    assert pool is not None
    assert (pool.active, pool.autostart) == (True, True)
    assert pool.owned_by(ClusterOwner(namespace=ns, name=name))

    # writes: one metadata/spec patch (finalizer + defaults), one status patch
    await settle(h)
    assert writes(h, name) == {"PATCH": 1, "PATCH/status": 1}
    # reconciles that find everything in place write nothing
    await reconcile_again(h, name)
    await reconcile_again(h, name)
    assert writes(h, name) == {"PATCH": 1, "PATCH/status": 1}

    # delete: network and pool go, then the object (the finalizer patch is the only write)
    await h.delete(LIBVIRT_CLUSTER, name)
    await h.wait_gone(LIBVIRT_CLUSTER, name)
    assert await host.get_network(derived) is None
    assert await host.get_pool(derived) is None
    assert writes(h, name) == {"PATCH": 2, "PATCH/status": 1}


async def test_two_clusters_with_different_cidrs_coexist(clusters: ControllerHarness) -> None:
    h = clusters
    names = [await create_cluster(h, unique(p), isolated()) for p in ("a", "b")]
    networks = set()
    for name in names:
        obj = await wait_condition(h, name, c.ConditionType.READY, "True")
        assert obj
        networks.add(get_path(cached(h, name) or {}, "spec", "network", "name"))
    assert len(networks) == 2
    for network in networks:
        assert await h.host().get_network(str(network)) is not None


async def test_failure_domains_and_an_unreachable_host(
    clusters: ControllerHarness, shared_test_driver: str
) -> None:
    h = clusters
    name = await create_cluster(
        h,
        unique("fd"),
        {
            "hosts": [
                {"name": "kvm1", "uri": TEST_DRIVER},
                {"name": "kvm2", "uri": shared_test_driver, "controlPlane": False},
                {"name": "kvm3", "uri": UNREACHABLE_URI, "controlPlane": False},
            ],
            # several hosts: a bridge-mode network (nat/isolated would be one island per
            # host, refused by the CRD), created by capl on every host like the others
            "network": {"mode": "bridge", "bridge": TEST_DRIVER_BRIDGE},
            "controlPlaneEndpoint": dict(BRIDGE_ENDPOINT),
        },
    )
    reachable = await wait_condition(h, name, c.ConditionType.HOSTS_REACHABLE, "False")
    assert reachable["reason"] == c.Reason.UNREACHABLE
    assert f"kvm3 ({UNREACHABLE_ID})" in reachable["message"]
    assert "kvm1" not in reachable["message"]
    assert "kvm2" not in reachable["message"]
    # the two other hosts keep working
    await wait_provisioned(h, name)
    await wait_condition(h, name, c.ConditionType.NETWORK_READY, "True")
    obj = await wait_condition(h, name, c.ConditionType.STORAGE_READY, "True")
    obj = await h.get(LIBVIRT_CLUSTER, name) or {}
    domains = obj["status"]["failureDomains"]
    assert [(d["name"], d["controlPlane"], d["attributes"]["uri"]) for d in domains] == [
        ("kvm1", True, TEST_DRIVER),
        ("kvm2", False, shared_test_driver),
    ]
    hosts = {entry["name"]: entry for entry in obj["status"]["hosts"]}
    assert hosts["kvm3"]["reachable"] is False
    assert "nonexistent" in hosts["kvm3"]["message"]
    assert hosts["kvm1"]["reachable"] is True
    assert hosts["kvm2"]["reachable"] is True
    assert has_condition(obj, c.ConditionType.READY, "False", c.Reason.UNREACHABLE)
    network = obj["spec"]["network"]["name"]
    for uri in (TEST_DRIVER, shared_test_driver):
        assert await h.host(uri).get_network(network) is not None
    # retrying the unreachable host does not rewrite the status
    await caught_up(h, name)
    before = writes(h, name)
    await reconcile_again(h, name)
    await reconcile_again(h, name)
    assert writes(h, name) == before

    # kvm2 goes away for good (its URI now leads nowhere): having the cluster's network and
    # pool, it blocks deletion until it leaves the spec; kvm3, where capl never created
    # anything, does not
    moved = [
        {**entry, "uri": GONE_URI} if entry["name"] == "kvm2" else entry
        for entry in obj["spec"]["hosts"]
    ]
    await h.patch(LIBVIRT_CLUSTER, name, {"spec": {"hosts": moved}})
    await h.wait_for(
        LIBVIRT_CLUSTER,
        name,
        lambda o: "kvm2" in str(condition_of(o, c.ConditionType.HOSTS_REACHABLE).get("message")),
        what="kvm2 unreachable",
    )
    await h.delete(LIBVIRT_CLUSTER, name)
    blocked = await wait_condition(h, name, c.ConditionType.READY, "False", c.Reason.DELETING)
    assert "kvm2" in blocked["message"]
    assert "kvm3" not in blocked["message"]
    assert await h.host().get_network(network) is None  # kvm1 is cleaned meanwhile
    remaining = [entry for entry in moved if entry["name"] != "kvm2"]
    await h.patch(LIBVIRT_CLUSTER, name, {"spec": {"hosts": remaining}})
    await h.wait_gone(LIBVIRT_CLUSTER, name)
    # what stays on the host that was dropped from spec is the admin's to clean up
    shared = h.host(shared_test_driver)
    owner = ClusterOwner(namespace=h.namespace, name=name)
    assert await shared.delete_network(name=network, owner=owner)
    assert await shared.delete_pool(name=obj["spec"]["storagePool"]["name"], owner=owner)


async def test_endpoint_records_follow_control_plane_machines(clusters: ControllerHarness) -> None:
    h = clusters
    name = unique("dns")
    cidr = random_cidr()
    base = cidr.rsplit(".", 1)[0]
    await create_cluster(h, name, isolated(cidr))
    obj = await wait_condition(h, name, c.ConditionType.READY, "True")
    obj = await h.get(LIBVIRT_CLUSTER, name) or {}
    network = obj["spec"]["network"]["name"]
    domain = obj["spec"]["network"]["dnsDomain"]
    host = h.host()

    async def records() -> dict[str, tuple[str, ...]]:
        info = await host.get_network(network)
        assert info is not None
        return {record.ip: record.hostnames for record in info.dns_hosts}

    # the machine controller's own record on the first machine's address
    await host.add_dns_hostnames(network=network, ip=f"{base}.10", hostnames=[f"cp1.{domain}"])
    await create_machine(h, "cp1", cluster=name, control_plane=True, addresses=[f"{base}.10"])
    await create_machine(
        h, "cp2", cluster=name, control_plane=True, label_on="machine", addresses=[f"{base}.11"]
    )
    await create_machine(h, "w1", cluster=name, control_plane=False, addresses=[f"{base}.12"])
    await h.wait_for(
        LIBVIRT_CLUSTER,
        name,
        lambda _: endpoint_message(h, name) == f"api.{domain}:6443 -> {base}.10, {base}.11",
        what="records for both control-plane machines",
    )
    await settle(h)
    assert await records() == {
        f"{base}.10": (f"cp1.{domain}", "api", "api-int"),
        f"{base}.11": ("api", "api-int"),
    }

    # an address change moves the record; a deleted machine's record goes (not the
    # machine controller's name beside it)
    await set_addresses(h, "cp2", [f"{base}.21", "fd00::1"])
    await delete_machine(h, "cp1")
    await h.wait_for(
        LIBVIRT_CLUSTER,
        name,
        lambda _: endpoint_message(h, name) == f"api.{domain}:6443 -> {base}.21",
        what="records follow the machines",
    )
    await settle(h)
    assert await records() == {f"{base}.10": (f"cp1.{domain}",), f"{base}.21": ("api", "api-int")}

    # deletion waits for the machines, then removes the network (and its records)
    await h.delete(LIBVIRT_CLUSTER, name)
    await h.wait_for(
        LIBVIRT_CLUSTER,
        name,
        lambda o: (
            "waiting for 2 LibvirtMachine(s)"
            in str(condition_of(o, c.ConditionType.READY).get("message"))
        ),
        what="deletion waiting for the machines",
    )
    assert await host.get_network(network) is not None
    await delete_machine(h, "cp2")
    await delete_machine(h, "w1")
    await h.wait_gone(LIBVIRT_CLUSTER, name)
    assert await host.get_network(network) is None


async def test_adopted_network_is_left_as_it_was(clusters: ControllerHarness) -> None:
    h = clusters
    host = h.host()
    before = await host.get_network("default")  # the test driver's 192.168.122.0/24
    assert before is not None
    name = unique("adopt")
    await create_cluster(
        h, name, {"hosts": [{"name": "kvm1", "uri": TEST_DRIVER}], "network": {"name": "default"}}
    )
    obj = await h.wait_for(
        LIBVIRT_CLUSTER,
        name,
        lambda o: (
            get_path(o, "spec", "controlPlaneEndpoint", "host") is not None
            and has_condition(o, c.ConditionType.READY, "True")
        ),
        what="endpoint decided and Ready",
    )
    domain = f"{name}.{h.namespace}.capl.internal"
    assert obj["spec"]["network"] == {"name": "default", "mode": "nat", "dnsDomain": domain}
    assert obj["spec"]["controlPlaneEndpoint"] == {"host": f"api.{domain}", "port": 6443}
    assert obj["status"]["hosts"][0]["networkCreated"] is False
    await create_machine(h, "cp1", cluster=name, control_plane=True, addresses=["192.168.122.50"])
    await h.wait_for(
        LIBVIRT_CLUSTER,
        name,
        lambda _: "192.168.122.50" in endpoint_message(h, name),
        what="record published",
    )
    await settle(h)
    during = await host.get_network("default")
    assert during is not None
    # on a shared network only names inside the cluster's own DNS domain
    assert {(record.ip, record.hostnames) for record in during.dns_hosts} == {
        ("192.168.122.50", (f"api.{domain}", f"api-int.{domain}"))
    }
    await h.delete(LIBVIRT_CLUSTER, name)
    await delete_machine(h, "cp1")
    await h.wait_gone(LIBVIRT_CLUSTER, name)
    assert await host.get_network("default") == before


async def test_bad_network_input_names_the_cause_and_creates_nothing(
    clusters: ControllerHarness,
) -> None:
    h = clusters
    host = h.host()
    # overlaps the test driver's network "default" (192.168.122.0/24)
    overlap = await create_cluster(h, unique("ovl"), isolated("192.168.122.128/25"))
    cond = await wait_condition(h, overlap, c.ConditionType.NETWORK_READY, "False")
    assert cond["reason"] == c.Reason.NETWORK_CONFLICT
    assert "'default'" in cond["message"]
    assert "192.168.122.0/24" in cond["message"]
    obj = await h.get(LIBVIRT_CLUSTER, overlap) or {}
    assert has_condition(obj, c.ConditionType.READY, "False", c.Reason.NETWORK_CONFLICT)
    assert await host.get_network(obj["spec"]["network"]["name"]) is None
    assert get_path(obj, "status", "initialization", "provisioned") is None
    # a missing bridge
    bridged = await create_cluster(
        h,
        unique("br"),
        {
            "hosts": [{"name": "kvm1", "uri": TEST_DRIVER}],
            "network": {"mode": "bridge", "bridge": "capl-nobr0"},
            "controlPlaneEndpoint": {"host": "10.0.0.100", "port": 6443},
        },
    )
    cond = await wait_condition(h, bridged, c.ConditionType.NETWORK_READY, "False")
    assert cond["reason"] == c.Reason.BRIDGE_NOT_FOUND
    assert "capl-nobr0" in cond["message"]
    obj = await h.get(LIBVIRT_CLUSTER, bridged) or {}
    assert await host.get_network(obj["spec"]["network"]["name"]) is None
    assert has_condition(obj, c.ConditionType.CONTROL_PLANE_ENDPOINT_READY, "True")
    # no hot loop: a problem only a spec change can fix is retried slowly, writing nothing
    await caught_up(h, overlap)
    before = writes(h, overlap)
    await reconcile_again(h, overlap)
    assert writes(h, overlap) == before


async def test_bridge_mode_without_endpoint_asks_for_one(clusters: ControllerHarness) -> None:
    h = clusters
    name = await create_cluster(
        h,
        unique("bre"),
        {
            "hosts": [{"name": "kvm1", "uri": TEST_DRIVER}],
            "network": {"mode": "bridge", "bridge": "capl-nobr1"},
        },
    )
    cond = await wait_condition(h, name, c.ConditionType.CONTROL_PLANE_ENDPOINT_READY, "False")
    assert cond["reason"] == c.Reason.CONTROL_PLANE_ENDPOINT_REQUIRED
    assert "controlPlaneEndpoint" not in (await h.get(LIBVIRT_CLUSTER, name) or {})["spec"]


async def test_credentials_secret_missing_then_malformed(clusters: ControllerHarness) -> None:
    h = clusters
    secret_name = unique("creds")
    name = await create_cluster(
        h,
        unique("cred"),
        {
            "hosts": [
                {
                    "name": "kvm1",
                    "uri": "qemu+ssh://root@127.0.0.1/system",
                    "credentialsRef": {"name": secret_name},
                }
            ],
            "network": {"mode": "isolated", "cidr": random_cidr()},
        },
    )
    cond = await wait_condition(h, name, c.ConditionType.HOSTS_REACHABLE, "False")
    assert cond["reason"] == c.Reason.CREDENTIALS_INVALID
    assert f"{h.namespace}/{secret_name} not found" in cond["message"]
    obj = await h.get(LIBVIRT_CLUSTER, name) or {}
    assert has_condition(obj, c.ConditionType.NETWORK_READY, "Unknown")
    assert "failureDomains" not in obj["status"]
    # the Secret appears without the private key: the condition says which key is missing
    await create_secret(h, secret_name, {"known_hosts": b"127.0.0.1 ssh-ed25519 AAAA\n"})
    obj = await h.wait_for(
        LIBVIRT_CLUSTER,
        name,
        lambda o: (
            "'ssh-privatekey'"
            in str(condition_of(o, c.ConditionType.HOSTS_REACHABLE).get("message"))
        ),
        what="malformed Secret reported",
    )
    cond = condition_of(obj, c.ConditionType.HOSTS_REACHABLE)
    assert cond["reason"] == c.Reason.CREDENTIALS_INVALID
    assert "AAAA" not in cond["message"]  # never the content
    # the Secret now belongs to the LibvirtCluster too (clusterctl move carries it)
    secret = await h.api.resource(SECRET).get(ObjectKey(h.namespace, secret_name))
    refs = secret["metadata"].get("ownerReferences", [])
    assert [ref["uid"] for ref in refs] == [obj["metadata"]["uid"]]
    assert not any(ref.get("controller") for ref in refs)
    # and the clusterctl move label, which moves it where owner references are refused
    assert secret["metadata"]["labels"][c.CLUSTERCTL_MOVE_LABEL] == ""
    obj = await h.wait_for(
        LIBVIRT_CLUSTER,
        name,
        lambda o: has_condition(o, c.ConditionType.CREDENTIALS_OWNED, "True"),
        what="CredentialsOwned",
    )
    assert has_condition(
        obj, c.ConditionType.CREDENTIALS_OWNED, "True", c.Reason.OWNER_REFERENCE_SET
    )


async def test_gates_owner_pause_and_external_management(clusters: ControllerHarness) -> None:
    h = clusters
    # no owner yet: nothing happens
    orphan = await create_cluster(h, unique("own"), isolated(), owned=False)
    await reconcile_again(h, orphan)
    assert writes(h, orphan) == {}
    # externally managed: hands off entirely
    external = await create_cluster(
        h, unique("ext"), isolated(), annotations={c.MANAGED_BY_ANNOTATION: "someone"}
    )
    await reconcile_again(h, external)
    assert writes(h, external) == {}
    # paused (Cluster.spec.paused): the Paused condition and nothing else — no finalizer, no
    # defaults, no host work; a reconcile forced while paused writes nothing
    paused = await create_cluster(h, unique("pau"), isolated(), paused=True)
    created = await h.get(LIBVIRT_CLUSTER, paused) or {}
    cond = await wait_condition(h, paused, c.ConditionType.PAUSED, "True", c.Reason.PAUSED)
    assert "is paused" in cond["message"]
    await reconcile_again(h, paused)
    obj = await h.get(LIBVIRT_CLUSTER, paused) or {}
    assert writes(h, paused) == {"PATCH/status": 1}
    assert obj["spec"] == created["spec"]
    assert "name" not in obj["spec"]["network"]
    assert not obj["metadata"].get("finalizers")
    assert list(conditions_of(obj)) == [c.ConditionType.PAUSED]
    # unpaused: the work happens
    await h.patch(CLUSTER, paused, {"spec": {"paused": False}})
    obj = await h.wait_for(
        LIBVIRT_CLUSTER, paused, lambda o: has_condition(o, c.ConditionType.READY, "True")
    )
    assert has_condition(obj, c.ConditionType.PAUSED, "False", c.Reason.NOT_PAUSED)
    # deleted without an owner: the finalizer just goes (nothing was created)
    await h.patch(LIBVIRT_CLUSTER, orphan, {"metadata": {"finalizers": [c.CLUSTER_FINALIZER]}})
    await h.delete(LIBVIRT_CLUSTER, orphan)
    await h.wait_gone(LIBVIRT_CLUSTER, orphan)


async def test_pool_with_a_foreign_volume_is_kept(clusters: ControllerHarness) -> None:
    h = clusters
    name = await create_cluster(h, unique("pool"), isolated())
    await wait_condition(h, name, c.ConditionType.READY, "True")
    obj = await h.get(LIBVIRT_CLUSTER, name) or {}
    pool = obj["spec"]["storagePool"]["name"]
    host = h.host()
    await host.create_volume(pool=pool, name="users-disk.qcow2", capacity_bytes=1 << 20)
    await h.delete(LIBVIRT_CLUSTER, name)
    await h.wait_gone(LIBVIRT_CLUSTER, name)
    assert await host.get_network(obj["spec"]["network"]["name"]) is None
    assert await host.get_pool(pool) is not None
    assert await host.get_volume(pool=pool, name="users-disk.qcow2") is not None
    await host.delete_volume(pool=pool, name="users-disk.qcow2")
    owner = ClusterOwner(namespace=h.namespace, name=name)
    assert await host.delete_pool(name=pool, owner=owner)
