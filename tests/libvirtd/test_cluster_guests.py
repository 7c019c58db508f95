"""The api DNS record follows real control-plane guests (TCG), both controllers running.

Two control-plane LibvirtMachines boot the test guest on the cluster's isolated network; the
LibvirtMachine controller reports their leased addresses, the LibvirtCluster controller
publishes `api`/`api-int` for them, and dnsmasq (queried at the network's gateway from the
host) answers `api.<dnsDomain>` with both. Deleting one machine drops its address. The test
plays Cluster API's part: owner references, labels, bootstrap Secrets and
`Cluster.status.initialization.infrastructureProvisioned`.
"""

from __future__ import annotations

import functools
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from capl.api import constants as c
from capl.controllers import machine as libvirtmachine
from capl.runtime.objects import ObjectKey, get_path
from capl.runtime.resources import CLUSTER, LIBVIRT_CLUSTER, LIBVIRT_MACHINE
from capl.testing.harness import ControllerHarness
from tests.controllers.conftest import harness
from tests.controllers.test_cluster_support import (
    SETUP,
    condition_of,
    create_cluster,
    create_machine,
    delete_everything,
    delete_machine,
    random_cidr,
    unique,
    wait_provisioned,
)
from tests.fixtures.libvirt import record_timing
from tests.fixtures.runtime import eventually
from tests.libvirtd.test_cluster_real import URI, resolves_to

__all__ = ["harness"]  # fixtures used by this module

pytestmark = [pytest.mark.apiserver, pytest.mark.libvirtd, pytest.mark.guest]

MACHINES = functools.partial(
    libvirtmachine.setup,
    options=libvirtmachine.MachineOptions(shutdown_timeout=20.0, address_poll=1.0),
)


@pytest.fixture
async def both(harness: ControllerHarness, libvirtd_uri: str) -> AsyncIterator[ControllerHarness]:
    """The cluster and the machine controller on the real daemon."""
    await harness.start(SETUP, MACHINES)
    try:
        yield harness
    finally:
        await delete_everything(harness)


def internal_ip(h: ControllerHarness, name: str) -> str | None:
    machine = h.manager.cache.get(LIBVIRT_MACHINE, ObjectKey(h.namespace, name))
    for address in get_path(machine or {}, "status", "addresses") or []:
        if address.get("type") == "InternalIP":
            return str(address["address"])
    return None


async def test_api_record_follows_real_guests(both: ControllerHarness, guest_image: Path) -> None:
    h = both
    name = unique("g")
    cidr = random_cidr()
    await create_cluster(
        h,
        name,
        {"hosts": [{"name": "kvm1", "uri": URI}], "network": {"mode": "isolated", "cidr": cidr}},
    )
    obj = await wait_provisioned(h, name, within=60)
    domain = obj["spec"]["network"]["dnsDomain"]
    gateway = cidr.rsplit(".", 1)[0] + ".1"
    # Cluster API would now mark the Cluster's infrastructure provisioned
    await h.patch_status(
        CLUSTER, name, {"status": {"initialization": {"infrastructureProvisioned": True}}}
    )
    started = time.monotonic()
    for machine in ("cp1", "cp2"):
        await create_machine(
            h,
            machine,
            cluster=name,
            control_plane=True,
            failure_domain="kvm1",
            bootstrap=f"#cloud-config\nhostname: {machine}\n".encode(),
            spec={
                "image": {"path": str(guest_image), "format": "qcow2"},
                "cpus": 1,
                "memoryMiB": 256,
                "domainType": "qemu",
            },
        )
    await eventually(
        lambda: internal_ip(h, "cp1") is not None and internal_ip(h, "cp2") is not None,
        within=300,
        message="both guests report an InternalIP",
    )
    record_timing("two TCG control-plane guests to InternalIP", time.monotonic() - started)
    ips = {m: str(internal_ip(h, m)) for m in ("cp1", "cp2")}
    both_ips = set(ips.values())
    await resolves_to(gateway, f"api.{domain}", both_ips, within=60)
    await resolves_to(gateway, f"api-int.{domain}", both_ips)
    # the machine controller's own names sit beside ours
    await resolves_to(gateway, f"cp1.{domain}", {ips["cp1"]})
    lc = await h.get(LIBVIRT_CLUSTER, name)
    assert condition_of(lc, c.ConditionType.CONTROL_PLANE_ENDPOINT_READY).get("status") == "True"

    # one machine goes: its address leaves the record as soon as its deletion starts
    await delete_machine(h, "cp1")
    await resolves_to(gateway, f"api.{domain}", {ips["cp2"]}, within=60)
    await resolves_to(gateway, f"api-int.{domain}", {ips["cp2"]})
