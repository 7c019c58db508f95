"""Benchmark: a real Kubernetes node through capl vs. a hand-run `kubeadm join`, same run.

Needs what `make demo` needs (and finds it the same way, capl.commands.demo.assets): the
control-plane binaries ($KUBEBUILDER_ASSETS), the Cluster API build with its kubeadm bootstrap
provider ($CAPL_CAPI_DIR), the node binaries ($CAPL_NODE_BIN) and the node image
($CAPL_NODE_IMAGE, `make node-image`), and libvirtd (`make libvirt-host`).

Set-up (timed apart, `setup_s`), the real-node demo's parts without its UI and without its
sweep of other demos' leftovers: a control plane (etcd + kube-apiserver) with capl's CRDs, the
Cluster API core manager and its kubeadm bootstrap provider (Ignition on), the `capl manager`
process (as deployed: config/rbac's roles, `--namespace` of the run, webhooks off), the
offline flavor's objects (capl.commands.demo.node_objects: a Cluster with an isolated
network, a directory pool, the node image's LibvirtMachineTemplate, KubeadmConfigTemplates and
MachineDeployments at 0 replicas) and the workload cluster's control plane on the network's
host address (capl.commands.demo.real_nodes: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler as host processes, made with kubeadm's phases). The node image is imported
into the pool as the base volume once, untimed: both sides boot overlays of it.

Then, in rounds, one worker per side, one side after the other (the order alternates: capl
first in even rounds), each removed before the next starts:

  capl     bench/realnode_capl.py: the Ignition MachineDeployment scaled 0 -> 1, until the
           workload cluster lists the Machine's Node Ready;
  kubeadm  bench/realnode_kubeadm.py: a bootstrap token, an Ignition config that runs a
           plain `kubeadm join`, an overlay + the Ignition file + a DHCP reservation + a
           transient domain of the same hardware with libvirt-python, until its Node is
           Ready.

Both sides' Nodes are read the same way (bench/realnode_common.py, every 0.5 s). Each side's
deadline is three times the slowest boot measured so far in the run (before any: 300 s times
the load average per CPU). Reported: per side the seconds to Ready with the steps on the way,
the machine's CPU use meanwhile; `ratio_to_kubeadm` = median of the per-round ratios
capl / kubeadm. Everything is removed on every path: each side's node after its round (capl's
through the API, the hand-made one directly), then the cluster through the API, whatever
capl left of it on the host (force-removed through its ownership-checked operations, and
reported), the processes. Writes bench/results/realnode.json.

    .venv/bin/python bench/realnode.py [--rounds 1] [--keep]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import cpu_seconds_of, libvirtd_pid, note, write_result
from bench.realnode_capl import CaplSide
from bench.realnode_common import POLL, Timeline, deadline, removal_deadline
from bench.realnode_kubeadm import KubeadmSide
from capl.api.machine import LibvirtMachineSpec
from capl.commands.demo.assets import (
    NodeParts,
    cache_dir,
    find_capi_assets,
    find_control_plane_assets,
    find_node_image,
)
from capl.commands.demo.leftovers import find_leftovers, force_clean
from capl.commands.demo.network import pick_network
from capl.commands.demo.node_objects import extra_resources, worker_objects, write_testbed_manifests
from capl.commands.demo.objects import layout_names, write_crds
from capl.commands.demo.plan import WORKER_MEMORY_MIB, DemoPlan
from capl.commands.demo.real_nodes import RealNodes
from capl.commands.demo.ui import Ui
from capl.controllers.machine.plan import image_plan
from capl.errors import CliError
from capl.kube import KubeClient
from capl.ports.naming import machine_names
from capl.runtime.errors import NotFound
from capl.runtime.logging import configure_logging
from capl.runtime.objects import ObjectKey
from capl.runtime.resources import CLUSTER, LIBVIRT_CLUSTER, LIBVIRT_MACHINE, NAMESPACE
from capl.testbed import ControlPlane
from capl.testbed.capi import CapiCore
from capl.testbed.caplmanager import CaplManager
from capl.testbed.identities import MANAGER_AUDIT_POLICY, refused_requests
from capl.virt import LibvirtHosts

URI = "qemu:///system"
RESULTS_NAME = "realnode"
TARGET_RATIO = 1.15
CLUSTER_DELETE_S = 300.0


async def _run(work: Awaitable[Any]) -> Any:
    """RealNodes' way to run a step (the demo's cancels it on Ctrl-C; here it just runs)."""
    return await work


def find_parts() -> NodeParts:
    try:
        assets = find_control_plane_assets()
        capi = find_capi_assets()
        image = find_node_image(None, cache=cache_dir())
        return NodeParts.find(image=image, envtest=assets.directory, capi=capi, cache=cache_dir())
    except CliError as exc:
        raise SystemExit(f"bench: {exc}") from None


@dataclass
class Bed:
    """Everything the run starts (see the module docstring); `close` takes it apart."""

    workdir: Path
    ui: Ui = field(default_factory=lambda: Ui(tty=False))
    hosts: LibvirtHosts = field(default_factory=LibvirtHosts)
    plane: ControlPlane | None = None
    capi: CapiCore | None = None
    nodes: RealNodes | None = None
    manager: CaplManager | None = None
    client: KubeClient | None = None
    plan: DemoPlan | None = None
    created: bool = False

    async def start(self, parts: NodeParts) -> tuple[CaplSide, KubeadmSide]:
        assets = find_control_plane_assets()
        self.plane = ControlPlane(
            assets=assets,
            workdir=self.workdir / "control-plane",
            audit_log=self.workdir / "control-plane" / "audit.log",
            audit_policy=MANAGER_AUDIT_POLICY,
        )
        await self.plane.start()
        crd_dir = self.workdir / "crds"
        write_crds(crd_dir)
        write_testbed_manifests(crd_dir)
        await self.plane.install_crds(crd_dir)
        self.capi = CapiCore(plane=self.plane, capi=parts.capi)
        await self.capi.start()
        self.client = await KubeClient.connect(str(self.plane.kubeconfig))
        namespace = f"bench-realnode-{secrets.token_hex(3)}"
        await self.client.resource(NAMESPACE).create({"metadata": {"name": namespace}})
        self.plan = DemoPlan(
            name=f"rn{secrets.token_hex(2)}",
            namespace=namespace,
            uri=URI,
            machines=0,  # the MachineDeployments start at 0: each capl round scales one up
            cidr=await pick_network(URI, domain_type="qemu"),
            pool_path=str(self.workdir / "pool"),
            domain_type="qemu",
            memory_mib=WORKER_MEMORY_MIB,
            **await parts.plan_values(),
        )
        self.nodes = RealNodes(plan=self.plan, workdir=self.workdir, parts=parts, plane=self.plane)
        await self.nodes.start_bootstrap_provider(self.ui, run=_run)
        self.manager = CaplManager(
            plane=self.plane,
            workdir=self.workdir / "manager",
            name="capl-bench-realnode",
            webhooks=False,
            namespace=namespace,
            log_level="info",
            extra_args=["--machine-shutdown-timeout=10s"],
            ready_timeout=120,
        )
        await self.manager.start()
        self.created = True  # from the first object on (the clean-up tolerates NotFound)
        await self.nodes.create(self.client, self.ui, run=_run)
        return await self._sides()

    async def _sides(self) -> tuple[CaplSide, KubeadmSide]:
        """Once the cluster's storage is ready: the base volume (untimed) and both sides."""
        assert self.plan is not None
        assert self.client is not None
        assert self.nodes is not None
        plan, nodes = self.plan, self.nodes
        await _until_storage_ready(self.client, plan)
        network, pool = layout_names(plan)
        template = next(o for o in worker_objects(plan) if o["kind"] == "LibvirtMachineTemplate")
        spec = LibvirtMachineSpec.model_validate(template["spec"]["template"]["spec"])
        image = image_plan(spec)
        t0 = time.perf_counter()
        base = await self.hosts.get(uri=URI).ensure_base_image(
            pool=pool, name=image.volume, source=image.source
        )
        note(f"base volume {image.volume} in pool {pool}: {time.perf_counter() - t0:.1f} s")
        assert nodes.workload is not None
        assert nodes.control_plane is not None
        capl = CaplSide(
            api=self.client,
            workload=nodes.workload,
            namespace=plan.namespace,
            cluster=plan.name,
            deployment=plan.md_ignition,
        )
        kubeadm = KubeadmSide(
            uri=URI,
            network=network,
            cidr=plan.cidr,
            pool=pool,
            base_path=base.volume.path,
            capacity_bytes=base.virtual_size_bytes,
            spec=spec,
            workload=nodes.workload,
            endpoint=nodes.endpoint,
            ca_pem=(nodes.control_plane.pki / "ca.crt").read_bytes(),
            workdir=self.workdir,
        )
        return capl, kubeadm

    def stack(self) -> dict[str, int | None]:
        """The processes whose CPU a side's time may go to, besides its guest."""
        found: dict[str, int | None] = {"libvirtd": libvirtd_pid(), "benchmark": os.getpid()}
        if self.plane is not None:
            for proc in (self.plane.apiserver_process, self.plane.etcd_process):
                if proc is not None:
                    found[f"management {proc.name}"] = proc.pid
        if self.capi is not None:
            found["cluster-api core"] = self.capi.pid
        if self.manager is not None:
            found["capl manager"] = self.manager.pid
        if self.nodes is not None:
            found.update(self.nodes.pids)
        return found

    async def close(self, *, keep: bool) -> list[str]:
        """Take everything apart, whichever parts started; what went wrong (never raises)."""
        problems: list[str] = []
        if self.created:
            problems += await _quietly("deleting the cluster", self._delete_cluster)
        if self.manager is not None:
            problems += await _quietly("stopping capl's manager", self.manager.stop)
        problems += [f"the manager's role refused: {r}" for r in refused_requests()]
        if self.created:
            problems += await _quietly("checking the libvirt host", self._verify_host)
        with contextlib.suppress(Exception):
            await self.hosts.close()
        if self.client is not None:
            with contextlib.suppress(Exception):
                await self.client.close()
        if self.nodes is not None:  # after the deletion: Cluster API deletes Nodes through it
            problems += await self.nodes.stop()
        if self.capi is not None:
            problems += await _quietly("stopping the Cluster API manager", self.capi.stop)
        if self.plane is not None:
            problems += await _quietly("stopping the control plane", self.plane.stop)
        if keep:
            note(f"kept {self.workdir}")
        else:
            shutil.rmtree(self.workdir, ignore_errors=True)
        return problems

    async def _delete_cluster(self) -> list[str]:
        """The MachineDeployments and the Cluster through the API, until capl removed the
        machines, the network and the pool (Cluster API deletes the rest)."""
        assert self.plan is not None
        assert self.client is not None
        assert self.nodes is not None
        plan, client = self.plan, self.client
        with contextlib.suppress(NotFound):  # a paused Cluster is not deleted
            await self.nodes.resume(client)
        md = extra_resources()["MachineDeployment"]
        targets = [(md, name) for name in plan.deployments] + [(CLUSTER, plan.name)]
        for resource, name in targets:
            with contextlib.suppress(NotFound):
                await client.resource(resource).delete(ObjectKey(plan.namespace, name))
        started = time.monotonic()
        while True:
            left = await _cluster_objects(client, plan)
            if not left:
                note(f"cluster deleted through the API: {time.monotonic() - started:.1f} s")
                return []
            if time.monotonic() - started > CLUSTER_DELETE_S:
                return [f"still there {CLUSTER_DELETE_S:.0f} s after the deletion: {left}"]
            await asyncio.sleep(POLL)

    async def _verify_host(self) -> list[str]:
        """Nothing of the cluster may be left; what is, is force-removed and reported."""
        assert self.plan is not None
        network, pool = layout_names(self.plan)
        names = {"namespace": self.plan.namespace, "cluster": self.plan.name, "network": network}
        host = self.hosts.get(uri=URI)
        left = await find_leftovers(host, **names, pool=pool)
        if left.empty:
            return []
        still = await force_clean(host, **names, pool=pool)
        return [f"capl left {left.describe()} (force-removed; still there: {still.describe()})"]


