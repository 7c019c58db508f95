"""capl.webhooks.validation: the admission checks as pure functions."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from capl import api
from capl.api import LibvirtCluster, LibvirtClusterTemplate, LibvirtMachine, LibvirtMachineTemplate
from capl.webhooks.validation import (
    GIB,
    FieldError,
    Verdict,
    host_key,
    validate_libvirt_cluster,
    validate_libvirt_cluster_template,
    validate_libvirt_machine,
    validate_libvirt_machine_template,
)


def cluster(
    name: str = "c",
    *,
    namespace: str = "ns",
    uid: str | None = None,
    hosts: list[dict[str, Any]] | None = None,
    **spec: Any,
) -> LibvirtCluster:
    return LibvirtCluster.model_validate(
        {
            "metadata": {"name": name, "namespace": namespace, "uid": uid or f"uid-{name}"},
            "spec": {
                "hosts": hosts or [{"name": "h0", "uri": "qemu:///system"}],
                "network": spec.pop("network", {"cidr": "192.168.150.0/24"}),
                **spec,
            },
        }
    )


def machine(**spec: Any) -> LibvirtMachine:
    return LibvirtMachine.model_validate(
        {
            "metadata": {"name": "m", "namespace": "ns"},
            "spec": {"image": {"url": "https://example.invalid/base.qcow2"}, **spec},
        }
    )


def machine_template(
    annotations: dict[str, str] | None = None, **spec: Any
) -> LibvirtMachineTemplate:
    return LibvirtMachineTemplate.model_validate(
        {
            "metadata": {"name": "t", "namespace": "ns", "annotations": annotations or {}},
            "spec": {
                "template": {
                    "spec": {"image": {"url": "https://example.invalid/base.qcow2"}, **spec}
                }
            },
        }
    )


def cluster_template(
    annotations: dict[str, str] | None = None, **network: Any
) -> LibvirtClusterTemplate:
    return LibvirtClusterTemplate.model_validate(
        {
            "metadata": {"name": "ct", "namespace": "ns", "annotations": annotations or {}},
            "spec": {
                "template": {
                    "spec": {
                        "hosts": [{"name": "h0", "uri": "qemu:///system"}],
                        "network": network or {"cidr": "10.9.0.0/24"},
                    }
                }
            },
        }
    )


def errors(verdict: Verdict) -> list[str]:
    return [str(e) for e in verdict.errors]


DRY_RUN = {api.TOPOLOGY_DRY_RUN_ANNOTATION: ""}


# --- host identity ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        ("qemu:///system", "qemu:///system", True),
        ("qemu:///system", "qemu+ssh://root@localhost/system", True),
        ("qemu+ssh://root@KVM1/system", "qemu+tls://kvm1/system", True),
        ("qemu+ssh://kvm1/system", "qemu+ssh://kvm2/system", False),
        ("qemu:///system", "qemu:///session", False),
        ("qemu:///system", "test:///default", False),
        ("qemu+tcp://127.0.0.1/system", "qemu:///system", True),
        ("qemu+ssh://kvm1/system?keyfile=/a", "qemu+ssh://kvm1/system", True),
    ],
)
def test_host_key(a: str, b: str, same: bool) -> None:
    assert (host_key(a) == host_key(b)) is same


# --- LibvirtCluster --------------------------------------------------------------------------


def test_valid_cluster_passes() -> None:
    verdict = validate_libvirt_cluster(
        cluster(
            network={
                "cidr": "192.168.150.0/24",
                "dhcp": {"start": "192.168.150.100", "end": "192.168.150.200"},
            }
        ),
        others=[cluster("other", network={"cidr": "192.168.151.0/24"})],
    )
    assert verdict.allowed, errors(verdict)


def test_cidr_with_host_bits() -> None:
    verdict = validate_libvirt_cluster(cluster(network={"cidr": "192.168.150.7/24"}))
    assert errors(verdict) == [
        "spec.network.cidr: 192.168.150.7/24 has host bits set; the network address is"
        " 192.168.150.0/24"
    ]


@pytest.mark.parametrize(
    ("dhcp", "message"),
    [
        (
            {"start": "192.168.151.10", "end": "192.168.150.20"},
            "spec.network.dhcp.start: 192.168.151.10 is outside",
        ),
        (
            {"start": "192.168.150.10", "end": "10.0.0.1"},
            "spec.network.dhcp.end: 10.0.0.1 is outside",
        ),
        (
            {"start": "192.168.150.1", "end": "192.168.150.20"},
            "spec.network.dhcp.start: 192.168.150.1 is the network, gateway",
        ),
        (
            {"start": "192.168.150.10", "end": "192.168.150.255"},
            "spec.network.dhcp.end: 192.168.150.255 is the network, gateway",
        ),
        (
            {"start": "192.168.150.50", "end": "192.168.150.20"},
            "spec.network.dhcp: start 192.168.150.50 is after end",
        ),
    ],
)
def test_dhcp_range_checks(dhcp: dict[str, str], message: str) -> None:
    verdict = validate_libvirt_cluster(cluster(network={"cidr": "192.168.150.0/24", "dhcp": dhcp}))
    assert any(e.startswith(message) for e in errors(verdict)), errors(verdict)


def test_vip_inside_dhcp_range_is_rejected() -> None:
    network = {
        "cidr": "192.168.150.0/24",
        "dhcp": {"start": "192.168.150.100", "end": "192.168.150.200"},
    }
    bad = cluster(network=network, controlPlaneEndpoint={"host": "192.168.150.150", "port": 6443})
    assert errors(validate_libvirt_cluster(bad)) == [
        "spec.controlPlaneEndpoint.host: 192.168.150.150 is inside the DHCP range"
        " 192.168.150.100-192.168.150.200: a virtual IP must not be handed out to machines"
    ]
    good = cluster(network=network, controlPlaneEndpoint={"host": "192.168.150.10", "port": 6443})
    assert validate_libvirt_cluster(good).allowed
    # the host's own address on the network (an API server on the libvirt host) is valid
    gateway = cluster(network=network, controlPlaneEndpoint={"host": "192.168.150.1", "port": 6443})
    assert validate_libvirt_cluster(gateway).allowed
    broadcast = cluster(
        network=network, controlPlaneEndpoint={"host": "192.168.150.255", "port": 6443}
    )
    assert errors(validate_libvirt_cluster(broadcast)) == [
        "spec.controlPlaneEndpoint.host: 192.168.150.255 is the network or broadcast address"
        " of 192.168.150.0/24"
    ]
    by_name = cluster(network=network, controlPlaneEndpoint={"host": "api.example", "port": 6443})
    assert validate_libvirt_cluster(by_name).allowed


def test_overlapping_cidr_on_a_shared_host_is_rejected() -> None:
    other = cluster("other", namespace="team-b", network={"cidr": "192.168.150.128/25"})
    verdict = validate_libvirt_cluster(cluster(), others=[other])
    assert errors(verdict) == [
        "spec.network.cidr: 192.168.150.0/24 overlaps 192.168.150.128/25 of LibvirtCluster"
        " team-b/other on host qemu:///system"
    ]


def test_overlap_is_detected_across_uri_spellings() -> None:
    other = cluster("other", hosts=[{"name": "x", "uri": "qemu+ssh://root@localhost/system"}])
    assert not validate_libvirt_cluster(cluster(), others=[other]).allowed


def test_same_cidr_on_different_hosts_is_fine() -> None:
    other = cluster("other", hosts=[{"name": "h0", "uri": "qemu+ssh://kvm2/system"}])
    assert validate_libvirt_cluster(cluster(), others=[other]).allowed


def test_adopted_networks_do_not_overlap_check() -> None:
    other = cluster("other", network={"name": "default"})
    assert validate_libvirt_cluster(cluster(), others=[other]).allowed
    mine = cluster(network={"name": "default"})
    assert validate_libvirt_cluster(mine, others=[other]).allowed


def test_created_network_name_collision() -> None:
    other = cluster("other", network={"cidr": "10.1.0.0/24", "name": "shared"})
    mine = cluster(network={"cidr": "10.2.0.0/24", "name": "shared"})
    assert errors(validate_libvirt_cluster(mine, others=[other])) == [
        "spec.network.name: network shared on host qemu:///system is created by"
        " LibvirtCluster ns/other"
    ]


def test_a_cluster_does_not_overlap_itself() -> None:
    me = cluster()
    assert validate_libvirt_cluster(me, old=me, others=[me]).allowed
    # Without a uid (e.g. on create) namespace/name identify it.
    no_uid = cluster(uid="")
    assert validate_libvirt_cluster(no_uid, others=[no_uid]).allowed


def test_updates_are_ratcheted() -> None:
    """An existing overlap (created without the webhook) does not block later updates."""
    other = cluster("other", network={"cidr": "192.168.150.0/24"})
    old = cluster()
    new = cluster(controlPlaneEndpoint={"host": "api.c.ns.capl.internal", "port": 6443})
    assert validate_libvirt_cluster(new, old=old, others=[other]).allowed
    # A new problem in the same update is still reported.
    worse = cluster(
        controlPlaneEndpoint={"host": "192.168.150.9", "port": 6443},
        network={"cidr": "192.168.150.0/24"},
    )
    assert validate_libvirt_cluster(worse, old=old, others=[other]).allowed  # VIP outside range
    bad_dhcp = cluster(
        network={"cidr": "192.168.150.0/24", "dhcp": {"start": "10.0.0.1", "end": "10.0.0.2"}}
    )
    assert not validate_libvirt_cluster(bad_dhcp, old=old, others=[other]).allowed


def test_bridge_mode_without_endpoint_warns() -> None:
    verdict = validate_libvirt_cluster(cluster(network={"mode": "bridge", "bridge": "br0"}))
    assert verdict.allowed
    assert verdict.warnings
    assert "controlPlaneEndpoint" in verdict.warnings[0]


def test_an_adopted_network_on_several_hosts_warns_that_it_must_span_them() -> None:
    two = [{"name": "h0", "uri": "qemu:///system"}, {"name": "h1", "uri": "qemu+tls://h1/system"}]
    verdict = validate_libvirt_cluster(cluster(hosts=two, network={"name": "lan"}))
    assert verdict.allowed
    assert len(verdict.warnings) == 1
    assert verdict.warnings[0].startswith("spec.network.name: network lan is adopted on 2 hosts")
    # one host, or bridge mode across hosts: nothing to warn about
    assert not validate_libvirt_cluster(cluster(network={"name": "lan"})).warnings
    endpoint = {"host": "10.0.0.5", "port": 6443}
    bridged = cluster(
        hosts=two, network={"mode": "bridge", "bridge": "br0"}, controlPlaneEndpoint=endpoint
    )
    assert not validate_libvirt_cluster(bridged).warnings


# --- LibvirtMachine --------------------------------------------------------------------------


def test_root_volume_smaller_than_image() -> None:
    verdict = validate_libvirt_machine(
        machine(rootVolume={"sizeGiB": 2}), image_size=int(2.5 * GIB)
    )
    assert errors(verdict) == [
        "spec.rootVolume.sizeGiB: 2 GiB is smaller than the image's virtual size"
        f" ({int(2.5 * GIB)} bytes); use at least 3"
    ]
    assert validate_libvirt_machine(
        machine(rootVolume={"sizeGiB": 3}), image_size=int(2.5 * GIB)
    ).allowed
    assert validate_libvirt_machine(machine(rootVolume={"sizeGiB": 1}), image_size=None).allowed
    assert validate_libvirt_machine(machine(), image_size=100 * GIB).allowed


def test_mac_checks() -> None:
    verdict = validate_libvirt_machine(
        machine(
            networkInterfaces=[
                {"mac": "52:54:00:00:00:01"},
                {"mac": "52:54:00:00:00:01".upper(), "bridge": "br0"},
                {"mac": "01:00:5e:00:00:01", "bridge": "br1"},
            ]
        )
    )
    assert errors(verdict) == [
        "spec.networkInterfaces[1].mac: duplicates spec.networkInterfaces[0].mac",
        "spec.networkInterfaces[2].mac: 01:00:5e:00:00:01 is a multicast address",
    ]


def test_duplicate_fixed_ips() -> None:
    verdict = validate_libvirt_machine(
        machine(networkInterfaces=[{"ip": "10.0.0.5"}, {"ip": "10.0.0.5"}])
    )
    assert errors(verdict) == [
        "spec.networkInterfaces[1].ip: duplicates spec.networkInterfaces[0].ip"
    ]


def test_plain_http_without_checksum_warns() -> None:
    verdict = validate_libvirt_machine(machine(image={"url": "http://example.invalid/x.qcow2"}))
    assert verdict.allowed
    assert verdict.warnings == [
        "spec.image.checksum: the image is downloaded over plain http and not verified;"
        " set a sha256 checksum"
    ]


# --- templates -------------------------------------------------------------------------------


def test_machine_template_update_is_rejected() -> None:
    old = machine_template(cpus=2)
    new = machine_template(cpus=4)
    verdict = validate_libvirt_machine_template(new, old=old)
    assert [e.path for e in verdict.errors] == ["spec.template.spec"]
    assert "immutable" in verdict.message()


def test_machine_template_dry_run_with_annotation_is_allowed() -> None:
    old = machine_template(cpus=2)
    new = machine_template(DRY_RUN, cpus=4)
    assert validate_libvirt_machine_template(new, old=old, dry_run=True).allowed
    # Either half alone is not enough.
    assert not validate_libvirt_machine_template(new, old=old, dry_run=False).allowed
    assert not validate_libvirt_machine_template(
        machine_template(cpus=4), old=old, dry_run=True
    ).allowed


def test_machine_template_metadata_may_change() -> None:
    old = machine_template(cpus=2)
    new = copy.deepcopy(old)
    new.metadata.labels = {"a": "b"}
    assert validate_libvirt_machine_template(new, old=old).allowed


@pytest.mark.parametrize(
    ("spec", "path"),
    [
        (
            {"networkInterfaces": [{"mac": "52:54:00:00:00:01"}]},
            "spec.template.spec.networkInterfaces[0].mac",
        ),
        (
            {"networkInterfaces": [{}, {"ip": "10.0.0.9"}]},
            "spec.template.spec.networkInterfaces[1].ip",
        ),
        (
            {"providerID": "libvirt:///6f1c8c52-1d7a-4c2e-9d4e-0a1b2c3d4e5f"},
            "spec.template.spec.providerID",
        ),
        ({"domainUUID": "6f1c8c52-1d7a-4c2e-9d4e-0a1b2c3d4e5f"}, "spec.template.spec.domainUUID"),
    ],
)
def test_machine_template_must_not_carry_machine_identity(spec: dict[str, Any], path: str) -> None:
    verdict = validate_libvirt_machine_template(machine_template(**spec))
    assert [e.path for e in verdict.errors] == [path]


def test_machine_template_root_volume_check() -> None:
    verdict = validate_libvirt_machine_template(
        machine_template(rootVolume={"sizeGiB": 1}), image_size=2 * GIB
    )
    assert [e.path for e in verdict.errors] == ["spec.template.spec.rootVolume.sizeGiB"]


def test_cluster_template_immutable_except_topology_dry_run() -> None:
    old = cluster_template(cidr="10.9.0.0/24")
    new = cluster_template(cidr="10.9.1.0/24")
    assert errors(validate_libvirt_cluster_template(new, old=old))[0].startswith(
        "spec.template.spec: LibvirtClusterTemplate spec is immutable"
    )
    dry = cluster_template(DRY_RUN, cidr="10.9.1.0/24")
    assert validate_libvirt_cluster_template(dry, old=old, dry_run=True).allowed
    assert validate_libvirt_cluster_template(old, old=old).allowed


def test_cluster_template_network_checks_use_template_paths() -> None:
    bad = cluster_template(cidr="10.9.0.0/24", dhcp={"start": "10.9.1.1", "end": "10.9.1.9"})
    assert [e.path for e in validate_libvirt_cluster_template(bad).errors] == [
        "spec.template.spec.network.dhcp.start",
        "spec.template.spec.network.dhcp.end",
    ]


def test_field_error_and_verdict() -> None:
    verdict = Verdict()
    verdict.error("spec.a", "bad")
    verdict.error("spec.b", "worse")
    assert verdict.message() == "spec.a: bad; spec.b: worse"
    assert str(FieldError("x", "y")) == "x: y"
    assert not verdict.allowed
