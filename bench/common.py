"""What the process benchmarks (scaleout, steady, scaling_curve) share.

They measure the product as it runs: the `capl manager` command as a separate process
(`capl.testbed.caplmanager.CaplManager`, the same entry point e2e and chaos tests use),
against a kube-apiserver + etcd of their own (`capl.testbed.ControlPlane`) and the libvirt
test driver hosted by libvirtd (`test+unix:///default`, one fake hypervisor shared by the
manager and the benchmark, kept alive by a connection this process holds). Nothing is faked.
Objects and CRDs come from `capl.testing`, as for the tests; bench/ imports nothing from
tests/ (an import-linter contract).

- `Bed` (async context manager): the control plane with the project's CRDs and the Cluster
  API Cluster/Machine CRDs (reduced to v1beta2 as for tests/controllers), an audit log of
  exactly two users — the manager (`MANAGER_USER`, the manager identity of
  `capl.testbed.identities`: bound to exactly config/rbac's ClusterRole, as deployed) and the
  raw-rate writer (`RAW_USER`, in group system:masters), both with client certificates of
  their own — so both sides of a comparison pay the same audit cost, while the benchmark's
  own bulk creates and watches are not logged. A request of the manager refused by its role
  fails the benchmark (`Bed` checks the audit log on exit).
- `Bed.raw_replay(cluster)`: the limit — the same API writes the manager made for the
  cluster's machines, replayed without capl by one tight loop and by `concurrency` loops
  (bench/machines_testdriver.py's `raw_api_writes`), as the raw user, on the same server.
- `Bed.start_manager(namespace)`: a `capl manager` process restricted to one namespace
  (`--namespace`), webhooks off, JSON log at info level.
- `Bed.cluster(namespace)`: Cluster + LibvirtCluster on the test driver; the manager's
  LibvirtCluster controller creates the network (a free /21: room for 2,000 DHCP
  reservations) and pool; then the base volume is put into the pool directly and the
  Cluster is marked provisioned (standing in for Cluster API core, which does not run here).
- `Bed.machines(...)`: N bootstrap Secrets and Machines up front (not timed), then N
  LibvirtMachines created as fast as the API server takes them while an informer of this
  process (`ReadyWatch`) records each one's creation and Ready times.
- `Bed.sweep(cluster)`: removes the cluster's domains, volumes, pool and network from the
  test driver directly (the API objects go with the control plane at the end).
- `ProcStat` (CPU seconds and RSS of a pid from /proc), `AuditWindow` (the manager's requests
  by verb and resource between two audit-log offsets), `parse_metrics` (Prometheus text).
- `write_result(name, data)`: bench/results/<name>.json with the machine's description.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import os
import platform
import re
import secrets
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import libvirt

from bench.machines_testdriver import raw_api_writes
from capl.kube import KubeClient
from capl.runtime.informer import Cache, FuncHandler
from capl.runtime.objects import Obj, ObjectKey
from capl.runtime.resources import (
    CLUSTER,
    EVENT,
    LIBVIRT_CLUSTER,
    LIBVIRT_MACHINE,
    MACHINE,
    SECRET,
)
from capl.runtime.resources import NAMESPACE as NAMESPACES
from capl.testbed import AssetsMissing, ControlPlane, find_assets, identities
from capl.testbed.capibuild import CapiMissing
from capl.testbed.caplmanager import CaplManager
from capl.testing.crds import CRD_DIR, capi_crd_dir, write_reduced_crds
from capl.testing.harness import gather_limited
from capl.testing.objects import (
    BASE_VOLUME,
    bootstrap_secret_obj,
    cluster_obj,
    is_ready,
    libvirt_cluster_obj,
    libvirt_machine_obj,
    libvirt_machine_spec,
    machine_obj,
)

RESULTS = Path(__file__).resolve().parent / "results"
TEST_DRIVER = "test+unix:///default"
MANAGER_USER = identities.MANAGER_USER
RAW_USER = "capl-bench-raw"
CLK_TCK = os.sysconf("SC_CLK_TCK")
WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})
BASE_CAPACITY = 1024**3


def _quiet(_ctx: object, _err: object) -> None:
    """libvirt prints every error to stderr by default; the exceptions say enough."""


libvirt.registerErrorHandler(_quiet, None)


def note(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..1) of a non-empty sequence."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


LOAD_AT_START = [round(x, 2) for x in os.getloadavg()]
"""The machine's load when this benchmark process started (before its own load, not before
the benchmarks run before it by the same `make bench`)."""


def run_load() -> list[float] | None:
    """The load when the whole run (`make bench`...) started, before its own work: what
    says whether other work shared the machine (set by hack/bench*.sh)."""
    text = os.environ.get("CAPL_BENCH_RUN_LOADAVG", "")
    try:
        return [float(x) for x in text.split()] or None
    except ValueError:
        return None


def machine_description() -> dict[str, Any]:
    load = os.getloadavg()
    return {
        "loadavg_at_start": LOAD_AT_START,
        "loadavg_at_run_start": run_load(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "libvirt": _libvirt_version(),
        "kernel": platform.release(),
        "loadavg_at_end": [round(x, 2) for x in load],
    }


def _libvirt_version() -> str:
    v = libvirt.getVersion()
    return f"{v // 1_000_000}.{v // 1000 % 1000}.{v % 1000}"


def write_result(name: str, data: Mapping[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    body = {
        "benchmark": name,
        **data,
        "machine": machine_description(),
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    path.write_text(json.dumps(body, indent=2) + "\n")
    note(f"wrote {path}")
    return path


def require_parts() -> None:
    """Exit with a one-line hint when a part of the test bed is missing."""
    try:
        find_assets()
    except AssetsMissing as e:
        raise SystemExit(f"bench: {e}") from None
    try:
        capi_crd_dir()
    except CapiMissing as e:
        raise SystemExit(f"bench: {e}") from None
    try:
        libvirt.open(TEST_DRIVER).close()
    except libvirt.libvirtError as e:
        raise SystemExit(
            f"bench: libvirtd's test driver {TEST_DRIVER} is not reachable "
            f"({e.get_error_message()}): run `make libvirt-host`"
        ) from None


# --- /proc ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProcStat:
    """CPU time and memory of one process at one moment."""

    at: float
    cpu_seconds: float
    rss_bytes: int
    peak_rss_bytes: int

    @classmethod
    def read(cls, pid: int) -> ProcStat:
        stat = Path(f"/proc/{pid}/stat").read_text()
        fields = stat.rsplit(")", 1)[1].split()
        ticks = int(fields[11]) + int(fields[12])  # utime + stime (fields 14, 15 of stat(5))
        status = Path(f"/proc/{pid}/status").read_text()
        return cls(
            at=time.monotonic(),
            cpu_seconds=ticks / CLK_TCK,
            rss_bytes=_status_kib(status, "VmRSS") * 1024,
            peak_rss_bytes=_status_kib(status, "VmHWM") * 1024,
        )


def libvirtd_pid() -> int | None:
    """The system libvirtd (hack/libvirt-host.sh starts it with this pid file)."""
    for path in ("/run/libvirtd.pid", "/var/run/libvirtd.pid"):
        with contextlib.suppress(OSError, ValueError):
            return int(Path(path).read_text().strip())
    return None


def cpu_seconds_of(pids: Mapping[str, int | None]) -> dict[str, float]:
    """CPU seconds so far of each named process (absent ones are left out)."""
    out: dict[str, float] = {}
    for name, pid in pids.items():
        if pid is not None:
            with contextlib.suppress(OSError, ValueError, IndexError):
                out[name] = ProcStat.read(pid).cpu_seconds
    return out


def _status_kib(status: str, key: str) -> int:
    match = re.search(rf"^{key}:\s+(\d+) kB", status, re.MULTILINE)
    return int(match.group(1)) if match else 0


def cpu_percent(before: ProcStat, after: ProcStat) -> float:
    """CPU used between two samples, in percent of one core."""
    return 100.0 * (after.cpu_seconds - before.cpu_seconds) / max(1e-9, after.at - before.at)


# --- the manager's view: audit log and metrics -----------------------------------------------


@dataclass
class AuditWindow:
    """Requests of one user between two audit-log offsets, counted once per request."""

    verbs: Counter[str] = field(default_factory=Counter)
    by_resource: Counter[tuple[str, str]] = field(default_factory=Counter)
    """(verb, resource[/subresource]) -> requests."""
    codes: Counter[int] = field(default_factory=Counter)

    @classmethod
    def read(cls, path: Path, *, user: str, start: int, end: int | None = None) -> AuditWindow:
        """The requests of `user` logged between byte offsets `start` and `end` (default:
        the end of the complete lines). An offset taken while the API server was writing a
        line may fall inside it: a line belongs to the window that holds its newline, so
        consecutive windows share no line and lose none."""
        back = min(start, 64 * 1024)
        with path.open("rb") as f:
            f.seek(start - back)
            data = f.read() if end is None else f.read(max(0, end - start) + back)
        head = data[:back]
        data = data[head.rfind(b"\n") + 1 :]  # from the start of the line that holds `start`
        data = data[: data.rfind(b"\n") + 1]
        window = cls()
        seen: set[str] = set()
        for line in data.splitlines():
            if not line.strip():
                continue
            event = json.loads(line)
            if (event.get("user") or {}).get("username") != user:
                continue
            audit_id = str(event.get("auditID"))
            if audit_id in seen:  # a watch logs ResponseStarted and ResponseComplete
                continue
            seen.add(audit_id)
            ref = event.get("objectRef") or {}
            resource = ref.get("resource", "?") + (
                f"/{ref['subresource']}" if ref.get("subresource") else ""
            )
            verb = str(event.get("verb"))
            window.verbs[verb] += 1
            window.by_resource[(verb, resource)] += 1
            code = (event.get("responseStatus") or {}).get("code")
            if code is not None:
                window.codes[int(code)] += 1
        return window

    @property
    def writes(self) -> int:
        return sum(n for verb, n in self.verbs.items() if verb in WRITE_VERBS)

    def writes_to(self, resource: str) -> int:
        return sum(
            n
            for (verb, res), n in self.by_resource.items()
            if verb in WRITE_VERBS and res == resource
        )

    def summary(self) -> dict[str, Any]:
        return {
            "by_verb": dict(sorted(self.verbs.items())),
            "by_verb_and_resource": {
                f"{verb} {res}": n for (verb, res), n in sorted(self.by_resource.items())
            },
            "by_code": {str(k): v for k, v in sorted(self.codes.items())},
        }


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Prometheus text exposition -> {(name, sorted labels): value}."""
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line.strip())
        if match is None:
            continue
        labels = tuple(sorted(_LABEL.findall(match.group(2) or "")))
        with contextlib.suppress(ValueError):
            samples[(match.group(1), labels)] = float(match.group(3))
    return samples


