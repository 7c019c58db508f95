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

import time
from pathlib import Path

import pytest

from capl.runtime.resources import LIBVIRT_MACHINE
from capl.testbed import ControlPlane
from capl.testbed.multihost import MultihostBed
from capl.virt import LibvirtHosts
from tests.e2e.harness import internal_ip
from tests.fixtures.bed import ManagerBed
from tests.fixtures.capl import CaplManagerFactory
from tests.fixtures.libvirt import record_timing
from tests.multihost.machines import HOSTS, bed, boot_worker, create_cluster, left_on, migrate

pytestmark = [pytest.mark.apiserver, pytest.mark.libvirtd, pytest.mark.guest]

__all__ = ["bed"]  # the fixture


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
    try:
        cluster = await create_cluster(bed, multihost_bed, "mig")
        worker = await boot_worker(bed, multihost_bed, consoles, cluster, guest_image)
        before = await bed.get(LIBVIRT_MACHINE, "worker")
        assert before is not None
        mac_before = (await worker.console("kvm1").domain_nics(worker.uuid))[0].mac
        last_on_source = (await worker.counts("kvm1"))[-1]

        t0 = time.monotonic()
        done = await migrate(bed, "worker-away", {"machineName": "worker"}, within=300)
        record_timing(
            "machine migration: created -> Succeeded (capl chose the target)",
            time.monotonic() - t0,
        )
        status = done["status"]
        assert status["phase"] == "Succeeded", status
        assert (status["sourceHost"], status["targetHost"]) == ("kvm1", "kvm2")
        assert status["copyStorage"] is True  # each host has its own pool directory
        assert status["conditions"][0]["reason"] == "MigrationSucceeded"
        assert "cleanupPending" not in status
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
        assert after["spec"]["domainUUID"] == worker.uuid
        assert after["spec"]["providerID"] == before["spec"]["providerID"]
        assert internal_ip(after) == worker.ip
        migrating = [c for c in after["status"]["conditions"] if c["type"] == "Migrating"]
        assert [(c["status"], c["reason"]) for c in migrating] == [("False", "NotMigrating")]
        assert worker.where() == {"kvm1": None, "kvm2": True}
        assert (await worker.console("kvm2").domain_nics(worker.uuid))[0].mac == mac_before
        # the memory state came along: the counter goes on, no boot in between
        await worker.counting_on("kvm2", last_on_source + 2)
        on_kvm2 = await worker.counts("kvm2")
        assert on_kvm2[0] >= last_on_source
        assert on_kvm2 == list(range(on_kvm2[0], on_kvm2[0] + len(on_kvm2)))
        assert left_on(multihost_bed, "kvm1", worker.names.prefix) == []
        await bed.wait_converged(within=120)

        # bad requests: Failed with the reason, nothing changed
        bad = (
            ("to-itself", {"targetHost": "kvm2"}, "NoTargetHost", "kvm2: the machine runs there"),
            ("to-nowhere", {"targetHost": "kvm9"}, "NoTargetHost", "kvm9: not a host of the"),
            ("no-machine", {"machineName": "ghost"}, "MigrationFailed", "ghost not found"),
        )
        for name, spec, reason, text in bad:
            failed = await migrate(bed, name, {"machineName": "worker", **spec}, within=60)
            assert failed["status"]["phase"] == "Failed", failed["status"]
            assert failed["status"]["conditions"][0]["reason"] == reason
            assert text in failed["status"]["message"]
        unchanged = await bed.get(LIBVIRT_MACHINE, "worker")
        assert unchanged is not None
        assert unchanged["spec"]["hostName"] == "kvm2"
        assert "migrationTarget" not in unchanged["spec"]
        assert worker.where() == {"kvm1": None, "kvm2": True}

        await bed.delete_cluster(cluster, within=180)
        for host in HOSTS:
            assert left_on(multihost_bed, host, f"capl-{bed.namespace}") == [], host
    finally:
        await consoles.close()
        await manager.stop()
