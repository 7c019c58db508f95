"""Host hardware and device passthrough through the libvirt adapter, on the test driver.

The test driver's node devices come from a custom host file (``test:///<file>.xml``, state
private to the one connection the `hosts` registry keeps): a host with two NVIDIA A10 PCI
functions and one vGPU (mdev). Checked: what ``Host.hardware`` reports, that concurrent
definitions never share a device, that a definition without a free device is refused with
nothing defined, that defining the same domain again keeps its devices, and that
placement (`plan_hardware.refusal`) turns away the host without devices / CPUs / pages.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest

from capl.api import constants as c
from capl.controllers.machine.plan import Failure, classify
from capl.controllers.machine.plan_hardware import refusal
from capl.ports.errors import DeviceUnavailable, InvalidSpec
from capl.ports.virt import CpuSpec, DomainHardware, MdevSelector, NumaCellSpec, PciSelector
from capl.virt import LibvirtHost, LibvirtHosts
from tests.virt.test_virt_domains import _owner, _spec

MDEV = "b1ae8bf6-38b0-4c81-9d44-78ce3f520496"
A10 = PciSelector(name="gpu", vendor="0x10de", product="0x2236")


def _pci(function: int) -> str:
    return f"""<device><name>pci_0000_65_00_{function}</name><parent>computer</parent>
  <capability type='pci'><class>0x030000</class><domain>0</domain><bus>101</bus><slot>0</slot>
  <function>{function}</function><product id='0x2236'>GA102GL [A10]</product>
  <vendor id='0x10de'>NVIDIA Corporation</vendor></capability></device>"""


GPU_HOST = f"""<node>{_pci(0)}{_pci(1)}
<device><name>mdev_{MDEV.replace("-", "_")}</name><parent>pci_0000_65_00_0</parent>
  <capability type='mdev'><type id='nvidia-558'/><uuid>{MDEV}</uuid><iommuGroup number='41'/>
  </capability></device>
</node>"""


@pytest.fixture
async def gpu_host(hosts: LibvirtHosts, tmp_path: Path) -> LibvirtHost:
    path = tmp_path / "gpuhost.xml"
    path.write_text(GPU_HOST)
    return hosts.get(uri=f"test://{path}")


async def test_hardware_lists_devices_and_who_uses_them(gpu_host: LibvirtHost) -> None:
    hw = await gpu_host.hardware()
    assert sorted((d.address, d.vendor, d.product) for d in hw.pci) == [
        ("0000:65:00.0", "0x10de", "0x2236"),
        ("0000:65:00.1", "0x10de", "0x2236"),
    ]
    assert [(m.uuid, m.type) for m in hw.mdevs] == [(MDEV, "nvidia-558")]
    assert (hw.used_pci, hw.used_mdevs) == (frozenset(), frozenset())
    spec = _spec(
        _owner(),
        hardware=DomainHardware(pci=(A10,), mdevs=(MdevSelector(name="v", type="nvidia-558"),)),
    )
    await gpu_host.define_domain(spec)
    hw = await gpu_host.hardware()
    assert (len(hw.used_pci), hw.used_mdevs) == (1, frozenset({MDEV}))
    assert spec.uuid in hw.domain_uuids
    # defined again (a retried reconcile): its own devices do not count as taken
    again = await gpu_host.define_domain(spec)
    assert again.uuid == spec.uuid
    # the vGPU is taken now: a second machine wanting one is refused, nothing defined
    other = _spec(_owner(), hardware=DomainHardware(mdevs=(MdevSelector(name="v", uuid=MDEV),)))
    with pytest.raises(InvalidSpec, match=f"no free mdev {MDEV}"):
        await gpu_host.define_domain(other)
    assert await gpu_host.get_domain(other.uuid) is None


async def test_concurrent_definitions_never_share_a_device(gpu_host: LibvirtHost) -> None:
    specs = [_spec(_owner(), hardware=DomainHardware(pci=(A10,))) for _ in range(3)]
    results = await asyncio.gather(
        *(gpu_host.define_domain(s) for s in specs), return_exceptions=True
    )
    refused = [r for r in results if isinstance(r, BaseException)]
    assert [type(r) for r in refused] == [DeviceUnavailable], results
    assert classify(refused[0]) == Failure(  # type: ignore[arg-type]
        c.Reason.HARDWARE_UNAVAILABLE, str(refused[0]), True
    )
    assert "no free PCI device vendor 0x10de product 0x2236" in str(refused[0])
    hw = await gpu_host.hardware()
    assert hw.used_pci == {"0000:65:00.0", "0000:65:00.1"}
    assert len([s for s in specs if s.uuid in hw.domain_uuids]) == 2


async def test_placement_refuses_hosts_without_the_hardware(
    gpu_host: LibvirtHost, hosts: LibvirtHosts
) -> None:
    gpu, plain = await gpu_host.hardware(), await hosts.get(uri="test:///default").hardware()
    want = DomainHardware(pci=(A10,))
    assert refusal(want, memory_mib=1024, host=gpu) is None
    assert refusal(want, memory_mib=1024, host=plain) == (
        "no free PCI device vendor 0x10de product 0x2236 (hostDevices gpu)"
    )
    # a machine placed there before (domain not defined yet) claims one; two are wanted
    two = dataclasses.replace(want, pci=(A10, dataclasses.replace(A10, name="gpu2")))
    assert refusal(two, memory_mib=1024, host=gpu) is None
    assert "hostDevices gpu2" in (
        refusal(two, memory_mib=1024, host=gpu, pending=([A10], [])) or ""
    )
    # test:///default: 2 NUMA cells of 8 CPUs, no free 2 MiB pages
    numa = CpuSpec(
        pins=(0, 9),
        numa=(NumaCellSpec(cpus="0", memory_mib=512), NumaCellSpec(cpus="1", memory_mib=512)),
    )
    assert refusal(DomainHardware(cpu=numa), memory_mib=1024, host=plain) is None
    too_many = dataclasses.replace(numa, numa=numa.numa * 2)
    assert refusal(DomainHardware(cpu=too_many), memory_mib=1024, host=plain) == (
        "4 NUMA cells asked, the host has 2"
    )
    pinned = dataclasses.replace(numa, pins=(0, 16))
    assert "host CPUs [16] (dedicatedCPUs) do not exist" in (
        refusal(DomainHardware(cpu=pinned), memory_mib=1024, host=plain) or ""
    )
    paged = DomainHardware(cpu=numa, hugepage_kib=2048)
    assert refusal(paged, memory_mib=1024, host=plain) == (
        "host NUMA cell 0 has 0 free 2048 KiB pages, 256 needed"
    )