def metric_sum(
    samples: Mapping[tuple[str, tuple[tuple[str, str], ...]], float],
    name: str,
    **labels: str,
) -> float:
    """Sum of the samples called `name` whose labels include `labels`."""
    return sum(
        value
        for (metric, have), value in samples.items()
        if metric == name and all((k, v) in have for k, v in labels.items())
    )


# --- machines and their readiness ------------------------------------------------------------


class ReadyWatch:
    """Creation and Ready times of LibvirtMachines in one namespace, from a watch."""

    def __init__(self, client: KubeClient, namespace: str) -> None:
        self.cache = Cache(client, namespace=namespace)
        self.created: dict[str, float] = {}
        self.ready: dict[str, float] = {}
        self.expected = 0
        self.all_ready = asyncio.Event()
        informer = self.cache.informer(LIBVIRT_MACHINE)
        informer.add_handler(
            FuncHandler(add=self._observe, update=lambda _o, new: self._observe(new))
        )

    def _observe(self, obj: Obj) -> None:
        name = obj["metadata"]["name"]
        if name not in self.ready and is_ready(obj):
            self.ready[name] = time.perf_counter()
            if self.expected and len(self.ready) >= self.expected:
                self.all_ready.set()

    async def start(self) -> None:
        self.cache.start([LIBVIRT_MACHINE])
        await self.cache.wait_synced([LIBVIRT_MACHINE])

    async def stop(self) -> None:
        await self.cache.stop()


