"""bench/report.py's part for issue 16: the work floor, the layout, the manager's own cost per
machine, the 10,000-machine steady state and the scaling curve's per-machine cost ratio —
their summary figures, targets, table rows, the per-process CPU plot (capl against the floor)
and the machine every figure was measured on.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

TARGETS: dict[str, tuple[str, float]] = {
    "scaleout.manager_cpu_ms_per_machine": ("<=", 7.0),
    "scaleout.manager_cpu_ratio_to_issue9": ("<=", 0.5),
    "scaleout.libvirt_calls_per_machine": ("<=", 15.0),
    "scaleout.api_writes_per_machine": ("<=", 3.0),
    "steady.machines": (">=", 10000.0),
    "scaling.per_machine_cost_ratio": ("<=", 1.25),
}
REQUIRED = (
    "scaleout.ratio_to_floor",
    "scaleout.clusters",
    "scaleout.machines",
    "scaleout.manager_cpu_ms_per_machine",
    "scaleout.manager_cpu_ratio_to_issue9",
    "scaleout.libvirt_calls_per_machine",
    "scaling.per_machine_cost_ratio",
)
LOADED = 0.5
"""1-minute load per CPU at a benchmark's start above which its figures are marked as
measured under load (other work on the machine: the benchmark's own load starts after)."""


def machine_of(data: Mapping[str, Any] | None) -> dict[str, Any]:
    """The machine a figure was measured on; ``under_load`` from the load when the whole run
    started (before its own work) where known, else when the benchmark started (which also
    holds the decay of the benchmark run before it)."""
    machine = dict((data or {}).get("machine") or {})
    start = machine.get("loadavg_at_run_start") or machine.get("loadavg_at_start")
    if start and machine.get("cpus"):
        machine["under_load"] = start[0] / machine["cpus"] > LOADED
    return machine


def machine_line(machine: Mapping[str, Any]) -> str:
    if not machine:
        return ""
    load = machine.get("loadavg_at_start") or machine.get("loadavg_at_end") or []
    text = (
        f"{machine.get('cpus', '?')} CPUs, kernel {machine.get('kernel', '?')}, libvirt "
        f"{machine.get('libvirt', '?')}, Python {machine.get('python', '?')}, loadavg at start "
        f"{' '.join(str(x) for x in load) or '?'}"
    )
    run = machine.get("loadavg_at_run_start")
    if run:
        text += f" (at the start of the whole run, before its own work: {' '.join(map(str, run))})"
    if machine.get("under_load"):
        text += " — MEASURED UNDER LOAD (other work on the machine)"
    return text


def summarize(inputs: Mapping[str, dict[str, Any] | None], summary: dict[str, Any]) -> None:
    """Adds issue 16's figures to `summary` (in place)."""
    s = inputs.get("scaleout")
    f = inputs.get("floor")
    if s is not None and "scaleout" in summary:
        out = summary["scaleout"]
        out["clusters"] = s.get("clusters", 1)
        out["machines"] = s["machines"]
        net = s.get("manager_cpu_ms_per_machine_without_trace")
        out["manager_cpu_ms_per_machine"] = (
            net if net is not None else s.get("manager_cpu_ms_per_machine")
        )
        out["manager_cpu_ms_per_machine_with_trace"] = s.get("manager_cpu_ms_per_machine")
        out["trace_cpu_ms_per_machine"] = s.get("trace_cpu_ms_per_machine")
        _machine_speed(s, out)
        out["libvirt_calls_per_machine"] = s.get("libvirt_calls_per_machine")
        _issue9(s.get("baseline") or {}, out)
        for key in ("ratio_to_floor", "ratio_to_floor_concurrent"):
            if key in s:
                out[key] = s[key]
        out["floor_machines_per_s"] = s.get("floor_machines_per_s_sequential")
        out["floor_machines_per_s_concurrent"] = s.get("floor_machines_per_s_concurrent")
        if f is not None:
            out["floor_source"] = f.get("source")
            out["floor_outcome_mismatches"] = sum(  # both passes, their set-up included
                (f.get(run) or {}).get(part, {}).get("outcome_mismatches", 0)
                for run in ("sequential", "concurrent")
                for part in ("replay", "setup_replay")
            )
            _floor_script_cpu(f, s["machines"], out)
        others = s.get("other_layouts") or []
        if others:
            o = others[0]
            out["one_network"] = {
                "clusters": o.get("clusters", 1),
                "machines": o["machines"],
                "machines_per_s": o["machines_per_s"],
                "ratio_to_apiserver": o["ratio_to_apiserver"],
                "manager_cpu_ms_per_machine": o.get("manager_cpu_ms_per_machine"),
                "libvirtd_cpu_ms_per_machine": round(
                    1000
                    * (o.get("cpu_seconds_by_process") or {}).get("libvirtd", 0.0)
                    / o["machines"],
                    2,
                ),
            }
        out["machine"] = machine_of(s)
    c = inputs.get("scaling_curve")
    if c is not None and "scaling" in summary:
        sc = summary["scaling"]
        sc["per_machine_cost_ratio"] = c.get(
            "per_machine_cost_ratio", c.get("seconds_per_machine_ratio_largest_to_smallest")
        )
        sc["clusters"] = [p.get("clusters", 1) for p in c["points"]]
        sc["manager_cpu_ms_per_machine"] = [
            p.get("manager_cpu_ms_per_machine") for p in c["points"]
        ]
        sc["machine"] = machine_of(c)
    st = inputs.get("steady")
    if st is not None and "steady" in summary:
        summary["steady"]["clusters"] = st.get("clusters", 1)
        summary["steady"]["machine"] = machine_of(st)


FLOOR_SCRIPT = "floor script (this process)"


def _machine_speed(s: Mapping[str, Any], out: dict[str, Any]) -> None:
    """The kube-apiserver's CPU per machine in the headline run, and the manager's per
    kube-apiserver ms: on these shared machines the CPU time of the same work moves by a
    third between runs minutes apart, and the two processes' move together, so the second
    figure says whether a change in the first is the manager's or the machine's."""
    n = s.get("machines") or 0
    apiserver = (s.get("cpu_seconds_by_process") or {}).get("kube-apiserver")
    manager = out.get("manager_cpu_ms_per_machine")
    if not n or not apiserver:
        return
    per_machine = 1000 * apiserver / n
    out["kube_apiserver_cpu_ms_per_machine"] = round(per_machine, 2)
    if manager is not None:
        out["manager_cpu_per_kube_apiserver_cpu"] = round(manager / per_machine, 3)


def _issue9(b: Mapping[str, Any], out: dict[str, Any]) -> None:
    """The same-run comparison with the manager issue 9 measured (bench/baseline.py)."""
    if b.get("manager_cpu_ratio") is None:
        if b.get("missing"):
            out["issue9_baseline"] = {"ref": b.get("ref"), "missing": b["missing"]}
        return
    out["manager_cpu_ratio_to_issue9"] = b["manager_cpu_ratio"]
    out["issue9_baseline"] = {
        "commit": b.get("commit"),
        "layout": b.get("layout"),
        "manager_cpu_ms_per_machine": (b.get("baseline") or {}).get("manager_cpu_ms_per_machine"),
        "current_manager_cpu_ms_per_machine": (b.get("current") or {}).get(
            "manager_cpu_ms_per_machine"
        ),
        "ratio_per_kube_apiserver": b.get("manager_cpu_ratio_per_kube_apiserver"),
        "rounds": b.get("rounds", 1),
        "kube_apiserver_cpu_ms_per_machine": [
            (b.get(side) or {}).get("cpu_ms_per_machine_by_process", {}).get("kube-apiserver")
            for side in ("baseline", "current")
        ],
    }


def _floor_script_cpu(f: Mapping[str, Any], machines: int, out: dict[str, Any]) -> None:
    """The floor script's own CPU per machine (the same API writes and libvirt calls made by a
    tight Python loop, same run) and the manager's CPU against it: how much of the manager's
    cost is the work itself, which no provider written on these libraries can avoid."""
    for key, name in (("sequential", ""), ("concurrent", "_concurrent")):
        seconds = ((f.get(key) or {}).get("cpu_seconds_by_process") or {}).get(FLOOR_SCRIPT)
        if seconds is not None and machines:
            out[f"floor_script_cpu_ms_per_machine{name}"] = round(1000 * seconds / machines, 2)
    script = out.get("floor_script_cpu_ms_per_machine_concurrent")
    manager = out.get("manager_cpu_ms_per_machine")
    if script and manager is not None:
        out["manager_cpu_ratio_to_floor_script"] = round(manager / script, 2)


Row = Callable[[str, Any, str, str], str]
Fmt = Callable[[Any], str]


def _issue9_limit(b: Mapping[str, Any], fmt: Fmt) -> str:
    if b.get("missing"):
        return f"the manager of {b.get('ref')} could not run: {b['missing']}"
    apiserver = b.get("kube_apiserver_cpu_ms_per_machine") or [None, None]
    return (
        f"the manager issue 9 measured ({str(b.get('commit') or '?')[:8]}) on the same "
        f"{fmt(b.get('layout'))} layout, alternating with this one ({fmt(b.get('rounds'))} "
        f"run(s) each), both untraced: {fmt(b.get('manager_cpu_ms_per_machine'))} ms/machine "
        f"against {fmt(b.get('current_manager_cpu_ms_per_machine'))} (kube-apiserver "
        f"meanwhile: {fmt(apiserver[0])} and {fmt(apiserver[1])} ms/machine; the ratio of the "
        f"two managers' CPU per kube-apiserver CPU: {fmt(b.get('ratio_per_kube_apiserver'))})"
    )


def rows(summary: Mapping[str, Any], row: Row, fmt: Fmt) -> list[str]:
    s = summary.get("scaleout", {})
    one = s.get("one_network") or {}
    sc = summary.get("scaling", {})
    return [
        row(
            "scaleout.ratio_to_floor",
            s.get("ratio_to_floor"),
            f"the work floor: capl's recorded libvirt calls and API writes for the same "
            f"{fmt(s.get('machines'))} machines ({fmt(s.get('clusters'))} clusters) replayed "
            f"by a tight script: {fmt(s.get('floor_machines_per_s'))} machines/s (one loop), "
            f"{fmt(s.get('floor_machines_per_s_concurrent'))}/s (capl's concurrency; ratio "
            f"{fmt(s.get('ratio_to_floor_concurrent'))}); capl {fmt(s.get('machines_per_s'))}/s",
            "—",
        ),
        row(
            "scaleout.manager_cpu_ms_per_machine",
            s.get("manager_cpu_ms_per_machine"),
            f"/proc/<pid>/stat of the manager, create to Ready, less the call recording's own "
            f"{fmt(s.get('trace_cpu_ms_per_machine'))} ms (with it: "
            f"{fmt(s.get('manager_cpu_ms_per_machine_with_trace'))}); the kube-apiserver took "
            f"{fmt(s.get('kube_apiserver_cpu_ms_per_machine'))} ms per machine in the same run "
            f"(the manager {fmt(s.get('manager_cpu_per_kube_apiserver_cpu'))} ms per "
            f"kube-apiserver ms: both move with the machine's speed); untraced, per size: "
            f"{', '.join(fmt(x) for x in sc.get('manager_cpu_ms_per_machine') or [])} "
            f"(scaling curve); the floor script's own CPU for the same work: "
            f"{fmt(s.get('floor_script_cpu_ms_per_machine_concurrent'))} ms/machine at capl's "
            f"concurrency ({fmt(s.get('floor_script_cpu_ms_per_machine'))} in one loop), "
            f"the manager {fmt(s.get('manager_cpu_ratio_to_floor_script'))} times that",
            "<= 7",
        ),
        row(
            "scaleout.manager_cpu_ratio_to_issue9",
            s.get("manager_cpu_ratio_to_issue9"),
            _issue9_limit(s.get("issue9_baseline") or {}, fmt),
            "<= 0.5",
        ),
        row(
            "scaleout.libvirt_calls_per_machine",
            s.get("libvirt_calls_per_machine"),
            "every libvirt call of the manager from the first create until it went quiet "
            "(cluster health checks included), / N",
            "<= 15",
        ),
        row(
            "scaleout.one_network.machines_per_s",
            one.get("machines_per_s"),
            f"{fmt(one.get('machines'))} machines on one network: ratio to the API-only "
            f"replay {fmt(one.get('ratio_to_apiserver'))}, manager "
            f"{fmt(one.get('manager_cpu_ms_per_machine'))} ms/machine, libvirtd "
            f"{fmt(one.get('libvirtd_cpu_ms_per_machine'))} ms/machine",
            "—",
        ),
        row(
            "steady.machines",
            summary.get("steady", {}).get("machines"),
            f"Ready machines across {fmt(summary.get('steady', {}).get('clusters'))} clusters "
            "during the steady window",
            ">= 10000",
        ),
        row(
            "scaling.per_machine_cost_ratio",
            sc.get("per_machine_cost_ratio"),
            f"seconds per machine at {fmt((sc.get('sizes') or [None])[-1])} / at "
            f"{fmt((sc.get('sizes') or [None])[0])} machines (clusters of 100)",
            "<= 1.25",
        ),
    ]


PROCESSES = ("manager", "libvirtd", "kube-apiserver", "etcd", "load")


def _process_key(name: str) -> str:
    if name.startswith("benchmark"):
        return "load"
    if name.startswith("floor script"):
        return "manager"
    return name


def plot_cpu_split(s: Mapping[str, Any], f: Mapping[str, Any], plt: Any, save: Any) -> str:
    """Per-process CPU ms per machine: capl's run against the floor's two passes."""
    n = s["machines"]
    columns = {
        "capl": s.get("cpu_seconds_by_process") or {},
        "floor, 1 loop": f["sequential"]["cpu_seconds_by_process"],
        f"floor, {f['concurrent']['loops']} loops": f["concurrent"]["cpu_seconds_by_process"],
    }
    walls = [
        s["seconds_to_all_ready"],
        f["sequential"]["seconds"],
        f["concurrent"]["seconds"],
    ]
    fig, ax = plt.subplots(figsize=(8.5, 4.8))
    labels = list(columns)
    bottom = [0.0] * len(labels)
    names = {
        "manager": "capl manager / floor script",
        "libvirtd": "libvirtd",
        "kube-apiserver": "kube-apiserver",
        "etcd": "etcd",
        "load": "load generator and watch",
    }
    for proc in PROCESSES:
        values = []
        for col in columns.values():
            total = sum(v for k, v in col.items() if _process_key(k) == proc)
            values.append(1000 * total / n)
        ax.bar(labels, values, bottom=bottom, label=names[proc])
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.plot(labels, [1000 * w / n for w in walls], "o", color="black", label="wall ms per machine")
    ax.set_ylabel("CPU ms per machine")
    ax.set_ylim(0, max(max(bottom), 1000 * max(walls) / n) * 1.35)
    ax.set_title(
        f"{n} machines, {s.get('clusters', 1)} clusters: CPU by process, capl against the floor",
        fontsize=10,
    )
    ax.legend(fontsize=8, loc="upper right", ncol=2)
    return str(save(fig, "cpu_split"))
