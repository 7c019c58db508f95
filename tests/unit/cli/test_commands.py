"""The `capl` command as users run it (a subprocess of .venv/bin/capl): help, usage errors,
unreachable API servers. No API server or libvirt is needed here.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from capl.cli import build_parser

CAPL = str(Path(sys.executable).with_name("capl"))


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CAPL, *args],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        env={**os.environ, **(env or {})},
        check=False,
    )


def commands() -> list[str]:
    """Every command and sub-verb ("images import"), from the parser itself."""
    found: list[str] = []

    def walk(parser: argparse.ArgumentParser, prefix: str) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    found.append(f"{prefix}{name}")
                    walk(child, f"{prefix}{name} ")

    walk(build_parser(), "")
    return sorted(found)


def test_every_operator_command_is_registered() -> None:
    assert {"manager", "version", "status", "console", "images import"} <= set(commands())


@pytest.mark.parametrize("command", commands())
def test_help_exits_0_with_examples(command: str) -> None:
    result = run(*command.split(), "--help")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert "examples:" in result.stdout
    examples = result.stdout.split("examples:", 1)[1]
    assert f"  capl {command}" in examples


def test_top_level_help_and_no_command() -> None:
    result = run("--help")
    assert result.returncode == 0
    for command in ("status", "console", "manager"):
        assert command in result.stdout
    bare = run()
    assert bare.returncode == 2
    assert "usage: capl" in bare.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["status", "-o", "yaml"], "invalid choice: 'yaml'"),
        (["status", "-n", "a", "-A"], "not allowed with argument"),
        (["status", "a", "b"], "unrecognized arguments: b"),
        (["console"], "the following arguments are required: MACHINE"),
        (["console", "m", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
        (["no-such-command"], "invalid choice: 'no-such-command'"),
        (["images", "import", "http://x/y.qcow2", "--pool", "p"], "required: --host"),
        (
            [
                "images",
                "import",
                "/a.qcow2",
                "--host",
                "qemu:///system",
                "--pool",
                "p",
                "--checksum",
                "sha256:abc",
            ],
            "--checksum 'sha256:abc': expected sha256:<64 hex digits>",
        ),
        (
            ["images", "import", "ftp://x/y", "--host", "qemu:///system", "--pool", "p"],
            "neither an http(s) URL nor an absolute path",
        ),
        (
            ["images", "import", "http://x/y", "--host", "kvm1", "--pool", "p"],
            "--host 'kvm1' is not a libvirt URI",
        ),
    ],
)
def test_bad_arguments_exit_2(args: list[str], message: str) -> None:
    result = run(*args)
    assert result.returncode == 2
    assert message in result.stderr.strip().splitlines()[-1]
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


@pytest.fixture
def unreachable_kubeconfig(tmp_path: Path) -> tuple[Path, str]:
    """A kubeconfig whose server is a loopback port nothing listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = f"https://127.0.0.1:{port}"
    path = tmp_path / "kubeconfig"
    path.write_text(
        f"""apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "{server}", insecure-skip-tls-verify: true}}}}]
users: [{{name: u, user: {{token: not-a-secret}}}}]
contexts: [{{name: x, context: {{cluster: c, user: u, namespace: team-a}}}}]
current-context: x
"""
    )
    return path, server


@pytest.mark.parametrize("args", [["status"], ["status", "-A", "-o", "json"], ["console", "vm-0"]])
def test_unreachable_api_server_is_one_line_exit_4(
    unreachable_kubeconfig: tuple[Path, str], args: list[str]
) -> None:
    path, server = unreachable_kubeconfig
    for how in ("flag", "env"):
        if how == "flag":
            result = run(*args, "--kubeconfig", str(path))
        else:
            result = run(*args, env={"KUBECONFIG": str(path)})
        assert result.returncode == 4, (how, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, result.stderr
        assert lines[0].startswith(f"capl: error: cannot reach the API server {server}: ")
        assert result.stdout == ""


def test_missing_kubeconfig_exit_4(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    result = run("status", "--kubeconfig", str(missing))
    assert result.returncode == 4
    assert result.stderr.strip() == (
        f"capl: error: cannot load the cluster configuration: --kubeconfig {missing}: no such file"
    )
    result = run("console", "m", env={"KUBECONFIG": str(missing)})
    assert result.returncode == 4
    assert result.stderr.strip().endswith(f"KUBECONFIG={missing}: no such file")


def test_debug_shows_the_traceback(unreachable_kubeconfig: tuple[Path, str]) -> None:
    path, _ = unreachable_kubeconfig
    result = run("--debug", "status", "--kubeconfig", str(path))
    assert result.returncode != 0
    assert "Traceback" in result.stderr