@dataclass
class BenchCluster:
    namespace: str
    name: str
    network: str
    pool: str


@dataclass
class ScaleOut:
    """What `Bed.machines` measured."""

    n: int
    first_create: float
    last_create: float
    last_ready: float
    latencies: list[float]

    @property
    def seconds(self) -> float:
        return self.last_ready - self.first_create

    @property
    def machines_per_s(self) -> float:
        return self.n / self.seconds


def machine_names(n: int, prefix: str = "m") -> list[str]:
    """The names `Bed.machines` gives N machines."""
    width = max(4, len(str(n - 1)))
    return [f"{prefix}{i:0{width}d}" for i in range(n)]


_HANDED_OUT: list[ipaddress.IPv4Network] = []


def free_cidr(prefix: int = 21) -> str:
    """A random 10.x.y.0/`prefix`: the test driver's networks are fake, but keep clear of
    what is configured on this machine anyway, and give each cluster of a run its own."""
    out = subprocess.run(
        ["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True, check=False
    ).stdout
    used = []
    for line in out.splitlines():
        parts = line.split()
        if "inet" in parts:
            with contextlib.suppress(ValueError):
                used.append(ipaddress.IPv4Interface(parts[parts.index("inet") + 1]).network)
    for _ in range(2000):
        net = ipaddress.IPv4Network(
            f"10.{secrets.randbelow(60) + 190}.{secrets.randbelow(32) * 8}.0/{prefix}",
            strict=False,
        )
        if not any(net.overlaps(u) for u in used + _HANDED_OUT):
            _HANDED_OUT.append(net)
            return str(net)
    raise RuntimeError("no free 10.x.y.0/21 network")


class Bed:
    """See the module docstring."""

    def __init__(self, *, workdir: Path) -> None:
        self.workdir = workdir
        self.audit_log = workdir / "audit.log"
        self.plane = ControlPlane(
            audit_log=self.audit_log,
            audit_policy={
                "apiVersion": "audit.k8s.io/v1",
                "kind": "Policy",
                "omitStages": ["RequestReceived"],
                "rules": [
                    {"level": "Metadata", "users": [MANAGER_USER, RAW_USER]},
                    {"level": "None"},
                ],
            },
        )
        self._admin: KubeClient | None = None
        self._holder: libvirt.virConnect | None = None
        self.managers: list[CaplManager] = []

    async def __aenter__(self) -> Bed:
        self._holder = libvirt.open(TEST_DRIVER)  # keeps the test driver's state alive
        await self.plane.start()
        await self.plane.install_crds(CRD_DIR)
        with tempfile.TemporaryDirectory() as tmp:
            write_reduced_crds(capi_crd_dir(), Path(tmp))
            await self.plane.install_crds(Path(tmp))
        self._admin = await KubeClient.connect(str(self.plane.kubeconfig))
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            for manager in reversed(self.managers):
                await manager.stop()
            if self._admin is not None:
                await self._admin.close()
            await self.plane.stop()
        finally:
            if self._holder is not None:
                self._holder.close()
        refused = identities.refused_requests()
        if refused and exc is None:
            raise RuntimeError("the manager's role refused:\n" + "\n".join(refused))

    @property
    def admin(self) -> KubeClient:
        assert self._admin is not None
        return self._admin

    def processes(self, manager: CaplManager) -> dict[str, int | None]:
        """The processes whose CPU a scale-out is spread over (libvirtd is shared with
        whatever else uses the machine's libvirtd meanwhile)."""
        api, etcd = self.plane.apiserver_process, self.plane.etcd_process
        return {
            "manager": manager.pid,
            "kube-apiserver": api.pid if api is not None else None,
            "etcd": etcd.pid if etcd is not None else None,
            "libvirtd": libvirtd_pid(),
            "benchmark (load and watch)": os.getpid(),
        }

    async def namespace(self, prefix: str) -> str:
        name = f"{prefix}-{secrets.token_hex(3)}"
        await self.admin.resource(NAMESPACES).create({"metadata": {"name": name}})
        return name

    # -- the limit --------------------------------------------------------------------------

    async def raw_replay(self, cluster: BenchCluster, *, concurrency: int) -> dict[str, float]:
        """The API server's raw rate for exactly the manager's writes: for every machine of
        `cluster` (all Ready), a fresh LibvirtMachine is created untimed in a namespace of its
        own, then the manager's writes for that machine are replayed — its metadata/spec merge
        patch with the resourceVersion precondition, its status patch, its Event — by one
        tight loop, and by `concurrency` loops (bench/machines_testdriver.py's
        `raw_api_writes`), as the raw user (audited like the manager). Machines per second."""
        ns = cluster.namespace
        machines = (await self.admin.resource(LIBVIRT_MACHINE).list(namespace=ns)).items
        events = (await self.admin.resource(EVENT).list(namespace=ns)).items
        kubeconfig = self.plane.add_user(RAW_USER, groups=["system:masters"])
        client = await KubeClient.connect(str(kubeconfig))
        try:
            sequential = await raw_api_writes(
                client, machines, events, cluster.name, loops=1, tag="seq"
            )
            concurrent = await raw_api_writes(
                client, machines, events, cluster.name, loops=concurrency, tag="conc"
            )
        finally:
            await client.close()
        return {"sequential": sequential, "concurrent": concurrent}

    # -- the manager --------------------------------------------------------------------------

    async def start_manager(
        self,
        namespace: str,
        *,
        concurrency: int = 10,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> CaplManager:
        kubeconfig = await identities.manager_kubeconfig(self.plane)
        manager = CaplManager(
            plane=self.plane,
            workdir=self.workdir / f"manager-{namespace}",
            name=f"capl-{namespace}",
            kubeconfig=kubeconfig,
            webhooks=False,
            namespace=namespace,
            log_level="info",
            extra_args=[f"--concurrency={concurrency}", *extra_args],
            ready_timeout=120,
            env=env,
        )
        self.managers.append(manager)
        await manager.start()
        return manager

    # -- objects ----------------------------------------------------------------------------

    async def cluster(self, namespace: str, name: str = "bench") -> BenchCluster:
        api = self.admin
        cluster = await api.resource(CLUSTER).create(
            cluster_obj(name, namespace, libvirt_cluster=name)
        )
        await api.resource(LIBVIRT_CLUSTER).create(
            libvirt_cluster_obj(
                name,
                namespace,
                cluster=cluster,
                hosts=[{"name": "h1", "uri": TEST_DRIVER}],
                cidr=free_cidr(),
                mode="isolated",
            )
        )
        key = ObjectKey(namespace, name)
        deadline = time.monotonic() + 120
        while True:
            lc = await api.resource(LIBVIRT_CLUSTER).get(key)
            if ((lc.get("status") or {}).get("initialization") or {}).get("provisioned"):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"LibvirtCluster not provisioned: {lc.get('status')}")
            await asyncio.sleep(0.2)
        pool = lc["spec"]["storagePool"]["name"]
        await asyncio.to_thread(_put_base_volume, pool)
        await api.resource(CLUSTER).patch_status(
            key, {"status": {"initialization": {"infrastructureProvisioned": True}}}
        )
        return BenchCluster(
            namespace=namespace, name=name, network=lc["spec"]["network"]["name"], pool=pool
        )

    async def machines(
        self,
        clusters: BenchCluster | Sequence[BenchCluster],
        n: int,
        *,
        prefix: str = "m",
        within: float = 900,
    ) -> ScaleOut:
        """N Secrets + Machines (untimed), then N LibvirtMachines at once, until all Ready;
        with several clusters (of one namespace), machine i belongs to cluster i * k // N."""
        if isinstance(clusters, BenchCluster):
            clusters = [clusters]
        cluster = clusters[0]
        ns, api = cluster.namespace, self.admin
        names = machine_names(n, prefix)
        owner = {name: clusters[i * len(clusters) // n].name for i, name in enumerate(names)}
        await gather_limited(
            [
                api.resource(SECRET).create(
                    bootstrap_secret_obj(
                        f"{name}-bootstrap", ns, data=b"#cloud-config\n", cluster=owner[name]
                    )
                )
                for name in names
            ],
            limit=32,
        )
        machines = await gather_limited(
            [
                api.resource(MACHINE).create(
                    machine_obj(
                        name,
                        ns,
                        cluster=owner[name],
                        infra_name=name,
                        bootstrap_secret=f"{name}-bootstrap",
                    )
                )
                for name in names
            ],
            limit=32,
        )
        watch_client = await KubeClient.connect(str(self.plane.kubeconfig))
        watch = ReadyWatch(watch_client, ns)
        watch.expected = n
        spec = libvirt_machine_spec()
        try:
            await watch.start()

            async def create(machine: Obj) -> None:
                name = machine["metadata"]["name"]
                watch.created[name] = time.perf_counter()
                await api.resource(LIBVIRT_MACHINE).create(
                    libvirt_machine_obj(name, ns, cluster=owner[name], machine=machine, spec=spec)
                )

            first = time.perf_counter()
            await gather_limited([create(m) for m in machines], limit=32)
            last_create = time.perf_counter()
            note(f"{n} LibvirtMachines created in {last_create - first:.1f} s")
            await self._wait_ready(watch, cluster, within=within)
            last_ready = max(watch.ready.values())
        finally:
            await watch.stop()
            await watch_client.close()
        return ScaleOut(
            n=n,
            first_create=first,
            last_create=last_create,
            last_ready=last_ready,
            latencies=[watch.ready[k] - watch.created[k] for k in names],
        )

    async def _wait_ready(self, watch: ReadyWatch, cluster: BenchCluster, *, within: float) -> None:
        """Until every machine is Ready; fails early when the test driver lost its state (a
        libvirtd restart by someone else on a shared machine drops it) or nothing progresses."""
        deadline = time.monotonic() + within
        progress, progress_at = -1, time.monotonic()
        while not watch.all_ready.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(watch.all_ready.wait(), timeout=5)
            if watch.all_ready.is_set():
                return
            now = time.monotonic()
            if len(watch.ready) != progress:
                progress, progress_at = len(watch.ready), now
            if not await asyncio.to_thread(_pool_exists, cluster.pool):
                raise RuntimeError(
                    f"the test driver lost pool {cluster.pool} ({len(watch.ready)}/"
                    f"{watch.expected} Ready): was libvirtd restarted meanwhile?"
                )
            if now > deadline or now - progress_at > 180:
                raise RuntimeError(
                    f"{len(watch.ready)}/{watch.expected} machines Ready; no progress for "
                    f"{now - progress_at:.0f} s"
                )

    async def sweep(self, cluster: BenchCluster) -> int:
        return await asyncio.to_thread(_sweep, cluster)


def _put_base_volume(pool: str) -> None:
    conn = libvirt.open(TEST_DRIVER)
    try:
        handle = conn.storagePoolLookupByName(pool)
        with contextlib.suppress(libvirt.libvirtError):
            handle.storageVolLookupByName(BASE_VOLUME)
            return
        handle.createXML(
            f"<volume><name>{BASE_VOLUME}</name><capacity>{BASE_CAPACITY}</capacity>"
            "<target><format type='qcow2'/></target></volume>",
            0,
        )
    finally:
        conn.close()


def _pool_exists(pool: str) -> bool:
    try:
        conn = libvirt.open(TEST_DRIVER)
    except libvirt.libvirtError:
        return False
    try:
        conn.storagePoolLookupByName(pool)
        return True
    except libvirt.libvirtError:
        return False
    finally:
        conn.close()


def _sweep(cluster: BenchCluster) -> int:
    """Remove the cluster's domains (by name prefix), its pool with volumes and its network
    from the test driver; returns the number of domains removed."""
    conn = libvirt.open(TEST_DRIVER)
    removed = 0
    try:
        prefix = f"capl-{cluster.namespace}-"
        for dom in conn.listAllDomains(0):
            with contextlib.suppress(libvirt.libvirtError):
                if not dom.name().startswith(prefix):
                    continue
                if dom.isActive():
                    dom.destroy()
                dom.undefine()
                removed += 1
        with contextlib.suppress(libvirt.libvirtError):
            pool = conn.storagePoolLookupByName(cluster.pool)
            for vol in pool.listAllVolumes(0):
                with contextlib.suppress(libvirt.libvirtError):
                    vol.delete(0)
            for step in (pool.destroy, pool.undefine):
                with contextlib.suppress(libvirt.libvirtError):
                    step()
        with contextlib.suppress(libvirt.libvirtError):
            net = conn.networkLookupByName(cluster.network)
            for step in (net.destroy, net.undefine):
                with contextlib.suppress(libvirt.libvirtError):
                    step()
    finally:
        conn.close()
    return removed
