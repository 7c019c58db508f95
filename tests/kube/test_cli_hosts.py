"""`capl hosts` and `capl maintenance start|stop` against the real kube-apiserver.

There is no manager: the test writes the status a controller would (``status.hosts[]``,
``observedGeneration``, ``status.hosts[].maintenance``) and, for ``--wait``, writes it while
the command runs, reading its output line by line to know when (no sleeps). The fleet is in
``tests.kube.cli_helpers``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from capl.commands.maintenance import _write
from capl.kube import KubeClient
from capl.runtime.objects import ObjectKey
from capl.runtime.resources import LIBVIRT_CLUSTER
from tests.kube.cli_helpers import Running, capl, create, create_fleet, libvirt_cluster, uri

pytestmark = pytest.mark.apiserver


@pytest.fixture
async def fleet(kube: KubeClient, namespace: str) -> str:
    await create_fleet(kube, namespace)
    return namespace


async def cluster(kube: KubeClient, namespace: str, name: str) -> dict[str, Any]:
    return await kube.resource(LIBVIRT_CLUSTER).get(ObjectKey(namespace, name))


def host(lc: dict[str, Any], name: str) -> dict[str, Any]:
    return next(h for h in lc["spec"]["hosts"] if h["name"] == name)


def rows(out: str) -> dict[str, list[str]]:
    """The host table's rows by HOST (cells split on blanks)."""
    lines = out.split("\n\n", 1)[0].splitlines()
    return {line.split()[0]: line.split() for line in lines[1:]}


async def set_maintenance_status(
    kube: KubeClient, namespace: str, name: str, generation: int, kvm2: dict[str, Any]
) -> None:
    """What the cluster controller writes while it evacuates alpha's kvm2."""
    await kube.resource(LIBVIRT_CLUSTER).patch_status(
        ObjectKey(namespace, name),
        {
            "status": {
                "observedGeneration": generation,
                "hosts": [
                    {"name": "kvm1", "reachable": True, "libvirtVersion": "10.0.0"},
                    {"name": "kvm2", "reachable": True, "maintenance": kvm2},
                ],
            }
        },
    )


# --- capl hosts ----------------------------------------------------------------------------------


async def test_hosts_one_row_per_host_with_machines_and_migrations(
    fleet: str, kubeconfig: Path
) -> None:
    code, out, err = await capl("hosts", "-n", fleet, "--kubeconfig", str(kubeconfig))
    assert code == 0, err
    header = out.splitlines()[0].split()
    assert header == [
        "HOST",
        "URI",
        "REACHABLE",
        "LIBVIRT",
        "MAINTENANCE",
        "MACHINES",
        "CONTROL-PLANE",
        "MIGRATING-IN",
        "MIGRATING-OUT",
        "CLUSTERS",
    ]
    table = rows(out)
    kvm1_uri, kvm2_uri, kvm3_uri = (uri(h, fleet) for h in ("kvm1", "kvm2", "kvm3"))
    # kvm1 is one host of both clusters: alpha-cp-0, alpha-w-0, beta-w-0; kvm3 has
    # beta-w-1 and beta-w-2 (status.host only)
    assert table["kvm1"] == [
        "kvm1", kvm1_uri, "True", "10.0.0", "-", "3", "1", "0", "1", "alpha,beta"
    ]  # fmt: skip
    assert table["kvm2"] == ["kvm2", kvm2_uri, "False", "-", "-", "1", "0", "1", "0", "alpha"]
    assert table["kvm3"] == ["kvm3", kvm3_uri, "-", "-", "-", "2", "0", "0", "0", "beta"]
    assert "HOSTS IN MAINTENANCE" not in out

    code, out, err = await capl("hosts", "beta", "-n", fleet, "--kubeconfig", str(kubeconfig))
    assert code == 0, err
    assert set(rows(out)) == {"kvm1", "kvm3"}
    assert rows(out)["kvm1"][5] == "1"  # beta's machine only

    code, out, err = await capl("hosts", "-A", "-o", "json", "--kubeconfig", str(kubeconfig))
    assert code == 0, err
    ours = {h["name"]: h for h in json.loads(out)["hosts"] if h["uri"].endswith(f".{fleet}/system")}
    assert set(ours) == {"kvm1", "kvm2", "kvm3"}
    kvm1 = ours["kvm1"]
    assert kvm1["clusters"] == [f"{fleet}/alpha", f"{fleet}/beta"]
    assert kvm1["machines"] == 3
    alpha = kvm1["entries"][0]
    assert alpha["machines"] == ["alpha-cp-0", "alpha-w-0"]
    assert alpha["control_plane_machines"] == ["alpha-cp-0"]
    assert alpha["migrating_out"] == ["alpha-w-0"]
    kvm2 = ours["kvm2"]
    assert kvm2["entries"][0]["migrating_in"] == ["alpha-w-0"]
    assert kvm2["entries"][0]["control_plane_allowed"] is False
    assert kvm2["entries"][0]["message"] == "connection refused"


