"""`capl manager`'s libvirt call limits: flags -> ProviderOptions -> LibvirtHosts.

The CLI keeps its own copies of the defaults (it must not import capl.virt, and with it
libvirt, to parse arguments), so they are checked against LibvirtHosts' signature here.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Any

import pytest

from capl import manager as capl_manager
from capl.cli import build_parser
from capl.errors import EXIT_USAGE
from capl.manager import ProviderOptions, build, options_from_args
from capl.virt.hosts import LibvirtHosts
from tests.fixtures.runtime import FakeApi, FakeClient

FLAGS = (
    "--libvirt-call-timeout",
    "--libvirt-long-call-timeout",
    "--libvirt-workers-per-host",
    "--libvirt-max-inflight-per-host",
)


def options(*args: str) -> ProviderOptions:
    return options_from_args(build_parser().parse_args(["manager", *args]))


def test_defaults_are_those_of_libvirt_hosts() -> None:
    defaults = {
        name: p.default for name, p in inspect.signature(LibvirtHosts.__init__).parameters.items()
    }
    opts = options()
    assert opts.libvirt_call_timeout == defaults["call_timeout"] == 30.0
    assert opts.libvirt_long_call_timeout == defaults["long_call_timeout"] == 1800.0
    assert opts.libvirt_workers_per_host == defaults["max_workers_per_host"] == 8
    assert opts.libvirt_max_inflight_per_host is defaults["max_inflight_per_host"] is None
    assert opts == ProviderOptions(
        manager=opts.manager,
        machine=opts.machine,
        cluster=opts.cluster,
        webhook_cert_dir=opts.webhook_cert_dir,
    )


def test_flags_parse_durations_and_counts() -> None:
    opts = options(
        "--libvirt-call-timeout",
        "1m30s",
        "--libvirt-long-call-timeout=2h",
        "--libvirt-workers-per-host",
        "3",
        "--libvirt-max-inflight-per-host",
        "5",
    )
    assert opts.libvirt_call_timeout == 90.0
    assert opts.libvirt_long_call_timeout == 7200.0
    assert opts.libvirt_workers_per_host == 3
    assert opts.libvirt_max_inflight_per_host == 5


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--libvirt-call-timeout", "0"], "argument --libvirt-call-timeout: must be a positive"),
        (["--libvirt-call-timeout=-5"], "argument --libvirt-call-timeout: must be a positive"),
        (["--libvirt-long-call-timeout", "0s"], "--libvirt-long-call-timeout: must be a positive"),
        (["--libvirt-long-call-timeout", "soon"], "invalid duration 'soon'"),
        (["--libvirt-workers-per-host", "0"], "--libvirt-workers-per-host: must be at least 1"),
        (["--libvirt-workers-per-host=-2"], "--libvirt-workers-per-host: must be at least 1"),
        (["--libvirt-max-inflight-per-host", "0"], "--libvirt-max-inflight-per-host: must be"),
        (["--libvirt-max-inflight-per-host", "x"], "invalid integer 'x'"),
    ],
)
def test_bad_values_are_one_line_usage_errors(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["manager", *args])
    assert exit_.value.code == EXIT_USAGE
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("capl manager: error: ")
    assert message in err[-1]


@pytest.mark.parametrize(
    "field",
    [
        {"libvirt_call_timeout": 0.0},
        {"libvirt_long_call_timeout": -1.0},
        {"libvirt_workers_per_host": 0},
        {"libvirt_max_inflight_per_host": 0},
    ],
)
def test_provider_options_reject_zero_and_negative(field: dict[str, Any]) -> None:
    (name,) = field
    with pytest.raises(ValueError, match=f"^{name} must be"):
        ProviderOptions(**field)


async def test_build_hands_the_limits_to_libvirt_hosts(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}

    class Recording(LibvirtHosts):
        def __init__(self, **kwargs: Any) -> None:
            seen.update(kwargs)
            super().__init__(**kwargs)

    monkeypatch.setattr(capl_manager, "LibvirtHosts", Recording)
    opts = options(
        "--webhook-port=0",
        "--libvirt-call-timeout=10s",
        "--libvirt-long-call-timeout=45m",
        "--libvirt-workers-per-host=2",
        "--libvirt-max-inflight-per-host=6",
    )
    built = build(opts, FakeClient(FakeApi()))  # type: ignore[arg-type]
    try:
        assert isinstance(built.hosts, Recording)
        assert seen == {
            "max_workers_per_host": 2,
            "call_timeout": 10.0,
            "long_call_timeout": 2700.0,
            "max_inflight_per_host": 6,
        }
    finally:
        await built.close()


def test_readme_names_every_libvirt_flag() -> None:
    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text()
    row = next(line for line in readme.splitlines() if line.startswith("| `capl manager` |"))
    named = set(re.findall(r"`(--[a-z-]+)", row))
    assert set(FLAGS) <= named