async def _quietly(what: str, work: Callable[[], Awaitable[Any]]) -> list[str]:
    try:
        result = await work()
    except Exception as exc:
        return [f"{what}: {exc}"]
    return list(result) if isinstance(result, list) else []


async def _cluster_objects(client: KubeClient, plan: DemoPlan) -> list[str]:
    left = []
    machines = await client.resource(LIBVIRT_MACHINE).list(
        namespace=plan.namespace, label_selector=f"cluster.x-k8s.io/cluster-name={plan.name}"
    )
    left += [f"LibvirtMachine {m['metadata']['name']}" for m in machines.items]
    for resource in (LIBVIRT_CLUSTER, CLUSTER):
        with contextlib.suppress(NotFound):
            await client.resource(resource).get(ObjectKey(plan.namespace, plan.name))
            left.append(resource.kind)
    return left


async def _until_storage_ready(client: KubeClient, plan: DemoPlan, within: float = 120) -> None:
    started = time.monotonic()
    while True:
        lc = await client.resource(LIBVIRT_CLUSTER).get(ObjectKey(plan.namespace, plan.name))
        conditions = (lc.get("status") or {}).get("conditions") or ()
        if any(c.get("type") == "StorageReady" and c.get("status") == "True" for c in conditions):
            return
        if time.monotonic() - started > within:
            raise TimeoutError(f"the cluster's pool was not ready within {within:.0f} s")
        await asyncio.sleep(POLL)


