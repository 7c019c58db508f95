"""BootstrapSucceeded through the real controller, the real API server and the test driver.

The test driver has no guest agent, which is the first case: no condition at all, and the
machine settles as before (nothing parked for a requeue). A real agent needs a node image
with qemu-guest-agent and a real libvirtd; here the second case scripts the adapter's two
reads (`LibvirtHost.read_guest_file`, `LibvirtHost.read_volume_tail`) so that the rest runs
for real: the status patch with the condition the CRD schema accepts, the one Warning event,
the redaction of what the console printed, the polling that stops once True.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest

from capl.api import constants as c
from capl.controllers import machine as libvirtmachine
from capl.controllers.machine.bootstrap import SUCCESS_FILE, BootstrapOptions
from capl.ports.virt import GuestFile, GuestFileState, VolumeTail
from capl.runtime.objects import ObjectKey
from capl.runtime.resources import EVENT, LIBVIRT_MACHINE
from capl.testing.harness import ControllerHarness
from capl.testing.objects import condition
from capl.virt.host import LibvirtHost
from tests.fixtures.common import eventually

pytestmark = pytest.mark.apiserver

TOKEN = "q8t3zk.4nv0c8m2x7w1p5rd"
CERT_KEY = "9c1f" * 16
CONSOLE = (
    "[   12.000000] cloud-init[800]: running 'kubeadm join'\n"
    f"kubeadm join api.bs.example:6443 --token {TOKEN} --certificate-key {CERT_KEY}\n"
    "[preflight] Running pre-flight checks\n"
    "error execution phase preflight: couldn't validate the identity of the API Server\n"
).encode()


def _setup(bootstrap: BootstrapOptions | None = None) -> functools.partial[Any]:
    options = libvirtmachine.MachineOptions(
        address_poll=0.2, retry_first=0.2, retry_max=1.0, bootstrap=bootstrap or BootstrapOptions()
    )
    return functools.partial(libvirtmachine.setup, options=options)


async def test_no_guest_agent_no_condition_and_the_machine_settles(
    harness: ControllerHarness,
) -> None:
    cluster = await harness.make_cluster()
    await harness.start(_setup())
    m = await harness.make_machine(cluster)
    obj = await harness.wait_ready(m.name)
    machines = await harness.settle(libvirtmachine.CONTROLLER_NAME)
    obj = await harness.get(LIBVIRT_MACHINE, m.name)
    assert obj is not None
    assert condition(obj, c.ConditionType.BOOTSTRAP_SUCCEEDED) is None
    assert ObjectKey(harness.namespace, m.name) not in machines.queue.waiting


class _Agent:
    """What the scripted guest agent answers (shared by every host of the test)."""

    def __init__(self) -> None:
        self.state = GuestFileState.ABSENT
        self.asked = 0
        self.console = CONSOLE


async def test_timed_out_then_succeeded_with_a_scripted_agent(
    harness: ControllerHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = _Agent()

    async def read_guest_file(
        self: LibvirtHost, uuid: str, path: str, *, limit: int = 4096
    ) -> GuestFile:
        assert path == SUCCESS_FILE
        agent.asked += 1
        return GuestFile(state=agent.state)

    async def read_volume_tail(
        self: LibvirtHost, *, pool: str, name: str, limit: int
    ) -> VolumeTail | None:
        assert name.endswith("-console.log")
        return VolumeTail(data=agent.console, offset=0)

    monkeypatch.setattr(LibvirtHost, "read_guest_file", read_guest_file)
    monkeypatch.setattr(LibvirtHost, "read_volume_tail", read_volume_tail)
    cluster = await harness.make_cluster()
    await harness.start(_setup(BootstrapOptions(timeout=2.0, poll=0.2, slow_poll=0.3)))
    m = await harness.make_machine(cluster)
    key = ObjectKey(harness.namespace, m.name)

    obj = await harness.wait_for(
        LIBVIRT_MACHINE,
        m.name,
        lambda o: (
            condition(o, c.ConditionType.BOOTSTRAP_SUCCEEDED, "reason")
            == c.Reason.BOOTSTRAP_TIMED_OUT
        ),
        within=60,
        what="BootstrapTimedOut",
    )
    assert condition(obj, c.ConditionType.READY) == "True"  # not part of Ready
    message = str(condition(obj, c.ConditionType.BOOTSTRAP_SUCCEEDED, "message"))
    assert message.startswith("bootstrap did not finish within 2s of the domain's start")
    assert message.endswith("couldn't validate the identity of the API Server")
    assert "--token [redacted] --certificate-key [redacted]" in message

    async def warnings() -> list[dict[str, Any]]:
        listing = await harness.api.resource(EVENT).list(namespace=harness.namespace)
        return [
            e
            for e in listing.items
            if (e.get("involvedObject") or {}).get("name") == m.name
            and e.get("reason") == c.Reason.BOOTSTRAP_TIMED_OUT
        ]

    await eventually(warnings, within=30, what="the BootstrapTimedOut event")
    asked = agent.asked
    await eventually(lambda: agent.asked >= asked + 3, within=30, what="slow polling")
    (event,) = await warnings()
    assert event["type"] == "Warning"
    assert event.get("count", 1) == 1
    assert "[redacted]" in event["message"]
    for text in (str(obj), str(event)):
        assert TOKEN not in text
        assert CERT_KEY not in text

    # what the guest prints after the deadline reaches the message; no second event
    agent.console = CONSOLE + b"[  700.000000] kubeadm: still trying, --token " + TOKEN.encode()
    obj = await harness.wait_for(
        LIBVIRT_MACHINE,
        m.name,
        lambda o: str(condition(o, c.ConditionType.BOOTSTRAP_SUCCEEDED, "message")).endswith(
            "kubeadm: still trying, --token [redacted]"
        ),
        within=30,
        what="the message following the console after the timeout",
    )
    assert TOKEN not in str(obj)
    (event,) = await warnings()
    assert event.get("count", 1) == 1

    agent.state = GuestFileState.PRESENT
    obj = await harness.wait_for(
        LIBVIRT_MACHINE,
        m.name,
        lambda o: condition(o, c.ConditionType.BOOTSTRAP_SUCCEEDED) == "True",
        within=30,
        what="BootstrapSucceeded",
    )
    assert condition(obj, c.ConditionType.BOOTSTRAP_SUCCEEDED, "reason") == (
        c.Reason.BOOTSTRAP_SUCCEEDED
    )
    machines = await harness.settle(libvirtmachine.CONTROLLER_NAME)
    assert key not in machines.queue.waiting  # no more polling
    asked = agent.asked
    await harness.reconciled_after(
        libvirtmachine.CONTROLLER_NAME,
        harness.patch(LIBVIRT_MACHINE, m.name, {"metadata": {"annotations": {"capl.test/x": "1"}}}),
    )
    assert agent.asked == asked
