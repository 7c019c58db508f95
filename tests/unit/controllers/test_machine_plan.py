"""The LibvirtMachine controller's pure decisions (capl.controllers.machine.plan*)."""

from __future__ import annotations

import base64
import json
import subprocess
import sys

import pytest

from capl.api import constants as c
from capl.api.machine import LibvirtMachineSpec
from capl.controllers.machine.plan import (
    FAULT_ENV,
    FAULT_EXIT_CODE,
    IGNITION_FWCFG_KEY,
    MAX_MAC_ATTEMPTS,
    BootstrapProblem,
    build_domain_spec,
    classify,
    dns_name,
    image_plan,
    mac_candidates,
    nic_plans,
    owner_matches,
    read_bootstrap,
)
from capl.controllers.machine.plan_addresses import RecordedIps, merge_addresses, recorded_ips
from capl.controllers.machine.plan_orphans import OrphanTracker, accounts_for
from capl.controllers.machine.plan_placement import (
    HostCandidate,
    Placement,
    choose_host,
    committed_memory,
)
from capl.ports.errors import (
    BootstrapDataError,
    ForeignDomainError,
    HostUnreachable,
    ImageChecksumError,
    ImageDownloadError,
    StorageFull,
    VirtError,
)
from capl.ports.naming import machine_names
from capl.ports.virt import (
    AddressSource,
    DiskBus,
    DiskDevice,
    DomainOwner,
    ImageFromPath,
    ImageFromURL,
    ImageFromVolume,
    InterfaceAddress,
)


def secret(**data: bytes) -> dict[str, object]:
    return {
        "metadata": {"name": "boot"},
        "data": {k: base64.b64encode(v).decode() for k, v in data.items()},
    }


def spec(**values: object) -> LibvirtMachineSpec:
    body: dict[str, object] = {"image": {"volume": "base.qcow2"}}
    body.update(values)
    return LibvirtMachineSpec.model_validate(body)


# --- bootstrap -------------------------------------------------------------------------------


def test_bootstrap_defaults_to_cloud_config() -> None:
    data = read_bootstrap(secret(value=b"#cloud-config\n"))
    assert data.format is c.BootstrapFormat.CLOUD_CONFIG
    assert data.data == b"#cloud-config\n"
    assert "cloud-config\\n" not in repr(data)


def test_bootstrap_ignition_is_validated_without_leaking_content() -> None:
    good = json.dumps({"ignition": {"version": "3.4.0"}}).encode()
    assert read_bootstrap(secret(value=good, format=b"ignition")).format is (
        c.BootstrapFormat.IGNITION
    )
    with pytest.raises(BootstrapProblem) as info:
        read_bootstrap(secret(value=b'{"password": "hunter2"', format=b"ignition"))
    assert info.value.reason == c.Reason.BOOTSTRAP_DATA_INVALID
    assert "not valid JSON" in info.value.message
    assert "hunter2" not in info.value.message


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"metadata": {"name": "boot"}, "data": {}}, "has no key 'value'"),
        (secret(value=b"x", format=b"yaml"), "not supported"),
        ({"metadata": {"name": "boot"}, "data": {"value": "%%%"}}, "not base64"),
    ],
)
def test_bootstrap_problems(body: dict[str, object], expected: str) -> None:
    with pytest.raises(BootstrapProblem, match=expected):
        read_bootstrap(body)


# --- placement -------------------------------------------------------------------------------


def test_choose_host_by_memory_left() -> None:
    assert choose_host([]) is None
    candidates = [
        HostCandidate(name="a", free_bytes=8, committed_bytes=0),
        HostCandidate(name="b", free_bytes=16, committed_bytes=12),
        HostCandidate(name="c", free_bytes=8, committed_bytes=0),
    ]
    assert choose_host(candidates) == "a"  # ties: spec order


def test_committed_memory_counts_unprovisioned_machines_on_the_host() -> None:
    def lm(uid: str, host: str, mib: int, provisioned: bool) -> dict[str, object]:
        return {
            "metadata": {"uid": uid},
            "spec": {"hostName": host, "memoryMiB": mib},
            "status": {"initialization": {"provisioned": provisioned}},
        }

    machines = [
        lm("1", "a", 1024, False),
        lm("2", "a", 2048, True),
        lm("3", "b", 512, False),
        lm("me", "a", 4096, False),
    ]
    assert committed_memory(machines, host="a", skip_uid="me") == 1024 * 1024**2


