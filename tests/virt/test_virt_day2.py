"""Day-2 operations of the libvirt adapter on the test driver: reading the hardware, vCPUs
and memory live within the maxima and persistent-only above them, ownership. (The test
driver has no device hot-plug or block resize: those run against the real libvirtd with a
guest, tests/libvirtd/test_machine_day2.py.)"""

from __future__ import annotations

import pytest

from capl.ports.errors import ForeignDomainError, Unsupported
from capl.ports.virt import Applied, DiskSpec, NicSpec
from capl.virt import LibvirtHost
from tests.virt.test_virt_domains import _owner, _spec

GIB = 1024**3


async def test_hardware_vcpus_and_memory_live_and_at_the_next_power_cycle(
    host: LibvirtHost,
) -> None:
    owner = _owner()
    spec = _spec(owner, vcpus=1, max_vcpus=2, memory_mib=128, max_memory_mib=256)
    await host.define_domain(spec)
    stopped = await host.domain_hardware(spec.uuid)
    assert (stopped.running, stopped.config_vcpus, stopped.config_max_vcpus) == (False, 1, 2)
    assert (stopped.config_memory_mib, stopped.config_max_memory_mib) == (128, 256)
    assert [(d.target, d.serial) for d in stopped.disks] == [("vda", None)]
    assert [n.network for n in stopped.nics] == ["default"]
    await host.start_domain(spec.uuid, owner=owner)

    # within the maxima the running domain was started with: live (and persistent)
    assert await host.set_vcpus(spec.uuid, owner=owner, count=2, maximum=2) == Applied(live=True)
    assert await host.set_memory(spec.uuid, owner=owner, mib=200, maximum=256) == Applied(live=True)
    hw = await host.domain_hardware(spec.uuid)
    assert (hw.running, hw.vcpus, hw.config_vcpus, hw.memory_mib, hw.config_memory_mib) == (
        True,
        2,
        2,
        200,
        200,
    )
    # again: nothing to do, still live
    assert await host.set_vcpus(spec.uuid, owner=owner, count=2, maximum=2) == Applied(live=True)

    # above them: the persistent maxima are raised, the running domain keeps what it has
    assert await host.set_vcpus(spec.uuid, owner=owner, count=3, maximum=4) == Applied(live=False)
    assert await host.set_memory(spec.uuid, owner=owner, mib=512, maximum=512) == Applied(
        live=False
    )
    hw = await host.domain_hardware(spec.uuid)
    assert (hw.vcpus, hw.max_vcpus, hw.config_vcpus, hw.config_max_vcpus) == (2, 2, 3, 4)
    assert (hw.config_memory_mib, hw.config_max_memory_mib, hw.max_memory_mib) == (512, 512, 256)


async def test_changes_need_the_owner_tag(host: LibvirtHost) -> None:
    owner = _owner()
    spec = _spec(owner)
    await host.define_domain(spec)
    other = _owner(owner.name)  # same name, another UID
    with pytest.raises(ForeignDomainError):
        await host.set_vcpus(spec.uuid, owner=other, count=2, maximum=2)
    with pytest.raises(ForeignDomainError):
        await host.detach_disk(spec.uuid, owner=other, serial="data")
    hw = await host.domain_hardware(spec.uuid)
    assert hw.config_vcpus == 1  # untouched


async def test_hot_plug_is_a_typed_error_where_the_driver_has_none(host: LibvirtHost) -> None:
    owner = _owner()
    spec = _spec(owner)
    await host.define_domain(spec)
    with pytest.raises(Unsupported):
        await host.attach_disk(spec.uuid, owner=owner, disk=DiskSpec(path="/pool/x", serial="x"))
    with pytest.raises(Unsupported):
        await host.attach_nic(
            spec.uuid, owner=owner, nic=NicSpec(mac="52:54:00:aa:bb:cc", network="default")
        )
    assert await host.detach_nic(spec.uuid, owner=owner, mac="52:54:00:aa:bb:cc") is False
