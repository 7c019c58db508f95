"""The manager of an earlier commit, run beside today's in the same benchmark: what "the
manager's own cost per machine halved" (issue 16) is measured against.

Issue 16 set its CPU target as half of the 14.4 ms per machine that issue 9 measured. An
absolute figure moves with the speed of the shared machine by a quarter and more between
hours (docs/benchmarks.md), so the comparison that carries over is the same one run against
the code issue 9 measured, on the same machine, minutes apart: `bench/scaleout.py` runs the
headline layout once with that commit's `capl` package and once with today's, both without
the call recording, and reports the ratio of their CPU per machine
(`scaleout.manager_cpu_ratio_to_issue9`, target <= 0.5).

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
    bed: Bed, *, clusters: int, per: int, concurrency: int, ref: str, workdir: Path
) -> dict[str, Any]:
    """The headline layout scaled out by `ref`'s manager and by today's, both untraced, one
    after the other (the earlier one first); scaleout.json's `baseline`."""
    commit, path = checkout(ref, workdir)
    n = clusters * per
    runs: dict[str, Run] = {}
    for side, env in (("baseline", {"PYTHONPATH": str(path)}), ("current", {})):
        note(f"same-run comparison: {side} manager ({commit[:8] if env else 'this checkout'})")
        run = await scale_out(bed, n, clusters=clusters, concurrency=concurrency, manager_env=env)
        runs[side] = run
        await finish(bed, run)
    figures = {side: _figures(run) for side, run in runs.items()}
    base = figures["baseline"]["manager_cpu_ms_per_machine"]
    current = figures["current"]["manager_cpu_ms_per_machine"]
    ratio = round(current / base, 3) if base else None
    note(f"manager CPU per machine: {current} ms against {base} ms at {commit[:8]}: {ratio}")
    return {
        "ref": ref,
        "commit": commit,
        "layout": f"{clusters}x{per}",
        "what": (
            "the headline layout scaled out by the manager of the commit issue 9 measured "
            "(its capl package on PYTHONPATH; today's virtualenv, CRDs, RBAC and benchmark) "
            "and by this checkout's, both without the call recording, one after the other"
        ),
        "manager_cpu_ratio": ratio,
        "target": f"<= {TARGET_RATIO:g}",
        **figures,
    }


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
