"""bench/report.py's plots: one SVG per benchmark in bench/results/, each with the machine it
was measured on (``MACHINE``, filled by the report from the inputs before plotting).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # after matplotlib.use: the backend is chosen first

__all__ = ["MACHINE", "RESULTS", "plt", "save"]

RESULTS = Path(__file__).resolve().parent / "results"

MACHINE: dict[str, str] = {}
"""name of a benchmark's input -> the machine it was measured on (report_floor.machine_line)."""


def save(fig: Any, name: str) -> str:
    path = RESULTS / f"{name}.svg"
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    line = MACHINE.get(name) or MACHINE.get("default", "")
    fig.text(0.01, 0.01, f"measured on: {line}", fontsize=7, color="#555555")
    fig.savefig(path, metadata={"Date": None})
    plt.close(fig)
    return path.name


def plot_scaleout(s: dict[str, Any]) -> str:
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    labels = ["capl manager", "raw replay,\none loop", f"raw replay,\n{s['concurrency']} loops"]
    values = [
        s["machines_per_s"],
        s["raw_machines_per_s_sequential"],
        s["raw_machines_per_s_concurrent"],
    ]
    bars = left.bar(labels, values, color=["#3b7dd8", "#999999", "#cccccc"])
    left.bar_label(bars, fmt="%.1f")
    left.set_ylabel("machines per second (same API writes)")
    left.set_title(
        f"{s['machines']} machines, {s['api_writes_per_machine']:.2f} API writes each\n"
        f"ratio {s['ratio_to_apiserver']:.2f} to one loop (target >= 0.7), "
        f"{s['ratio_to_apiserver_concurrent']:.2f} to {s['concurrency']} loops",
        fontsize=10,
    )
    latencies = s.get("create_to_ready_s") or []
    if latencies:
        ys = [(i + 1) / len(latencies) for i in range(len(latencies))]
        right.plot(latencies, ys, color="#3b7dd8")
        for q, label in ((s["create_to_ready_p50_s"], "p50"), (s["create_to_ready_p99_s"], "p99")):
            right.axvline(q, color="#999999", linestyle="--", linewidth=1)
            right.text(q, 0.05, f" {label} {q:.1f} s", fontsize=8)
    right.set_xlabel("create to Ready (s)")
    right.set_ylabel("fraction of machines")
    right.set_title("create-to-Ready, all created at once", fontsize=10)
    return save(fig, "scaleout")


def plot_steady(st: dict[str, Any]) -> str:
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.6))
    panels = [
        ("CPU, % of one core", st["cpu_percent_of_core"], 2.0),
        ("RSS, MB", st["rss_mb"], 250.0),
        ("LIST requests after start-up", st["list_calls_after_start"], 0.0),
    ]
    for ax, (title, value, target) in zip(axes, panels, strict=True):
        bar = ax.bar(["capl manager"], [value], color="#3b7dd8")
        ax.bar_label(bar, fmt="%.2f" if isinstance(value, float) else "%d")
        ax.axhline(target, color="#d83b3b", linestyle="--", linewidth=1, label=f"target {target:g}")
        ax.set_title(title, fontsize=10)
        ax.set_ylim(0, max(value, target, 1) * 1.3)
        ax.legend(fontsize=8, loc="upper right")
    fig.suptitle(
        f"steady state: {st['machines']} Ready machines, {st['seconds']:.0f} s", fontsize=10
    )
    return save(fig, "steady")


def plot_realvm(r: dict[str, Any]) -> str:
    rounds = r["per_round"]
    fig, ax = plt.subplots(figsize=(7, 4))
    xs = list(range(1, len(rounds) + 1))
    width = 0.38
    ax.bar([x - width / 2 for x in xs], [x["baseline"]["wall_s"] for x in rounds], width,
           label="virsh create + DHCP lease", color="#999999")  # fmt: skip
    ax.bar([x + width / 2 for x in xs], [x["capl"]["wall_s"] for x in rounds], width,
           label="capl: Secret + Machine + LibvirtMachine to Ready", color="#3b7dd8")  # fmt: skip
    ax.set_xticks(xs, [f"round {x}" for x in xs])
    ax.set_ylabel(f"seconds until all {r['vms']} TCG guests are up")
    ratio = r.get("ratio_paired_median", r.get("ratio_wall_capl_vs_baseline"))
    ax.set_title(f"real VMs: ratio capl / virsh {ratio} (target <= 1.0)", fontsize=10)
    ax.legend(fontsize=8)
    return save(fig, "realvm")