async def test_hosts_same_name_other_uri_is_another_host_and_unknown_cluster(
    kube: KubeClient, fleet: str, kubeconfig: Path
) -> None:
    other = [{"name": "kvm1", "uri": "qemu+tls://elsewhere/system"}]
    await create(kube, LIBVIRT_CLUSTER, libvirt_cluster("gamma", fleet, other), None)
    code, out, err = await capl("hosts", "-n", fleet, "--kubeconfig", str(kubeconfig))
    assert code == 0, err
    kvm1_rows = [line.split() for line in out.splitlines() if line.startswith("kvm1 ")]
    assert [(r[1], r[-1]) for r in kvm1_rows] == [
        (uri("kvm1", fleet), "alpha,beta"),
        ("qemu+tls://elsewhere/system", "gamma"),
    ]

    code, out, err = await capl("hosts", "delta", "-n", fleet, "--kubeconfig", str(kubeconfig))
    assert code == 3
    assert out == ""
    assert err.strip() == (
        f"capl: error: cluster 'delta' not found in namespace {fleet} "
        "(no LibvirtCluster of that name, or of a Cluster of that name)"
    )


async def test_hosts_shows_maintenance_phase_reason_and_message(
    kube: KubeClient, fleet: str, kubeconfig: Path
) -> None:
    code, out, err = await capl(
        "maintenance", "start", "kvm2", "--reason", "new disks", "-n", fleet,
        "--kubeconfig", str(kubeconfig),
    )  # fmt: skip
    assert code == 0, err
    code, out, _ = await capl("hosts", "-n", fleet, "--kubeconfig", str(kubeconfig))
    assert rows(out)["kvm2"][4] == "Pending"  # asked for, not reported yet
    assert "kvm2 in LibvirtCluster alpha: Pending; reason: new disks" in out

    generation = (await cluster(kube, fleet, "alpha"))["metadata"]["generation"]
    blocked = {
        "phase": "Blocked",
        "machines": 1,
        "message": "alpha-w-1 has evictionStrategy None",
    }
    await set_maintenance_status(kube, fleet, "alpha", generation, blocked)
    code, out, _ = await capl("hosts", "-n", fleet, "--kubeconfig", str(kubeconfig))
    assert rows(out)["kvm2"][2:5] == ["True", "-", "Blocked"]
    assert out.split("\n\n", 1)[1].splitlines() == [
        "HOSTS IN MAINTENANCE",
        "kvm2 in LibvirtCluster alpha: Blocked; reason: new disks; 1 machine left: "
        "alpha-w-1 has evictionStrategy None",
    ]


# --- capl maintenance ----------------------------------------------------------------------------