# --- the rounds ------------------------------------------------------------------------------

Join = Callable[[float], Awaitable[tuple[Timeline, str]]]
Remove = Callable[[float], Awaitable[list[str]]]


def _busy() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs so far (/proc/stat; idle and iowait are not busy)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(fields) - fields[3] - fields[4], sum(fields)


def qemu_pid(domain: str) -> int | None:
    """The QEMU process of a running domain (its command line names it `guest=<name>,`)."""
    needle = f"guest={domain},".encode()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if needle in (entry / "cmdline").read_bytes():
                    return int(entry.name)
    return None


async def side(
    name: str,
    join: Join,
    remove: Remove,
    measured: list[float],
    *,
    stack: dict[str, int | None],
    domain: Callable[[], str],
) -> dict[str, Any]:
    """One side's node, timed by its timeline, then removed (on every path; a node that
    cannot be removed fails the run). With the CPU seconds each process of `stack` and the
    guest's QEMU spent meanwhile."""
    within = deadline(measured)
    load = round(os.getloadavg()[0], 2)
    busy0, total0 = _busy()
    cpu0 = cpu_seconds_of(stack)
    note(f"{name}: one node, deadline {within:.0f} s (load average {load})")
    try:
        timeline, node = await join(within)
    except BaseException:
        with contextlib.suppress(Exception):
            left = await remove(removal_deadline(measured))
            if left:
                note(f"{name}: still there after the failure: {left}")
        raise
    busy1, total1 = _busy()
    cpu1 = cpu_seconds_of(stack | {"guest (QEMU)": qemu_pid(domain())})
    seconds = timeline.marks["Node Ready"]
    measured.append(seconds)
    note(f"{name}: Node {node} Ready after {seconds:.1f} s: {timeline.marks}")
    t0 = time.perf_counter()
    left = await remove(removal_deadline(measured))
    if left:
        raise RuntimeError(f"{name}: still there after the removal: {left}")
    return {
        "seconds": seconds,
        "steps_s": timeline.marks,
        "node": node,
        "deadline_s": round(within, 1),
        "loadavg_at_start": load,
        "machine_cpu_busy_cores": round(
            (os.cpu_count() or 1) * (busy1 - busy0) / max(1, total1 - total0), 2
        ),
        "removal_s": round(time.perf_counter() - t0, 2),
        "cpu_s": {k: round(v - cpu0.get(k, 0.0), 2) for k, v in cpu1.items()},
    }