def plot_scaling(c: dict[str, Any]) -> str:
    points = c["points"]
    xs = [p["machines"] for p in points]
    by_process = [p.get("cpu_ms_per_machine_by_process") or {} for p in points]
    fig, axes = plt.subplots(
        1, 3 if any(by_process) else 2, figsize=(15 if any(by_process) else 11, 4.2)
    )
    left, right = axes[0], axes[1]
    for ax, key, label in (
        (left, "seconds_to_all_ready", "seconds, first create to last Ready"),
        (right, "manager_rss_after_mb", "manager RSS with N Ready machines, MB"),
    ):
        ys = [p[key] for p in points]
        fit = c["fits"][key]
        ax.plot(xs, ys, "o", color="#3b7dd8", label="measured")
        line_x = [0, max(xs)]
        ax.plot(
            line_x,
            [fit["intercept"] + fit["slope"] * x for x in line_x],
            "--",
            color="#999999",
            label=f"least squares (R² {fit['r2']})",
        )
        for x, y, p in zip(xs, ys, points, strict=True):
            note = (
                f"{1000 * p['seconds_per_machine']:.0f} ms/machine"
                if key == "seconds_to_all_ready"
                else f"+{p['rss_growth_kb_per_machine']:.0f} KB/machine"
            )
            ax.annotate(note, (x, y), textcoords="offset points", xytext=(-30, 8), fontsize=7)
        ax.set_xlabel("machines")
        ax.set_ylabel(label)
        ax.set_xlim(0, max(xs) * 1.05)
        ax.set_ylim(0, max(ys) * 1.15)
    right.axhline(
        points[0]["manager_rss_idle_mb"], color="#cccccc", linewidth=1, label="idle manager"
    )
    left.legend(fontsize=8)
    right.legend(fontsize=8)
    left.set_title("time grows linearly when the points sit on the line", fontsize=10)
    right.set_title("memory: idle process + per-machine state", fontsize=10)
    if any(by_process):
        ax = axes[2]
        names = sorted({k for d in by_process for k in d})
        labels = [str(x) for x in xs]
        bottom = [0.0] * len(xs)
        for name in names:
            values = [d.get(name, 0.0) for d in by_process]
            ax.bar(labels, values, bottom=bottom, label=name)
            bottom = [b + v for b, v in zip(bottom, values, strict=True)]
        ax.plot(
            labels,
            [1000 * p["seconds_per_machine"] for p in points],
            "o-",
            color="black",
            label="wall time per machine",
        )
        ax.set_xlabel("machines")
        ax.set_ylabel("ms per machine")
        ax.set_ylim(0, max(max(bottom), 1000 * max(p["seconds_per_machine"] for p in points)) * 1.6)
        ax.set_title("CPU per machine, by process, against wall time", fontsize=10)
        ax.legend(fontsize=7, loc="upper left", ncol=2)
    return save(fig, "scaling_curve")


def plot_runtime(t: dict[str, Any]) -> str:
    rounds = t["per_round"]
    fig, ax = plt.subplots(figsize=(7, 4))
    xs = list(range(1, len(rounds) + 1))
    width = 0.38
    ax.bar([x - width / 2 for x in xs], [r["raw_sequential"] for r in rounds], width,
           label="raw status patches, one loop", color="#999999")  # fmt: skip
    ax.bar([x + width / 2 for x in xs], [r["rate"] for r in rounds], width,
           label="toy controller on capl's runtime", color="#3b7dd8")  # fmt: skip
    ax.set_xticks(xs, [f"round {x}" for x in xs])
    ax.set_ylabel("objects per second")
    ax.set_title(f"runtime: ratio {t['ratio_toy_vs_raw_sequential']} (target >= 0.8)", fontsize=10)
    ax.legend(fontsize=8)
    return save(fig, "runtime")
