"""Crash consistency: `capl manager` is killed at every provisioning step and restarted.

The manager is the product's entry point, `capl manager` as a process (tests/fixtures/capl.py
`CaplManager`, webhooks off), watching the test's namespace, against the shared libvirt test
driver inside libvirtd (`test+unix:///default`), so its libvirt state survives the crash and
this test sees the same hypervisor. `CAPL_FAULT=<step>` makes the process `os._exit` when
provisioning reaches that step (capl.controllers.machine.plan.FAULT_STEPS).

The cluster is made the way a user's is: the manager's own LibvirtCluster controller creates
its network and pool (tests/fixtures/bed.py `ManagerBed.create_cluster`), then the machine is
created and the manager dies at the step. After a restart without the fault the machine
must converge to Ready, and libvirt, listed directly (`ManagerBed.audit`), must hold exactly
one running domain for it (the UUID recorded in spec, under its own name), exactly its own
volumes (root overlay and bootstrap volume besides the cluster's base volume), one DHCP
reservation and one DNS record, and nothing else; deleting it must leave nothing, and the
cluster is deleted through the manager afterwards.
"""

from __future__ import annotations

import pytest

from capl.controllers.machine.plan import FAULT_ENV, FAULT_EXIT_CODE, FAULT_STEPS
from capl.testbed import ControlPlane
from capl.testbed.caplmanager import CaplManager
from tests.fixtures.bed import Host, ManagerBed, bed_for
from tests.fixtures.capl import CaplManagerFactory
from tests.fixtures.common import eventually

pytestmark = pytest.mark.apiserver


async def exit_status(manager: CaplManager, *, within: float) -> int | None:
    await eventually(lambda: not manager.running, within=within, what=f"{manager.name} exits")
    assert manager.process is not None
    return manager.process.returncode


def problems_text(problems: list[str], manager: CaplManager) -> str:
    return "\n  ".join(problems[:20]) + f"\n{manager.log_text()[-4000:]}"


@pytest.mark.parametrize("step", FAULT_STEPS)
async def test_crash_at_step_converges(
    control_plane: ControlPlane,
    capi_crds: list[str],
    namespace: str,
    shared_test_driver: str,
    capl_manager_factory: CaplManagerFactory,
    step: str,
) -> None:
    manager = await capl_manager_factory(
        control_plane,
        name=f"capl-crash-{step}",
        webhooks=False,
        namespace=namespace,
        env={FAULT_ENV: step},
    )
    async with bed_for(ManagerBed, control_plane, namespace, dns_domain="crash.example") as bed:
        try:
            await manager.start()
            cluster = await bed.create_cluster("crash", hosts=[Host("h1", shared_test_driver)])
            await bed.create_machine(cluster, "crashy")
            code = await exit_status(manager, within=60)
            assert code == FAULT_EXIT_CODE, manager.log_text()[-4000:]

            manager.env[FAULT_ENV] = ""  # the same manager again, without the fault
            await manager.start()
            try:
                _, machines = await bed.wait_converged(within=60)
            except AssertionError as exc:
                raise AssertionError(f"{exc}\n{manager.log_text()[-4000:]}") from None
            problems = await bed.audit(cluster, machines)
            assert not problems, problems_text(problems, manager)

            await bed.delete_machine("crashy")
            await bed.wait_converged(within=60)
            problems = await bed.audit(cluster)
            assert not problems, problems_text(problems, manager)
            await bed.delete_cluster(cluster)
        finally:
            await manager.stop()
