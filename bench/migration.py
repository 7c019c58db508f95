"""Benchmark: live migration of a running TCG guest between two real hosts with storage copy,
through capl (a LibvirtMachineMigration) against the same move done by hand with virsh.

Needs root and the multi-host bed (`capl.testbed.multihost`, ``make multihost-bed``): kvm1 and
kvm2 over ``qemu+tls://``, each with its own storage (the disks are copied), on one LAN.
With --start-bed a bed is started when there is none, and stopped at the end only if this
run started it and no one else uses it by then (bench/migration_bed.py: how the bed is shared
with other sessions; an unhealthy bed someone uses is waited for, never repaired). Wrap the
run in ``flock /tmp/capl-multihost.lock`` (hack/bench.sh does). Also needs
$KUBEBUILDER_ASSETS, $CAPL_CAPI_DIR and $CAPL_GUEST_IMAGE.

Set-up (untimed): a control plane of its own, a `capl manager` process (all controllers,
webhooks off, restricted to the run's namespace), a bridge-mode LibvirtCluster on kvm1 and
kvm2 (bench/migration_capl.py), the base image of the test image put on both hosts (capl
would import it on the first move otherwise; the hand-made side needs it there anyway), then
two guests booted on kvm1 side by side until each has its DHCP lease: capl's machine (the
test image, 1 vCPU, 256 MiB, TCG) and a hand-made domain of the same shape
(bench/migration_virsh.py). Both keep running during the whole run, so each side is measured
under the same load.

Measured, `--reps` times, back and forth (kvm1 -> kvm2 -> kvm1 ...), the two sides one after
the other in the same direction, with a short pause after each; which side goes first follows
capl, virsh, virsh, capl, ... so that each direction is measured in both orders:

  capl   a LibvirtMachineMigration created -> `phase: Succeeded` seen by a watch. It includes
         scheduling (the request checked, the target recorded in the migration's status and
         the machine's spec), the handshake with the machine controller (it acknowledges the
         target before anything moves), the preparation of the destination (host identity,
         where the domain is, pool sharing probe, the base image checked, the root overlay
         created, the NoCloud ISO copied), the libvirt job (managed direct migrate3 over two
         dedicated connections, progress read every second), the checks after it, the status
         and machine writes, and the clean-up of the source (volumes, serial log).
  virsh  one virsh process creating the root overlay and the ISO on the destination
         (`vol-create-as`, `vol-upload`), then `virsh migrate --live --persistent
         --undefinesource --copy-storage-inc`; the source's clean-up is timed apart and not
         part of the figure.

Reported: medians of both, the ratio capl / virsh (the median of the per-repetition ratios;
target <= 1.2), libvirt's job time and the guest's downtime on both sides (capl: the
migration's status.state.downtimeMs and its Succeeded message; virsh: `domjobinfo
--completed` on the destination), and where capl's time goes: the phases as the watch saw
them, and the manager's log lines of each move with their offsets. Writes
bench/results/migration.json.

    .venv/bin/python bench/migration.py [--reps 8] [--start-bed]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import cpu_seconds_of, note, write_result
from bench.migration_bed import SharedBed
from bench.migration_capl import HOSTS, CaplSide
from bench.migration_virsh import VirshFloor, virsh
from capl.api.machine import LibvirtMachineSpec
from capl.controllers.machine.plan import image_plan
from capl.kube import KubeClient
from capl.runtime.logging import configure_logging
from capl.runtime.resources import NAMESPACE
from capl.testbed import AssetsMissing, ControlPlane, ManagedProcess, find_assets
from capl.testbed.capibuild import CapiMissing
from capl.testbed.caplmanager import CaplManager
from capl.testbed.identities import MANAGER_AUDIT_POLICY, refused_requests
from capl.testbed.multihost import MultihostBed
from capl.testing.crds import CRD_DIR, capi_crd_dir, write_reduced_crds
from capl.virt import LibvirtHosts

TARGET_RATIO = 1.2
LOG_KEYS = ("event", "level", "controller", "name", "logger", "seconds", "error")


def _median(values: Sequence[float | int | None]) -> float | None:
    known = [float(v) for v in values if v is not None]
    return statistics.median(known) if known else None


def _ratio(a: float | int | None, b: float | int | None) -> float | None:
    return None if a is None or b is None or not b else float(a) / float(b)


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def _epoch(stamp: str) -> float | None:
    with contextlib.suppress(ValueError):
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    return None


def log_window(records: list[dict[str, Any]], start: float, end: float) -> list[dict[str, Any]]:
    """The manager's log lines between two wall-clock times, with their offset from `start`."""
    lines = []
    for record in records:
        at = _epoch(str(record.get("timestamp") or ""))
        if at is None or not start - 0.05 <= at <= end + 0.5:
            continue
        line: dict[str, Any] = {"t_s": round(at - start, 3)}
        line |= {k: record[k] for k in LOG_KEYS if k in record}
        lines.append(line)
    return lines


