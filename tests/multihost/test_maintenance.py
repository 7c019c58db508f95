"""Host maintenance with real migrations, the real Cluster API core and the real `capl` CLI.

The bed (tests/multihost/conftest.py): kvm1 and kvm2 (``qemu+tls://``), each with bridge
``br-lan`` on one LAN whose DHCP server is the bed's dnsmasq, each with its own storage (disks
are copied by a migration). The management cluster is the e2e harness's (tests/e2e/harness/
`start_management`): its own kube-apiserver, ``clusterctl init`` with capl's release, the
Cluster API core manager and `capl manager` as processes, capl's webhooks on. No kubelet and
no workload API server: the Machines stay at phase Provisioned (no nodeRef), which is all
the Machine, MachineSet and MachineDeployment controllers need here.

One Cluster + LibvirtCluster in bridge mode on kvm1 and kvm2 (``controlPlaneEndpoint``
10.231.0.52:6443, a LAN address outside the DHCP range; nothing answers there), three
machines of the test guest image (TCG, 1 vCPU, 256 MiB):

- ``live``: a stand-alone Machine, evictionStrategy LiveMigrate; its shell counts on the
  serial console;
- the one Machine of MachineDeployment ``maint-md`` (1 replica), whose LibvirtMachineTemplate
  has evictionStrategy Recreate and pins no host (a pinned template would make the
  replacement wait for the end of the maintenance);
- ``stay``: a stand-alone Machine, evictionStrategy None.

All three go on kvm1 because kvm2 is in maintenance while they are placed (``capl maintenance
start kvm2 --wait``: an empty host is Evacuated at once); kvm2's maintenance ends before they
boot. Then ``capl maintenance start kvm1 --reason test``, and:

- the migration controller live-migrates ``live`` to kvm2 through the evacuation migration
  the maintenance created: Succeeded, the domain runs on kvm2 and is gone from kvm1, same
  UUID, providerID and address, and the counter goes on (no reboot);
- capl deletes the MachineDeployment's Machine; Cluster API deletes its LibvirtMachine and
  the MachineSet creates a replacement, which capl places on kvm2 (never on kvm1: a
  watcher records every host any LibvirtMachine ever names);
- ``stay`` keeps running on kvm1: status.hosts[kvm1].maintenance is Blocked, 1 machine, the
  message names it; failure domain kvm1 says controlPlane false (in the LibvirtCluster and
  in Cluster API's Cluster); `capl hosts` shows kvm1 Blocked with 1 machine; ``capl
  maintenance start kvm1 --wait`` exits 1 saying why; the Events say what happened;
- a new Machine pinned to kvm1 by its failure domain waits (HostNotFound, "in maintenance").

``capl maintenance stop kvm1``: the maintenance status is gone, failure domain kvm1 is
controlPlane true again, the evacuation migration is deleted, the pinned machine is placed
on kvm1 and runs there. Deleting the Cluster (Cluster API deletes the MachineDeployment and
the Machines, capl the domains, volumes, pool and network) leaves nothing on either host.
Guests at once: at most 4.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from capl.api import constants as c
from capl.controllers.cluster_maintenance_plan import migration_name
from capl.ports.naming import machine_names
from capl.runtime.objects import Obj, ObjectKey, get_path
from capl.runtime.resources import (
    CLUSTER,
    LIBVIRT_CLUSTER,
    LIBVIRT_MACHINE,
    LIBVIRT_MACHINE_MIGRATION,
    MACHINE,
    SECRET,
)
from capl.testbed.capi import CapiAssets
from capl.testbed.clusterctl import LocalProvider
from capl.testbed.multihost import MultihostBed
from capl.testing.objects import (
    b64,
    cluster_obj,
    condition_of,
    create_machine_objects,
    libvirt_cluster_obj,
)
from capl.virt import LibvirtHosts
from tests.e2e.harness import (
    CAPL_E2E_ARGS,
    Management,
    internal_ip,
    start_management,
)
from tests.fixtures.capi import ControlPlaneFactory
from tests.fixtures.capl import CaplManagerFactory
from tests.fixtures.common import eventually
from tests.fixtures.libvirt import record_timing
from tests.multihost.machines import Worker, active_on, start_counter
from tests.multihost.maintenance_site import (
    BLOCKED,
    BOOT,
    CLUSTER_NAME,
    ENDPOINT,
    HOSTS,
    Site,
    control_plane_allowed,
    create_machine_deployment,
    events,
    guest_spec,
    host_status,
    hosts_row,
    maintenance_of,
    teardown,
    traces,
)

pytestmark = [pytest.mark.e2e, pytest.mark.apiserver, pytest.mark.libvirtd, pytest.mark.guest]


@pytest.fixture(scope="module")
async def management(
    control_plane_factory: ControlPlaneFactory,
    capi_assets: CapiAssets,
    libvirt_provider: LocalProvider,
    capl_manager_factory: CaplManagerFactory,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[Management]:
    mgmt = await start_management(
        name="maintenance",
        plane_factory=control_plane_factory,
        capi=capi_assets,
        provider=libvirt_provider,
        capl_factory=capl_manager_factory,
        workdir=tmp_path_factory.mktemp("management"),
        capl_args=CAPL_E2E_ARGS,
    )
    try:
        yield mgmt
    finally:
        await mgmt.close()


# --- the test ---------------------------------------------------------------------------------


@pytest.mark.timeout(900)
async def test_maintenance_moves_replaces_and_blocks_then_ends(
    management: Management, multihost_bed: MultihostBed, guest_image: Path
) -> None:
    t_start = time.monotonic()
    namespace = f"maint-{secrets.token_hex(3)}"
    await management.plane.kubectl("create", "namespace", namespace)
    site = Site(management=management, lan=multihost_bed, namespace=namespace)
    consoles = LibvirtHosts()
    watcher: asyncio.Task[None] | None = None
    network = pool = None
    try:
        made = await create_cluster(site)
        network = made["spec"]["network"].get("name")
        pool = made["spec"]["storagePool"]["name"]
        provisioned = await wait_provisioned(site)
        t_cluster = time.monotonic()

        md_first, md_old_lm = await place_on_kvm1(site, guest_image)
        md_old = str(md_first["metadata"]["name"])
        booted = await boot(site, md_old_lm, since=t_cluster)
        live_before = booted["live"]
        status_hosts = get_path(provisioned, "status", "hosts") or []
        worker = Worker(
            bed=None,
            lan=multihost_bed,
            consoles=consoles,
            pool=str(status_hosts[0]["storagePool"]),
            names=machine_names(namespace=namespace, name="live"),
            uuid=str(live_before["spec"]["domainUUID"]),
            ip=str(internal_ip(live_before)),
        )
        await start_counter(worker, "kvm1")
        stay_uuid = str(booted["stay"]["spec"]["domainUUID"])
        md_old_uuid = str(booted[md_old_lm]["spec"]["domainUUID"])
        assert worker.where() == {"kvm1": True, "kvm2": None}
        watcher = asyncio.create_task(site.watch_hosts(), name="host-watcher")
        last_on_kvm1 = (await worker.counts("kvm1"))[-1]  # read before kvm1's copy goes

        # -- maintenance of kvm1
        t0 = time.monotonic()
        start = await site.capl("maintenance", "start", "kvm1", "--reason", "test")
        assert start.code == 0, start
        assert start.out.strip() == (
            f"LibvirtCluster {namespace}/{CLUSTER_NAME}: host kvm1 put into maintenance "
            "(reason: test)"
        )
        evacuation = await assert_live_migrated(site, worker, live_before, last_on_kvm1, since=t0)
        new_lm = await assert_replaced_on_kvm2(
            site, md_first, md_old_lm, md_old_uuid=md_old_uuid, since=t0
        )
        await assert_blocked(site, stay_uuid, since=t0)
        await assert_shown_by_the_cli(site, new_lm)
        await assert_events(site, evacuation=evacuation, md_old=md_old, md_old_lm=md_old_lm)
        await assert_pinned_machine_waits(site, guest_image)

        await end_maintenance(site, evacuation)
        assert worker.where() == {"kvm1": None, "kvm2": True}  # moved machines stay moved
        assert active_on(multihost_bed, "kvm1", stay_uuid) is True

        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
        seen = dict(site.seen_hosts)
        assert seen.get("live") == ["kvm1", "kvm2"], seen
        assert seen.get("stay") == ["kvm1"], seen
        assert seen.get(new_lm) == ["kvm2"], seen  # never kvm1
        assert seen.get("late") == ["kvm1"], seen
        assert set(seen) <= {"live", "stay", md_old_lm, new_lm, "late"}, seen

        await delete_everything(site)
        record_timing("maintenance: the whole test", time.monotonic() - t_start)
    finally:
        if watcher is not None:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        await consoles.close()
        await teardown(site, network=network, pool=pool)


# --- the phases -------------------------------------------------------------------------------


async def create_cluster(site: Site) -> Obj:
    """Credentials Secrets, the Cluster and the LibvirtCluster in bridge mode on kvm1 and kvm2
    (as a user writes it: Cluster API's Cluster controller adds owner and label); the
    LibvirtCluster as created (capl's webhook filled in the network and pool names)."""
    entries = []
    for name in HOSTS:
        bed_host = site.lan.host(name)
        await site.create(
            SECRET,
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": f"{name}-credentials"},
                "data": {k: b64(v) for k, v in bed_host.credentials.items()},
            },
        )
        entries.append(
            {
                "name": name,
                "uri": bed_host.uri,
                "credentialsRef": {"name": f"{name}-credentials"},
            }
        )
    cluster = await site.create(
        CLUSTER, cluster_obj(CLUSTER_NAME, site.namespace, libvirt_cluster=CLUSTER_NAME)
    )
    lc = libvirt_cluster_obj(
        CLUSTER_NAME,
        site.namespace,
        cluster=cluster,
        hosts=entries,
        mode="bridge",
        bridge=site.lan.host_bridge,
    )
    lc["spec"]["controlPlaneEndpoint"] = dict(ENDPOINT)
    del lc["metadata"]["ownerReferences"], lc["metadata"]["labels"]
    return await site.create(LIBVIRT_CLUSTER, lc)


async def wait_provisioned(site: Site) -> Obj:
    """Until capl provisioned the LibvirtCluster (owned by the Cluster) and Cluster API saw
    it; the LibvirtCluster then."""
    provisioned = await site.wait_cluster(
        lambda o: bool(get_path(o, "status", "initialization", "provisioned")),
        "provisioned on kvm1 and kvm2",
    )
    owners = provisioned["metadata"].get("ownerReferences") or []
    assert [(o["kind"], o["name"]) for o in owners] == [("Cluster", CLUSTER_NAME)]
    await site.wait(
        CLUSTER,
        CLUSTER_NAME,
        lambda o: bool(get_path(o, "status", "initialization", "infrastructureProvisioned")),
        within=60,
        what="infrastructure provisioned (Cluster API)",
    )
    return provisioned


async def place_on_kvm1(site: Site, image: Path) -> tuple[Obj, str]:
    """kvm2 cordoned while the three machines are placed, so they all go on kvm1; then
    kvm2's maintenance ends. The MachineDeployment's first Machine and its LibvirtMachine."""
    cordon = await site.capl(
        "maintenance", "start", "kvm2", "--reason", "placement", "--wait", "--timeout", "2m"
    )
    assert cordon.code == 0, cordon
    assert f"LibvirtCluster {site.namespace}/{CLUSTER_NAME}: host kvm2 Evacuated" in cordon.out
    await create_machine_objects(
        site.create, "live", site.namespace, cluster=CLUSTER_NAME,
        spec=guest_spec(image, "LiveMigrate"),
    )  # fmt: skip
    await create_machine_objects(
        site.create, "stay", site.namespace, cluster=CLUSTER_NAME,
        spec=guest_spec(image, "None"),
    )  # fmt: skip
    await create_machine_deployment(site, image)
    md_first = await eventually(
        site.md_machine, within=60, what="the MachineDeployment's Machine",
        explain=site.explain,
    )  # fmt: skip
    md_old_lm = str(md_first["spec"]["infrastructureRef"]["name"])
    for name in ("live", "stay", md_old_lm):
        placed = await site.wait(
            LIBVIRT_MACHINE, name, lambda o: bool(get_path(o, "spec", "hostName")),
            within=60, what="placed",
        )  # fmt: skip
        assert placed["spec"]["hostName"] == "kvm1", name
    uncordon = await site.capl("maintenance", "stop", "kvm2")
    assert uncordon.code == 0, uncordon
    await site.wait_cluster(
        lambda o: maintenance_of(o, "kvm2") is None and control_plane_allowed(o, "kvm2") is True,
        "kvm2 out of maintenance",
    )
    return md_first, md_old_lm


async def boot(site: Site, md_old_lm: str, *, since: float) -> dict[str, Obj]:
    """All three boot on kvm1: their LibvirtMachines with an address."""
    booted: dict[str, Obj] = {}
    for name in ("live", "stay", md_old_lm):
        booted[name] = await site.wait(
            LIBVIRT_MACHINE, name, lambda o: bool(internal_ip(o)), within=BOOT,
            what="an address",
        )  # fmt: skip
    record_timing("maintenance: 3 machines created -> addresses", time.monotonic() - since)
    return booted


async def assert_live_migrated(
    site: Site, worker: Worker, live_before: Obj, last_on_kvm1: int, *, since: float
) -> str:
    """LiveMigrate: moved by the migration controller to kvm2 through the evacuation
    migration; same UUID, providerID and address, the counter goes on. The migration's name."""
    evacuation = migration_name("live", live_before["metadata"]["uid"], "kvm1")
    done = await site.wait(
        LIBVIRT_MACHINE_MIGRATION,
        evacuation,
        lambda o: get_path(o, "status", "phase") in ("Succeeded", "Failed"),
        within=240,
        what="finished",
    )
    record_timing("maintenance: start -> live migration Succeeded", time.monotonic() - since)
    status = done["status"]
    assert status["phase"] == "Succeeded", status
    assert (status["sourceHost"], status["targetHost"]) == ("kvm1", "kvm2")
    assert status["copyStorage"] is True
    assert done["spec"]["machineName"] == "live"
    assert "targetHost" not in done["spec"]  # the migration controller chose kvm2
    assert done["metadata"]["labels"][c.EVACUATION_HOST_LABEL] == "kvm1"
    assert [(o["kind"], o["name"]) for o in done["metadata"]["ownerReferences"]] == [
        ("LibvirtCluster", CLUSTER_NAME)
    ]
    moved = await site.wait(
        LIBVIRT_MACHINE, "live", lambda o: get_path(o, "status", "host") == "kvm2",
        within=60, what="reports kvm2",
    )  # fmt: skip
    assert moved["spec"]["hostName"] == "kvm2"
    assert "migrationTarget" not in moved["spec"]
    assert moved["spec"]["domainUUID"] == worker.uuid
    assert moved["spec"]["providerID"] == live_before["spec"]["providerID"]
    assert internal_ip(moved) == worker.ip
    assert worker.where() == {"kvm1": None, "kvm2": True}
    await worker.counting_on("kvm2", last_on_kvm1 + 2)  # the same memory: no boot
    on_kvm2 = await worker.counts("kvm2")
    assert on_kvm2[0] >= last_on_kvm1
    assert on_kvm2 == list(range(on_kvm2[0], on_kvm2[0] + len(on_kvm2)))
    return evacuation


async def assert_replaced_on_kvm2(
    site: Site, md_first: Obj, md_old_lm: str, *, md_old_uuid: str, since: float
) -> str:
    """Recreate: the Machine deleted by capl, replaced by the MachineSet on kvm2. The
    replacement's LibvirtMachine."""
    lan = site.lan
    md_old = str(md_first["metadata"]["name"])
    await site.wait_gone(MACHINE, md_old, within=180)
    await site.wait_gone(LIBVIRT_MACHINE, md_old_lm, within=30)
    replacement = await eventually(
        site.md_machine, within=120, what="the replacement Machine", explain=site.explain
    )
    new_lm = str(replacement["spec"]["infrastructureRef"]["name"])
    assert replacement["metadata"]["name"] != md_old
    owners = replacement["metadata"].get("ownerReferences") or []
    assert [o["kind"] for o in owners] == ["MachineSet"], owners
    assert owners[0]["name"] == md_first["metadata"]["ownerReferences"][0]["name"]
    placed = await site.wait(
        LIBVIRT_MACHINE, new_lm, lambda o: bool(get_path(o, "spec", "domainUUID")),
        within=120, what="placed and defined",
    )  # fmt: skip
    assert placed["spec"]["hostName"] == "kvm2"
    assert placed["spec"]["evictionStrategy"] == "Recreate"
    new_uuid = str(placed["spec"]["domainUUID"])
    await eventually(
        lambda: active_on(lan, "kvm2", new_uuid),
        within=120, what="the replacement runs on kvm2", explain=site.explain,
    )  # fmt: skip
    assert active_on(lan, "kvm1", new_uuid) is None
    for host in HOSTS:
        assert active_on(lan, host, md_old_uuid) is None, host
    record_timing("maintenance: start -> replacement running on kvm2", time.monotonic() - since)
    return new_lm


async def assert_blocked(site: Site, stay_uuid: str, *, since: float) -> None:
    """None: ``stay`` stays on kvm1, and the maintenance says so (Blocked, 1 machine, failure
    domain kvm1 without control planes in the LibvirtCluster and in Cluster API's Cluster)."""
    blocked = await site.wait_cluster(
        lambda o: (maintenance_of(o, "kvm1") or {}).get("machines") == 1,
        "kvm1: one machine left",
    )
    record_timing("maintenance: start -> kvm1 Blocked, 1 machine left", time.monotonic() - since)
    assert maintenance_of(blocked, "kvm1") == {
        "phase": "Blocked",
        "machines": 1,
        "message": BLOCKED,
    }
    assert control_plane_allowed(blocked, "kvm1") is False
    assert control_plane_allowed(blocked, "kvm2") is True
    await site.wait(
        CLUSTER, CLUSTER_NAME, lambda o: control_plane_allowed(o, "kvm1") is False,
        within=60, what="failure domain kvm1 without control planes (Cluster API)",
    )  # fmt: skip
    stay = await site.get(LIBVIRT_MACHINE, "stay")
    assert stay is not None
    assert (stay["spec"]["hostName"], stay["status"]["host"]) == ("kvm1", "kvm1")
    assert active_on(site.lan, "kvm1", stay_uuid) is True
    assert active_on(site.lan, "kvm2", stay_uuid) is None
    assert await site.get(MACHINE, "stay") is not None
    assert await site.get(MACHINE, "live") is not None


async def assert_shown_by_the_cli(site: Site, new_lm: str) -> None:
    """`capl hosts` (plain and JSON) shows kvm1 Blocked with 1 machine; ``capl maintenance
    start kvm1 --wait`` exits 1 saying why."""
    shown = await site.capl("hosts")
    assert shown.code == 0, shown
    row = hosts_row(shown.out, "kvm1")
    assert (row[4], row[5]) == ("Blocked", "1"), shown.out
    assert hosts_row(shown.out, "kvm2")[4:6] == ["-", "2"], shown.out
    assert f"kvm1 in LibvirtCluster {CLUSTER_NAME}: Blocked; reason: test; 1 machine left: " \
        f"{BLOCKED}" in shown.out  # fmt: skip
    as_json = await site.capl("hosts", "-o", "json")
    hosts = {h["name"]: h for h in json.loads(as_json.out)["hosts"]}
    assert (hosts["kvm1"]["maintenance"], hosts["kvm1"]["machines"]) == ("Blocked", 1)
    assert hosts["kvm1"]["entries"][0]["machines"] == ["stay"]
    assert sorted(hosts["kvm2"]["entries"][0]["machines"]) == sorted(["live", new_lm])

    waited = await site.capl("maintenance", "start", "kvm1", "--wait", "--timeout", "1m")
    assert waited.code == 1, waited
    assert "host kvm1 already in maintenance (reason: test): unchanged" in waited.out
    assert f"host kvm1 Blocked, 1 machine left: {BLOCKED}" in waited.out
    assert "host kvm1 cannot be evacuated" in waited.err


async def assert_events(site: Site, *, evacuation: str, md_old: str, md_old_lm: str) -> None:
    """The Events say what happened (sets: the recorder may write a repeated Event twice
    instead of counting it)."""
    assert await events(site, c.Reason.EVACUATING) == {
        ("Normal", "host kvm1 is in maintenance (test): evacuating 3 machine(s) of the cluster")
    }
    assert await events(site, "MigrationCreated") == {
        (
            "Normal",
            f"host kvm1 is in maintenance: created LibvirtMachineMigration {evacuation} "
            "for machine live",
        )
    }
    assert await events(site, "MachineDeleted") == {
        (
            "Normal",
            f"host kvm1 is in maintenance: deleted Machine {md_old} (LibvirtMachine "
            f"{md_old_lm}, evictionStrategy Recreate) for its owner to replace",
        )
    }
    assert await events(site, c.Reason.EVICTION_BLOCKED) == {("Warning", f"host kvm1: {BLOCKED}")}
    assert await events(site, c.Reason.EVACUATED) == set()
    # kvm2's short maintenance while the machines were placed: empty, so evacuated at once
    assert await events(site, c.Reason.EVACUATING, "kvm2") == {
        (
            "Normal",
            "host kvm2 is in maintenance (placement): evacuating 0 machine(s) of the cluster",
        )
    }
    assert await events(site, c.Reason.EVACUATED, "kvm2") == {
        ("Normal", "host kvm2 is evacuated: no machine of the cluster is left on it")
    }


async def assert_pinned_machine_waits(site: Site, image: Path) -> None:
    """Cordon: a new machine ``late`` pinned to kvm1 (its Machine's failure domain) waits."""
    await create_machine_objects(
        site.create, "late", site.namespace, cluster=CLUSTER_NAME,
        spec=guest_spec(image, "LiveMigrate"), failure_domain="kvm1",
    )  # fmt: skip
    waiting = await site.wait(
        LIBVIRT_MACHINE,
        "late",
        lambda o: (
            condition_of(o, c.ConditionType.DOMAIN_PROVISIONED).get("reason")
            == c.Reason.HOST_NOT_FOUND
        ),
        within=60,
        what="waits for kvm1",
    )
    assert "host kvm1 is in maintenance (test)" in str(
        condition_of(waiting, c.ConditionType.DOMAIN_PROVISIONED).get("message")
    )
    assert not get_path(waiting, "spec", "hostName")
    assert not get_path(waiting, "spec", "domainUUID")


async def end_maintenance(site: Site, evacuation: str) -> None:
    """``capl maintenance stop kvm1``: the maintenance status gone, failure domain kvm1 with
    control planes again, the evacuation migration deleted, ``late`` placed and running on
    kvm1; `capl hosts` shows kvm1 with 2 machines."""
    t1 = time.monotonic()
    stop = await site.capl("maintenance", "stop", "kvm1")
    assert stop.code == 0, stop
    assert stop.out.strip() == (
        f"LibvirtCluster {site.namespace}/{CLUSTER_NAME}: host kvm1 taken out of maintenance "
        "(it was: test)"
    )
    ended = await site.wait_cluster(
        lambda o: maintenance_of(o, "kvm1") is None and control_plane_allowed(o, "kvm1") is True,
        "kvm1 out of maintenance, control planes allowed",
    )
    assert "maintenance" not in host_status(ended, "kvm1")
    await site.wait(
        CLUSTER, CLUSTER_NAME, lambda o: control_plane_allowed(o, "kvm1") is True,
        within=60, what="failure domain kvm1 with control planes again (Cluster API)",
    )  # fmt: skip
    await site.wait_gone(LIBVIRT_MACHINE_MIGRATION, evacuation, within=60)
    late = await site.wait(
        LIBVIRT_MACHINE, "late", lambda o: bool(get_path(o, "spec", "domainUUID")),
        within=60, what="placed once kvm1 is out of maintenance",
    )  # fmt: skip
    assert late["spec"]["hostName"] == "kvm1"
    late_uuid = str(late["spec"]["domainUUID"])
    await eventually(
        lambda: active_on(site.lan, "kvm1", late_uuid),
        within=60, what="the new machine runs on kvm1", explain=site.explain,
    )  # fmt: skip
    record_timing("maintenance: stop -> new machine running on kvm1", time.monotonic() - t1)
    after = await site.capl("hosts", "-o", "json")
    hosts = {h["name"]: h for h in json.loads(after.out)["hosts"]}
    assert (hosts["kvm1"]["maintenance"], hosts["kvm1"]["machines"]) == (None, 2)


async def delete_everything(site: Site) -> None:
    """Deleting the Cluster (Cluster API deletes the MachineDeployment and the Machines, capl
    the domains, volumes, pool and network) leaves nothing on either host."""
    t2 = time.monotonic()
    await site.api.resource(CLUSTER).delete(ObjectKey(site.namespace, CLUSTER_NAME))
    await site.wait_gone(CLUSTER, CLUSTER_NAME, within=180)
    await site.wait_gone(LIBVIRT_CLUSTER, CLUSTER_NAME, within=30)
    assert await site.list(LIBVIRT_MACHINE) == []
    assert await site.list(MACHINE) == []
    record_timing("maintenance: Cluster deleted -> gone", time.monotonic() - t2)
    for host in HOSTS:
        assert traces(site.lan, host, site.namespace) == [], host