async def test_maintenance_start_and_stop_every_cluster_with_the_host(
    kube: KubeClient, fleet: str, kubeconfig: Path
) -> None:
    flags = ("-n", fleet, "--kubeconfig", str(kubeconfig))
    code, out, err = await capl("maintenance", "start", "kvm1", "--reason", "kernel 6.12", *flags)
    assert code == 0, err
    assert out.splitlines() == [
        f"LibvirtCluster {fleet}/alpha: host kvm1 put into maintenance (reason: kernel 6.12)",
        f"LibvirtCluster {fleet}/beta: host kvm1 put into maintenance (reason: kernel 6.12)",
    ]
    for name in ("alpha", "beta"):
        lc = await cluster(kube, fleet, name)
        assert host(lc, "kvm1") == {
            "name": "kvm1",
            "uri": uri("kvm1", fleet),
            "controlPlane": True,
            "insecureSkipHostKeyVerification": False,
            "allowInsecureTCP": False,
            "maintenance": {"reason": "kernel 6.12"},
        }
        assert all("maintenance" not in h for h in lc["spec"]["hosts"] if h["name"] != "kvm1")

    code, out, err = await capl("maintenance", "start", "kvm1", "--cluster", "beta", *flags)
    assert code == 0, err
    assert out.splitlines() == [
        f"LibvirtCluster {fleet}/beta: host kvm1 already in maintenance (reason: kernel 6.12): "
        "unchanged"
    ]
    code, out, err = await capl(
        "maintenance", "start", "kvm1", "--cluster", "beta", "--reason", "kernel 6.13", *flags
    )
    assert code == 0, err
    assert out.splitlines() == [
        f"LibvirtCluster {fleet}/beta: host kvm1 already in maintenance; reason changed from "
        "'kernel 6.12' to 'kernel 6.13'"
    ]
    assert host(await cluster(kube, fleet, "alpha"), "kvm1")["maintenance"] == {
        "reason": "kernel 6.12"
    }

    code, out, err = await capl("maintenance", "stop", "kvm1", "--cluster", "alpha", *flags)
    assert code == 0, err
    assert out.splitlines() == [
        f"LibvirtCluster {fleet}/alpha: host kvm1 taken out of maintenance (it was: kernel 6.12)"
    ]
    code, out, err = await capl("maintenance", "stop", "kvm1", *flags)
    assert code == 0, err
    assert out.splitlines() == [
        f"LibvirtCluster {fleet}/alpha: host kvm1 is not in maintenance: unchanged",
        f"LibvirtCluster {fleet}/beta: host kvm1 taken out of maintenance (it was: kernel 6.13)",
    ]
    for name in ("alpha", "beta"):
        assert "maintenance" not in host(await cluster(kube, fleet, name), "kvm1")


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (
            ["start", "kvm9"],
            3,
            "no LibvirtCluster in namespace {ns} has a host named 'kvm9' "
            "(their hosts: kvm1, kvm2, kvm3)",
        ),
        (
            ["stop", "kvm3", "--cluster", "alpha"],
            3,
            "LibvirtCluster {ns}/alpha has no host 'kvm3' (its hosts: kvm1, kvm2)",
        ),
        (
            ["start", "kvm1", "--cluster", "delta"],
            3,
            "LibvirtCluster 'delta' not found in namespace {ns}",
        ),
        (
            ["start", "kvm1", "--reason", "x" * 257],
            2,
            "argument --reason: invalid reason: String should have at most 256 characters",
        ),
    ],
)
async def test_maintenance_refuses_bad_input_and_changes_nothing(
    kube: KubeClient,
    fleet: str,
    kubeconfig: Path,
    args: list[str],
    code: int,
    message: str,
) -> None:
    before = {n: await cluster(kube, fleet, n) for n in ("alpha", "beta")}
    got, out, err = await capl("maintenance", *args, "-n", fleet, "--kubeconfig", str(kubeconfig))
    assert got == code, err
    assert out == ""
    assert err.strip().splitlines()[-1].endswith(message.format(ns=fleet))
    for name, lc in before.items():
        after = await cluster(kube, fleet, name)
        assert after["metadata"]["resourceVersion"] == lc["metadata"]["resourceVersion"]


async def test_maintenance_refuses_a_host_name_meaning_two_hosts(
    kube: KubeClient, fleet: str, kubeconfig: Path
) -> None:
    other = [{"name": "kvm1", "uri": "qemu+tls://elsewhere/system"}]
    await create(kube, LIBVIRT_CLUSTER, libvirt_cluster("gamma", fleet, other), None)
    code, out, err = await capl(
        "maintenance", "start", "kvm1", "-n", fleet, "--kubeconfig", str(kubeconfig)
    )
    assert code == 1
    assert out == ""
    kvm1 = uri("kvm1", fleet)
    assert err.strip() == (
        f"capl: error: the host name 'kvm1' names different hosts in namespace {fleet} "
        f"({kvm1} in {fleet}/alpha, {kvm1} in {fleet}/beta, qemu+tls://elsewhere/system in "
        f"{fleet}/gamma): choose the cluster with --cluster"
    )
    for name in ("alpha", "beta", "gamma"):
        assert "maintenance" not in host(await cluster(kube, fleet, name), "kvm1")
    code, _, err = await capl(
        "maintenance", "start", "kvm1", "--cluster", "gamma", "-n", fleet,
        "--kubeconfig", str(kubeconfig),
    )  # fmt: skip
    assert code == 0, err


