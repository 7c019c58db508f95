"""Crash consistency: the manager process is killed at every provisioning step and restarted.

The manager runs as its own process (tests/controllers/manager_proc.py) against the shared
libvirt test driver inside libvirtd (`test+unix:///default`), so its libvirt state survives
the crash and this test sees the same hypervisor. `CAPL_FAULT=<step>` makes the process
`os._exit` when provisioning reaches that step (capl.controllers.machine_plan.FAULT_STEPS).
After a restart without the fault the machine must converge to Ready with exactly one domain
(the UUID recorded in spec), exactly its own volumes, one DHCP reservation and one DNS record;
deleting it must leave nothing.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

import pytest

from capl.controllers.machine_plan import FAULT_ENV, FAULT_EXIT_CODE, FAULT_STEPS
from capl.ports.naming import machine_hostname, machine_names
from capl.testbed import ControlPlane, ManagedProcess
from tests.controllers.conftest import close_harness, leftovers, new_harness

pytestmark = pytest.mark.apiserver

REPO = Path(__file__).resolve().parents[2]


def manager_process(
    kubeconfig: Path, namespace: str, log_path: Path, *, fault: str | None
) -> ManagedProcess:
    env = {k: v for k, v in os.environ.items() if k != FAULT_ENV}
    if fault is not None:
        env[FAULT_ENV] = fault
    return ManagedProcess(
        name=f"manager-{fault or 'clean'}",
        argv=[
            sys.executable,
            "-m",
            "tests.controllers.manager_proc",
            "--kubeconfig",
            str(kubeconfig),
            "--namespace",
            namespace,
            "--log-level",
            "debug",
            "--machine-option",
            "address_poll=0.2",
        ],
        log_path=log_path,
        env=env,
        cwd=REPO,
    )


async def _exited(proc: ManagedProcess, *, within: float) -> int:
    deadline = time.monotonic() + within
    while proc.running:
        if time.monotonic() > deadline:
            raise AssertionError(f"{proc.name} did not exit; log: {proc.log_tail()}")
        await asyncio.sleep(0.05)
    code = proc.returncode
    assert code is not None
    return code


@pytest.mark.parametrize("step", FAULT_STEPS)
async def test_crash_at_step_converges(
    control_plane: ControlPlane,
    capi_crds: list[str],
    namespace: str,
    shared_test_driver: str,
    tmp_path: Path,
    step: str,
) -> None:
    h = await new_harness(control_plane.kubeconfig, namespace)
    log_path = tmp_path / "manager.log"
    procs: list[ManagedProcess] = []
    try:
        cluster = await h.make_cluster(
            hosts=[{"name": "h1", "uri": shared_test_driver}], dns_domain="crash.example"
        )
        crashing = manager_process(control_plane.kubeconfig, namespace, log_path, fault=step)
        procs.append(crashing)
        crashing.start()
        m = await h.make_machine(cluster, "crashy")
        code = await _exited(crashing, within=60)
        assert code == FAULT_EXIT_CODE, crashing.log_tail()

        clean = manager_process(control_plane.kubeconfig, namespace, log_path, fault=None)
        procs.append(clean)
        clean.start()
        try:
            obj = await h.wait_ready(m.name, within=60)
        except AssertionError:
            raise AssertionError(clean.log_tail(lines=60)) from None
        domain_uuid = obj["spec"]["domainUUID"]

        host = h.host(shared_test_driver)
        names = machine_names(namespace=namespace, name=m.name)
        mine = [
            d
            for d in await host.list_domains(cluster=cluster.name)
            if d.owner is not None and d.owner.name == m.name
        ]
        assert [d.uuid for d in mine] == [domain_uuid]
        assert mine[0].name == names.domain
        lay = cluster.layout_model()
        pool = str(lay.spec.storage_pool.name)  # type: ignore[union-attr]
        volumes = {v.name for v in await host.list_volumes(pool=pool, prefix="capl-", refresh=True)}
        assert volumes - {"capl-test-base.qcow2"} == {names.root_volume, names.cidata_volume}
        network = await host.get_network(str(lay.spec.network.name))
        assert network is not None
        hostname = machine_hostname(m.name)
        assert [h_.name for h_ in network.dhcp_hosts] == [hostname]
        assert [d.hostnames for d in network.dns_hosts] == [(f"{hostname}.crash.example",)]

        await h.delete_machine(m.name, within=60)
        assert await leftovers(h, cluster, m.name, uri=shared_test_driver) == []
    finally:
        for proc in procs:
            await proc.stop(grace=10)
        await close_harness(h)
