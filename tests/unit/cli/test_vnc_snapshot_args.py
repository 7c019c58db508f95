"""`capl vnc` and `capl snapshot` refuse bad arguments before any API or libvirt call."""

from __future__ import annotations

import pytest

from tests.unit.cli.test_commands import run


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["vnc", "m", "--address", "0.0.0.0"], "--address 0.0.0.0 is not a loopback address"),
        (["vnc", "m", "--address", "kvm1"], "--address kvm1 is not a loopback address"),
        (["vnc", "m", "--port", "70000"], "--port 70000 is not a port number"),
        (["snapshot", "create", "m", "../etc"], "snapshot name '../etc' is invalid"),
        (["snapshot", "revert", "m", "a b"], "snapshot name 'a b' is invalid"),
        (["snapshot", "create", "m", "capl-day2"], "'capl-day2' is reserved for the manager's"),
        (["snapshot", "revert", "m", "s", "--start", "--no-start"], "not allowed with"),
        (["snapshot"], "the following arguments are required: ACTION"),
    ],
)
def test_bad_arguments_exit_2(args: list[str], message: str) -> None:
    result = run(*args)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr.strip().splitlines()[-1]
    assert "Traceback" not in result.stderr