async def test_maintenance_write_rereads_after_a_concurrent_edit(
    kube: KubeClient, fleet: str
) -> None:
    """The write is made against the object as read. Another writer reordered the hosts: the
    test of the host's name at its index fails (422), the command reads again and writes at
    the new index. Another writer changed something else: the resourceVersion precondition
    fails (409), the command reads again and writes. Both times the other change stays."""
    key = ObjectKey(fleet, "alpha")
    stale = await cluster(kube, fleet, "alpha")
    kvm0 = {"name": "kvm0", "uri": "qemu+ssh://root@kvm0/system"}
    reordered = [kvm0, *reversed(stale["spec"]["hosts"])]
    await kube.resource(LIBVIRT_CLUSTER).patch(key, {"spec": {"hosts": reordered}})
    invalid = kube.stats.total(method="PATCH", code=422)
    outcome = await _write(kube, stale, "kvm1", start=True, reason="firmware")
    assert kube.stats.total(method="PATCH", code=422) == invalid + 1
    assert outcome.text == "host kvm1 put into maintenance (reason: firmware)"
    lc = await cluster(kube, fleet, "alpha")
    assert [h["name"] for h in lc["spec"]["hosts"]] == ["kvm0", "kvm2", "kvm1"]
    assert [h.get("maintenance") for h in lc["spec"]["hosts"]] == [
        None,
        None,
        {"reason": "firmware"},
    ]
    assert outcome.generation == lc["metadata"]["generation"]

    stale = lc
    endpoint = {"host": "10.0.0.10", "port": 6443}
    await kube.resource(LIBVIRT_CLUSTER).patch(key, {"spec": {"controlPlaneEndpoint": endpoint}})
    conflicts = kube.stats.total(method="PATCH", code=409)
    outcome = await _write(kube, stale, "kvm1", start=False, reason=None)
    assert kube.stats.total(method="PATCH", code=409) == conflicts + 1
    assert outcome.text == "host kvm1 taken out of maintenance (it was: firmware)"
    lc = await cluster(kube, fleet, "alpha")
    assert lc["spec"]["controlPlaneEndpoint"] == endpoint
    assert all("maintenance" not in h for h in lc["spec"]["hosts"])


async def test_maintenance_wait_follows_until_evacuated(
    kube: KubeClient, fleet: str, kubeconfig: Path
) -> None:
    run = await Running.start(
        "maintenance", "start", "kvm2", "--cluster", "alpha", "--wait", "-n", fleet,
        "--kubeconfig", str(kubeconfig),
    )  # fmt: skip
    try:
        assert await run.line() == f"LibvirtCluster {fleet}/alpha: host kvm2 put into maintenance"
        generation = (await cluster(kube, fleet, "alpha"))["metadata"]["generation"]
        assert await run.line() == (
            f"LibvirtCluster {fleet}/alpha: waiting for capl's manager to see the maintenance "
            f"(status.observedGeneration 1, the change is generation {generation})"
        )
        evacuating = {"phase": "Evacuating", "machines": 1, "message": "migrating alpha-w-1"}
        await set_maintenance_status(kube, fleet, "alpha", generation, evacuating)
        assert await run.line() == (
            f"LibvirtCluster {fleet}/alpha: host kvm2 Evacuating, 1 machine left: "
            "migrating alpha-w-1"
        )
        await set_maintenance_status(
            kube, fleet, "alpha", generation, {"phase": "Evacuated", "machines": 0}
        )
        assert await run.line() == f"LibvirtCluster {fleet}/alpha: host kvm2 Evacuated"
        code, rest, err = await run.finish()
    finally:
        run.kill()
    assert code == 0, err
    assert rest == ""


async def test_maintenance_wait_exits_1_when_blocked_or_timed_out(
    kube: KubeClient, fleet: str, kubeconfig: Path
) -> None:
    flags = ("--cluster", "alpha", "-n", fleet, "--kubeconfig", str(kubeconfig))
    run = await Running.start("maintenance", "start", "kvm2", "--wait", *flags)
    try:
        await run.line()  # put into maintenance
        await run.line()  # waiting for the manager
        generation = (await cluster(kube, fleet, "alpha"))["metadata"]["generation"]
        blocked = {"phase": "Blocked", "machines": 1, "message": "alpha-w-1: evictionStrategy None"}
        await set_maintenance_status(kube, fleet, "alpha", generation, blocked)
        code, rest, err = await run.finish()
    finally:
        run.kill()
    assert code == 1
    assert rest == (
        f"LibvirtCluster {fleet}/alpha: host kvm2 Blocked, 1 machine left: "
        "alpha-w-1: evictionStrategy None\n"
    )
    assert err.strip() == (
        f"capl: error: host kvm2 cannot be evacuated from LibvirtCluster {fleet}/alpha: a "
        "machine cannot leave it (see above); move or delete it, or end the maintenance "
        "(capl maintenance stop kvm2)"
    )

    # a manager that never answers: the deadline
    code, out, err = await capl("maintenance", "start", "kvm1", "--wait", "--timeout", "1s", *flags)
    assert code == 1
    assert out.splitlines()[0] == f"LibvirtCluster {fleet}/alpha: host kvm1 put into maintenance"
    assert "capl: error: timed out after 1s waiting for host kvm1 to be evacuated" in err
    assert "waiting for capl's manager to see the maintenance" in err
