"""A LibvirtMachineMigration moves a running machine between two real hosts, through the manager.

The bed (tests/multihost/conftest.py): kvm1 and kvm2 (``qemu+tls://``), each with bridge
``br-lan`` on one LAN whose DHCP server is the bed's dnsmasq, and separate storage (each
host its own /var/lib/libvirt: the disks are copied). A real `capl manager` process under
test (tests/fixtures/capl.py) runs all its controllers, including the migration controller;
`tests/fixtures/bed.py` `ManagerBed` stands in for the Cluster API core.

One worker machine (a TCG guest of the test guest image) is created on kvm1. Its shell
writes a counter to the serial console. A LibvirtMachineMigration without a target moves it
(capl chooses kvm2, the only other host): the migration ends Succeeded, the machine reports
kvm2 as its host and failure domain, keeps its UUID, providerID, MAC and address, the
counter goes on in kvm2's console log without a boot in between, nothing of it is left on
kvm1. Then the bad requests: a target that is the machine's own host, one that is not a host
of the cluster — each Failed with the reason, the machine untouched. Deleting the cluster
leaves nothing on either host.
"""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from capl.ports.naming import machine_names
from capl.runtime.resources import (
    CLUSTER,
    LIBVIRT_CLUSTER,
    LIBVIRT_MACHINE,
    LIBVIRT_MACHINE_MIGRATION,
)
from capl.testbed import ControlPlane
from capl.testbed.multihost import MultihostBed
from capl.testing.objects import cluster_obj, create_machine_objects, libvirt_cluster_obj
from capl.virt import LibvirtHost, LibvirtHosts
from tests.e2e.harness import internal_ip
from tests.fixtures.bed import BedCluster, Host, ManagerBed, bed_for
from tests.fixtures.capl import CaplManagerFactory
from tests.fixtures.common import eventually
from tests.fixtures.libvirt import record_timing
from tests.fixtures.libvirt_direct import open_libvirt
from tests.multihost.guest import run_in_guest

pytestmark = [pytest.mark.apiserver, pytest.mark.libvirtd, pytest.mark.guest]

BOOT = 240.0  # a TCG guest on two shared cores
HOSTS = ("kvm1", "kvm2")
ENDPOINT = "10.231.0.51"
COUNT = re.compile(rb"CAPL-COUNT=(\d+)")


@pytest.fixture
async def bed(
    control_plane: ControlPlane, capi_crds: list[str], namespace: str
) -> AsyncIterator[ManagerBed]:
    async with bed_for(ManagerBed, control_plane, namespace) as made:
        yield made


async def create_cluster(bed: ManagerBed, lan: MultihostBed, name: str) -> BedCluster:
    hosts = []
    for host_name in HOSTS:
        bed_host = lan.host(host_name)
        await bed.secret(f"{host_name}-credentials", bed_host.credentials)
        hosts.append(
            Host(
                name=host_name,
                uri=bed_host.uri,
                direct_uri=bed_host.local_uri,
                credentials_secret=f"{host_name}-credentials",
            )
        )
    cluster = BedCluster(
        name=name, namespace=bed.namespace, hosts=hosts, cidr=f"{lan.gateway}/24", dns_domain=None
    )
    bed.clusters.append(cluster)
    cluster.cluster = await bed.create(
        CLUSTER, cluster_obj(name, bed.namespace, libvirt_cluster=name)
    )
    lc = libvirt_cluster_obj(
        name,
        bed.namespace,
        cluster=cluster.cluster,
        hosts=[h.entry() for h in hosts],
        mode="bridge",
        bridge=lan.host_bridge,
    )
    lc["spec"]["controlPlaneEndpoint"] = {"host": ENDPOINT, "port": 6443}
    await bed.create(LIBVIRT_CLUSTER, lc)
    cluster.libvirt_cluster = await bed.wait_for(
        LIBVIRT_CLUSTER,
        name,
        lambda o: bool(((o.get("status") or {}).get("initialization") or {}).get("provisioned")),
        within=120,
        what="provisioned on kvm1 and kvm2",
    )
    await bed.patch_status(
        CLUSTER, name, {"status": {"initialization": {"infrastructureProvisioned": True}}}
    )
    return cluster


