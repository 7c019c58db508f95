"""The same-run comparison with issue 9's manager (bench/baseline.py) and its summary figure."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import report_floor
from bench.baseline import ISSUE9_REF, BaselineMissing, _side, checkout


def test_the_earlier_commit_is_checked_out_as_a_package_to_put_on_pythonpath(
    tmp_path: Path,
) -> None:
    try:
        commit, root = checkout(ISSUE9_REF, tmp_path)
    except BaselineMissing as exc:  # a shallow clone: what the benchmark reports then
        pytest.skip(str(exc))
    assert commit.startswith(ISSUE9_REF)
    assert len(commit) == 40
    assert (root / "capl" / "__init__.py").is_file()
    assert (root / "capl" / "manager.py").is_file()
    assert not (root / "tests").exists()  # the package only


def test_a_commit_not_in_the_history_is_reported_with_its_reason(tmp_path: Path) -> None:
    with pytest.raises(BaselineMissing, match="deadbeef0 is not in this checkout's history"):
        checkout("deadbeef0", tmp_path)
    assert list(tmp_path.iterdir()) == []


def _summary(baseline: dict[str, object]) -> dict[str, object]:
    scaleout = {"machines": 1000, "clusters": 10, "baseline": baseline}
    summary: dict[str, dict[str, object]] = {"scaleout": {}}
    report_floor.summarize({"scaleout": scaleout}, summary)
    return summary["scaleout"]


def test_the_ratio_to_issue9_is_a_summary_figure_with_a_target() -> None:
    out = _summary(
        {
            "commit": "31af5423c5e01b32026314e4b6dab4dace2ad22e",
            "layout": "10x100",
            "manager_cpu_ratio": 0.48,
            "manager_cpu_ratio_per_kube_apiserver": 0.483,
            "rounds": 2,
            "baseline": {
                "manager_cpu_ms_per_machine": 13.6,
                "cpu_ms_per_machine_by_process": {"kube-apiserver": 21.0},
            },
            "current": {
                "manager_cpu_ms_per_machine": 6.5,
                "cpu_ms_per_machine_by_process": {"kube-apiserver": 20.8},
            },
        }
    )
    assert out["manager_cpu_ratio_to_issue9"] == 0.48
    assert out["issue9_baseline"] == {
        "commit": "31af5423c5e01b32026314e4b6dab4dace2ad22e",
        "layout": "10x100",
        "manager_cpu_ms_per_machine": 13.6,
        "current_manager_cpu_ms_per_machine": 6.5,
        "ratio_per_kube_apiserver": 0.483,
        "rounds": 2,
        "kube_apiserver_cpu_ms_per_machine": [21.0, 20.8],
    }
    assert report_floor.TARGETS["scaleout.manager_cpu_ratio_to_issue9"] == ("<=", 0.5)


def test_a_missing_comparison_is_no_figure_but_says_why() -> None:
    out = _summary({"ref": "31af542", "missing": "commit 31af542 is not in this checkout"})
    assert "manager_cpu_ratio_to_issue9" not in out
    assert out["issue9_baseline"] == {
        "ref": "31af542",
        "missing": "commit 31af542 is not in this checkout",
    }


def test_each_side_is_the_mean_of_its_runs_per_process() -> None:
    """A process missing from a run's reading does not count as zero."""
    runs = [
        {"manager_cpu_ms_per_machine": 12.0, "cpu_ms_per_machine_by_process": {"manager": 12.0}},
        {
            "manager_cpu_ms_per_machine": 14.0,
            "cpu_ms_per_machine_by_process": {"manager": 14.0, "kube-apiserver": 20.0},
        },
    ]
    side = _side(runs)
    assert side["manager_cpu_ms_per_machine"] == 13.0
    assert side["cpu_ms_per_machine_by_process"] == {"kube-apiserver": 20.0, "manager": 13.0}
    assert side["runs"] == runs


def test_the_headline_run_reports_the_kube_apiservers_cpu_beside_the_managers() -> None:
    scaleout = {
        "machines": 1000,
        "clusters": 10,
        "manager_cpu_ms_per_machine": 7.06,
        "manager_cpu_ms_per_machine_without_trace": 6.7,
        "cpu_seconds_by_process": {"manager": 7.06, "kube-apiserver": 18.41},
    }
    summary: dict[str, dict[str, object]] = {"scaleout": {}}
    report_floor.summarize({"scaleout": scaleout}, summary)
    out = summary["scaleout"]
    assert out["kube_apiserver_cpu_ms_per_machine"] == 18.41
    assert out["manager_cpu_per_kube_apiserver_cpu"] == 0.364  # 6.7 (untraced) / 18.41


def test_no_kube_apiserver_figure_is_made_up_when_its_cpu_was_not_read() -> None:
    summary: dict[str, dict[str, object]] = {"scaleout": {}}
    report_floor.summarize({"scaleout": {"machines": 1000, "clusters": 10}}, summary)
    assert "kube_apiserver_cpu_ms_per_machine" not in summary["scaleout"]
    assert "manager_cpu_per_kube_apiserver_cpu" not in summary["scaleout"]