def test_placement_record_round_trip() -> None:
    record = Placement(
        host="kvm1",
        uri="qemu+ssh://root@kvm1/system",
        pool="p",
        network="n",
        dns_domain="d.example",
        credentials_secret="kvm1-ssh",
        cluster="c",
    )
    assert Placement.decode(record.encode()) == record
    assert Placement.decode(None) is None
    assert Placement.decode("{not json") is None
    assert Placement.decode('{"host": "x"}') is None


# --- network interfaces ----------------------------------------------------------------------


def test_default_nic_is_on_the_cluster_network() -> None:
    [nic] = nic_plans(spec(), cluster_network="net", bridge_mode=False)
    assert (nic.network, nic.bridge, nic.cluster_network, nic.mac) == ("net", None, True, None)
    [bridged] = nic_plans(spec(), cluster_network="net", bridge_mode=True)
    assert not bridged.cluster_network  # no DHCP managed by libvirt there


def test_nic_plans_follow_the_spec() -> None:
    plans = nic_plans(
        spec(
            networkInterfaces=[
                {"mac": "52:54:00:AA:BB:CC", "ip": "10.0.0.5"},
                {"network": "storage"},
                {"bridge": "br0"},
            ]
        ),
        cluster_network="net",
        bridge_mode=False,
    )
    assert [(p.network, p.bridge, p.cluster_network) for p in plans] == [
        ("net", None, True),
        ("storage", None, False),
        (None, "br0", False),
    ]
    assert plans[0].mac == "52:54:00:aa:bb:cc"
    assert plans[0].dhcp_name("m") == "m"
    assert plans[1].dhcp_name("m") == "m-nic1"
    assert list(mac_candidates(plans[0], cluster="c", namespace="ns", name="m")) == [plans[0].mac]
    derived = list(mac_candidates(plans[1], cluster="c", namespace="ns", name="m"))
    assert len(set(derived)) == MAX_MAC_ATTEMPTS
    first = mac_candidates(
        nic_plans(spec(), cluster_network="net", bridge_mode=False)[0],
        cluster="c",
        namespace="ns",
        name="m",
    )
    assert not set(first) & set(derived)  # NICs never share a MAC


# --- images ----------------------------------------------------------------------------------


def test_image_plans() -> None:
    digest = "ab" * 32
    url = image_plan(
        spec(
            image={
                "url": "https://img.example/fcos/disk.qcow2?sig=x",
                "checksum": f"sha256:{digest}",
            }
        )
    )
    assert isinstance(url.source, ImageFromURL)
    assert url.source.sha256 == digest
    assert url.volume.startswith("capl-base-disk.qcow2-")
    other = image_plan(spec(image={"url": "https://img.example/fcos/disk.qcow2"}))
    assert other.volume != url.volume  # different content, different base volume
    path = image_plan(spec(image={"path": "/srv/images/fcos.qcow2"}))
    assert isinstance(path.source, ImageFromPath)
    volume = image_plan(spec())
    assert isinstance(volume.source, ImageFromVolume)
    assert volume.volume == "base.qcow2"


# --- the domain ------------------------------------------------------------------------------


def test_domain_spec() -> None:
    names = machine_names(namespace="ns", name="m")
    owner = DomainOwner(cluster="c", namespace="ns", name="m", uid="u")
    s = spec(firmware="uefi", extraDisks=[{"name": "data", "sizeGiB": 5}], cpus=3, memoryMiB=2048)
    [nic] = nic_plans(s, cluster_network="net", bridge_mode=False)
    domain = build_domain_spec(
        names=names,
        uuid="6f0e1c2a-93a3-4f1c-8f62-1d1d9d7c1d11",
        owner=owner,
        spec=s,
        domain_type="kvm",
        arch="x86_64",
        root_path="/pool/root.qcow2",
        extra_paths=[("data", "/pool/data0.qcow2")],
        ignition_path=None,
        cidata_path="/pool/cidata.iso",
        nics=[(nic, "52:54:00:00:00:01")],
        console_log="/pool/console.log",
    )
    assert domain.name == names.domain
    assert (domain.vcpus, domain.memory_mib) == (3, 2048)
    assert domain.firmware.value == "uefi"
    assert domain.cpu_mode == "host-passthrough"
    root, data, iso = domain.disks
    assert root.path == "/pool/root.qcow2"
    assert data.serial == "data"
    assert (iso.device, iso.bus, iso.readonly) == (DiskDevice.CDROM, DiskBus.SCSI, True)
    assert domain.fw_cfg == ()
    assert domain.nics[0].network == "net"
    ignition = build_domain_spec(
        names=names,
        uuid="6f0e1c2a-93a3-4f1c-8f62-1d1d9d7c1d11",
        owner=owner,
        spec=spec(),
        domain_type="qemu",
        arch="x86_64",
        root_path="/pool/root.qcow2",
        extra_paths=[],
        ignition_path="/pool/m.ign",
        cidata_path=None,
        nics=[],
        console_log=None,
    )
    assert [(e.name, e.file) for e in ignition.fw_cfg] == [(IGNITION_FWCFG_KEY, "/pool/m.ign")]
    assert ignition.cpu_mode is None
    assert all(d.device is DiskDevice.DISK for d in ignition.disks)


