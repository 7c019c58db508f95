"""The multi-host bed's plan and files (capl/testbed/multihost*.py), without namespaces or
daemons: addresses, URIs and host UUIDs of the hosts, the configuration each libvirtd gets,
the holder's mounts, and the start-failure message with the log tail. The real bed is the
multihost stage's (tests/multihost)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from capl.testbed import multihost
from capl.testbed.multihost_host import (
    SHARED_MOUNT,
    HostDirs,
    holder_script,
    wait_until,
    write_libvirt_config,
)
from capl.testbed.multihost_lock import BedLocks
from capl.testbed.multihost_net import BedError


def _settings(path: Path) -> dict[str, str]:
    found = {}
    for line in path.read_text().splitlines():
        match = re.fullmatch(r'(\w+) = "?([^"]*)"?', line)
        if match:
            found[match.group(1)] = match.group(2)
    return found


def test_hosts_are_distinct_on_one_lan() -> None:
    hosts = multihost.HOSTS
    assert [h.lan_ip for h in hosts] == ["10.231.0.11", "10.231.0.12", "10.231.0.13"]
    assert [h.uri for h in hosts] == [
        "qemu+tls://10.231.0.11/system",
        "qemu+tls://10.231.0.12/system",
        "qemu+ssh://root@10.231.0.13/system",
    ]
    assert len({h.host_uuid for h in hosts}) == len(hosts)
    assert all(len(h.netns) <= 15 and len(h.root_if) <= 15 for h in hosts)  # IFNAMSIZ


def test_libvirt_configuration_of_a_tls_and_an_ssh_host(tmp_path: Path) -> None:
    tls, _, ssh = multihost.HOSTS
    for plan in (tls, ssh):
        dirs = HostDirs(tmp_path / plan.name)
        dirs.create()
        write_libvirt_config(plan, dirs)
        libvirtd = _settings(dirs.etc / "libvirtd.conf")
        assert libvirtd["host_uuid"] == plan.host_uuid
        assert libvirtd["listen_tcp"] == "0"
        qemu = _settings(dirs.etc / "qemu.conf")
        assert qemu["migration_address"] == qemu["migration_host"] == plan.lan_ip
        assert qemu["security_driver"] == "none"
        assert qemu["dynamic_ownership"] == "0"
    tls_conf = _settings(tmp_path / tls.name / "etc" / "libvirtd.conf")
    assert tls_conf["listen_tls"] == "1"
    assert tls_conf["listen_addr"] == tls.lan_ip
    assert tls_conf["cert_file"] == "/etc/libvirt/pki/servercert.pem"
    assert _settings(tmp_path / ssh.name / "etc" / "libvirtd.conf")["listen_tls"] == "0"


def test_the_holder_mounts_the_host_state_over_libvirts_paths(tmp_path: Path) -> None:
    dirs = HostDirs(tmp_path / "kvm1")
    script = holder_script(dirs, tmp_path / "shared", "kvm1")
    for target in ("/etc/libvirt", "/run/libvirt", "/var/lib/libvirt", "/var/cache/libvirt"):
        assert re.search(rf"^mount --bind \S+ {target}$", script, re.MULTILINE), target
    assert f"mount --bind {tmp_path / 'shared'} {SHARED_MOUNT}" in script
    assert script.splitlines()[1] == "hostname kvm1"
    assert script.endswith("exec sleep infinity")


def test_a_failed_start_shows_the_daemons_log_tail(tmp_path: Path) -> None:
    log = tmp_path / "libvirtd.log"
    log.write_text("starting\nerror : cannot bind 10.231.0.11:16514\n")
    with pytest.raises(BedError) as info:
        wait_until(
            lambda: None, within=5, what="kvm1: libvirtd answers", logs=[log], alive=lambda: False
        )
    message = str(info.value)
    assert message.startswith("kvm1: libvirtd answers: the process exited")
    assert "cannot bind 10.231.0.11:16514" in message


def test_admin_lock_is_exclusive_and_waits_with_a_deadline(tmp_path: Path) -> None:
    root = tmp_path / "bed"
    first, second = BedLocks(root), BedLocks(root)
    with (
        first.admin(),
        pytest.raises(BedError, match="starting or stopping the multi-host bed"),
        second.admin(within=0.3),
    ):
        pass
    with second.admin(within=0.3):  # free again once the holder left
        pass
    assert first.admin_path.parent == tmp_path  # beside the state directory, not in it


def test_users_lock_counts_every_session_but_none_twice(tmp_path: Path) -> None:
    root = tmp_path / "bed"
    a, b, c = BedLocks(root), BedLocks(root), BedLocks(root)
    a.join()
    a.join()  # idempotent
    b.join()
    with c.alone() as alone:
        assert not alone
    a.leave()
    with c.alone() as alone:
        assert not alone  # b still uses it
    b.leave()
    b.leave()  # idempotent
    with c.alone() as alone:
        assert alone
        with pytest.raises(BedError, match="held exclusively"):
            a.join()  # only under the admin lock, which the stopping session holds
    a.join()
    assert a.joined
    a.leave()
    assert not a.joined


def test_owner_of_a_bed(tmp_path: Path) -> None:
    root = tmp_path / "bed"
    assert multihost.owner(root) is None
    root.mkdir()
    (root / multihost.OWNER_FILE).write_text("tests\n")
    assert multihost.owner(root) == multihost.BY_TESTS


def _fake_bed(root: Path) -> multihost.MultihostBed:
    return multihost.MultihostBed(root=root, hosts=())


def test_use_does_not_rebuild_a_bed_another_session_uses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "bed"
    bed = _fake_bed(root)
    health = [["kvm2: nothing listens on 10.231.0.12:16514"]] * 2 + [[]]
    starts: list[list[str]] = []

    def status(_root: Path | None = None) -> tuple[multihost.MultihostBed, list[str]]:
        return bed, health[0]

    def start(
        _root: Path | None = None, *, say: object = None, by: str | None = None
    ) -> tuple[multihost.MultihostBed, bool]:
        starts.append(health[0])
        return bed, False

    def sleep(_seconds: float) -> None:  # the other session's test brings the link back
        health.pop(0)

    monkeypatch.setattr(multihost, "status", status)
    monkeypatch.setattr(multihost, "start", start)
    monkeypatch.setattr(multihost.time, "sleep", sleep)
    other = BedLocks(root)
    other.join()  # another session uses the bed
    held = multihost.use(root, say=lambda _line: None, within=60)
    assert starts == [[]]  # asked to start only once it was healthy again: nothing rebuilt
    assert held.locks.joined
    held.locks.leave()
    other.leave()


def test_use_gives_up_on_a_bed_unhealthy_under_another_session(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "bed"
    bed = _fake_bed(root)
    monkeypatch.setattr(multihost, "status", lambda _root=None: (bed, ["kvm1: libvirtd is dead"]))
    monkeypatch.setattr(multihost.time, "sleep", lambda _seconds: None)

    def start(*_args: object, **_kwargs: object) -> tuple[multihost.MultihostBed, bool]:
        raise AssertionError("rebuilt under another session")

    monkeypatch.setattr(multihost, "start", start)
    other = BedLocks(root)
    other.join()
    with pytest.raises(BedError, match=r"unhealthy .*kvm1: libvirtd is dead.* another session"):
        multihost.use(root, say=lambda _line: None, within=0.2)
    other.leave()
