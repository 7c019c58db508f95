"""The manager of an earlier commit, run beside today's in the same benchmark: what "the
manager's own cost per machine halved" (issue 16) is measured against.

Issue 16 set its CPU target as half of the 14.4 ms per machine that issue 9 measured. An
absolute figure moves with the speed of the shared machine by a quarter and more between
hours (docs/benchmarks.md), so the comparison that carries over is the same one run against
the code issue 9 measured, on the same machine, minutes apart: `bench/scaleout.py` runs the
headline layout with that commit's `capl` package and with today's, both without the call
recording, twice each in the order A B B A (the machine's speed moves by a fifth between
runs a minute apart), and reports the ratio of their mean CPU per machine
(`scaleout.manager_cpu_ratio_to_issue9`, target <= 0.5) and, beside it, the same ratio with
each side's manager CPU divided by kube-apiserver's in its runs.

How the old manager runs: `git archive <ref> capl` into a temporary directory, put first on
the manager process's PYTHONPATH (ahead of the editable install of today's package), with
today's virtualenv, CRDs, RBAC and benchmark. Its dependencies are a subset of today's. A
checkout without that history (a shallow clone, a source tarball) reports the figure missing
and says why.
"""

from __future__ import annotations

import subprocess
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path
from typing import Any

from bench.common import Bed, note
from bench.runs import Run, finish, scale_out

REPO = Path(__file__).resolve().parents[1]

ISSUE9_REF = "31af542"
"""The commit of issue 9's closing `make bench` (2026-11-30, "Benchmark results of a quiet
run"): manager 14.4 ms per machine at 1 x 1,000, the figure issue 16 asks to halve."""


class BaselineMissing(Exception):
    """The earlier commit cannot be checked out here (the reason is the message)."""


def checkout(ref: str, into: Path) -> tuple[str, Path]:
    """(full commit id, directory to put on PYTHONPATH) of `ref`'s `capl` package."""
    try:
        commit = _git("rev-parse", "--verify", f"{ref}^{{commit}}").decode().strip()
        archive = _git("archive", "--format=tar", commit, "capl")
    except (OSError, subprocess.CalledProcessError) as exc:
        detail = ""
        if isinstance(exc, subprocess.CalledProcessError) and exc.stderr:
            detail = exc.stderr.decode(errors="replace").strip()
        raise BaselineMissing(
            f"commit {ref} is not in this checkout's history ({detail or exc}): a shallow "
            "clone or a source tarball cannot run the earlier manager"
        ) from None
    root = Path(tempfile.mkdtemp(prefix=f"capl-{commit[:8]}-", dir=into))
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(root, filter="data")
    return commit, root


def _git(*args: str) -> bytes:
    done = subprocess.run(
        ["git", "-C", str(REPO), *args], check=True, capture_output=True, timeout=60
    )
    return done.stdout


TARGET_RATIO = 0.5
"""Issue 16: the manager's own cost per machine halved."""


async def compare(
    bed: Bed,
    *,
    clusters: int,
    per: int,
    concurrency: int,
    ref: str,
    workdir: Path,
    rounds: int = 2,
) -> dict[str, Any]:
    """The headline layout scaled out by `ref`'s manager and by today's, both untraced,
    `rounds` times each in the order A B, B A, ... (this machine's speed moves by a fifth
    between two runs a minute apart); scaleout.json's `baseline`."""
    commit, path = checkout(ref, workdir)
    n = clusters * per
    envs = {"baseline": {"PYTHONPATH": str(path)}, "current": {}}
    runs: dict[str, list[dict[str, Any]]] = {"baseline": [], "current": []}
    order: list[str] = []
    for index in range(rounds):
        sides = ("baseline", "current") if index % 2 == 0 else ("current", "baseline")
        for side in sides:
            who = commit[:8] if side == "baseline" else "this checkout"
            note(f"same-run comparison, round {index + 1}/{rounds}: {side} manager ({who})")
            run = await scale_out(
                bed, n, clusters=clusters, concurrency=concurrency, manager_env=envs[side]
            )
            runs[side].append(_figures(run))
            order.append(side)
            await finish(bed, run)
    sides = {side: _side(figures) for side, figures in runs.items()}
    base, current = sides["baseline"], sides["current"]
    ratio = _ratio(current["manager_cpu_ms_per_machine"], base["manager_cpu_ms_per_machine"])
    apiserver = _ratio(
        _ratio(current["manager_cpu_ms_per_machine"], _apiserver(current)) or 0.0,
        _ratio(base["manager_cpu_ms_per_machine"], _apiserver(base)) or 0.0,
    )
    note(
        f"manager CPU per machine: {current['manager_cpu_ms_per_machine']} ms against "
        f"{base['manager_cpu_ms_per_machine']} ms at {commit[:8]}: {ratio} "
        f"({apiserver} per kube-apiserver CPU)"
    )
    return {
        "ref": ref,
        "commit": commit,
        "layout": f"{clusters}x{per}",
        "what": (
            "the headline layout scaled out by the manager of the commit issue 9 measured "
            "(its capl package on PYTHONPATH; today's virtualenv, CRDs, RBAC and benchmark) "
            "and by this checkout's, both without the call recording, alternating"
        ),
        "rounds": rounds,
        "order": order,
        "manager_cpu_ratio": ratio,
        "manager_cpu_ratio_per_kube_apiserver": apiserver,
        "target": f"<= {TARGET_RATIO:g}",
        **sides,
    }


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 3) if b else None


def _apiserver(side: dict[str, Any]) -> float:
    value = side["cpu_ms_per_machine_by_process"].get("kube-apiserver", 0.0)
    return float(value)


def _side(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One side's runs and their means (CPU per machine, per process)."""
    processes = {name for run in runs for name in run["cpu_ms_per_machine_by_process"]}
    return {
        "manager_cpu_ms_per_machine": _mean([r["manager_cpu_ms_per_machine"] for r in runs]),
        "cpu_ms_per_machine_by_process": {
            name: _mean(
                [
                    r["cpu_ms_per_machine_by_process"][name]
                    for r in runs
                    if name in r["cpu_ms_per_machine_by_process"]
                ]
            )
            for name in sorted(processes)
        },
        "runs": runs,
    }


def _mean(values: list[float]) -> float:
    return round(sum(values) / len(values), 2)


def _figures(run: Run) -> dict[str, Any]:
    numbers = run.numbers()
    per_machine = {
        name: round(1000 * seconds / run.n, 2)
        for name, seconds in numbers["cpu_seconds_by_process"].items()
    }
    return {
        "manager_cpu_ms_per_machine": numbers["manager_cpu_ms_per_machine"],
        "cpu_ms_per_machine_by_process": per_machine,
        "machines_per_s": numbers["machines_per_s"],
        "api_writes_per_machine": numbers["api_writes_per_machine"],
        "seconds_to_all_ready": numbers["seconds_to_all_ready"],
    }
