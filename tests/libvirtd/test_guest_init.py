"""The test guest's config parsing (hack/guest/init, hack/guest/jsonflat.awk), run on the host
with busybox, the same applets the guest has: every Ignition hostname encoding the guest
claims to read, and cloud-init's precedence. The real boots are in test_guest_boot.py."""

from __future__ import annotations

import base64
import gzip
import json
import os
import shutil
import subprocess
import urllib.parse
from pathlib import Path

import pytest

from capl.controllers.machine.plan_ipam import (
    ClaimedAddress,
    ignition_with_network,
    network_config_v2,
)

REPO = Path(__file__).resolve().parents[2]
GUEST = REPO / "hack" / "guest"


@pytest.fixture(scope="module")
def busybox_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    busybox = shutil.which("busybox")
    if busybox is None:
        pytest.skip("busybox is not installed (make deps installs busybox-static)")
    bindir = tmp_path_factory.mktemp("busybox-bin")
    applets = subprocess.run(
        [busybox, "--list"], capture_output=True, text=True, check=True
    ).stdout.split()
    for applet in applets:
        (bindir / applet).symlink_to(busybox)
    return str(bindir)


def _run_init_function(busybox_path: str, tmp_path: Path, call: str) -> tuple[str, str]:
    """Source /init as a library and run `call`; returns (stdout, console markers)."""
    console = tmp_path / "console"
    console.touch()
    env = {
        "PATH": busybox_path,
        "CAPL_GUEST_INIT_LIB": "1",
        "CAPL_CONSOLE": str(console),
        "CAPL_RUN": str(tmp_path),
        "CAPL_LIB": str(GUEST),
    }
    result = subprocess.run(
        ["sh", "-c", f". {GUEST / 'init'}; {call}"],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
        check=False,
        executable=os.path.join(busybox_path, "sh"),
    )
    assert result.returncode == 0, result.stderr
    return result.stdout, console.read_text()


def _ignition(source: str, compression: str | None = None) -> bytes:
    contents: dict[str, str] = {"source": source}
    if compression is not None:
        contents["compression"] = compression
    files = [
        {"path": "/etc/motd", "contents": {"source": "data:,not%20this"}},
        {"path": "/etc/hostname", "mode": 420, "contents": contents},
    ]
    return json.dumps({"ignition": {"version": "3.4.0"}, "storage": {"files": files}}).encode()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (_ignition("data:,node-a%0A"), "node-a"),
        (_ignition("data:," + urllib.parse.quote("node-b\n", safe="")), "node-b"),
        (_ignition("data:;base64," + _b64(b"node-c\n")), "node-c"),
        (_ignition("data:text/plain;charset=utf-8;base64," + _b64(b"node-d")), "node-d"),
        (_ignition("data:;base64," + _b64(gzip.compress(b"node-e\n")), "gzip"), "node-e"),
        (b'{"ignition": {"version": "3.4.0"}}', ""),
        # pretty-printed, escaped slash, unicode elsewhere
        (
            json.dumps(
                {
                    "ignition": {"version": "3.4.0"},
                    "passwd": {"users": [{"name": "core", "gecos": 'caf\u00e9 "x"'}]},
                    "storage": {
                        "files": [{"path": "/etc/hostname", "contents": {"source": "data:,node-f"}}]
                    },
                },
                indent=2,
                ensure_ascii=True,
            )
            .encode()
            .replace(b"/etc/hostname", b"\\/etc\\/hostname"),
            "node-f",
        ),
    ],
    ids=["percent", "percent-quoted", "base64", "mediatype-base64", "gzip", "none", "pretty"],
)
def test_hostname_from_ignition(
    busybox_path: str, tmp_path: Path, config: bytes, expected: str
) -> None:
    (tmp_path / "config.ign").write_bytes(config)
    out, console = _run_init_function(
        busybox_path, tmp_path, f"hostname_from_ignition {tmp_path / 'config.ign'}"
    )
    assert out.strip() == expected
    assert console == ""


def test_invalid_ignition_is_reported_not_fatal(busybox_path: str, tmp_path: Path) -> None:
    (tmp_path / "config.ign").write_bytes(b'{"storage": {"files": [')
    out, console = _run_init_function(
        busybox_path, tmp_path, f"hostname_from_ignition {tmp_path / 'config.ign'}"
    )
    assert out.strip() == ""
    assert console.startswith("CAPL-GUEST: error ignition is not valid JSON")


@pytest.mark.parametrize(
    ("user_data", "meta_data", "expected"),
    [
        (b"#cloud-config\nhostname: from-ud\n", b"local-hostname: from-md\n", "from-ud"),
        (b"#cloud-config\nhostname: 'quoted'\n", b"", "quoted"),
        (b"#cloud-config\npackages: []\n", b"instance-id: x\nlocal-hostname: from-md\n", "from-md"),
        (b"#!/bin/sh\nhostname: not-yaml\n", b"local-hostname: from-md\n", "from-md"),
        (b"", b"", ""),
    ],
    ids=["user-data", "quoted", "meta-data", "script-user-data", "empty"],
)
def test_hostname_from_cloud_init(
    busybox_path: str, tmp_path: Path, user_data: bytes, meta_data: bytes, expected: str
) -> None:
    (tmp_path / "user-data").write_bytes(user_data)
    (tmp_path / "meta-data").write_bytes(meta_data)
    out, _ = _run_init_function(
        busybox_path,
        tmp_path,
        f"hostname_from_cloud_init {tmp_path / 'user-data'} {tmp_path / 'meta-data'}",
    )
    assert out.strip() == expected


# -- static addresses (Cluster API IPAM): exactly what capl writes --------------------------


def _ipam_nics() -> list[tuple[str, ClaimedAddress]]:
    return [
        ("52:54:00:12:34:56", ClaimedAddress(0, "10.231.0.50", 24, "10.231.0.1", "m-nic0")),
        ("52:54:00:ab:cd:ef", ClaimedAddress(1, "192.168.7.9", 16, None, "m-nic1")),
    ]


EXPECTED_STATIC = "52:54:00:12:34:56 10.231.0.50/24 10.231.0.1\n52:54:00:ab:cd:ef 192.168.7.9/16 \n"


def test_static_addresses_from_capl_ignition(busybox_path: str, tmp_path: Path) -> None:
    config = ignition_with_network(_ignition("data:,node-a%0A"), _ipam_nics())
    (tmp_path / "config.ign").write_bytes(config)
    out, console = _run_init_function(
        busybox_path, tmp_path, f"static_from_ignition {tmp_path / 'config.ign'}"
    )
    assert out == EXPECTED_STATIC
    assert "error" not in console


def test_static_addresses_from_capl_network_config(busybox_path: str, tmp_path: Path) -> None:
    (tmp_path / "network-config").write_bytes(network_config_v2(_ipam_nics()))
    out, _ = _run_init_function(
        busybox_path, tmp_path, f"static_from_network_config {tmp_path / 'network-config'}"
    )
    assert out == EXPECTED_STATIC


def test_no_static_addresses_without_units(busybox_path: str, tmp_path: Path) -> None:
    (tmp_path / "config.ign").write_bytes(_ignition("data:,node-a%0A"))
    out, _ = _run_init_function(
        busybox_path, tmp_path, f"static_from_ignition {tmp_path / 'config.ign'}"
    )
    assert out == ""
