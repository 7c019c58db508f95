"""The day-2 plan: a spec against a domain's hardware -> the changes, and what is not in place."""

from __future__ import annotations

from typing import Any

from capl.api.machine import LibvirtMachineSpec
from capl.controllers.machine.day2 import describe
from capl.controllers.machine.day2_plan import (
    AddDisk,
    AddNic,
    GrowDisk,
    RemoveDisk,
    RemoveNic,
    SetMemory,
    SetVcpus,
    added_disk_volume,
    fingerprint,
    plan_changes,
)
from capl.ports.naming import machine_names
from capl.ports.virt import DomainDisk, DomainNic, DomainResources

GIB = 1024**3


def _spec(**extra: Any) -> LibvirtMachineSpec:
    raw: dict[str, Any] = {"image": {"path": "/img.qcow2"}, "cpus": 2, "memoryMiB": 1024}
    raw.update(extra)
    return LibvirtMachineSpec.model_validate(raw)


def _hw(**changes: Any) -> DomainResources:
    values: dict[str, Any] = {
        "running": True,
        "vcpus": 2,
        "max_vcpus": 2,
        "config_vcpus": 2,
        "config_max_vcpus": 2,
        "memory_mib": 1024,
        "max_memory_mib": 1024,
        "config_memory_mib": 1024,
        "config_max_memory_mib": 1024,
        "disks": (DomainDisk(target="vda", path="/p/root", serial=None, capacity_bytes=10 * GIB),),
        "nics": (DomainNic(mac="52:54:00:00:00:01", network="cl"),),
    }
    values.update(changes)
    return DomainResources(**values)


def _plan(spec: LibvirtMachineSpec, hw: DomainResources) -> Any:
    return plan_changes(spec, hw, cluster_network="cl", bridge_mode=False)


def test_nothing_changed_nothing_to_do() -> None:
    plan = _plan(_spec(rootVolume={"sizeGiB": 10}), _hw())
    assert plan.changes == ()
    assert plan.not_in_place == ()


def test_grown_disks_first_then_devices_then_cpus_and_memory() -> None:
    hw = _hw(
        disks=(
            DomainDisk(target="vda", path="/p/root", serial=None, capacity_bytes=10 * GIB),
            DomainDisk(
                target="vdb", path="/p/capl-x-data0.qcow2", serial="old", capacity_bytes=GIB
            ),
            DomainDisk(
                target="vdc", path="/p/capl-x-data1.qcow2", serial="keep", capacity_bytes=GIB
            ),
        ),
        max_vcpus=4,
    )
    spec = _spec(
        cpus=4,
        maxCPUs=4,
        memoryMiB=2048,
        maxMemoryMiB=2048,
        rootVolume={"sizeGiB": 20},
        extraDisks=[{"name": "keep", "sizeGiB": 3}, {"name": "new", "sizeGiB": 5}],
        networkInterfaces=[{}, {"network": "other"}],
    )
    plan = _plan(spec, hw)
    assert plan.not_in_place == ()
    assert plan.changes[:2] == (
        GrowDisk("vda", 20 * GIB, "rootVolume.sizeGiB"),
        GrowDisk("vdc", 3 * GIB, "extraDisks[keep].sizeGiB"),
    )
    assert plan.changes[2:4] == (AddDisk("new", 5), RemoveDisk("old", "/p/capl-x-data0.qcow2"))
    added = plan.changes[4]
    assert isinstance(added, AddNic)
    assert (added.nic.index, added.nic.network, added.nic.cluster_network) == (1, "other", False)
    assert plan.changes[5:] == (SetVcpus(4, 4), SetMemory(2048, 2048))
    assert [describe(x) for x in plan.changes[:1]] == ["rootVolume.sizeGiB grown to 20 GiB (vda)"]


def test_a_smaller_disk_is_never_a_change() -> None:
    # the API server refuses a shrink; a disk already bigger (grown by hand) stays as it is
    assert _plan(_spec(rootVolume={"sizeGiB": 5}), _hw()).changes == ()


def test_removed_nics_from_the_end_and_a_changed_nic_is_not_in_place() -> None:
    hw = _hw(
        nics=(
            DomainNic(mac="52:54:00:00:00:01", network="cl"),
            DomainNic(mac="52:54:00:00:00:02", network="other"),
            DomainNic(mac="52:54:00:00:00:03", bridge="br0"),
        )
    )
    plan = _plan(_spec(networkInterfaces=[{}]), hw)
    assert plan.changes == (
        RemoveNic("52:54:00:00:00:03", None),
        RemoveNic("52:54:00:00:00:02", "other"),
    )
    plan = _plan(_spec(networkInterfaces=[{"bridge": "br1"}]), hw)
    assert len(plan.not_in_place) == 1
    assert "networkInterfaces[0]" in plan.not_in_place[0]
    plan = _plan(_spec(networkInterfaces=[{"mac": "52:54:00:00:00:09"}]), hw)
    assert plan.not_in_place == ("networkInterfaces[0].mac changed",)


def test_an_added_ipam_nic_is_not_in_place() -> None:
    pools = [{"apiGroup": "ipam.cluster.x-k8s.io", "kind": "InClusterIPPool", "name": "p"}]
    plan = _plan(_spec(networkInterfaces=[{}, {"addressesFromPools": pools}]), _hw())
    assert plan.changes == ()
    assert "addressesFromPools" in plan.not_in_place[0]


def test_cpus_live_count_and_memory_target() -> None:
    # a power cycle pending: the persistent count is right, the live one not yet
    assert _plan(_spec(cpus=2), _hw(vcpus=1)).changes == (SetVcpus(2, 2),)
    # the live balloon size is not compared (it never moves without a guest driver)
    assert _plan(_spec(), _hw(memory_mib=512)).changes == ()
    # a stopped domain: only the persistent values count
    assert _plan(_spec(), _hw(running=False, vcpus=1)).changes == ()
    assert _plan(_spec(memoryMiB=512), _hw()).changes == (SetMemory(512, 512),)


def test_fingerprint_and_volume_names() -> None:
    a = _spec(extraDisks=[{"name": "d", "sizeGiB": 1}])
    assert fingerprint(a) == fingerprint(_spec(extraDisks=[{"name": "d", "sizeGiB": 1}]))
    assert fingerprint(a) != fingerprint(_spec(extraDisks=[{"name": "d", "sizeGiB": 2}]))
    names = machine_names(namespace="ns", name="m")
    volume = added_disk_volume(names, "data")
    assert names.owns_volume(volume)
    assert volume.endswith("-disk-data.qcow2")
