"""Benchmark: N LibvirtMachines created at once on the libvirt test driver, to Ready.

Starts its own etcd + kube-apiserver (capl.testbed.ControlPlane, binaries from
$KUBEBUILDER_ASSETS), installs capl's CRDs and the Cluster API Cluster/Machine CRDs
($CAPL_CAPI_DIR, reduced to v1beta2 like tests/controllers do). Each round, in a fresh
namespace:

  machines  one cluster on the test driver (network /20 with a DNS domain, pool, base volume,
            made through the Hosts port); N bootstrap Secrets + Machines; the
            LibvirtMachine controller (capl.runtime Manager, KubeClient, LibvirtHosts: nothing
            faked) runs in this process. A load process (this script with --load-child: the
            "user", kept out of the manager's process as kubectl or the MachineSet controller
            would be) creates the N LibvirtMachines as fast as the API server takes them
            (32 in flight) and takes each one's create-to-Ready time from its own watch.
  raw API   the same API writes, without capl: N fresh LibvirtMachines (created untimed),
            then for each one exactly the writes the manager made for a machine of this round
            (its metadata/spec merge patch with the resourceVersion precondition, its status
            patch, its Event), sent by one tight loop, and by `concurrency` loops.
  raw toy   one status merge patch per object on N toy objects, one loop: the figure
            bench/runtime_toy.py calls "raw patches/s", for reference.
  libvirt   the floor of the network step: N x (DHCP host add + DNS host add, LIVE|CONFIG) on a
            scratch network of the same shape, one loop, straight through libvirt-python. Each
            update makes libvirt format and parse the whole network definition, so this grows
            as N^2 and is the limit of a big scale-out on one network.

Figures (per round; the headline is the median over rounds)
  machines_per_s               N / (first create sent .. last machine Ready)
  create_to_ready_p50_s/p99_s  per machine: create sent .. Ready seen by the load's watch
  api_writes_per_machine       LibvirtMachine patches by the manager (spec + status)
  events_per_machine           Events written by the manager
  all_api_writes_per_machine   every write request of the manager's client
  libvirt_calls_per_machine    libvirt calls made through LibvirtHosts (all methods)
  ratio_to_apiserver           machines_per_s / raw_api_machines_per_s_sequential: the time one
                               tight loop needs for the same writes, divided by capl's time
                               (the issue's "machines/s vs. the raw apiserver patch rate for the
                               same number of writes"; as bench/runtime_toy.py, the raw side is
                               one loop, and its ratio is reconciles/s over raw patches/s with
                               one write per object). Target >= 0.7.
  ratio_to_apiserver_concurrent  the same against `concurrency` loops.
  ratio_to_toy_patches         machines_per_s * all_api_writes_per_machine / raw toy patches/s
                               (the same idea with runtime_toy's cheaper writes).
  ratio_to_libvirt_network     machines_per_s / libvirt_network_machines_per_s.
  cpu_seconds_per_machine      CPU seconds per machine in the machine phase: manager process
                               (its event-loop thread, and the other threads: libvirt worker
                               threads, where the in-process test driver's own work runs),
                               kube-apiserver, etcd, libvirtd (test+unix:// URIs), the load.
  raw_api_cpu_seconds_per_machine  kube-apiserver and etcd CPU per machine while the raw API
                               loop runs (object creation included), for comparison.

Writes bench/results/machines_testdriver.json (or --out).

    .venv/bin/python bench/machines_testdriver.py [--machines 500] [--rounds 1]
        [--concurrency 10] [--uri test:///default] [--no-libvirt-baseline]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import libvirt

from capl.api import constants as c
from capl.controllers import machine as libvirtmachine
from capl.controllers.common import layout
from capl.kube import KubeClient
from capl.runtime.informer import Cache, FuncHandler
from capl.runtime.logging import configure_logging
from capl.runtime.manager import ManagerOptions
from capl.runtime.objects import Obj, ObjectKey, copy_obj
from capl.runtime.patch import diff
from capl.runtime.resources import (
    EVENT,
    LIBVIRT_MACHINE,
    MACHINE,
    NAMESPACE,
    SECRET,
)
from capl.testbed import ControlPlane
from capl.testbed.identities import MANAGER_AUDIT_POLICY, manager_kubeconfig, refused_requests
from capl.testing.crds import CRD_DIR, capi_crd_dir, write_reduced_crds
from capl.testing.harness import TEST_DRIVER, ControllerHarness, gather_limited
from capl.testing.objects import (
    bootstrap_secret_obj,
    is_ready,
    libvirt_machine_obj,
    libvirt_machine_spec,
    machine_obj,
)
from capl.testing.toy import TOY, ensure_toy_crd, toy
from capl.virt import LibvirtHosts

SCRIPT = Path(__file__).resolve()
RESULTS = SCRIPT.parent / "results" / "machines_testdriver.json"
PROTOCOL = "BENCH-LOAD "  # prefix of the load process's protocol lines on stdout
CIDR = "10.240.0.0/20"  # DHCP range: the upper half, ~2000 addresses
LOAD_IN_FLIGHT = 32
TICK = os.sysconf("SC_CLK_TCK")


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


# -- CPU accounting (/proc) -------------------------------------------------------------------


def _cpu_of(stat_path: str) -> float:
    with open(stat_path) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def _children() -> dict[int, str]:
    found: dict[int, str] = {}
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                text = f.read()
            if int(text.rsplit(")", 1)[1].split()[1]) == me:
                found[int(entry)] = text[text.index("(") + 1 : text.rindex(")")]
        except (OSError, ValueError):
            continue
    return found


def _libvirtd_pid() -> int | None:
    for path in ("/run/libvirtd.pid", "/var/run/libvirtd.pid"):
        with contextlib.suppress(OSError, ValueError):
            return int(Path(path).read_text().strip())
    return None


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


class CpuWindow:
    """CPU seconds of this process (all threads, and its event-loop thread alone), of the
    control plane's processes, of libvirtd, and of one extra process, between start and stop."""

    def __init__(self, *, extra: int | None = None, libvirtd: bool = False) -> None:
        self.extra = extra
        self.pids = {pid: name for pid, name in _children().items() if pid != extra}
        self.libvirtd = _libvirtd_pid() if libvirtd else None
        self._start = self._sample()

    def _sample(self) -> dict[str, float]:
        sample = {
            "process": _cpu_of("/proc/self/stat"),
            "loop_thread": time.thread_time(),
        }
        for pid, name in self.pids.items():
            with contextlib.suppress(OSError):
                sample[name] = sample.get(name, 0.0) + _cpu_of(f"/proc/{pid}/stat")
        if self.libvirtd is not None:
            with contextlib.suppress(OSError):
                sample["libvirtd"] = _cpu_of(f"/proc/{self.libvirtd}/stat")
        if self.extra is not None:
            with contextlib.suppress(OSError):
                sample["load"] = _cpu_of(f"/proc/{self.extra}/stat")
        return sample

    def stop(self) -> dict[str, float]:
        end = self._sample()
        used = {k: end[k] - self._start.get(k, 0.0) for k in end}
        used["other_threads"] = used["process"] - used["loop_thread"]
        return used