# --- addresses -------------------------------------------------------------------------------


def _addr(
    ip: str, source: AddressSource = AddressSource.LEASE, family: int = 4
) -> InterfaceAddress:
    return InterfaceAddress(mac="52:54:00:00:00:01", ip=ip, prefix=24, source=source, family=family)


def test_addresses_merged_lease_first_ipv4_first() -> None:
    observed = [
        _addr("fd00::5", AddressSource.AGENT, 6),
        _addr("10.0.0.9", AddressSource.AGENT),
        _addr("10.0.0.5"),
        _addr("10.0.0.5", AddressSource.AGENT),
    ]
    addresses, known = merge_addresses(observed, previous=None, hostname="m", fqdn="m.d")
    assert known
    assert addresses == [
        {"type": "InternalIP", "address": "10.0.0.5"},
        {"type": "InternalIP", "address": "10.0.0.9"},
        {"type": "InternalIP", "address": "fd00::5"},
        {"type": "Hostname", "address": "m"},
        {"type": "InternalDNS", "address": "m.d"},
    ]


def test_last_known_address_is_kept() -> None:
    previous = [{"type": "InternalIP", "address": "10.0.0.5"}, {"type": "Hostname", "address": "m"}]
    addresses, known = merge_addresses([], previous=previous, hostname="m", fqdn=None)
    assert known
    assert addresses == previous
    addresses, known = merge_addresses([], previous=None, hostname="m", fqdn=None)
    assert not known
    assert addresses == [{"type": "Hostname", "address": "m"}]


def test_recorded_ips_skip_self() -> None:
    machines = [
        {
            "metadata": {"uid": "a"},
            "status": {"addresses": [{"type": "InternalIP", "address": "1.1.1.1"}]},
        },
        {"metadata": {"uid": "b"}, "status": {"addresses": [{"type": "Hostname", "address": "b"}]}},
        {
            "metadata": {"uid": "me"},
            "status": {"addresses": [{"type": "InternalIP", "address": "2.2.2.2"}]},
        },
    ]
    assert recorded_ips(machines, skip_uid="me") == {"1.1.1.1"}


def test_recorded_ips_answer_from_the_live_index_without_copying_it() -> None:
    index: dict[str, object] = {"10.0.0.2": "a", "10.0.0.3": "me"}
    taken = RecordedIps(index, own=["10.0.0.3"])
    assert "10.0.0.2" in taken
    assert "10.0.0.3" not in taken  # only this machine reports it
    assert "10.0.0.4" not in taken
    index["10.0.0.4"] = "b"  # recorded meanwhile (another machine's status): seen
    assert "10.0.0.4" in taken
    taken.add("10.0.0.9")  # picked for an earlier NIC of this machine
    assert "10.0.0.9" in taken
    assert sorted(taken) == ["10.0.0.2", "10.0.0.4", "10.0.0.9"]
    assert len(taken) == 3
    assert 7 not in taken


# --- errors, ownership -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "reason", "transient", "condition"),
    [
        (HostUnreachable("down"), c.Reason.UNREACHABLE, True, c.ConditionType.DOMAIN_PROVISIONED),
        (
            ImageChecksumError("bad", expected="a", actual="b"),
            c.Reason.CHECKSUM_MISMATCH,
            False,
            c.ConditionType.DOMAIN_PROVISIONED,
        ),
        (
            ImageDownloadError("404"),
            c.Reason.IMAGE_UNAVAILABLE,
            True,
            c.ConditionType.DOMAIN_PROVISIONED,
        ),
        (
            StorageFull("full"),
            c.Reason.STORAGE_UNAVAILABLE,
            True,
            c.ConditionType.DOMAIN_PROVISIONED,
        ),
        (
            ForeignDomainError("x", name="d"),
            c.Reason.NAME_COLLISION,
            False,
            c.ConditionType.DOMAIN_PROVISIONED,
        ),
        (
            BootstrapDataError("bad"),
            c.Reason.BOOTSTRAP_DATA_INVALID,
            False,
            c.ConditionType.BOOTSTRAP_DATA_DELIVERED,
        ),
        (VirtError("odd"), c.Reason.DOMAIN_ERROR, True, c.ConditionType.DOMAIN_PROVISIONED),
    ],
)
def test_classify(error: VirtError, reason: str, transient: bool, condition: str) -> None:
    failure = classify(error)
    assert (failure.reason, failure.transient, failure.condition) == (reason, transient, condition)
    assert failure.message == str(error)


