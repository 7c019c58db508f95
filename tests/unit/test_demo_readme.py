"""The README cannot drift from the code it documents.

Checked against their sources: every condition reason (`capl.api.constants.Reason`) has a
row in the troubleshooting table and no row names a reason that does not exist; every
condition type is named; every metric the manager serves is listed; every `capl` command
and every `capl manager` flag it mentions exist; every template variable of
`templates/*.yaml` is documented; every `make` target it mentions exists; the docs it links
exist.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from capl.api.constants import ConditionType, Reason
from capl.cli import build_parser
from capl.runtime.metrics import RequestStats, RuntimeMetrics

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()


def _section(title: str) -> str:
    start = README.index(f"\n## {title}")
    end = README.find("\n## ", start + 1)
    return README[start : end if end != -1 else None]


def _table_first_column(section: str) -> list[str]:
    return re.findall(r"^\| `([^`]+)` \|", section, re.MULTILINE)


def test_every_reason_has_a_row_in_the_troubleshooting_table() -> None:
    rows = _table_first_column(_section("Troubleshooting"))
    assert sorted(set(rows)) == sorted(rows), "a reason has two rows"
    missing = sorted({r.value for r in Reason} - set(rows))
    unknown = sorted(set(rows) - {r.value for r in Reason})
    assert not missing, f"reasons without a row in README.md's troubleshooting table: {missing}"
    assert not unknown, f"rows for reasons capl does not have: {unknown}"


def test_every_condition_type_is_named() -> None:
    section = _section("Troubleshooting")
    for type_ in ConditionType:
        assert f"`{type_.value}`" in section, type_


def test_every_served_metric_is_listed() -> None:
    metrics = RuntimeMetrics()
    metrics.register_collector(RequestStats())
    served = set(re.findall(r"^# TYPE (\S+) ", metrics.exposition().decode(), re.MULTILINE))
    section = _section("Metrics and logs")
    listed = set(re.findall(r"`([a-z_]+)`", section))
    assert served, "no metrics found"
    assert not sorted(served - listed), f"metrics missing in README.md: {served - listed}"


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_every_capl_command_is_in_the_table_and_the_table_only_has_real_ones() -> None:
    commands = _subcommands()
    rows = [row.split()[1] for row in _table_first_column(_section("The `capl` command"))]
    assert sorted(rows) == sorted(commands)


def test_the_manager_flags_the_readme_names_exist() -> None:
    manager = _subcommands()["manager"]
    known = {opt for action in manager._actions for opt in action.option_strings}
    section = _section("The `capl` command") + _section("Metrics and logs")
    row = next(line for line in section.splitlines() if line.startswith("| `capl manager` |"))
    named = set(re.findall(r"`(--[a-z-]+)", row))
    named |= set(re.findall(r"`(--(?:metrics|health|log)[a-z-]*)", _section("Metrics and logs")))
    assert named, "the manager row names no flags"
    assert not sorted(named - known), f"unknown manager flags in README.md: {named - known}"


@pytest.mark.parametrize("template", sorted((REPO / "templates").glob("*.yaml")))
def test_every_template_variable_is_documented(template: Path) -> None:
    standard = {
        "CLUSTER_NAME",
        "NAMESPACE",
        "KUBERNETES_VERSION",
        "CONTROL_PLANE_MACHINE_COUNT",
        "WORKER_MACHINE_COUNT",
    }
    variables = set(re.findall(r"\$\{([A-Z0-9_]+)", template.read_text())) - standard
    section = _section("Quick start with clusterctl")
    missing = sorted(v for v in variables if f"`{v}`" not in section)
    assert not missing, f"{template.name}: variables not documented in README.md: {missing}"


def test_every_make_target_mentioned_exists() -> None:
    makefile = (REPO / "Makefile").read_text()
    targets = set(re.findall(r"^([a-z][a-z0-9-]*):", makefile, re.MULTILINE))
    mentioned = set(re.findall(r"`make ([a-z][a-z0-9-]*)", README))
    mentioned |= {t for t in re.findall(r"`([a-z0-9-]+)`", _section("Development")) if t in targets}
    assert {"demo", "test"} <= mentioned
    assert not sorted(mentioned - targets), f"unknown make targets: {mentioned - targets}"


def test_linked_documents_exist() -> None:
    for link in re.findall(r"\]\(((?:docs|config|templates)/[^)#]+)\)", README):
        assert (REPO / link).exists(), link
    assert (REPO / "docs" / "architecture.md").is_file()
    assert (REPO / "docs" / "benchmarks.md").is_file()


def test_the_two_commands_come_first() -> None:
    first = README.index("\n## ")
    assert README[first:].startswith("\n## Run it: two commands")
    section = _section("Run it: two commands")
    assert "| `make demo` |" in section
    assert "| `make test` |" in section
    assert "3/3 machines Ready" in section
