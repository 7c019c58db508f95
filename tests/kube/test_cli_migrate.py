"""`capl migrate` and `capl migrate --cancel` against the real kube-apiserver.

There is no manager: the test writes the status of a LibvirtMachineMigration as the migration
controller would, while ``--wait`` follows it, reading the command's output line by line to
know when (no sleeps). The fleet is in ``tests.kube.cli_helpers``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from capl.kube import KubeClient
from capl.runtime.objects import ObjectKey
from capl.runtime.resources import LIBVIRT_CLUSTER, LIBVIRT_MACHINE, LIBVIRT_MACHINE_MIGRATION
from tests.kube.cli_helpers import Running, capl, create, create_fleet, libvirt_machine

pytestmark = pytest.mark.apiserver

GIB = 1024**3
MIB = 1024**2


@pytest.fixture
async def fleet(kube: KubeClient, namespace: str) -> str:
    await create_fleet(kube, namespace)
    return namespace


async def migrations(kube: KubeClient, namespace: str) -> list[dict[str, Any]]:
    listed = await kube.resource(LIBVIRT_MACHINE_MIGRATION).list(namespace=namespace)
    return sorted(listed.items, key=lambda m: m["metadata"]["creationTimestamp"])


async def set_status(kube: KubeClient, namespace: str, name: str, **status: Any) -> None:
    await kube.resource(LIBVIRT_MACHINE_MIGRATION).patch_status(
        ObjectKey(namespace, name), {"status": status}
    )


def created_name(line: str, namespace: str) -> str:
    match = re.fullmatch(rf"migration {namespace}/(\S+) created: .*", line)
    assert match, line
    return match.group(1)


async def test_migrate_creates_a_migration_and_refuses_a_second_one(
    kube: KubeClient, fleet: str, kubeconfig: Path
) -> None:
    flags = ("-n", fleet, "--kubeconfig", str(kubeconfig))
    code, out, err = await capl(
        "migrate", "alpha-w-1", "--to", "kvm1", "--bandwidth", "100", *flags
    )
    assert code == 0, err
    [line] = out.splitlines()
    name = created_name(line, fleet)
    assert re.fullmatch(r"alpha-w-1-[a-z0-9]{5}", name)
    assert line.endswith(": moves alpha-w-1 from kvm2 to kvm1")
    [migration] = await migrations(kube, fleet)
    assert migration["metadata"]["name"] == name
    assert migration["metadata"]["generateName"] == "alpha-w-1-"
    assert migration["metadata"]["labels"] == {"cluster.x-k8s.io/cluster-name": "alpha"}
    assert migration["spec"] == {
        "machineName": "alpha-w-1",
        "targetHost": "kvm1",
        "bandwidthMiBPerSecond": 100,
        "completionTimeoutPerGiB": 150,  # the CRD's defaults
        "progressTimeoutSeconds": 150,
        "allowAutoConverge": False,
        "allowPostCopy": False,
    }

    code, out, err = await capl("migrate", "alpha-w-1", *flags)
    assert code == 1
    assert out == ""
    assert err.strip() == (
        "capl: error: LibvirtMachine alpha-w-1 has an unfinished migration already: "
        f"LibvirtMachineMigration {fleet}/{name} (phase Pending); wait for it, or cancel it "
        f"with capl migrate --cancel {name}"
    )
    assert len(await migrations(kube, fleet)) == 1

    await set_status(kube, fleet, name, phase="Failed", message="no CPU model in common")
    code, out, err = await capl("migrate", "alpha-w-1", *flags)  # a finished one is no obstacle
    assert code == 0, err
    assert out.rstrip().endswith(": moves alpha-w-1 from kvm2 to a host capl chooses")
    latest = (await migrations(kube, fleet))[-1]
    assert latest["spec"]["machineName"] == "alpha-w-1"
    assert "targetHost" not in latest["spec"]
    assert "bandwidthMiBPerSecond" not in latest["spec"]


async def test_migrate_without_target_needs_another_host_that_fits(
    kube: KubeClient, fleet: str, kubeconfig: Path
) -> None:
    """alpha-cp-0 is a control-plane machine on kvm1, and alpha's only other host (kvm2) takes
    none: capl could choose no target."""
    code, _, err = await capl("migrate", "alpha-cp-0", "-n", fleet, "--kubeconfig", str(kubeconfig))
    assert code == 1
    assert err.strip() == (
        "capl: error: no other host can take alpha-cp-0 (it runs on kvm1): host kvm2 takes no "
        "control-plane machines (controlPlane: false)"
    )
    assert await migrations(kube, fleet) == []


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (
            ["nosuch"],
            3,
            "machine {ns}/nosuch not found (no LibvirtMachine or Machine of that name)",
        ),
        (
            ["alpha-w-1", "--to", "kvm9"],
            3,
            "LibvirtCluster {ns}/alpha has no host 'kvm9' (its hosts: kvm1, kvm2)",
        ),
        (
            ["alpha-w-1", "--to", "kvm2"],
            1,
            "LibvirtMachine alpha-w-1 runs on kvm2 already: --to must name another host of "
            "LibvirtCluster {ns}/alpha",
        ),
        (
            ["alpha-cp-0", "--to", "kvm2"],
            1,
            "cannot migrate alpha-cp-0 to kvm2: host kvm2 takes no control-plane machines "
            "(controlPlane: false)",
        ),
        (
            ["alpha-w-0", "--to", "kvm2"],
            1,
            "LibvirtMachine {ns}/alpha-w-0 is migrating already (spec.migrationTarget: kvm2)",
        ),
        (
            ["beta-w-1", "--to", "kvm1"],
            1,
            "cannot migrate beta-w-1 to kvm1: host kvm1 is in maintenance (kernel update)",
        ),
        (
            ["beta-w-0", "--to", "kvm3"],
            1,
            "cannot migrate beta-w-0 to kvm3: host kvm3 is unreachable (no route to host)",
        ),
        (["beta-w-2"], 1, "LibvirtMachine {ns}/beta-w-2 has no domain yet"),
        (["booting"], 1, "LibvirtMachine {ns}/booting is not provisioned yet"),
        (["alpha-w-1", "--bandwidth", "0"], 2, "invalid bandwidth 0: Input should be greater"),
        (["--cancel", "x", "--to", "kvm1"], 2, "--cancel takes no --to or --bandwidth"),
    ],
)
async def test_migrate_refuses_bad_input_and_creates_nothing(
    kube: KubeClient,
    fleet: str,
    kubeconfig: Path,
    args: list[str],
    code: int,
    message: str,
) -> None:
    beta = await kube.resource(LIBVIRT_CLUSTER).get(ObjectKey(fleet, "beta"))
    hosts = beta["spec"]["hosts"]
    hosts[0]["maintenance"] = {"reason": "kernel update"}
    await kube.resource(LIBVIRT_CLUSTER).patch(ObjectKey(fleet, "beta"), {"spec": {"hosts": hosts}})
    kvm3 = {"name": "kvm3", "reachable": False, "message": "no route to host"}
    await kube.resource(LIBVIRT_CLUSTER).patch_status(
        ObjectKey(fleet, "beta"), {"status": {"hosts": [*beta["status"]["hosts"], kvm3]}}
    )
    booting = libvirt_machine("booting", fleet, "alpha", host="kvm1")
    await create(kube, LIBVIRT_MACHINE, booting, {"host": "kvm1"})
    got, out, err = await capl("migrate", *args, "-n", fleet, "--kubeconfig", str(kubeconfig))
    assert got == code, err
    assert out == ""
    assert message.format(ns=fleet) in err.strip().splitlines()[-1]
    assert await migrations(kube, fleet) == []


async def test_migrate_wait_prints_phases_and_data_remaining(
    kube: KubeClient, fleet: str, kubeconfig: Path
) -> None:
    run = await Running.start(
        "migrate", "alpha-w-1", "--to", "kvm1", "--wait", "-n", fleet,
        "--kubeconfig", str(kubeconfig),
    )  # fmt: skip
    try:
        name = created_name(await run.line(), fleet)
        assert await run.line() == f"migration {name}: Pending"
        moving = {"sourceHost": "kvm2", "targetHost": "kvm1"}
        state = {"dataTotalBytes": 2 * GIB, "dataRemainingBytes": GIB}
        await set_status(kube, fleet, name, phase="Running", state=state, **moving)
        assert await run.line() == (
            f"migration {name}: Running (kvm2 -> kvm1), 1.0 GiB of 2.0 GiB left"
        )
        state = {"dataTotalBytes": 2 * GIB, "dataRemainingBytes": 300 * MIB}
        await set_status(kube, fleet, name, state=state)
        assert await run.line() == (
            f"migration {name}: Running (kvm2 -> kvm1), 300.0 MiB of 2.0 GiB left"
        )
        await set_status(
            kube,
            fleet,
            name,
            phase="Succeeded",
            state={"dataRemainingBytes": 0, "downtimeMs": 42},
            message="alpha-w-1 runs on kvm1",
        )
        assert await run.line() == (
            f"migration {name}: Succeeded (kvm2 -> kvm1), downtime 42 ms: alpha-w-1 runs on kvm1"
        )
        code, rest, err = await run.finish()
    finally:
        run.kill()
    assert code == 0, err
    assert rest == ""


async def test_migrate_wait_exits_1_when_it_fails(
    kube: KubeClient, fleet: str, kubeconfig: Path
) -> None:
    run = await Running.start(
        "migrate", "beta-w-0", "--wait", "-n", fleet, "--kubeconfig", str(kubeconfig)
    )
    try:
        name = created_name(await run.line(), fleet)
        await run.line()  # Pending
        await set_status(
            kube, fleet, name, phase="Failed", message="the destination lacks the image"
        )
        code, rest, err = await run.finish()
    finally:
        run.kill()
    assert code == 1
    assert rest == f"migration {name}: Failed: the destination lacks the image\n"
    assert err == ""


async def test_cancel_deletes_an_unfinished_migration_and_waits_until_it_is_gone(
    kube: KubeClient, fleet: str, kubeconfig: Path
) -> None:
    flags = ("-n", fleet, "--kubeconfig", str(kubeconfig))
    code, out, err = await capl("migrate", "alpha-w-1", *flags)
    assert code == 0, err
    plain = created_name(out.strip(), fleet)
    code, out, err = await capl("migrate", "--cancel", plain, *flags)
    assert code == 0, err
    assert out.splitlines() == [
        f"migration {fleet}/{plain} deleted (Pending): capl aborts it, and removes it once the "
        "domain runs in one place"
    ]
    assert await migrations(kube, fleet) == []

    # one the manager holds (its finalizer) while it aborts, found by its machine's name
    body = {
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1",
        "kind": "LibvirtMachineMigration",
        "metadata": {
            "name": "beta-w-0-abcde",
            "namespace": fleet,
            "finalizers": ["libvirtmachinemigration.infrastructure.cluster.x-k8s.io"],
        },
        "spec": {"machineName": "beta-w-0"},
    }
    await create(
        kube, LIBVIRT_MACHINE_MIGRATION, body, {"phase": "Running", "sourceHost": "kvm1",
                                                "targetHost": "kvm3"}
    )  # fmt: skip
    run = await Running.start("migrate", "--cancel", "beta-w-0", "--wait", *flags)
    try:
        assert await run.line() == (
            f"migration {fleet}/beta-w-0-abcde deleted (Running (kvm1 -> kvm3)): capl aborts "
            "it, and removes it once the domain runs in one place"
        )
        assert await run.line() == (
            "migration beta-w-0-abcde: Running (kvm1 -> kvm3), being aborted"
        )
        await set_status(kube, fleet, "beta-w-0-abcde", phase="Failed", message="aborted")
        assert await run.line() == "migration beta-w-0-abcde: Failed (kvm1 -> kvm3): aborted"
        await kube.resource(LIBVIRT_MACHINE_MIGRATION).patch(
            ObjectKey(fleet, "beta-w-0-abcde"), {"metadata": {"finalizers": None}}
        )
        code, rest, err = await run.finish()
    finally:
        run.kill()
    assert code == 0, err
    assert rest == (
        f"migration {fleet}/beta-w-0-abcde is gone (last: Failed (kvm1 -> kvm3): aborted)\n"
    )


async def test_cancel_refuses_finished_and_unknown_migrations(
    kube: KubeClient, fleet: str, kubeconfig: Path
) -> None:
    flags = ("-n", fleet, "--kubeconfig", str(kubeconfig))
    code, out, err = await capl("migrate", "alpha-w-1", *flags)
    assert code == 0, err
    name = created_name(out.strip(), fleet)
    await set_status(kube, fleet, name, phase="Succeeded")
    code, out, err = await capl("migrate", "--cancel", name, *flags)
    assert code == 1
    assert err.strip() == (
        f"capl: error: migration {fleet}/{name} is finished (Succeeded): there is nothing to "
        "cancel (kubectl delete removes its record)"
    )
    code, out, err = await capl("migrate", "--cancel", "alpha-w-1", *flags)
    assert code == 3
    assert err.strip() == (
        f"capl: error: no LibvirtMachineMigration {fleet}/alpha-w-1, and no unfinished "
        "migration of a machine alpha-w-1"
    )
    assert len(await migrations(kube, fleet)) == 1