def _check_parts() -> Path:
    if os.geteuid() != 0:
        raise SystemExit("bench: the multi-host bed needs root (network and mount namespaces)")
    try:
        find_assets()
        capi_crd_dir()
    except (AssetsMissing, CapiMissing) as e:
        raise SystemExit(f"bench: {e}") from None
    image = Path(os.environ.get("CAPL_GUEST_IMAGE", ""))
    if not image.is_file():
        raise SystemExit("bench: set CAPL_GUEST_IMAGE to the test guest image (make guest-image)")
    return image


async def _hypervisor(bed: MultihostBed) -> dict[str, str]:
    """What `virsh version` says on kvm1 (the bed's hosts are one libvirt and QEMU build)."""
    out = await virsh(bed.client_uri("kvm1"), "version")
    found = {}
    for line in out.splitlines():
        key, _, value = line.partition(":")
        if value.strip():
            found[key.strip().lower().replace(" ", "_")] = value.strip()
    return found


async def measure(bed: MultihostBed, image: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Set up, measure (within ``--budget`` seconds), clean up whatever happened."""
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="capl-bench-migration-") as tmp:
        # the manager runs as deployed (config/rbac's roles); its refusals are in the log
        plane = ControlPlane(audit_log=Path(tmp) / "audit.log", audit_policy=MANAGER_AUDIT_POLICY)
        async with plane:
            await plane.install_crds(CRD_DIR)
            write_reduced_crds(capi_crd_dir(), Path(tmp) / "capi")
            await plane.install_crds(Path(tmp) / "capi")
            api = await KubeClient.connect(str(plane.kubeconfig))
            namespace = f"bench-migration-{secrets.token_hex(3)}"
            await api.resource(NAMESPACE).create({"metadata": {"name": namespace}})
            manager = CaplManager(
                plane=plane,
                workdir=Path(tmp) / "manager",
                name="capl-bench-migration",
                webhooks=False,
                namespace=namespace,
                log_level=args.log_level,
                extra_args=["--machine-shutdown-timeout=5s"],
                ready_timeout=120,
            )
            run = Run(
                bed=bed,
                plane=plane,
                manager=manager,
                capl=CaplSide(bed=bed, api=api, namespace=namespace, image=image),
                args=args,
                t_start=t_start,
            )
            try:
                async with asyncio.timeout(args.budget):
                    measured = await run.measure()
            finally:
                t_teardown = time.perf_counter()
                await run.clean_up()
                await api.close()
        refused = refused_requests()
        if refused:
            raise RuntimeError("the manager's role refused:\n" + "\n".join(refused))
    return measured | {
        "teardown_s": round(time.perf_counter() - t_teardown, 2),
        "total_s": round(time.perf_counter() - t_start, 2),
    }


@dataclass
class Run:
    """One run's parts: the manager, capl's side, the hand-made side (once booted)."""

    bed: MultihostBed
    plane: ControlPlane
    manager: CaplManager
    capl: CaplSide
    args: argparse.Namespace
    t_start: float
    hosts: LibvirtHosts = field(default_factory=LibvirtHosts)
    floor: VirshFloor | None = None

    async def measure(self) -> dict[str, Any]:
        bed, capl, args = self.bed, self.capl, self.args
        await self.manager.start()
        await capl.cluster()
        spec = LibvirtMachineSpec.model_validate(capl.machine_spec("kvm1"))
        plan = image_plan(spec)
        for name in HOSTS:  # the base image on both hosts (see the module docstring)
            base = await self.hosts.get(uri=bed.host(name).local_uri).ensure_base_image(
                pool=capl.pool, name=plan.volume, source=plan.source
            )
        floor = self.floor = VirshFloor(
            bed=bed,
            pool=capl.pool,
            pool_path=capl.pool_path,
            base_path=base.volume.path,
            capacity_bytes=base.virtual_size_bytes,
            bridge=bed.host_bridge,
        )
        setup_s = time.perf_counter() - self.t_start
        capl_boot, virsh_boot = await asyncio.gather(
            capl.boot("kvm1", within=args.boot_within),
            floor.boot("kvm1", spec, within=args.boot_within),
        )
        note(f"booted on kvm1: capl's machine in {capl_boot:.1f} s, virsh's in {virsh_boot:.1f} s")
        await asyncio.sleep(args.settle)
        stack = {
            "manager": self.manager.pid,
            "kube-apiserver": _pid(self.plane.apiserver_process),
            "etcd": _pid(self.plane.etcd_process),
            "benchmark": os.getpid(),
        }
        reps = await _repetitions(capl, floor, args, stack)
        records = self.manager.log_records()
        for rep in reps:
            move = rep["capl"]
            capl.add_log(move, log_window(records, move["started_at"], move["finished_at"]))
        return {
            "reps": reps,
            "setup_s": round(setup_s, 2),
            "boot_s": {"capl": round(capl_boot, 2), "virsh": round(virsh_boot, 2)},
            "hosts": await _hypervisor(bed),
        }

    async def clean_up(self) -> None:
        """The hand-made guest; the machine and cluster through the manager; then directly
        whatever is left of the namespace on both hosts."""
        if self.floor is not None:
            with contextlib.suppress(Exception):
                await self.floor.remove(HOSTS)
        try:
            await self.capl.teardown()
        except Exception as exc:  # what is left is swept below
            note(f"teardown through the manager: {exc}")
        try:
            left = await asyncio.to_thread(self.capl.sweep)
            if left:
                note(f"swept directly: {left}")
        finally:
            await self.manager.stop()
            await self.hosts.close()


def _pid(process: ManagedProcess | None) -> int | None:
    return None if process is None else process.pid


def _busy() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs so far (/proc/stat; idle and iowait are not busy)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(fields) - fields[3] - fields[4], sum(fields)


async def _sampled(move: Any, stack: dict[str, int | None]) -> dict[str, Any]:
    """`move` awaited; with the machine's CPU use meanwhile and that of capl's processes."""
    busy0, total0 = _busy()
    cpu0 = cpu_seconds_of(stack)
    result: dict[str, Any] = await move
    busy1, total1 = _busy()
    cpu1 = cpu_seconds_of(stack)
    cpus = os.cpu_count() or 1
    result["machine_cpu_busy_cores"] = round(cpus * (busy1 - busy0) / max(1, total1 - total0), 2)
    result["cpu_s"] = {k: round(cpu1[k] - cpu0[k], 3) for k in cpu1 if k in cpu0}
    return result


async def _repetitions(
    capl: CaplSide, floor: VirshFloor, args: argparse.Namespace, stack: dict[str, int | None]
) -> list[dict[str, Any]]:
    reps: list[dict[str, Any]] = []
    for i in range(args.reps):
        to = HOSTS[(i + 1) % len(HOSTS)]
        # capl first in repetitions 1, 4, 5, 8, ...: each direction gets both orders
        order = ("capl", "virsh") if i % 4 in (0, 3) else ("virsh", "capl")
        rep: dict[str, Any] = {"first": order[0]}
        for side in order:
            rep[side] = await _sampled(capl.move(to) if side == "capl" else floor.move(to), stack)
            await asyncio.sleep(args.settle)
        c, v = rep["capl"], rep["virsh"]
        note(
            f"rep {i + 1}/{args.reps} {c['from']} -> {to}: capl {c['seconds']:.2f} s (job "
            f"{c['job_s']} s, downtime {c['downtime_ms']} ms; {c['split_s']}), virsh "
            f"{v['seconds']:.2f} s (prepare {v['prepare_s']:.2f} s, migrate "
            f"{v['migrate_s']:.2f} s, job {v['job_ms']} ms, downtime {v['downtime_ms']} ms)"
        )
        reps.append(rep)
    return reps


def summarize(run: dict[str, Any]) -> dict[str, Any]:
    reps = run["reps"]
    capl = [r["capl"] for r in reps]
    hand = [r["virsh"] for r in reps]
    paired = [_ratio(c["seconds"], v["seconds"]) for c, v in zip(capl, hand, strict=True)]
    down = [_ratio(c["downtime_ms"], v["downtime_ms"]) for c, v in zip(capl, hand, strict=True)]
    capl_s, virsh_s = _median([c["seconds"] for c in capl]), _median([v["seconds"] for v in hand])
    capl_down = _median([c["downtime_ms"] for c in capl])
    virsh_down = _median([v["downtime_ms"] for v in hand])
    virsh_job = _median([v["job_ms"] for v in hand])
    phases = ("scheduling", "handshake", "preparation", "running", "finalizing")
    return {
        "repetitions": len(reps),
        "direction": "kvm1 -> kvm2 -> kvm1 ... (qemu+tls, separate storage: storage copied)",
        "capl_seconds": _round(capl_s),
        "virsh_seconds": _round(virsh_s),
        "ratio_to_virsh": _round(_median(paired)),
        "ratio_of_medians": _round(_ratio(capl_s, virsh_s)),
        "ratio_per_rep": [_round(x) for x in paired],
        "target_ratio": TARGET_RATIO,
        "capl_downtime_ms": capl_down,
        "virsh_downtime_ms": virsh_down,
        "downtime_ratio": _round(_median(down)),
        "downtime_ratio_per_rep": [_round(x) for x in down],
        "capl_job_seconds": _round(_median([c["job_s"] for c in capl])),
        "virsh_job_seconds": _round(None if virsh_job is None else virsh_job / 1000),
        "virsh_prepare_seconds": _round(_median([v["prepare_s"] for v in hand])),
        "virsh_migrate_seconds": _round(_median([v["migrate_s"] for v in hand])),
        "virsh_cleanup_seconds": _round(_median([v["cleanup_s"] for v in hand])),
        "capl_migrate_call_seconds": _round(_median([c.get("migrate_call_s") for c in capl])),
        "capl_outside_job_seconds": _round(_median([c.get("outside_job_s") for c in capl])),
        "virsh_outside_job_seconds": _round(_median([v.get("outside_job_s") for v in hand])),
        "capl_steps_seconds": _round(_median([c.get("capl_steps_s") for c in capl])),
        "machine_cpu_busy_cores": {
            "capl": _round(_median([c.get("machine_cpu_busy_cores") for c in capl]), 2),
            "virsh": _round(_median([v.get("machine_cpu_busy_cores") for v in hand]), 2),
        },
        "capl_stack_cpu_seconds_per_move": {
            k: _round(_median([c["cpu_s"].get(k) for c in capl]))
            for k in ("manager", "kube-apiserver", "etcd", "benchmark")
        },
        "capl_split_seconds": {p: _round(_median([c["split_s"][p] for c in capl])) for p in phases},
        "capl_seconds_per_rep": [_round(c["seconds"]) for c in capl],
        "virsh_seconds_per_rep": [_round(v["seconds"]) for v in hand],
    }


async def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=8, help="moves per side, back and forth")
    parser.add_argument(
        "--start-bed", action="store_true",
        help="start a multi-host bed when there is none (and stop it at the end then)",
    )  # fmt: skip
    parser.add_argument("--boot-within", type=float, default=240.0)
    parser.add_argument(
        "--bed-within", type=float, default=120.0,
        help="seconds to wait while another session uses an unhealthy bed",
    )  # fmt: skip
    parser.add_argument("--settle", type=float, default=2.0, help="pause after each move (s)")
    parser.add_argument("--log-level", default="info", help="the manager's log level")
    parser.add_argument(
        "--budget", type=float, default=600.0, help="seconds for set-up and measurement"
    )
    args = parser.parse_args(argv)
    configure_logging(level="warning", format="console")
    image = _check_parts()
    t0 = time.perf_counter()
    shared = SharedBed(say=note)
    bed = await shared.acquire(start=args.start_bed, within=args.bed_within)
    bed_s = time.perf_counter() - t0
    try:
        run = await measure(bed, image, args)
    finally:
        await shared.release()
    body = summarize(run) | {
        "bed": {"started_by_this_run": shared.started, "start_s": round(bed_s, 2)},
        **{k: v for k, v in run.items() if k != "reps"},
        "per_rep": run["reps"],
    }
    write_result("migration", body)
    note(
        f"migration kvm1 <-> kvm2 with storage copy, {body['repetitions']} moves per side: "
        f"capl {body['capl_seconds']} s vs virsh {body['virsh_seconds']} s, ratio "
        f"{body['ratio_to_virsh']} (target <= {TARGET_RATIO}); downtime capl "
        f"{body['capl_downtime_ms']} ms vs virsh {body['virsh_downtime_ms']} ms; "
        f"capl's split {body['capl_split_seconds']}"
    )
    print(json.dumps({k: body[k] for k in ("ratio_to_virsh", "downtime_ratio")}))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
