"""What the multihost tests of machines driven by the manager share: the `bed` fixture (a
`ManagerBed` standing in for the Cluster API core), a bridge-mode cluster on kvm1 and kvm2, a
counting worker (`boot_worker`; `start_counter` for a guest booted otherwise), where a domain
is, what is left on a host, and a migration run to its end.
"""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from capl.ports.naming import MachineNames, machine_names
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
from tests.fixtures.common import eventually
from tests.fixtures.libvirt import record_timing
from tests.fixtures.libvirt_direct import open_libvirt
from tests.multihost.guest import run_in_guest

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


async def create_cluster(
    bed: ManagerBed,
    lan: MultihostBed,
    name: str,
    *,
    on: Sequence[str] = HOSTS,
    endpoint: str = ENDPOINT,
) -> BedCluster:
    """Credentials Secrets, Cluster + LibvirtCluster in bridge mode on the hosts `on` (default
    kvm1 and kvm2) with the endpoint set; waits until capl provisioned it on all of them."""
    hosts = []
    for host_name in on:
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
    lc["spec"]["controlPlaneEndpoint"] = {"host": endpoint, "port": 6443}
    await bed.create(LIBVIRT_CLUSTER, lc)
    cluster.libvirt_cluster = await bed.wait_for(
        LIBVIRT_CLUSTER,
        name,
        lambda o: bool(((o.get("status") or {}).get("initialization") or {}).get("provisioned")),
        within=120,
        what=f"provisioned on {' and '.join(on)}",
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


@dataclass
class Worker:
    """A booted worker machine whose shell counts on its serial console."""

    bed: ManagerBed | None
    """None when the real Cluster API core manages the machine (test_maintenance)."""
    lan: MultihostBed
    consoles: LibvirtHosts
    pool: str
    names: MachineNames
    uuid: str
    ip: str

    def console(self, host: str) -> LibvirtHost:
        bed_host = self.lan.host(host)
        return self.consoles.get(uri=bed_host.uri, credentials=bed_host.credentials)

    async def counts(self, host: str) -> list[int]:
        tail = await self.console(host).read_volume_tail(
            pool=self.pool, name=self.names.console_log, limit=1 << 20
        )
        return [int(n) for n in COUNT.findall(tail.data if tail is not None else b"")]

    async def counting_on(self, host: str, past: int) -> int:
        """Waits until the counter on `host`'s console goes beyond `past`; its last value."""

        async def probe() -> int | None:
            seen = await self.counts(host)
            return seen[-1] if seen and seen[-1] > past else None

        return await eventually(probe, within=60, what=f"the counter on {host} past {past}")

    def where(self) -> dict[str, bool | None]:
        return {host: active_on(self.lan, host, self.uuid) for host in HOSTS}


async def boot_worker(
    bed: ManagerBed,
    lan: MultihostBed,
    consoles: LibvirtHosts,
    cluster: BedCluster,
    image: Path,
    *,
    name: str = "worker",
    host: str = "kvm1",
) -> Worker:
    pool = next(h["storagePool"] for h in cluster.libvirt_cluster["status"]["hosts"])
    started = time.monotonic()
    bed.live[name] = host
    await create_machine_objects(
        bed.create,
        name,
        bed.namespace,
        cluster=cluster.name,
        spec={
            "image": {"path": str(image), "format": "qcow2"},
            "cpus": 1,
            "memoryMiB": 256,
            "domainType": "qemu",
            "hostName": host,
        },
    )
    obj = await bed.wait_for(
        LIBVIRT_MACHINE, name, lambda o: bool(internal_ip(o)), within=BOOT,
        what=f"the address of {name}",
    )  # fmt: skip
    record_timing(f"multihost: {name} created -> address", time.monotonic() - started)
    worker = Worker(
        bed=bed,
        lan=lan,
        consoles=consoles,
        pool=pool,
        names=machine_names(namespace=bed.namespace, name=name),
        uuid=str(obj["spec"]["domainUUID"]),
        ip=internal_ip(obj),
    )
    await start_counter(worker, host)
    return worker


async def start_counter(worker: Worker, host: str) -> None:
    """Start the counter in the guest's shell (typed on its console on `host`); waits until
    it counted past 2 in the console log."""
    counting = await run_in_guest(
        worker.console(host),
        worker.uuid,
        "(i=0; while :; do echo CAPL-COUNT=$i; i=$((i+1)); sleep 1; done) >/dev/ttyS0 2>&1 & true",
        within=120,
    )
    assert counting.status == 0
    await worker.counting_on(host, 2)
