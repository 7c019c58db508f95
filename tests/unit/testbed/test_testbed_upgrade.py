"""Pure parts of the clusterctl upgrade support in capl.testbed.clusterctl: the next release
series, the `upgrade plan` table, the staged source of the next version's manager."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from capl.testbed.capibuild import CapiError
from capl.testbed.clusterctl import next_minor, parse_upgrade_plan, stage_capl_source

# `clusterctl upgrade plan` of cluster-api v1.13 (cmd/clusterctl/cmd/upgrade_plan.go), with
# capl's next minor in the local repository and cert-manager externally managed.
PLAN = """
Latest release available for the v1beta2 Cluster API contract version:

NAME                     NAMESPACE     TYPE                     CURRENT VERSION   NEXT VERSION
cluster-api              capi-system   CoreProvider             v1.13.6           Already up to date
infrastructure-libvirt   capl-system   InfrastructureProvider   v0.1.0            v0.2.0

You can now apply the upgrade by executing the following command:

clusterctl upgrade apply --contract v1beta2

"""


@pytest.mark.parametrize(
    ("version", "following"),
    [("v0.1.0", "v0.2.0"), ("0.1.3", "0.2.0"), ("v1.9.12", "v1.10.0")],
)
def test_next_minor(version: str, following: str) -> None:
    assert next_minor(version) == following


def test_upgrade_plan_rows() -> None:
    rows = parse_upgrade_plan(PLAN)
    assert set(rows) == {"cluster-api", "infrastructure-libvirt"}
    core, libvirt = rows["cluster-api"], rows["infrastructure-libvirt"]
    assert (core.type, core.current, core.next) == ("CoreProvider", "v1.13.6", None)
    assert (libvirt.namespace, libvirt.current, libvirt.next) == (
        "capl-system",
        "v0.1.0",
        "v0.2.0",
    )
    up_to_date = PLAN.replace("v0.2.0", "Already up to date")
    assert parse_upgrade_plan(up_to_date)["infrastructure-libvirt"].next is None


def test_upgrade_plan_without_rows_is_an_error() -> None:
    with pytest.raises(CapiError, match="no provider rows"):
        parse_upgrade_plan("There are no providers in the cluster.\n")


def test_staged_source_reports_the_version(tmp_path: Path) -> None:
    source = Path(__file__).resolve().parents[3] / "capl"
    staged = stage_capl_source(source, tmp_path / "next", version="0.2.0")
    assert not list(staged.rglob("__pycache__"))
    # the same code: every module but __init__.py identical
    for path in source.rglob("*.py"):
        if path.name == "__init__.py" and path.parent == source:
            continue
        if "__pycache__" in path.parts:
            continue
        copy = staged / "capl" / path.relative_to(source)
        assert copy.read_bytes() == path.read_bytes(), path
    # a process with it first on PYTHONPATH runs the copy and says 0.2.0
    out = subprocess.run(
        [sys.executable, "-c", "import capl; print(capl.__version__, capl.__file__)"],
        env={"PYTHONPATH": str(staged)},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert out == ["0.2.0", str(staged / "capl" / "__init__.py")]
    # staging again replaces the copy
    assert stage_capl_source(source, tmp_path / "next", version="0.3.0") == staged
    assert '__version__ = "0.3.0"' in (staged / "capl" / "__init__.py").read_text()


def test_staged_source_needs_a_version_line(tmp_path: Path) -> None:
    source = tmp_path / "capl"
    source.mkdir()
    (source / "__init__.py").write_text("VERSION = 1\n")
    with pytest.raises(CapiError, match="no __version__ line"):
        stage_capl_source(source, tmp_path / "out", version="0.2.0")
