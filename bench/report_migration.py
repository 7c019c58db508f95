"""The migration benchmark's part of the report (bench/report.py): its `migration.*` figures
in summary.json, its rows in docs/benchmarks.md and its plot, from
bench/results/migration.json (bench/migration.py).

    migration.capl_seconds       median, LibvirtMachineMigration created -> Succeeded
    migration.virsh_seconds      median, hand preparation + `virsh migrate --copy-storage-inc`
    migration.ratio_to_virsh     median of the per-repetition ratios capl / virsh (<= 1.2)
    migration.capl_downtime_ms   median of status.state.downtimeMs
    migration.virsh_downtime_ms  median of `domjobinfo --completed` "Total downtime"
    migration.downtime_ratio     median of the per-repetition ratios
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

TARGETS: dict[str, tuple[str, float]] = {"migration.ratio_to_virsh": ("<=", 1.2)}
REQUIRED = (
    "migration.capl_seconds",
    "migration.virsh_seconds",
    "migration.ratio_to_virsh",
    "migration.capl_downtime_ms",
    "migration.virsh_downtime_ms",
    "migration.downtime_ratio",
)
CAPTION = (
    "Live migration kvm1 ⇄ kvm2 with storage copy, per repetition: capl (a "
    "LibvirtMachineMigration to Succeeded, split into its phases as a watch saw them) against "
    "the hand preparation + `virsh migrate` of a guest of the same shape; right: the guest's "
    "downtime on each side."
)
PHASES = ("scheduling", "handshake", "preparation", "running", "finalizing")


def summarize(m: Mapping[str, Any]) -> dict[str, Any]:
    machine = dict(m.get("machine") or {})
    hosts = m.get("hosts") or {}
    if hosts.get("running_hypervisor"):
        machine["hypervisor"] = hosts["running_hypervisor"]
    return {
        "repetitions": m["repetitions"],
        "capl_seconds": m["capl_seconds"],
        "virsh_seconds": m["virsh_seconds"],
        "ratio_to_virsh": m["ratio_to_virsh"],
        "ratio_of_medians": m.get("ratio_of_medians"),
        "capl_downtime_ms": m["capl_downtime_ms"],
        "virsh_downtime_ms": m["virsh_downtime_ms"],
        "downtime_ratio": m["downtime_ratio"],
        "capl_job_seconds": m.get("capl_job_seconds"),
        "virsh_job_seconds": m.get("virsh_job_seconds"),
        "capl_split_seconds": m.get("capl_split_seconds"),
        "capl_steps_seconds": m.get("capl_steps_seconds"),
        "capl_migrate_call_seconds": m.get("capl_migrate_call_seconds"),
        "virsh_prepare_seconds": m.get("virsh_prepare_seconds"),
        "virsh_migrate_seconds": m.get("virsh_migrate_seconds"),
        "capl_outside_job_seconds": m.get("capl_outside_job_seconds"),
        "virsh_outside_job_seconds": m.get("virsh_outside_job_seconds"),
        "machine": machine,
    }


def rows(
    g: Mapping[str, Any], row: Callable[[str, Any, str, str], str], fmt: Callable[[Any], str]
) -> list[str]:
    if not g:
        return [row("migration.ratio_to_virsh", None, "not measured", "<= 1.2")]
    return [
        row(
            "migration.ratio_to_virsh",
            g.get("ratio_to_virsh"),
            f"capl {fmt(g.get('capl_seconds'))} s (LibvirtMachineMigration created → Succeeded)"
            f" vs hand preparation + `virsh migrate --copy-storage-inc` "
            f"{fmt(g.get('virsh_seconds'))} s: a TCG guest, 256 MiB, kvm1 ⇄ kvm2 over qemu+tls "
            f"with storage copy (median of {fmt(g.get('repetitions'))} paired moves)",
            "<= 1.2",
        ),
        row(
            "migration.downtime_ratio",
            g.get("downtime_ratio"),
            f"the guest's downtime: capl {fmt(g.get('capl_downtime_ms'))} ms vs virsh "
            f"{fmt(g.get('virsh_downtime_ms'))} ms (libvirt's completed job statistics)",
            "—",
        ),
    ]


def paragraph(g: Mapping[str, Any], fmt: Callable[[Any], str]) -> list[str]:
    """Where capl's time goes, below the table."""
    if not g:
        return []
    split = g.get("capl_split_seconds") or {}
    phases = ", ".join(f"{p} {fmt(split.get(p))}" for p in PHASES)
    return [
        "",
        f"Live migration, medians per move: capl {fmt(g.get('capl_seconds'))} s = its own "
        f"steps {fmt(g.get('capl_steps_seconds'))} s + the `migrate3` call "
        f"{fmt(g.get('capl_migrate_call_seconds'))} s (libvirt's job "
        f"{fmt(g.get('capl_job_seconds'))} s of it, the rest "
        f"{fmt(g.get('capl_outside_job_seconds'))} s: connections, the incoming QEMU, "
        f"Finish/Confirm, capl's checks after the job); virsh {fmt(g.get('virsh_seconds'))} s "
        "= preparation "
        f"{fmt(g.get('virsh_prepare_seconds'))} s + `virsh migrate` "
        f"{fmt(g.get('virsh_migrate_seconds'))} s (job {fmt(g.get('virsh_job_seconds'))} s, "
        f"the rest {fmt(g.get('virsh_outside_job_seconds'))} s). capl's phases as its watch "
        f"saw them (s): {phases}.",
    ]


def plot(m: Mapping[str, Any], plt: Any, save: Callable[[Any, str], str]) -> str:
    reps = m["per_rep"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    xs = list(range(1, len(reps) + 1))
    width = 0.38
    bottom = [0.0] * len(reps)
    colors = ("#9ecae1", "#6baed6", "#4292c6", "#2171b5", "#08519c")
    for phase, color in zip(PHASES, colors, strict=True):
        values = [r["capl"]["split_s"].get(phase) or 0.0 for r in reps]
        left.bar([x + width / 2 for x in xs], values, width, bottom=bottom, color=color,
                 label=f"capl: {phase}")  # fmt: skip
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    prep = [r["virsh"]["prepare_s"] for r in reps]
    left.bar([x - width / 2 for x in xs], prep, width, color="#bbbbbb",
             label="virsh: preparation")  # fmt: skip
    left.bar([x - width / 2 for x in xs], [r["virsh"]["migrate_s"] for r in reps], width,
             bottom=prep, color="#777777", label="virsh: migrate")  # fmt: skip
    left.set_xticks(xs, [f"{r['capl']['from']}→{r['capl']['to']}" for r in reps])
    left.set_ylabel("seconds")
    left.set_title(
        f"ratio capl / virsh {m['ratio_to_virsh']} (target <= 1.2), {len(reps)} moves per side",
        fontsize=10,
    )
    left.legend(fontsize=7, ncol=2)
    right.bar([x - width / 2 for x in xs], [r["virsh"]["downtime_ms"] or 0 for r in reps],
              width, color="#999999", label="virsh")  # fmt: skip
    right.bar([x + width / 2 for x in xs], [r["capl"]["downtime_ms"] or 0 for r in reps],
              width, color="#3b7dd8", label="capl")  # fmt: skip
    right.set_xticks(xs, [str(x) for x in xs])
    right.set_xlabel("repetition")
    right.set_ylabel("guest downtime, ms")
    right.set_title(f"downtime ratio {m['downtime_ratio']}", fontsize=10)
    right.legend(fontsize=8)
    return save(fig, "migration")
