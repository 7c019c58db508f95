"""Placement by hardware with the machine controller against the real API server, on two
test-driver hosts: h1 (`test:///default`, no PCI devices) and h2 (a custom test-driver host
file with two NVIDIA A10 functions, see tests/virt/test_virt_hardware.py).

- a machine asking for an A10 by vendor/product is placed on h2 (the only host with one) and
  its domain gets one of the functions as a `<hostdev>`;
- a machine asking for that function by address is not placed: DomainProvisioned False /
  HardwareUnavailable naming each host and why, a Warning Event, nothing created;
- a second machine asking by vendor/product gets the other function: never two machines on
  one device.

The manager's host registry is the test's as well here (`observer = hosts`): a custom
test-driver file gives each connection its own state.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from capl.api import constants as c
from capl.controllers import machine as libvirtmachine
from capl.runtime.resources import LIBVIRT_MACHINE
from capl.testing.harness import TEST_DRIVER, ControllerHarness
from capl.testing.objects import condition, libvirt_machine_spec
from tests.controllers.conftest import events_of, leftovers
from tests.fixtures.common import eventually
from tests.virt.test_virt_hardware import GPU_HOST

pytestmark = pytest.mark.apiserver

FAST = libvirtmachine.MachineOptions(address_poll=0.2, retry_first=0.2, retry_max=1.0)
A10 = {"name": "gpu", "vendor": "0x10de", "product": "0x2236", "resourceName": "nvidia.com/A10"}


async def test_devices_steer_placement_and_are_never_shared(
    harness: ControllerHarness, tmp_path: Path
) -> None:
    h = harness
    h.observer = h.hosts  # one connection per host: the custom host's state is per connection
    gpu_file = tmp_path / "gpuhost.xml"
    gpu_file.write_text(GPU_HOST)
    gpu_uri = f"test://{gpu_file}"
    hosts = [{"name": "h1", "uri": TEST_DRIVER}, {"name": "h2", "uri": gpu_uri}]
    cluster = await h.make_cluster(hosts=hosts, adopt_network=True)
    await h.start(functools.partial(libvirtmachine.setup, options=FAST))

    first = await h.make_machine(cluster, "gpu-a", spec=libvirt_machine_spec(hostDevices=[A10]))
    obj = await h.wait_ready(first.name)
    assert obj["spec"]["hostName"] == "h2"
    gpu_host = h.hosts.get(uri=gpu_uri)
    hardware = await gpu_host.hardware()  # devices read from the domains' <hostdev>s
    assert obj["spec"]["domainUUID"] in hardware.domain_uuids
    (address,) = hardware.used_pci
    assert address in {"0000:65:00.0", "0000:65:00.1"}

    taken = {"name": "gpu", "pciAddress": address}
    second = await h.make_machine(cluster, "gpu-b", spec=libvirt_machine_spec(hostDevices=[taken]))
    obj = await h.wait_for(
        LIBVIRT_MACHINE,
        second.name,
        lambda o: (
            condition(o, c.ConditionType.DOMAIN_PROVISIONED, "reason")
            == c.Reason.HARDWARE_UNAVAILABLE
        ),
        what="HardwareUnavailable",
    )
    message = condition(obj, c.ConditionType.DOMAIN_PROVISIONED, "message") or ""
    assert message == (
        "no host can give the machine its hardware:"
        f" h1: no free PCI device {address} (hostDevices gpu);"
        f" h2: no free PCI device {address} (hostDevices gpu)"
    )
    assert "hostName" not in obj["spec"]  # not placed
    assert "domainUUID" not in obj["spec"]

    async def warned() -> bool:
        events = await events_of(h, second.name)
        return any(e[0] == "Warning" and e[1] == c.Reason.HARDWARE_UNAVAILABLE for e in events)

    await eventually(warned, within=30, what="a HardwareUnavailable Warning event")
    for uri in (TEST_DRIVER, gpu_uri):
        assert await leftovers(h, cluster, second.name, uri=uri) == []

    third = await h.make_machine(cluster, "gpu-c", spec=libvirt_machine_spec(hostDevices=[A10]))
    obj = await h.wait_ready(third.name)
    assert obj["spec"]["hostName"] == "h2"
    hardware = await gpu_host.hardware()
    assert obj["spec"]["domainUUID"] in hardware.domain_uuids
    assert hardware.used_pci == {"0000:65:00.0", "0000:65:00.1"}
