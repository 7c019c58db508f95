"""The multi-host bed's own facts (capl/testbed/multihost.py): three real libvirt hosts in
namespaces of their own on one LAN, reached the way capl reaches remote hosts.

- every host answers through capl's own connection layer (`capl.virt.LibvirtHosts`) with the
  credentials Secret's data: kvm1 and kvm2 over ``qemu+tls://`` (client certificates), kvm3
  over ``qemu+ssh://`` (pinned host key), each with its own host name;
- the hosts have the explicit, distinct host UUIDs of their libvirtd.conf (what live
  migration needs), none the machine's own daemon's;
- they reach each other and the LAN's gateway on the LAN; each has its own /etc/libvirt (the
  migration address of its qemu.conf is its LAN address) and sees the one shared directory;
- `start` on the running bed changes nothing; the stop at the end of a session (last in
  the stage, and only of a bed test sessions started that no other session uses: a bed
  found running may be someone else's) leaves no namespace, veth, bridge, process or state
  behind, and the machine's own libvirtd (its PID, its networks, /etc/libvirt) is the same
  as before the bed started;
- while a session uses the bed, another's release leaves it running, and the command's
  ``stop`` refuses without ``--force``.
"""

from __future__ import annotations

import re
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest

from capl.testbed import multihost
from capl.testbed.multihost import MultihostBed
from capl.testbed.multihost_host import DAEMONS, HostDirs
from capl.testbed.multihost_net import link_exists, netns_exists, netns_pids, pid_alive, read_pid
from capl.virt import LibvirtHosts
from tests.fixtures.libvirt import record_timing
from tests.multihost.conftest import BedSession, in_host, ping, root_view

pytestmark = pytest.mark.libvirtd


def _capabilities_uuid(xml: str) -> str:
    match = re.search(r"<host>\s*<uuid>([0-9a-f-]+)</uuid>", xml)
    assert match, xml[:400]
    return match.group(1)


async def test_every_host_answers_through_capls_connection_layer(
    multihost_bed: MultihostBed, hosts: LibvirtHosts
) -> None:
    for bed_host in multihost_bed.hosts:
        host = hosts.get(uri=bed_host.uri, credentials=bed_host.credentials)
        started = time.monotonic()
        info = await host.info()
        record_timing(f"multihost: {bed_host.uri} connect + host info", time.monotonic() - started)
        assert info.hypervisor == "QEMU"
        assert info.hostname == bed_host.name  # its own UTS namespace: not this machine
        assert "qemu" in info.domain_types
        await host.list_domains()  # a bed found running may hold other tests' domains
        assert await host.reachable()
    assert {h.transport for h in multihost_bed.hosts} == {"tls", "ssh"}