def test_owner_matching() -> None:
    mine = DomainOwner(cluster="c", namespace="ns", name="m", uid="u1")
    assert owner_matches(mine, mine) == (True, False)
    moved = DomainOwner(cluster="c", namespace="ns", name="m", uid="u0")
    assert owner_matches(moved, mine) == (True, True)
    other = DomainOwner(cluster="c", namespace="ns", name="n", uid="u1")
    assert owner_matches(other, mine) == (False, False)
    assert owner_matches(None, mine) == (False, False)


def test_fault_point_exits_only_at_its_step() -> None:
    script = (
        "from capl.controllers.machine.plan import fault_point\n"
        "fault_point('domain-started')\n"
        "fault_point('domain-defined')\n"
        "print('survived')\n"
    )
    survived = subprocess.run(
        [sys.executable, "-c", script],
        env={"PATH": "/usr/bin:/bin", FAULT_ENV: "status-written"},
        capture_output=True,
        check=False,
    )
    assert survived.returncode == 0
    assert survived.stdout.strip() == b"survived"
    crashed = subprocess.run(
        [sys.executable, "-c", script],
        env={"PATH": "/usr/bin:/bin", FAULT_ENV: "domain-defined"},
        capture_output=True,
        check=False,
    )
    assert crashed.returncode == FAULT_EXIT_CODE
    assert b"survived" not in crashed.stdout


def test_dns_names() -> None:
    assert dns_name("m", "lab.example") == "m.lab.example"
    assert dns_name("m", None) is None
    assert dns_name("api", "lab.example") is None  # the cluster controller's name
    assert dns_name("api-int", "lab.example") is None


# --- orphans ---------------------------------------------------------------------------------


def test_accounts_for_same_uid_or_adopting_move_only() -> None:
    obj = {"metadata": {"uid": "u1"}, "spec": {"domainUUID": "AAA"}}
    assert accounts_for(obj, owner_uid="u1", domain_uuid="bbb")  # same incarnation
    assert accounts_for(obj, owner_uid="old", domain_uuid="aaa")  # moved: it records the domain
    assert not accounts_for(obj, owner_uid="old", domain_uuid="bbb")  # re-created: new domain
    assert not accounts_for(None, owner_uid="u1", domain_uuid="aaa")
    assert not accounts_for({"metadata": {"uid": "u1"}}, owner_uid="", domain_uuid="aaa")


def test_orphan_tracker_needs_two_sweeps_and_the_grace_period() -> None:
    from capl.runtime.clock import FakeClock

    clock = FakeClock()
    tracker = OrphanTracker(grace=60.0)
    assert tracker.observe("ns/c/h1", ["A", "b"], now=clock.now()) == set()
    assert tracker.pending() == 2
    clock.advance(30)
    assert tracker.observe("ns/c/h1", ["a", "b"], now=clock.now()) == set()  # too young
    clock.advance(30)
    assert tracker.observe("ns/c/h1", ["a"], now=clock.now()) == {"a"}  # b vanished: reset
    assert tracker.observe("ns/c/h1", ["a", "b"], now=clock.now()) == {"a"}
    clock.advance(60)
    assert tracker.observe("ns/c/h1", ["a", "b"], now=clock.now()) == {"a", "b"}
    tracker.forget("A")
    assert tracker.observe("ns/c/h1", ["a", "b"], now=clock.now()) == {"b"}
    # scopes are independent; a scope swept with an error starts over
    assert tracker.observe("ns/c/h2", ["c"], now=clock.now()) == set()
    tracker.reset("ns/c/h1")
    clock.advance(120)
    assert tracker.observe("ns/c/h1", ["b"], now=clock.now()) == set()
    assert tracker.observe("ns/c/h2", ["c"], now=clock.now()) == {"c"}
    tracker.retain(["ns/c/h1"])
    assert tracker.observe("ns/c/h2", ["c"], now=clock.now()) == set()


def test_orphan_tracker_without_grace_confirms_on_the_second_sweep() -> None:
    tracker = OrphanTracker(grace=0.0)
    assert tracker.observe("s", ["x"], now=5.0) == set()
    assert tracker.observe("s", ["x"], now=5.0) == {"x"}
