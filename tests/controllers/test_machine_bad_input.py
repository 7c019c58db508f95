"""Bad input: every case ends in a condition naming the real cause, a Warning event, nothing
left behind on the host, and no hot retry loop (no reconcile errors, a handful of retries).

A full storage pool cannot be had on the test driver (it never runs out of space for the
sparse volumes capl creates): tests/libvirtd/test_machine_real.py fills a small tmpfs pool.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
from dataclasses import dataclass
from typing import Any

import libvirt
import pytest

from capl.api import constants as c
from capl.controllers import machine as libvirtmachine
from capl.ports.naming import machine_names
from capl.runtime.objects import ObjectKey
from capl.runtime.resources import LIBVIRT_MACHINE, MACHINE
from capl.testing.harness import TEST_DRIVER, ClusterObjects, ControllerHarness
from capl.testing.objects import condition, libvirt_machine_spec
from tests.controllers.conftest import events_of, leftovers
from tests.fixtures.images import ImageServer, qcow2_image

pytestmark = pytest.mark.apiserver

SETUP = functools.partial(
    libvirtmachine.setup, options=libvirtmachine.MachineOptions(retry_first=0.5, retry_max=2.0)
)
UNREACHABLE = "qemu+unix:///system?socket=/nonexistent/capl-test.sock"


@dataclass
class Case:
    spec: dict[str, Any]
    condition: str
    reason: str
    message: str
    bootstrap: bytes | None = b"#cloud-config\n"
    format: str | None = None
    secret: bool = True
    hosts: list[dict[str, Any]] | None = None
    foreign_domain: bool = False
    """A domain (not capl's) already holds the machine's domain name."""


def cases(server: ImageServer) -> dict[str, Case]:
    good = qcow2_image()
    server.files["/good.qcow2"] = good
    return {
        "missing-image-volume": Case(
            spec=libvirt_machine_spec(image={"volume": "no-such-image.qcow2"}),
            condition=c.ConditionType.DOMAIN_PROVISIONED,
            reason=c.Reason.IMAGE_UNAVAILABLE,
            message="no-such-image.qcow2",
        ),
        "image-url-404": Case(
            spec=libvirt_machine_spec(image={"url": server.url("/missing.qcow2")}),
            condition=c.ConditionType.DOMAIN_PROVISIONED,
            reason=c.Reason.IMAGE_UNAVAILABLE,
            message="HTTP 404",
        ),
        "image-url-refused": Case(
            spec=libvirt_machine_spec(image={"url": "http://127.0.0.1:1/image.qcow2"}),
            condition=c.ConditionType.DOMAIN_PROVISIONED,
            reason=c.Reason.IMAGE_UNAVAILABLE,
            message="127.0.0.1:1",
        ),
        "checksum-mismatch": Case(
            spec=libvirt_machine_spec(
                image={
                    "url": server.url("/good.qcow2"),
                    "checksum": "sha256:" + hashlib.sha256(b"something else").hexdigest(),
                }
            ),
            condition=c.ConditionType.DOMAIN_PROVISIONED,
            reason=c.Reason.CHECKSUM_MISMATCH,
            message=hashlib.sha256(good).hexdigest(),
        ),
        "missing-bootstrap-secret": Case(
            spec=libvirt_machine_spec(),
            condition=c.ConditionType.BOOTSTRAP_DATA_DELIVERED,
            reason=c.Reason.WAITING_FOR_BOOTSTRAP_DATA,
            message="not found",
            secret=False,
        ),
        "malformed-ignition": Case(
            spec=libvirt_machine_spec(),
            condition=c.ConditionType.BOOTSTRAP_DATA_DELIVERED,
            reason=c.Reason.BOOTSTRAP_DATA_INVALID,
            message="not valid JSON",
            bootstrap=b'{"ignition": {"version": "3.4.0"',
            format="ignition",
        ),
        "ignition-without-version": Case(
            spec=libvirt_machine_spec(),
            condition=c.ConditionType.BOOTSTRAP_DATA_DELIVERED,
            reason=c.Reason.BOOTSTRAP_DATA_INVALID,
            message="ignition",
            bootstrap=json.dumps({"storage": {}}).encode(),
            format="ignition",
        ),
        "host-unreachable": Case(
            spec=libvirt_machine_spec(),
            condition=c.ConditionType.DOMAIN_PROVISIONED,
            reason=c.Reason.UNREACHABLE,
            message="capl-test.sock",
            hosts=[{"name": "h1", "uri": UNREACHABLE}],
        ),
        "name-collision": Case(
            spec=libvirt_machine_spec(),
            condition=c.ConditionType.DOMAIN_PROVISIONED,
            reason=c.Reason.NAME_COLLISION,
            message="left untouched",
            foreign_domain=True,
        ),
    }


CASES = [
    "missing-image-volume",
    "image-url-404",
    "image-url-refused",
    "checksum-mismatch",
    "missing-bootstrap-secret",
    "malformed-ignition",
    "ignition-without-version",
    "host-unreachable",
    "name-collision",
]


@pytest.mark.parametrize("case_name", CASES)
async def test_bad_input(
    harness: ControllerHarness, image_server: ImageServer, case_name: str
) -> None:
    case = cases(image_server)[case_name]
    reachable = case.hosts is None
    cluster = await harness.make_cluster(hosts=case.hosts, prepare=reachable)
    machine = "bad-" + case_name[:20]
    conn = libvirt.open(TEST_DRIVER)  # also keeps the test driver's state for the test
    try:
        await _run_case(harness, conn, cluster, machine, case, reachable)
    finally:
        conn.close()


async def _run_case(
    harness: ControllerHarness,
    conn: libvirt.virConnect,
    cluster: ClusterObjects,
    machine: str,
    case: Case,
    reachable: bool,
) -> None:
    domain_name = machine_names(namespace=harness.namespace, name=machine).domain
    if case.foreign_domain:
        foreign = conn.defineXML(
            f"<domain type='test'><name>{domain_name}</name><memory unit='MiB'>64</memory>"
            "<os><type>hvm</type></os></domain>"
        )
        foreign.create()
    await harness.start(SETUP)
    m = await harness.make_machine(
        cluster,
        machine,
        spec=case.spec,
        bootstrap=case.bootstrap if case.secret else None,
        format=case.format,
    )
    if not case.secret:
        await harness.patch(
            MACHINE,
            m.name,
            {"spec": {"bootstrap": {"configRef": None, "dataSecretName": "nowhere"}}},
        )
    obj = await harness.wait_for(
        LIBVIRT_MACHINE,
        m.name,
        lambda o: (
            condition(o, case.condition, "reason") == case.reason
            and case.message in (condition(o, case.condition, "message") or "")
        ),
        what=f"{case.condition}={case.reason}",
    )
    message = condition(obj, case.condition, "message") or ""
    assert case.message in message, message
    assert condition(obj, c.ConditionType.READY) == "False"
    assert condition(obj, c.ConditionType.READY, "reason") == case.reason
    if case.condition == c.ConditionType.BOOTSTRAP_DATA_DELIVERED:
        assert "domainUUID" not in obj["spec"]  # nothing was even placed
        assert "cloud-config" not in message
        assert '"3.4.0"' not in message
    if case.reason not in (c.Reason.WAITING_FOR_BOOTSTRAP_DATA,):
        warnings = [e for e in await _wait_events(harness, m.name) if e[0] == "Warning"]
        assert any(e[1] == case.reason and case.message in e[2] for e in warnings), warnings

    # no hot loop: no reconcile raised, and the key waits for a backoff (or for a change)
    controller = await harness.settle(libvirtmachine.CONTROLLER_NAME)
    assert controller.failures == 0
    parked = controller.queue.waiting.get(ObjectKey(harness.namespace, m.name))
    if parked is not None:
        assert parked - controller.clock.now() >= -0.1  # parked for later, not spinning
    assert controller.reconciles <= 12

    if reachable:
        assert await leftovers(harness, cluster, m.name) == []
    # deleting a machine that never got a domain is quick and clean
    await harness.delete_machine(m.name, within=30)
    if reachable:
        assert await leftovers(harness, cluster, m.name) == []
    if case.foreign_domain:  # the foreign domain was never touched
        assert foreign.isActive()
        assert conn.lookupByName(domain_name).UUIDString() == foreign.UUIDString()
        foreign.destroy()
        foreign.undefine()


async def _wait_events(harness: ControllerHarness, name: str) -> list[tuple[str, str, str]]:
    for _ in range(100):
        events = await events_of(harness, name)
        if events:
            return events
        await asyncio.sleep(0.05)
    return []