def test_hosts_have_explicit_distinct_uuids(multihost_bed: MultihostBed) -> None:
    seen = {}
    for host in multihost_bed.hosts:
        xml = in_host(multihost_bed, host.name, "virsh", "-c", "qemu:///system", "capabilities")
        seen[host.name] = _capabilities_uuid(xml)
        assert seen[host.name] == host.host_uuid
        conf = in_host(multihost_bed, host.name, "cat", "/etc/libvirt/libvirtd.conf")
        assert f'host_uuid = "{host.host_uuid}"' in conf
    assert len(set(seen.values())) == len(seen)
    system = root_view()
    if system.libvirtd_pid is not None:
        xml = subprocess.run(
            ["virsh", "-c", "qemu:///system", "capabilities"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
        assert _capabilities_uuid(xml) not in seen.values()


def test_hosts_reach_each_other_on_the_lan(multihost_bed: MultihostBed) -> None:
    for source in multihost_bed.hosts:
        assert ping(source.netns, multihost_bed.gateway), f"{source.name} -> gateway"
        for target in multihost_bed.hosts:
            if target is not source:
                assert ping(source.netns, target.lan_ip), f"{source.name} -> {target.name}"
    for host in multihost_bed.hosts:
        assert ping(None, host.lan_ip), f"root namespace -> {host.name}"


def test_each_host_has_its_own_libvirt_state_and_the_shared_directory(
    multihost_bed: MultihostBed,
) -> None:
    token = secrets.token_hex(8)
    probe = multihost_bed.shared_dir / f"probe-{token}"
    probe.write_text(token)
    try:
        for host in multihost_bed.hosts:
            qemu_conf = in_host(multihost_bed, host.name, "cat", "/etc/libvirt/qemu.conf")
            assert f'migration_address = "{host.lan_ip}"' in qemu_conf
            assert f'migration_host = "{host.lan_ip}"' in qemu_conf
            assert 'security_driver = "none"' in qemu_conf
            seen = in_host(
                multihost_bed, host.name, "cat", f"{multihost_bed.shared_mount}/{probe.name}"
            )
            assert seen == token
            sockets = in_host(multihost_bed, host.name, "ls", "/run/libvirt")
            assert {"libvirt-sock", "virtlogd-sock"} <= set(sockets.split())
        assert not Path(multihost_bed.shared_mount).exists()  # only inside the hosts
        assert not Path("/etc/libvirt/qemu.conf").exists() or (
            "migration_address" not in Path("/etc/libvirt/qemu.conf").read_text()
        )
    finally:
        probe.unlink()


def _bed_pids(bed: MultihostBed) -> dict[str, list[int]]:
    """Every process in each host's namespaces."""
    return {h.name: sorted(netns_pids(h.netns)) for h in bed.hosts}


def _daemon_pids(bed: MultihostBed) -> dict[str, list[int | None]]:
    """The holder and the daemons of each host (ssh sessions come and go beside them)."""
    found = {}
    for host in bed.hosts:
        dirs = HostDirs(bed.root / host.name)
        files = [dirs.holder_pid, *(dirs.pid_file(d) for d in DAEMONS)]
        found[host.name] = [read_pid(f) for f in files]
    return found


def test_start_on_the_running_bed_changes_nothing(multihost_bed: MultihostBed) -> None:
    before = _daemon_pids(multihost_bed)
    lines: list[str] = []
    bed, started = multihost.start(say=lines.append)
    assert not started
    assert lines == [f"multi-host bed already running and healthy ({bed.root}): nothing to do"]
    assert _daemon_pids(multihost_bed) == before
    assert all(pid_alive(p) for group in before.values() for p in group if p is not None)
    assert [h.uri for h in bed.hosts] == [h.uri for h in multihost_bed.hosts]


def test_a_bed_in_use_is_not_stopped_under_it(multihost_bed: MultihostBed) -> None:
    before = _daemon_pids(multihost_bed)
    other = multihost.use(say=lambda _line: None)  # a second session's hold on the bed
    assert not other.started
    said: list[str] = []
    # this session (the fixture's hold) still uses the bed: the other's release keeps it
    assert not other.release(say=said.append)
    assert len(said) == 1
    assert "another session uses it" in said[0] or "started by hand" in said[0]
    assert not other.release(say=said.append)  # released once
    refused = subprocess.run(
        [sys.executable, "-m", "capl.testbed.multihost", "stop"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert refused.returncode == 1, refused.stdout
    assert "a test session uses the multi-host bed" in refused.stderr
    assert "--force" in refused.stderr
    assert multihost.status() == (multihost_bed, [])
    assert _daemon_pids(multihost_bed) == before


def test_stop_leaves_nothing_behind_and_the_root_namespace_untouched(
    multihost_session: BedSession,
) -> None:
    bed = multihost_session.bed
    pids = [pid for group in _bed_pids(bed).values() for pid in group]
    assert pids
    said: list[str] = []
    started = time.monotonic()
    if not multihost_session.use.release(say=said.append):
        # started by hand, or another session uses it: not ours to stop
        pytest.skip("; ".join(said))
    record_timing("multihost: bed stop", time.monotonic() - started)
    assert not [p for p in pids if pid_alive(p)]
    assert not [h.netns for h in bed.hosts if netns_exists(h.netns)]
    links = [bed.lan_bridge, *(f"capl-{h.name}" for h in bed.hosts)]
    assert not [name for name in links if link_exists(name)]
    assert not bed.root.exists()
    assert multihost.status() == (None, [])
    before, after = multihost_session.before, root_view()
    assert (after.networks, after.etc_libvirt) == (before.networks, before.etc_libvirt)
    # the machine's own libvirtd was never one of the bed's processes (the only ones it
    # signals); other sessions' set-up may restart that daemon meanwhile (hack/libvirt-host.sh
    # when it finds it unhealthy: seen), so its PID is compared only while it still runs
    assert before.libvirtd_pid is None or before.libvirtd_pid not in pids
    if before.libvirtd_pid is not None and pid_alive(before.libvirtd_pid):
        assert after.libvirtd_pid == before.libvirtd_pid