# -- the load process (the "user") ------------------------------------------------------------


async def load_child(spec_path: str) -> int:
    """Create the LibvirtMachines, watch them to Ready; print one JSON line of timings."""
    configure_logging(level="warning", format="console")
    spec = json.loads(await asyncio.to_thread(Path(spec_path).read_text))
    namespace, cluster, machines = spec["namespace"], spec["cluster"], spec["machines"]
    n = len(machines)
    client = await KubeClient.connect(spec["kubeconfig"])
    cache = Cache(client, namespace=namespace)
    created: dict[str, float] = {}
    ready: dict[str, float] = {}
    all_ready = asyncio.Event()

    def observe(obj: Obj) -> None:
        name = obj["metadata"]["name"]
        if name not in ready and name in created and is_ready(obj):
            ready[name] = time.monotonic()
            if len(ready) == n:
                all_ready.set()

    cache.informer(LIBVIRT_MACHINE).add_handler(
        FuncHandler(add=observe, update=lambda _old, new: observe(new))
    )
    try:
        cache.start([LIBVIRT_MACHINE])
        await cache.wait_synced([LIBVIRT_MACHINE])
        print(PROTOCOL + "synced", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        machines_client = client.resource(LIBVIRT_MACHINE)

        async def create(machine: Obj) -> None:
            name = machine["metadata"]["name"]
            obj = libvirt_machine_obj(
                name, namespace, cluster=cluster, machine=machine, spec=libvirt_machine_spec()
            )
            created[name] = time.monotonic()
            await machines_client.create(obj)

        t0 = time.monotonic()
        await gather_limited([create(m) for m in machines], limit=LOAD_IN_FLIGHT)
        t_created = time.monotonic()
        await asyncio.wait_for(all_ready.wait(), timeout=float(spec["timeout"]))
        t_ready = time.monotonic()
    finally:
        await cache.stop()
        await client.close()
    print(
        PROTOCOL
        + json.dumps(
            {
                "t0": t0,
                "t_created": t_created,
                "t_ready": t_ready,
                "latencies": [ready[k] - created[k] for k in created],
            }
        ),
        flush=True,
    )
    return 0


# -- raw baselines ----------------------------------------------------------------------------


async def raw_toy_patches(client: KubeClient, namespace: str, n: int) -> float:
    """One status merge patch per toy object, one loop (bench/runtime_toy.py's raw figure)."""
    toys = client.resource(TOY)
    existing = {o["metadata"]["name"] for o in (await toys.list(namespace=namespace)).items}
    await gather_limited(
        [
            toys.create(toy(f"toy-{i:05d}", namespace, i))
            for i in range(n)
            if f"toy-{i:05d}" not in existing
        ]
    )
    keys = [ObjectKey(namespace, f"toy-{i:05d}") for i in range(n)]
    value = -time.time_ns()
    started = time.perf_counter()
    for key in keys:
        await toys.patch_status(key, {"status": {"observed": value}})
    return n / (time.perf_counter() - started)


def _replay_plan(
    machines: Sequence[Obj], events: Sequence[Obj], namespace: str, cluster: str
) -> list[tuple[Obj, dict[str, Any], dict[str, Any], Obj | None]]:
    """Per machine of the round: (the object as the user created it, in `namespace`; the
    manager's metadata/spec patch; its status body; its Event, re-addressed)."""
    by_object: dict[str, Obj] = {}
    for event in events:
        involved = event.get("involvedObject") or {}
        if involved.get("kind") == c.Kind.LIBVIRT_MACHINE.value:
            by_object.setdefault(str(involved.get("name")), event)
    plan = []
    for final in machines:
        name = final["metadata"]["name"]
        fresh = libvirt_machine_obj(
            name, namespace, cluster=cluster, machine=None, spec=libvirt_machine_spec()
        )
        desired = copy_obj(fresh)
        md = final["metadata"]
        desired["metadata"]["finalizers"] = list(md.get("finalizers") or [])
        desired["metadata"]["annotations"] = dict(md.get("annotations") or {})
        desired["spec"] = copy_obj(final["spec"])
        main, _ = diff(fresh, desired)
        event = by_object.get(name)
        replayed: Obj | None = None
        if event is not None:
            replayed = {
                k: v for k, v in event.items() if k not in ("metadata", "involvedObject")
            } | {
                "metadata": {"name": f"{name}.raw{time.time_ns():x}", "namespace": namespace},
                "involvedObject": {
                    "apiVersion": c.API_VERSION,
                    "kind": c.Kind.LIBVIRT_MACHINE.value,
                    "name": name,
                    "namespace": namespace,
                },
            }
        plan.append((fresh, main, {"status": final.get("status") or {}}, replayed))
    return plan


async def raw_api_writes(
    client: KubeClient,
    machines: Sequence[Obj],
    events: Sequence[Obj],
    cluster: str,
    *,
    loops: int,
    tag: str,
) -> float:
    """Machines per second when the manager's writes for `machines` are sent by `loops`
    tight loops (objects created beforehand, untimed, in a namespace of their own)."""
    namespace = f"raw-{tag}-{time.time_ns() % 10**8:x}"
    await client.resource(NAMESPACE).create({"metadata": {"name": namespace}})
    plan = _replay_plan(machines, events, namespace, cluster)
    lms = client.resource(LIBVIRT_MACHINE)
    event_client = client.resource(EVENT)
    created = await gather_limited(
        [lms.create(fresh) for fresh, _, _, _ in plan], limit=LOAD_IN_FLIGHT
    )
    work = iter(zip(created, plan, strict=True))

    async def loop() -> None:
        for obj, (_, main, status, event) in work:
            key = ObjectKey(namespace, obj["metadata"]["name"])
            await lms.patch(key, main, resource_version=obj["metadata"]["resourceVersion"])
            await lms.patch_status(key, status)
            if event is not None:
                await event_client.create(event)

    started = time.perf_counter()
    await asyncio.gather(*(loop() for _ in range(loops)))
    return len(plan) / (time.perf_counter() - started)


def libvirt_network_floor(uri: str, n: int, dns_domain: str = "bench.floor") -> float:
    """Machines per second of the network step alone: N x (DHCP host + DNS host) LIVE|CONFIG
    updates on a scratch network shaped like the cluster's, one loop, raw libvirt-python."""
    conn = libvirt.open(uri)
    name = f"capl-bench-floor-{os.getpid()}"
    flags = libvirt.VIR_NETWORK_UPDATE_AFFECT_LIVE | libvirt.VIR_NETWORK_UPDATE_AFFECT_CONFIG
    xml = (
        f"<network><name>{name}</name><domain name='{dns_domain}' localOnly='yes'/>"
        "<ip address='10.250.0.1' netmask='255.255.240.0'><dhcp>"
        "<range start='10.250.8.0' end='10.250.15.254'/></dhcp></ip></network>"
    )
    network = conn.networkDefineXML(xml)
    try:
        network.create()
        started = time.perf_counter()
        for i in range(n):
            ip = f"10.250.{8 + i // 250}.{1 + i % 250}"
            mac = f"52:54:00:fe:{i // 256:02x}:{i % 256:02x}"
            network.update(
                libvirt.VIR_NETWORK_UPDATE_COMMAND_ADD_LAST,
                libvirt.VIR_NETWORK_SECTION_IP_DHCP_HOST,
                -1,
                f"<host mac='{mac}' name='m{i}' ip='{ip}'/>",
                flags,
            )
            network.update(
                libvirt.VIR_NETWORK_UPDATE_COMMAND_ADD_LAST,
                libvirt.VIR_NETWORK_SECTION_DNS_HOST,
                -1,
                f"<host ip='{ip}'><hostname>m{i}.{dns_domain}</hostname></host>",
                flags,
            )
        return n / (time.perf_counter() - started)
    finally:
        with contextlib.suppress(libvirt.libvirtError):
            network.destroy()
        with contextlib.suppress(libvirt.libvirtError):
            network.undefine()
        conn.close()


# -- one round --------------------------------------------------------------------------------


async def _spawn_load(spec: Mapping[str, Any], workdir: Path) -> asyncio.subprocess.Process:
    path = workdir / "load.json"
    path.write_text(json.dumps(spec))
    return await asyncio.create_subprocess_exec(
        sys.executable,
        str(SCRIPT),
        "--load-child",
        str(path),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )


async def _protocol_line(load: asyncio.subprocess.Process) -> str:
    assert load.stdout is not None
    while True:
        raw = await load.stdout.readline()
        if not raw:
            raise RuntimeError(f"load process ended with {await load.wait()}")
        text = raw.decode(errors="replace").rstrip("\n")
        if text.startswith(PROTOCOL):
            return text[len(PROTOCOL) :]
        sys.stderr.write(f"load: {text}\n")


async def run_round(
    plane: ControlPlane, *, n: int, concurrency: int, uri: str, index: int, workdir: Path
) -> dict[str, Any]:
    namespace = f"bench-{index}"
    manager_config = await manager_kubeconfig(plane)  # as deployed: config/rbac's roles
    client = await KubeClient.connect(str(manager_config), track_objects=True)
    api = await KubeClient.connect(str(plane.kubeconfig))
    hosts = LibvirtHosts()
    holder = libvirt.open(uri)  # keeps a libvirtd-hosted test driver's state alive
    harness = ControllerHarness(
        client=client,
        api=api,
        hosts=hosts,
        namespace=namespace,
        options=ManagerOptions(
            namespace=namespace,
            metrics_bind_address="0",
            health_probe_bind_address="0",
            handle_signals=False,
            concurrency=concurrency,
        ),
    )
    load: asyncio.subprocess.Process | None = None
    try:
        await api.resource(NAMESPACE).create({"metadata": {"name": namespace}})
        cluster = await harness.make_cluster(
            f"bench{index}", cidr=CIDR, hosts=[{"name": "h1", "uri": uri}]
        )
        dns_domain = layout(cluster.layout_model()).dns_domain
        await gather_limited(
            [
                harness.create(
                    SECRET,
                    bootstrap_secret_obj(
                        f"m{i:04d}-bootstrap",
                        namespace,
                        data=b"#cloud-config\n",
                        cluster=cluster.name,
                    ),
                )
                for i in range(n)
            ],
            limit=LOAD_IN_FLIGHT,
        )
        machines = await gather_limited(
            [
                harness.create(
                    MACHINE,
                    machine_obj(
                        f"m{i:04d}",
                        namespace,
                        cluster=cluster.name,
                        infra_name=f"m{i:04d}",
                        bootstrap_secret=f"m{i:04d}-bootstrap",
                    ),
                )
                for i in range(n)
            ],
            limit=LOAD_IN_FLIGHT,
        )
        await harness.start(libvirtmachine.setup)
        load = await _spawn_load(
            {
                "kubeconfig": str(plane.kubeconfig),
                "namespace": namespace,
                "cluster": cluster.name,
                "machines": machines,
                "timeout": 1800,
            },
            workdir,
        )
        line = await _protocol_line(load)
        if line != "synced":
            raise RuntimeError(f"load process: {line!r}")
        hosts.calls.reset()
        client.stats.reset()
        controller = harness.controller(libvirtmachine.CONTROLLER_NAME)
        reconciles_before = controller.reconciles
        window = CpuWindow(extra=load.pid, libvirtd=not uri.startswith("test:///"))
        assert load.stdin is not None
        load.stdin.write(b"go\n")
        await load.stdin.drain()
        line = await _protocol_line(load)
        cpu = window.stop()
        rss = _rss_mb()
        timings = json.loads(line)
        await load.wait()
        await harness.manager.recorder.flush()
        seconds = timings["t_ready"] - timings["t0"]
        latencies = timings["latencies"]
        stats = client.stats
        lm_counts = stats.object_counts(resource=LIBVIRT_MACHINE)
        lm_patches = sum(n_ for r, n_ in lm_counts.items() if r.method == "PATCH")
        lm_status = sum(
            n_ for r, n_ in lm_counts.items() if r.method == "PATCH" and r.subresource == "status"
        )
        per_method: dict[str, int] = {}
        for methods in hosts.calls.snapshot().values():
            for method, count in methods.items():
                per_method[method] = per_method.get(method, 0) + count
        domains = await harness.host(uri).list_domains(cluster=cluster.name)
        result: dict[str, Any] = {
            "machines": n,
            "seconds_create_phase": timings["t_created"] - timings["t0"],
            "seconds_to_all_ready": seconds,
            "machines_per_s": n / seconds,
            "create_to_ready_p50_s": percentile(latencies, 0.5),
            "create_to_ready_p99_s": percentile(latencies, 0.99),
            "create_to_ready_max_s": max(latencies),
            "api_writes_per_machine": lm_patches / n,
            "api_status_writes_per_machine": lm_status / n,
            "api_spec_writes_per_machine": (lm_patches - lm_status) / n,
            "events_per_machine": stats.total(method="POST") / n,
            "all_api_writes_per_machine": stats.writes_total() / n,
            "api_requests_total": stats.total(),
            "events_dropped": harness.manager.recorder.dropped,
            "libvirt_calls_per_machine": hosts.calls.total() / n,
            "libvirt_calls_by_method_per_machine": {
                k: round(v / n, 2) for k, v in sorted(per_method.items(), key=lambda kv: -kv[1])
            },
            "reconciles_per_machine": (controller.reconciles - reconciles_before) / n,
            "reconcile_failures": controller.failures,
            "domains_running": sum(1 for d in domains if d.state.value == "running"),
            "manager_rss_mb": rss,
            "cpu_seconds_per_machine": {k: v / n for k, v in sorted(cpu.items())},
            "cpu_cores_busy": {k: v / seconds for k, v in sorted(cpu.items())},
        }
        await harness.stop()
        listing = await api.resource(LIBVIRT_MACHINE).list(namespace=namespace)
        events = (await api.resource(EVENT).list(namespace=namespace)).items
        finals = listing.items
        raw_window = CpuWindow()
        result["raw_api_machines_per_s_sequential"] = await raw_api_writes(
            api, finals, events, cluster.name, loops=1, tag=f"{index}s"
        )
        raw_cpu = raw_window.stop()  # includes creating the raw objects (untimed)
        result["raw_api_machines_per_s_concurrent"] = await raw_api_writes(
            api, finals, events, cluster.name, loops=concurrency, tag=f"{index}c"
        )
        result["raw_toy_patches_per_s"] = await raw_toy_patches(api, "bench-toys", n)
        result["raw_api_cpu_seconds_per_machine"] = {
            k: v / n for k, v in sorted(raw_cpu.items()) if k in ("kube-apiserver", "etcd")
        }
        result["dns_domain"] = dns_domain
        return result
    finally:
        if load is not None and load.returncode is None:
            load.kill()
            await load.wait()
        await harness.close()
        await hosts.close()
        holder.close()
        for kube in (client, api):
            await kube.close()


def _ratios(r: Mapping[str, Any]) -> dict[str, float]:
    rate = float(r["machines_per_s"])
    ratios = {
        "ratio_to_apiserver": rate / r["raw_api_machines_per_s_sequential"],
        "ratio_to_apiserver_concurrent": rate / r["raw_api_machines_per_s_concurrent"],
        "ratio_to_toy_patches": rate * r["all_api_writes_per_machine"] / r["raw_toy_patches_per_s"],
    }
    if r.get("libvirt_network_machines_per_s"):
        ratios["ratio_to_libvirt_network"] = rate / r["libvirt_network_machines_per_s"]
    return ratios


def _median(rounds: Sequence[Mapping[str, Any]], key: str) -> Any:
    values = [r[key] for r in rounds if key in r]
    if not values:
        return None
    if isinstance(values[0], int | float):
        return statistics.median(values)
    return values[len(values) // 2]


async def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--machines", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=10, help="manager workers (10)")
    parser.add_argument("--uri", default=TEST_DRIVER, help="the host (a test driver URI)")
    parser.add_argument("--no-libvirt-baseline", action="store_true")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--load-child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.load_child:
        return await load_child(args.load_child)
    configure_logging(level="warning", format="console")
    n = args.machines
    rounds: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        # the manager runs as deployed (config/rbac's roles); its refusals are in this log
        audit = Path(tmp) / "audit.log"
        async with ControlPlane(audit_log=audit, audit_policy=MANAGER_AUDIT_POLICY) as plane:
            await plane.install_crds(CRD_DIR)
            write_reduced_crds(capi_crd_dir(), Path(tmp))
            await plane.install_crds(Path(tmp))
            admin = await KubeClient.connect(str(plane.kubeconfig))
            try:
                await ensure_toy_crd(admin)
                await admin.resource(NAMESPACE).create({"metadata": {"name": "bench-toys"}})
                await raw_toy_patches(admin, "bench-toys", n)  # warm-up
            finally:
                await admin.close()
            for index in range(args.rounds):
                floor = None
                if not args.no_libvirt_baseline:
                    floor = await asyncio.to_thread(libvirt_network_floor, args.uri, n)
                result = await run_round(
                    plane,
                    n=n,
                    concurrency=args.concurrency,
                    uri=args.uri,
                    index=index,
                    workdir=Path(tmp),
                )
                if floor is not None:
                    result["libvirt_network_machines_per_s"] = floor
                result.update(_ratios(result))
                rounds.append(result)
                print(_line(index + 1, result), flush=True)
        refused = refused_requests()
        if refused:
            raise RuntimeError("the manager's role refused:\n" + "\n".join(refused))
    keys = [k for k in rounds[0] if isinstance(rounds[0][k], int | float)]
    summary: dict[str, Any] = {
        "benchmark": "machines_testdriver",
        "machines": n,
        "rounds": args.rounds,
        "concurrency": args.concurrency,
        "uri": args.uri,
        **{k: _round(_median(rounds, k)) for k in keys if k != "machines"},
        "libvirt_calls_by_method_per_machine": rounds[-1]["libvirt_calls_by_method_per_machine"],
        **{
            field: {
                k: _round(statistics.median(r[field][k] for r in rounds)) for k in rounds[0][field]
            }
            for field in ("cpu_seconds_per_machine", "raw_api_cpu_seconds_per_machine")
        },
        "per_round": rounds,
        "definitions": _definitions(),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "libvirt": _libvirt_version(),
            "loadavg_at_end": os.getloadavg(),
        },
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=2) + "\n")
    print(f"median of {args.rounds}: " + _line(0, summary))
    print(f"wrote {args.out}")
    return 0