async def one_round(
    r: int, bed: Bed, capl: CaplSide, kubeadm: KubeadmSide, measured: list[float]
) -> dict[str, Any]:
    async def capl_join(within: float) -> tuple[Timeline, str]:
        return await capl.join(within=within)

    async def capl_remove(within: float) -> list[str]:
        return await capl.scale_down(within=within)

    def capl_domain() -> str:
        machine = capl.machines_seen[-1] if capl.machines_seen else ""
        return machine_names(namespace=capl.namespace, name=machine).domain

    node = kubeadm.new_node(f"{r}-{secrets.token_hex(2)}")

    async def kubeadm_join(within: float) -> tuple[Timeline, str]:
        return await kubeadm.join(node, within=within), node.name

    async def kubeadm_remove(within: float) -> list[str]:
        return await kubeadm.remove(node, within=within)

    order = ("capl", "kubeadm") if r % 2 == 0 else ("kubeadm", "capl")
    result: dict[str, Any] = {"first": order[0]}
    for name in order:
        if name == "capl":
            deleted = len(capl.nodes_deleted)
            result[name] = await side(
                name, capl_join, capl_remove, measured, stack=bed.stack(), domain=capl_domain
            )
            result[name]["nodes_deleted_by_benchmark"] = capl.nodes_deleted[deleted:]
        else:
            result[name] = await side(
                name, kubeadm_join, kubeadm_remove, measured, stack=bed.stack(),
                domain=lambda: node.name,
            )  # fmt: skip
    result["ratio"] = round(result["capl"]["seconds"] / result["kubeadm"]["seconds"], 3)
    note(
        f"round {r + 1}: capl {result['capl']['seconds']:.1f} s, kubeadm "
        f"{result['kubeadm']['seconds']:.1f} s, ratio {result['ratio']}"
    )
    return result


