"""`capl manager --orphan-sweep-interval / --orphan-grace` -> MachineOptions (the real-process
tests shorten the sweep with them: tests/security/test_rbac_audit.py)."""

from __future__ import annotations

from capl.cli import build_parser
from capl.controllers.machine import MachineOptions
from capl.manager import options_from_args


def test_orphan_flags_default_to_the_machine_options_and_parse_durations() -> None:
    default = options_from_args(build_parser().parse_args(["manager"])).machine
    assert default.orphan_sweep_interval == MachineOptions().orphan_sweep_interval == 60.0
    assert default.orphan_grace == MachineOptions().orphan_grace == 30.0
    args = ["manager", "--orphan-sweep-interval=2s", "--orphan-grace", "0"]
    machine = options_from_args(build_parser().parse_args(args)).machine
    assert (machine.orphan_sweep_interval, machine.orphan_grace) == (2.0, 0.0)