def _round(value: Any) -> Any:
    return round(value, 4) if isinstance(value, float) else value


def _line(index: int, r: Mapping[str, Any]) -> str:
    head = f"round {index}: " if index else ""
    libvirt_part = ""
    if r.get("libvirt_network_machines_per_s"):
        libvirt_part = (
            f"; libvirt network floor {r['libvirt_network_machines_per_s']:.0f}/s "
            f"(ratio {r['ratio_to_libvirt_network']:.2f})"
        )
    return (
        f"{head}{r['machines']} machines Ready in {r['seconds_to_all_ready']:.1f} s: "
        f"{r['machines_per_s']:.1f} machines/s; p50 {r['create_to_ready_p50_s']:.2f} s, "
        f"p99 {r['create_to_ready_p99_s']:.2f} s; {r['api_writes_per_machine']:.2f} patches + "
        f"{r['events_per_machine']:.2f} events/machine; "
        f"{r['libvirt_calls_per_machine']:.1f} libvirt calls/machine; raw API (same writes) "
        f"{r['raw_api_machines_per_s_sequential']:.0f} machines/s one loop, "
        f"{r['raw_api_machines_per_s_concurrent']:.0f} concurrent: ratio "
        f"{r['ratio_to_apiserver']:.2f} (concurrent {r['ratio_to_apiserver_concurrent']:.2f}, "
        f"toy patches {r['ratio_to_toy_patches']:.2f}){libvirt_part}"
    )


def _libvirt_version() -> str:
    major, rest = divmod(libvirt.getVersion(), 1_000_000)
    return f"{major}.{rest // 1000}.{rest % 1000}"


def _definitions() -> dict[str, str]:
    doc = __doc__ or ""
    start = doc.index("Figures")
    return {"figures": doc[start : doc.index("Writes bench/")].strip()}


if __name__ == "__main__":
    threading.current_thread().name = "bench-main"
    sys.exit(asyncio.run(main(sys.argv[1:])))
