"""The test guest's minimal guest agent (hack/guest/agent), run on the host with busybox (the
applets the guest has) on stdin/stdout: what libvirt sends and expects. The real answers
through libvirt (addresses in bridge mode) are in tests/multihost/test_bridge_cluster.py."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from tests.libvirtd.test_guest_init import GUEST, busybox_path

__all__ = ["busybox_path"]  # the module fixture, registered by this import


def _serve(busybox_path: str, *commands: str) -> list[bytes]:
    result = subprocess.run(
        ["sh", str(GUEST / "agent"), "stdio"],
        input=("\n".join(commands) + "\n").encode(),
        capture_output=True,
        env={"PATH": busybox_path},
        timeout=30,
        check=False,
        executable=os.path.join(busybox_path, "sh"),
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def test_sync_ping_and_refused_commands(busybox_path: str) -> None:
    lines = _serve(
        busybox_path,
        '{"execute":"guest-sync","arguments":{"id":1234567890123}}',
        "",
        '{"execute": "guest-ping"}',
        '{"execute":"guest-sync-delimited","arguments":{"id":7}}',
        '{"execute":"guest-file-open","arguments":{"path":"/run/cluster-api/bootstrap-success.complete"}}',
    )
    assert lines[0] == b'{"return": 1234567890123}'
    assert json.loads(lines[1]) == {"return": {}}  # no answer to the empty line
    assert lines[2] == b'\xff{"return": 7}'
    refused = json.loads(lines[3])["error"]
    # what capl.virt.agent reads as "this agent has no file commands" (UNSUPPORTED)
    assert refused["class"] == "CommandNotFound"
    assert "guest-file-open has not been found" in refused["desc"]
    assert len(lines) == 4


def test_interfaces_are_reported_as_libvirt_parses_them(busybox_path: str) -> None:
    (answer,) = _serve(busybox_path, '{"execute":"guest-network-get-interfaces"}')
    interfaces = json.loads(answer)["return"]
    names = {i["name"] for i in interfaces}
    assert names == {p.name for p in Path("/sys/class/net").iterdir()}
    lo = next(i for i in interfaces if i["name"] == "lo")
    assert {"ip-address-type": "ipv4", "ip-address": "127.0.0.1", "prefix": 8} in lo["ip-addresses"]
    for interface in interfaces:
        assert set(interface) == {"name", "hardware-address", "ip-addresses"}
        for address in interface["ip-addresses"]:
            assert address["ip-address-type"] in ("ipv4", "ipv6")
            assert isinstance(address["prefix"], int)


def test_guest_info_lists_what_it_answers(busybox_path: str) -> None:
    (answer,) = _serve(busybox_path, '{"execute":"guest-info"}')
    info = json.loads(answer)["return"]
    assert {c["name"] for c in info["supported_commands"]} == {
        "guest-sync",
        "guest-sync-delimited",
        "guest-ping",
        "guest-info",
        "guest-network-get-interfaces",
    }