def summarize(rounds: list[dict[str, Any]], plan: DemoPlan) -> dict[str, Any]:
    capl_s = statistics.median(r["capl"]["seconds"] for r in rounds)
    kubeadm_s = statistics.median(r["kubeadm"]["seconds"] for r in rounds)
    return {
        "rounds": len(rounds),
        "capl_seconds": round(capl_s, 2),
        "kubeadm_seconds": round(kubeadm_s, 2),
        "ratio_to_kubeadm": round(statistics.median(r["ratio"] for r in rounds), 3),
        "ratio_of_medians": round(capl_s / kubeadm_s, 3),
        "ratio_per_round": [r["ratio"] for r in rounds],
        "target_ratio": TARGET_RATIO,
        "guest": {
            "image": Path(plan.image_path or "").name,
            "cpus": plan.cpus,
            "memory_mib": plan.memory_mib,
            "domain_type": plan.domain_type,
            "bootstrap_format": "ignition",
            "kubernetes_version": plan.kubernetes_version,
        },
        "per_round": rounds,
    }


async def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    args = parser.parse_args(argv)
    configure_logging(level="warning", format="console")
    parts = find_parts()
    started = time.perf_counter()
    bed = Bed(workdir=Path(tempfile.mkdtemp(prefix="capl-bench-realnode-")))
    rounds: list[dict[str, Any]] = []
    try:
        capl, kubeadm = await bed.start(parts)
        setup_s = time.perf_counter() - started
        note(f"set-up: {setup_s:.1f} s")
        measured: list[float] = []  # boot times so far: the next deadlines
        for r in range(args.rounds):
            rounds.append(await one_round(r, bed, capl, kubeadm, measured))
    finally:
        teardown = time.perf_counter()
        problems = await bed.close(keep=args.keep)
        note(f"clean-up: {time.perf_counter() - teardown:.1f} s")
        for problem in problems:
            note(f"clean-up problem: {problem}")
    if problems:
        raise RuntimeError("clean-up: " + "; ".join(problems))
    assert bed.plan is not None
    summary = summarize(rounds, bed.plan) | {
        "setup_s": round(setup_s, 1),
        "teardown_s": round(time.perf_counter() - teardown, 1),
        "total_s": round(time.perf_counter() - started, 1),
    }
    write_result(RESULTS_NAME, summary)
    note(
        f"real node: capl {summary['capl_seconds']} s vs kubeadm join "
        f"{summary['kubeadm_seconds']} s to Node Ready; ratio {summary['ratio_to_kubeadm']} "
        f"(median of {len(rounds)} paired round(s); target <= {TARGET_RATIO})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
