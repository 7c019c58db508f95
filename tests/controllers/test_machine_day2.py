"""The machine controller's day-2 step on the test driver and the real API server: a spec
changed after creation reaches the domain instead of being ignored, and the HardwareUpdated
condition says what happened (the guest's view, hot-plug and disk growth are in
tests/libvirtd/test_machine_day2.py)."""

from __future__ import annotations

import pytest

from capl.api import constants as c
from capl.runtime.objects import Obj
from capl.runtime.resources import LIBVIRT_MACHINE
from capl.testing.harness import ControllerHarness
from capl.testing.objects import condition_of, libvirt_machine_spec
from tests.controllers.conftest import events_of
from tests.controllers.test_machine_lifecycle import SETUP
from tests.fixtures.common import eventually

pytestmark = pytest.mark.apiserver


def _updated(generation: int, status: str, reason: str) -> object:
    def check(obj: Obj) -> bool:
        cond = condition_of(obj, c.ConditionType.HARDWARE_UPDATED)
        return (
            cond.get("observedGeneration") == generation
            and cond.get("status") == status
            and cond.get("reason") == reason
        )

    return check


async def test_changed_cpus_and_memory_reach_the_domain(harness: ControllerHarness) -> None:
    h = harness
    cluster = await h.make_cluster()
    await h.start(SETUP)
    spec = libvirt_machine_spec(cpus=1, maxCPUs=4, memoryMiB=128, maxMemoryMiB=512)
    m = await h.make_machine(cluster, spec=spec)
    obj = await h.wait_ready(m.name)
    assert condition_of(obj, c.ConditionType.HARDWARE_UPDATED) == {}
    domain_uuid = obj["spec"]["domainUUID"]
    host = h.host()
    hw = await host.domain_hardware(domain_uuid)
    assert (hw.vcpus, hw.max_vcpus, hw.memory_mib, hw.max_memory_mib) == (1, 4, 128, 512)

    changed = await h.patch(LIBVIRT_MACHINE, m.name, {"spec": {"cpus": 3, "memoryMiB": 384}})
    generation = changed["metadata"]["generation"]
    await h.wait_for(
        LIBVIRT_MACHINE,
        m.name,
        _updated(generation, "True", c.Reason.HARDWARE_APPLIED),  # type: ignore[arg-type]
        what="HardwareUpdated True",
    )
    hw = await host.domain_hardware(domain_uuid)
    assert (hw.vcpus, hw.config_vcpus, hw.memory_mib, hw.config_memory_mib) == (3, 3, 384, 384)

    async def applied_event() -> str | None:
        events = await events_of(h, m.name)
        found = [message for _t, reason, message in events if reason == c.Reason.HARDWARE_APPLIED]
        return found[-1] if found else None

    applied = await eventually(applied_event, within=10, what="the HardwareApplied event")
    assert "cpus set to 3" in applied
    assert "memoryMiB set to 384" in applied

    # a NIC changed in place cannot be applied: said so, the domain keeps its NIC
    changed = await h.patch(
        LIBVIRT_MACHINE, m.name, {"spec": {"networkInterfaces": [{"bridge": "br-none"}]}}
    )
    obj = await h.wait_for(
        LIBVIRT_MACHINE,
        m.name,
        _updated(changed["metadata"]["generation"], "False", c.Reason.NOT_IN_PLACE),  # type: ignore[arg-type]
        what="HardwareUpdated NotInPlace",
    )
    message = condition_of(obj, c.ConditionType.HARDWARE_UPDATED)["message"]
    assert "networkInterfaces[0]" in message
    assert [n.bridge for n in (await host.domain_hardware(domain_uuid)).nics] == [None]
