"""The real-node benchmark's part of the report (bench/report.py): its `realnode.*` figures in
summary.json, its row in docs/benchmarks.md and its plot, from bench/results/realnode.json
(bench/realnode.py).

    realnode.capl_seconds       median: MachineDeployment scaled 0 -> 1 until the Node is Ready
    realnode.kubeadm_seconds    median: token + Ignition + libvirt objects by hand until the
                                Node is Ready (a plain `kubeadm join` in the guest)
    realnode.ratio_to_kubeadm   median of the per-round ratios capl / kubeadm (<= 1.15, as
                                realvm.ratio_to_virsh: the issue names no number)
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping
from typing import Any

TARGETS: dict[str, tuple[str, float]] = {"realnode.ratio_to_kubeadm": ("<=", 1.15)}
REQUIRED = ("realnode.capl_seconds", "realnode.kubeadm_seconds", "realnode.ratio_to_kubeadm")
CAPTION = (
    "Real Kubernetes nodes (TCG guests of the node image, Ignition), per round: capl (a "
    "MachineDeployment scaled 0 → 1: Cluster API, the kubeadm bootstrap provider, capl's "
    "machine controller, the guest's boot and `kubeadm join`) against the same image joined by "
    "hand (a bootstrap token, an Ignition config running `kubeadm join`, the libvirt objects "
    "made with libvirt-python), each until its Node is Ready; the segments are the steps "
    "each side passed."
)
SIDES = ("capl", "kubeadm")


def _median_steps(rounds: list[Mapping[str, Any]], side: str) -> dict[str, float]:
    steps: dict[str, list[float]] = {}
    for r in rounds:
        for step, seconds in r[side]["steps_s"].items():
            steps.setdefault(step, []).append(seconds)
    return {k: round(statistics.median(v), 2) for k, v in steps.items()}


def summarize(n: Mapping[str, Any]) -> dict[str, Any]:
    rounds = n["per_round"]
    return {
        "rounds": n["rounds"],
        "capl_seconds": n["capl_seconds"],
        "kubeadm_seconds": n["kubeadm_seconds"],
        "ratio_to_kubeadm": n["ratio_to_kubeadm"],
        "ratio_of_medians": n.get("ratio_of_medians"),
        "capl_steps_s": _median_steps(rounds, "capl"),
        "kubeadm_steps_s": _median_steps(rounds, "kubeadm"),
        "guest": n.get("guest"),
        "wall_s": n.get("total_s"),
    }


def rows(
    g: Mapping[str, Any], row: Callable[[str, Any, str, str], str], fmt: Callable[[Any], str]
) -> list[str]:
    if not g:
        return [row("realnode.ratio_to_kubeadm", None, "not measured", "<= 1.15")]
    guest = g.get("guest") or {}
    return [
        row(
            "realnode.ratio_to_kubeadm",
            g.get("ratio_to_kubeadm"),
            f"capl {fmt(g.get('capl_seconds'))} s (MachineDeployment 0 → 1 → Node Ready) vs "
            f"a hand-run `kubeadm join` {fmt(g.get('kubeadm_seconds'))} s (token, Ignition, "
            f"overlay, domain by hand → Node Ready): the node image, "
            f"{fmt(guest.get('cpus'))} vCPUs, {fmt(guest.get('memory_mib'))} MiB, TCG, "
            f"Ignition (median of {fmt(g.get('rounds'))} paired round(s))",
            "<= 1.15",
        ),
    ]


def paragraph(g: Mapping[str, Any], fmt: Callable[[Any], str]) -> list[str]:
    """The steps each side passed, below the table."""
    if not g:
        return []

    def steps(side: str) -> str:
        marks = g.get(f"{side}_steps_s") or {}
        return ", ".join(f"{step} {fmt(seconds)}" for step, seconds in marks.items())

    return [
        "",
        f"Real node, medians of the steps (s since the start): capl: {steps('capl')}; "
        f"kubeadm by hand: {steps('kubeadm')}. The benchmark's wall time, set-up and clean-up "
        f"included: {fmt(g.get('wall_s'))} s.",
    ]


def plot(n: Mapping[str, Any], plt: Any, save: Callable[[Any, str], str]) -> str:
    rounds = n["per_round"]
    fig, ax = plt.subplots(figsize=(9, 2.8 + 1.1 * len(rounds)))
    colors = {"capl": ("#c6dbef", "#6baed6", "#3182bd", "#08519c", "#08306b"),
              "kubeadm": ("#e0e0e0", "#bdbdbd", "#969696", "#636363", "#252525")}  # fmt: skip
    labels: list[str] = []
    y = 0.0
    for i, r in enumerate(rounds):
        for side in SIDES:
            start = 0.0
            for k, (step, end) in enumerate(sorted(r[side]["steps_s"].items(), key=lambda s: s[1])):
                color = colors[side][min(k, len(colors[side]) - 1)]
                label = f"{side}: until {step}"
                ax.barh(y, end - start, left=start, color=color,
                        label=label if label not in labels else None)  # fmt: skip
                labels.append(label)
                start = end
            ax.text(start, y, f" {start:.0f} s", va="center", fontsize=8)
            y += 1
        if i < len(rounds) - 1:
            y += 0.5
    ticks = [f"round {i + 1} {side}" for i in range(len(rounds)) for side in SIDES]
    positions = [i * 2.5 + j for i in range(len(rounds)) for j in range(2)]
    ax.set_yticks(positions, ticks)
    ax.invert_yaxis()
    ax.set_xlabel("seconds from the start until the Node is Ready")
    ax.set_title(
        f"real node: ratio capl / kubeadm join {n['ratio_to_kubeadm']} (target <= 1.15)",
        fontsize=10,
    )
    ax.legend(fontsize=7, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.3))
    return save(fig, "realnode")