def active_on(lan: MultihostBed, host: str, uuid: str) -> bool | None:
    """True: running there; False: defined, not running; None: not defined there."""
    conn = open_libvirt(lan.host(host).local_uri)
    try:
        try:
            return bool(conn.lookupByUUIDString(uuid).isActive())
        except Exception:  # libvirt.libvirtError: no domain with matching uuid
            return None
    finally:
        conn.close()


def left_on(lan: MultihostBed, host: str, prefix: str) -> list[str]:
    conn = open_libvirt(lan.host(host).local_uri)
    try:
        left = [d.name() for d in conn.listAllDomains()]
        for pool in conn.listAllStoragePools():
            if pool.isActive():
                pool.refresh(0)
                left += [v.name() for v in pool.listAllVolumes()]
        return sorted(n for n in left if n.startswith(prefix))
    finally:
        conn.close()


async def migrate(
    bed: ManagerBed, name: str, spec: dict[str, Any], within: float
) -> dict[str, Any]:
    await bed.create(
        LIBVIRT_MACHINE_MIGRATION,
        {
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1",
            "kind": "LibvirtMachineMigration",
            "metadata": {"name": name, "namespace": bed.namespace},
            "spec": spec,
        },
    )
    return await bed.wait_for(
        LIBVIRT_MACHINE_MIGRATION,
        name,
        lambda o: (o.get("status") or {}).get("phase") in ("Succeeded", "Failed"),
        within=within,
        what=f"migration {name} finished",
    )


