"""The benchmark report: plots, bench/results/summary.json and the results section of
docs/benchmarks.md, from the JSON files the benchmarks wrote into bench/results/.

Inputs (each optional unless --require lists it): runtime.json (bench/runtime_toy.py),
machines_testdriver.json (bench/machines_testdriver.py), scaleout.json, steady.json,
scaling_curve.json (bench/scaling_curve.py, bench/scaleout.py, bench/steady.py),
machines_realvm.json (bench/machines_realvm.py), migration.json (bench/migration.py; its
part of the report is bench/report_migration.py), realnode.json (bench/realnode.py;
bench/report_realnode.py).

summary.json is nested: one object per benchmark, so the figure called
`scaleout.ratio_to_apiserver` is `summary["scaleout"]["ratio_to_apiserver"]` (jq:
`.scaleout.ratio_to_apiserver`). Every figure is a number, shown with the limit it was
measured against in the same run and its target:

    scaleout.ratio_to_apiserver       machines/s / a tight loop replaying the same writes (>= 0.7)
    scaleout.api_writes_per_machine   the manager's API writes per machine, events included
    scaleout.p99_create_to_ready_s    (and p50) per machine, N created at once
    steady.cpu_percent_of_core        manager CPU over the steady window (< 2)
    steady.rss_mb                     manager RSS with N Ready machines (< 400)
    steady.list_calls_after_start     LIST requests after start-up (0)
    realvm.ratio_to_virsh             capl / `virsh create` + lease, 3 TCG guests (<= 1.0)
    migration.ratio_to_virsh          capl / hand preparation + `virsh migrate`, live with
                                      storage copy between two hosts (<= 1.2; and
                                      migration.capl_seconds, .virsh_seconds, .capl_downtime_ms,
                                      .virsh_downtime_ms, .downtime_ratio)
    realnode.ratio_to_kubeadm         capl / a hand-run `kubeadm join`, a real node to Ready
                                      (<= 1.15; and .capl_seconds, .kubeadm_seconds)

plus `targets_met` (figure -> bool) and the inputs' timestamps.

Plots (SVG, matplotlib's Agg backend, into bench/results/, each with the machine it was
measured on; bench/report_plots.py): scaleout.svg (throughput against the raw rate; the
create-to-Ready distribution), steady.svg (CPU, RSS, LIST against their targets), realvm.svg
(per round: capl against the baseline), migration.svg (per move: capl's phases against
virsh's preparation + migrate; downtime), realnode.svg (per round: each side's steps to the
Ready Node), scaling_curve.svg (time and memory against N, with the fitted lines),
runtime.svg (toy controller against raw patches), cpu_split.svg (CPU per machine by process:
capl against the work floor; bench/report_floor.py).

docs/benchmarks.md: the text between the `bench:results:begin` and `bench:results:end`
markers is replaced; everything else in the file is kept.

    .venv/bin/python bench/report.py [--require scaleout,steady,realvm,scaling_curve]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import report_floor, report_migration, report_plots, report_realnode
from bench.report_plots import MACHINE, RESULTS, plt, save

DOCS = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"
BEGIN = re.compile(r"<!-- bench:results:begin.*?-->", re.DOTALL)
END = "<!-- bench:results:end -->"

TARGETS: dict[str, tuple[str, float]] = {
    "steady.cpu_percent_of_core": ("<", 2.0),
    "steady.rss_mb": ("<", 400.0),
    "steady.list_calls_after_start": ("==", 0.0),
    "realvm.ratio_to_virsh": ("<=", 1.0),
    **report_migration.TARGETS,
    **report_realnode.TARGETS,
    **report_floor.TARGETS,
}
REQUIRED = (
    "scaleout.ratio_to_apiserver",
    "scaleout.api_writes_per_machine",
    "scaleout.p99_create_to_ready_s",
    "steady.cpu_percent_of_core",
    "steady.rss_mb",
    "steady.list_calls_after_start",
    "realvm.ratio_to_virsh",
    *report_migration.REQUIRED,
    *report_realnode.REQUIRED,
    *report_floor.REQUIRED,
)


def load(name: str) -> dict[str, Any] | None:
    path = RESULTS / f"{name}.json"
    if not path.exists():
        return None
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def meets(op: str, value: float, target: float) -> bool:
    return {
        ">=": value >= target,
        "<=": value <= target,
        "<": value < target,
        "==": value == target,
    }[op]


# --- summary -----------------------------------------------------------------------------


def summarize(inputs: Mapping[str, dict[str, Any] | None]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    if (s := inputs.get("scaleout")) is not None:
        summary["scaleout"] = {
            "machines": s["machines"],
            "machines_per_s": s["machines_per_s"],
            "ratio_to_apiserver": s["ratio_to_apiserver"],
            "ratio_to_apiserver_concurrent": s["ratio_to_apiserver_concurrent"],
            "raw_machines_per_s": s["raw_machines_per_s_sequential"],
            "raw_machines_per_s_concurrent": s["raw_machines_per_s_concurrent"],
            "raw_writes_per_s": s["raw_writes_per_s_sequential"],
            "manager_api_writes_per_s": s["manager_api_writes_per_s"],
            "api_writes_per_machine": s["api_writes_per_machine"],
            "api_writes_per_machine_libvirtmachines": s["api_writes_per_machine_libvirtmachines"],
            "p50_create_to_ready_s": s["create_to_ready_p50_s"],
            "p99_create_to_ready_s": s["create_to_ready_p99_s"],
            "seconds_to_all_ready": s["seconds_to_all_ready"],
        }
    if (st := inputs.get("steady")) is not None:
        summary["steady"] = {
            "machines": st["machines"],
            "seconds": st["seconds"],
            "cpu_percent_of_core": st["cpu_percent_of_core"],
            "rss_mb": st["rss_mb"],
            "list_calls_after_start": st["list_calls_after_start"],
            "api_requests_in_window": st["api_requests_in_window"],
            "reconciles_in_window": sum(st["reconciles_in_window"].values()),
            "reconciles_in_window_by_controller": st["reconciles_in_window"],
            "drain_seconds_before_window": st.get("drain_seconds_before_window"),
            "drained_before_window": st.get("drained_before_window"),
            "reconciles_while_draining": (
                sum(st["reconciles_while_draining"].values())
                if "reconciles_while_draining" in st
                else None
            ),
        }
    if (r := inputs.get("machines_realvm")) is not None:
        ratio = r.get("ratio_paired_median", r.get("ratio_wall_capl_vs_baseline"))
        summary["realvm"] = {
            "vms": r["vms"],
            "rounds": r["rounds"],
            "ratio_to_virsh": ratio,
            "ratio_wall": r.get("ratio_wall_capl_vs_baseline"),
            "capl_wall_s": r["capl_wall_s"],
            "virsh_wall_s": r["baseline_wall_s"],
        }
    if (m := inputs.get("migration")) is not None:
        summary["migration"] = report_migration.summarize(m)
    if (n := inputs.get("realnode")) is not None:
        summary["realnode"] = report_realnode.summarize(n)
    if (c := inputs.get("scaling_curve")) is not None:
        summary["scaling"] = {
            "sizes": [p["machines"] for p in c["points"]],
            "seconds": [p["seconds_to_all_ready"] for p in c["points"]],
            "rss_mb": [p["manager_rss_after_mb"] for p in c["points"]],
            "time_fit_r2": c["fits"]["seconds_to_all_ready"]["r2"],
            "rss_fit_r2": c["fits"]["manager_rss_after_mb"]["r2"],
            "seconds_per_machine_ratio_largest_to_smallest": c[
                "seconds_per_machine_ratio_largest_to_smallest"
            ],
            "cpu_ms_per_machine_by_process": [
                p.get("cpu_ms_per_machine_by_process") or {} for p in c["points"]
            ],
        }
    if (t := inputs.get("runtime")) is not None:
        summary["runtime"] = {
            "ratio_toy_vs_raw_sequential": t["ratio_toy_vs_raw_sequential"],
            "toy_reconciles_per_s": t["toy_reconciles_per_s"],
        }
    report_floor.summarize(inputs, summary)
    met: dict[str, bool] = {}
    for key, (op, target) in TARGETS.items():
        value = lookup(summary, key)
        if value is not None:
            met[key] = meets(op, float(value), target)
    summary["targets"] = {k: f"{op} {target:g}" for k, (op, target) in TARGETS.items()}
    summary["targets_met"] = met
    summary["inputs"] = {k: (v or {}).get("when") for k, v in inputs.items() if v is not None}
    return summary


def lookup(summary: Mapping[str, Any], dotted: str) -> Any:
    node: Any = summary
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


# --- docs ----------------------------------------------------------------------------------


def _fmt(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value)


def results_section(
    summary: Mapping[str, Any], inputs: Mapping[str, dict[str, Any] | None], plots: list[str]
) -> str:
    met = summary["targets_met"]

    def row(figure: str, value: Any, limit: str, target: str) -> str:
        status = {True: "met", False: "**missed**"}.get(met.get(figure), "—")
        return f"| `{figure}` | {_fmt(value)} | {limit} | {target} | {status} |"

    s, st, r = summary.get("scaleout", {}), summary.get("steady", {}), summary.get("realvm", {})
    scale = inputs.get("scaleout") or {}
    machine: dict[str, Any] = next(
        (
            data["machine"]
            for name in ("scaleout", "steady", "scaling_curve", "machines_realvm")
            if (data := inputs.get(name)) and "machine" in data
        ),
        {},
    )
    lines = [
        f"Latest run: {max((w for w in summary['inputs'].values() if w), default='—')} on "
        f"{report_floor.machine_line(report_floor.machine_of({'machine': machine}))}. Figures "
        "from a shared, busy machine are noisy; the ratios are what carries over.",
        "",
        "| figure | capl | limit measured in the same run | target | |",
        "|---|---|---|---|---|",
        row(
            "scaleout.ratio_to_apiserver",
            s.get("ratio_to_apiserver"),
            f"a tight loop replaying the manager's writes: {_fmt(s.get('raw_machines_per_s'))} "
            f"machines/s ({_fmt(s.get('raw_writes_per_s'))} writes/s); capl "
            f"{_fmt(s.get('machines_per_s'))} machines/s; against "
            f"{scale.get('concurrency', '?')} loops "
            f"({_fmt(s.get('raw_machines_per_s_concurrent'))}/s): "
            f"{_fmt(s.get('ratio_to_apiserver_concurrent'))} (API-only; reported)",
            "—",
        ),
        row(
            "scaleout.api_writes_per_machine",
            s.get("api_writes_per_machine"),
            f"{_fmt(s.get('api_writes_per_machine_libvirtmachines'))} to the LibvirtMachine "
            "(spec + status), the rest Events",
            "<= 3",
        ),
        *report_floor.rows(summary, row, _fmt),
        row(
            "scaleout.p99_create_to_ready_s",
            s.get("p99_create_to_ready_s"),
            f"p50 {_fmt(s.get('p50_create_to_ready_s'))} s; all {_fmt(s.get('machines'))} "
            f"created at once, all Ready after {_fmt(s.get('seconds_to_all_ready'))} s",
            "—",
        ),
        row(
            "steady.cpu_percent_of_core",
            st.get("cpu_percent_of_core"),
            f"{_fmt(st.get('machines'))} Ready machines, {_fmt(st.get('seconds'))} s window",
            "< 2",
        ),
        row("steady.rss_mb", st.get("rss_mb"), "VmRSS at the end of the window", "< 400"),
        row(
            "steady.list_calls_after_start",
            st.get("list_calls_after_start"),
            f"in the window: {_fmt(st.get('api_requests_in_window'))} API requests, "
            f"{_fmt(st.get('reconciles_in_window'))} reconcile(s) "
            f"({_fmt(st.get('reconciles_in_window_by_controller'))}); the window began once "
            f"the work queues drained, {_fmt(st.get('drain_seconds_before_window'))} s after "
            f"the API went quiet ({_fmt(st.get('reconciles_while_draining'))} reconciles "
            "meanwhile)",
            "0",
        ),
        row(
            "realvm.ratio_to_virsh",
            r.get("ratio_to_virsh"),
            f"capl {_fmt(r.get('capl_wall_s'))} s vs `virsh create` + lease "
            f"{_fmt(r.get('virsh_wall_s'))} s for {_fmt(r.get('vms'))} TCG guests "
            f"(median of {_fmt(r.get('rounds'))} paired rounds)",
            "<= 1.0",
        ),
        *report_migration.rows(summary.get("migration", {}), row, _fmt),
        *report_realnode.rows(summary.get("realnode", {}), row, _fmt),
    ]
    lines += report_migration.paragraph(summary.get("migration", {}), _fmt)
    lines += report_realnode.paragraph(summary.get("realnode", {}), _fmt)
    if "scaling" in summary:
        sc = summary["scaling"]
        lines += [
            "",
            f"Scaling curve: {', '.join(str(n) for n in sc['sizes'])} machines took "
            f"{', '.join(_fmt(x) for x in sc['seconds'])} s (R² of the straight line "
            f"{sc['time_fit_r2']:.4f}; seconds per machine at the largest size / at the "
            f"smallest: {_fmt(sc['seconds_per_machine_ratio_largest_to_smallest'])}); manager "
            f"RSS {', '.join(_fmt(x) for x in sc['rss_mb'])} MB (R² {sc['rss_fit_r2']:.4f}).",
        ]
        cpu = sc.get("cpu_ms_per_machine_by_process") or []
        if cpu and cpu[0] and cpu[-1]:
            parts = [
                f"{name} {_fmt(cpu[0].get(name))} → {_fmt(cpu[-1].get(name))}"
                for name in sorted(cpu[-1], key=lambda k: -cpu[-1][k])
            ]
            lines += [
                "",
                f"CPU milliseconds per machine, {sc['sizes'][0]} → {sc['sizes'][-1]} machines: "
                + "; ".join(parts)
                + ". A process whose cost per machine grows with N makes the total grow "
                "faster than linearly.",
            ]
    if "runtime" in summary:
        rt = summary["runtime"]
        lines += [
            "",
            f"Runtime (toy controller): {_fmt(rt['toy_reconciles_per_s'])} reconciles/s, "
            f"ratio to raw patches {_fmt(rt['ratio_toy_vs_raw_sequential'])} (target >= 0.8).",
        ]
    timings = load("timings")
    if timings is not None:
        walls = ", ".join(
            f"{name} {w['seconds']} s" + ("" if w["status"] == "ok" else f" ({w['status']})")
            for name, w in timings["benchmarks"].items()
        )
        lines += [
            "",
            f"`make bench` wall time: {timings['total_seconds']} s (budget "
            f"{timings['budget_seconds']} s), set-up included: {walls}; load average at the "
            f"end {', '.join(str(x) for x in timings['loadavg_at_end'])}.",
        ]
    measured = ", ".join(f"{k} {v}" for k, v in summary["inputs"].items())
    lines += [
        "",
        f"Measured at: {measured}. The numbers in full: `bench/results/*.json`; "
        "`summary.json` holds the table.",
    ]
    if plots:
        lines += [
            "",
            "The plots below are written by `make bench` into `bench/results/` (SVG, "
            "committed with the JSON files of the same run); each names the machine it was "
            "measured on.",
        ]
    for name in plots:
        caption = CAPTIONS.get(name.removesuffix(".svg"), "")
        lines += ["", f"![{name.removesuffix('.svg')}](../bench/results/{name})"]
        if caption:
            lines += ["", f"*{caption}*"]
    return "\n".join(lines)


CAPTIONS = {
    "scaleout": "Left: machines per second through the capl manager, against a tight loop "
    "sending the same API writes to the same API server. Right: create-to-Ready per machine.",
    "steady": "The manager with N Ready machines and nothing to do: CPU, memory and LIST "
    "requests against their targets.",
    "realvm": "Real TCG guests: capl (Secrets, Machines, LibvirtMachines to Ready) against a "
    "script that boots the same image with `virsh create` until the DHCP lease, per round.",
    "scaling_curve": "Time to Ready and manager memory against the number of machines, with "
    "the least-squares line: linear growth keeps the points on it.",
    "runtime": "capl's controller runtime with a toy reconciler against raw status patches.",
    "cpu_split": "CPU milliseconds per machine by process for the headline scale-out: capl "
    "(manager, libvirtd, kube-apiserver, etcd, the benchmark's load and watch) against the work "
    "floor (the same libvirt calls and API writes by a tight script, one loop and capl's "
    "concurrency); dots: wall time per machine.",
    "migration": report_migration.CAPTION,
    "realnode": report_realnode.CAPTION,
}


def update_docs(section: str) -> bool:
    if not DOCS.exists():
        return False
    text = DOCS.read_text()
    begin = BEGIN.search(text)
    end = text.find(END)
    if begin is None or end < begin.end():
        print(f"report: {DOCS} has no results markers; not updated", file=sys.stderr)
        return False
    DOCS.write_text(text[: begin.end()] + "\n\n" + section + "\n\n" + text[end:])
    return True


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--require",
        default="",
        help="comma-separated summary groups that must be present (e.g. scaleout,steady,realvm)",
    )
    parser.add_argument("--no-docs", action="store_true", help="leave docs/benchmarks.md alone")
    args = parser.parse_args(argv)
    names: tuple[str, ...] = ("runtime", "machines_testdriver", "scaleout", "steady")
    names += ("machines_realvm", "migration", "realnode")
    inputs = {name: load(name) for name in (*names, "scaling_curve", "floor")}
    for name, data in inputs.items():
        line = report_floor.machine_line(report_floor.machine_of(data))
        if line:
            MACHINE[{"machines_realvm": "realvm"}.get(name, name)] = line
            MACHINE.setdefault("default", line)
    if "scaleout" in MACHINE:
        MACHINE["cpu_split"] = MACHINE["scaleout"]
    summary = summarize(inputs)
    required = {g.strip() for g in args.require.split(",") if g.strip()}
    missing = [
        key for key in REQUIRED if key.split(".")[0] in required and lookup(summary, key) is None
    ]
    missing += [g for g in required if g not in summary]
    plots: list[str] = []
    for name, plot in (
        ("scaleout", report_plots.plot_scaleout),
        ("steady", report_plots.plot_steady),
        ("machines_realvm", report_plots.plot_realvm),
        ("migration", lambda m: report_migration.plot(m, plt, save)),
        ("realnode", lambda n: report_realnode.plot(n, plt, save)),
        ("scaling_curve", report_plots.plot_scaling),
        ("runtime", report_plots.plot_runtime),
        ("floor", lambda f: report_floor.plot_cpu_split(inputs["scaleout"] or {}, f, plt, save)),
    ):
        data = inputs.get(name)
        if data is not None and (name != "floor" or inputs.get("scaleout") is not None):
            plots.append(plot(data))
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"wrote {RESULTS / 'summary.json'} and {', '.join(plots) or 'no plots'}")
    if not args.no_docs and update_docs(results_section(summary, inputs, plots)):
        print(f"updated the results section of {DOCS}")
    for key in REQUIRED:
        value = lookup(summary, key)
        target = TARGETS.get(key)
        verdict = ""
        if target is not None and value is not None:
            verdict = " (met)" if meets(target[0], float(value), target[1]) else " (MISSED)"
        print(
            f"  {key}: {_fmt(value)}"
            + (f"  target {target[0]} {target[1]:g}" if target else "")
            + verdict
        )
    if missing:
        print(f"report: missing figures: {', '.join(sorted(missing))}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