@pytest.mark.timeout(900)
async def test_a_running_machine_moves_to_the_other_host(
    bed: ManagerBed,
    multihost_bed: MultihostBed,
    capl_manager_factory: CaplManagerFactory,
    control_plane: ControlPlane,
    guest_image: Path,
) -> None:
    manager = await capl_manager_factory(
        control_plane,
        name="capl-migration",
        webhooks=False,
        namespace=bed.namespace,
        extra_args=["--machine-shutdown-timeout=20s"],
    )
    await manager.start()
    consoles = LibvirtHosts()
    lan = multihost_bed

    def console(host: str) -> LibvirtHost:
        return consoles.get(uri=lan.host(host).uri, credentials=lan.host(host).credentials)

    try:
        cluster = await create_cluster(bed, lan, "mig")
        pool = next(h["storagePool"] for h in cluster.libvirt_cluster["status"]["hosts"])
        names = machine_names(namespace=bed.namespace, name="worker")
        started = time.monotonic()
        bed.live["worker"] = "kvm1"
        await create_machine_objects(
            bed.create,
            "worker",
            bed.namespace,
            cluster=cluster.name,
            spec={
                "image": {"path": str(guest_image), "format": "qcow2"},
                "cpus": 1,
                "memoryMiB": 256,
                "domainType": "qemu",
                "hostName": "kvm1",
            },
        )
        before = await bed.wait_for(
            LIBVIRT_MACHINE, "worker", lambda o: bool(internal_ip(o)), within=BOOT,
            what="the worker's address",
        )  # fmt: skip
        record_timing("machine migration: worker created -> address", time.monotonic() - started)
        uuid = str(before["spec"]["domainUUID"])
        ip = internal_ip(before)
        mac_before = (await console("kvm1").domain_nics(uuid))[0].mac
        counting = await run_in_guest(
            console("kvm1"),
            uuid,
            "(i=0; while :; do echo CAPL-COUNT=$i; i=$((i+1)); sleep 1; done)"
            " >/dev/ttyS0 2>&1 & true",
            within=120,
        )
        assert counting.status == 0

        async def counts(host: str) -> list[int]:
            tail = await console(host).read_volume_tail(
                pool=pool, name=names.console_log, limit=1 << 20
            )
            return [int(n) for n in COUNT.findall(tail.data if tail is not None else b"")]

        assert await eventually(
            lambda: _past(counts, "kvm1", 2), within=60, what="the counter on kvm1"
        )
        last_on_source = (await counts("kvm1"))[-1]

        t0 = time.monotonic()
        done = await migrate(bed, "worker-away", {"machineName": "worker"}, within=300)
        record_timing(
            "machine migration: created -> Succeeded (capl chose the target)", time.monotonic() - t0
        )
        status = done["status"]
        assert status["phase"] == "Succeeded", status
        assert (status["sourceHost"], status["targetHost"]) == ("kvm1", "kvm2")
        assert status["copyStorage"] is True  # each host has its own pool directory
        assert status["conditions"][0]["reason"] == "MigrationSucceeded"
        bed.live["worker"] = "kvm2"

        after = await bed.wait_for(
            LIBVIRT_MACHINE,
            "worker",
            lambda o: (o.get("status") or {}).get("host") == "kvm2",
            within=60,
            what="the worker reports kvm2",
        )
        assert after["spec"]["hostName"] == "kvm2"
        assert "migrationTarget" not in after["spec"]
        assert after["status"]["failureDomain"] == "kvm2"
        assert after["spec"]["domainUUID"] == uuid
        assert after["spec"]["providerID"] == before["spec"]["providerID"]
        assert internal_ip(after) == ip
        migrating = [c for c in after["status"]["conditions"] if c["type"] == "Migrating"]
        assert [(c["status"], c["reason"]) for c in migrating] == [("False", "NotMigrating")]
        assert active_on(lan, "kvm2", uuid) is True
        assert active_on(lan, "kvm1", uuid) is None
        assert (await console("kvm2").domain_nics(uuid))[0].mac == mac_before
        # the memory state came along: the counter goes on, no boot in between
        assert await eventually(
            lambda: _past(counts, "kvm2", last_on_source + 2), within=60, what="the counter on kvm2"
        )
        on_kvm2 = await counts("kvm2")
        assert on_kvm2[0] >= last_on_source
        assert on_kvm2 == list(range(on_kvm2[0], on_kvm2[0] + len(on_kvm2)))
        assert left_on(lan, "kvm1", names.prefix) == []
        await bed.wait_converged(within=120)

        # bad requests: Failed with the reason, nothing changed
        for name, spec, reason, text in (
            (
                "to-itself",
                {"targetHost": "kvm2"},
                "NoTargetHost",
                "targetHost kvm2: the machine runs there",
            ),
            (
                "to-nowhere",
                {"targetHost": "kvm9"},
                "NoTargetHost",
                "not a host of the machine's LibvirtCluster",
            ),
            ("no-machine", {"machineName": "ghost"}, "MigrationFailed", "LibvirtMachine"),
        ):
            failed = await migrate(bed, name, {"machineName": "worker", **spec}, within=60)
            assert failed["status"]["phase"] == "Failed", failed["status"]
            assert failed["status"]["conditions"][0]["reason"] == reason
            assert text in failed["status"]["message"]
        unchanged = await bed.get(LIBVIRT_MACHINE, "worker")
        assert unchanged is not None
        assert unchanged["spec"]["hostName"] == "kvm2"
        assert "migrationTarget" not in unchanged["spec"]
        assert active_on(lan, "kvm2", uuid) is True

        await bed.delete_cluster(cluster, within=180)
        for host in HOSTS:
            assert left_on(lan, host, f"capl-{bed.namespace}") == [], host
    finally:
        await consoles.close()
        await manager.stop()


async def _past(counts: Callable[[str], Awaitable[list[int]]], host: str, value: int) -> bool:
    seen = await counts(host)
    return bool(seen) and seen[-1] > value
