"""The pure part of Cluster API IPAM for machines (capl.controllers.machine.plan_ipam):
claim names and bodies, reading an IPAddress, exhausted pools, the DHCP spec and the
static configuration that goes into Ignition and NoCloud."""

from __future__ import annotations

import json
import urllib.parse
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from capl.api import constants as c
from capl.api.machine import IPPoolReference, LibvirtMachineSpec
from capl.controllers.machine.plan import BootstrapData, nic_plans
from capl.controllers.machine.plan_ipam import (
    ClaimedAddress,
    InvalidAddress,
    PoolNic,
    address_of,
    bound_address_name,
    claim_body,
    claim_name,
    effective_spec,
    exhausted,
    ignition_with_network,
    network_config_v2,
    networkd_unit,
    outside_network,
    owned_by,
    pool_nics,
    with_static_addresses,
)

POOL = {"apiGroup": "ipam.cluster.x-k8s.io", "kind": "InClusterIPPool", "name": "pool-a"}


def spec(*nics: dict[str, Any]) -> LibvirtMachineSpec:
    return LibvirtMachineSpec.model_validate(
        {"image": {"volume": "base"}, "networkInterfaces": list(nics)}
    )


def ip_address(**spec_: Any) -> dict[str, Any]:
    return {"metadata": {"name": "m-nic0"}, "spec": spec_}


ADDR = ClaimedAddress(index=1, address="10.231.0.50", prefix=24, gateway="10.231.0.1", claim="m")


def test_pool_nics_are_the_nics_with_pools_by_index() -> None:
    s = spec({}, {"bridge": "br0", "addressesFromPools": [POOL]})
    assert pool_nics(s) == [PoolNic(index=1, pool=IPPoolReference.model_validate(POOL))]
    assert pool_nics(spec({})) == []


def test_ip_and_pools_are_exclusive_and_one_pool_per_nic() -> None:
    with pytest.raises(ValidationError):
        spec({"addressesFromPools": [POOL, POOL]})
    with pytest.raises(ValidationError):
        spec({"addressesFromPools": [{**POOL, "apiGroup": "Not A Group"}]})
    # the CEL rule (ip xor pools) is in the CRD; the webhook says it too (test below)
    schema = LibvirtMachineSpec.model_json_schema(by_alias=True)
    rules = json.dumps(schema)
    assert "ip and addressesFromPools are mutually exclusive" in rules


def test_claim_name_is_stable_and_bounded() -> None:
    assert claim_name("worker-a", 0) == "worker-a-nic0"
    long = "a" * 253
    name = claim_name(long, 3)
    assert len(name) == 253
    assert name.endswith("-nic3")
    assert name == claim_name(long, 3)
    assert name != claim_name(long[:-1] + "b", 3)


def test_claim_body_is_owned_labelled_and_names_pool_and_cluster() -> None:
    body = claim_body(
        name="m-nic0",
        namespace="ns",
        cluster="c1",
        owner_name="m",
        owner_uid="uid-1",
        pool=IPPoolReference.model_validate(POOL),
    )
    assert body["apiVersion"] == "ipam.cluster.x-k8s.io/v1beta2"
    assert body["metadata"]["labels"] == {c.CLUSTER_NAME_LABEL: "c1"}
    (ref,) = body["metadata"]["ownerReferences"]
    assert (ref["kind"], ref["name"], ref["uid"], ref["controller"]) == (
        "LibvirtMachine",
        "m",
        "uid-1",
        True,
    )
    assert body["spec"] == {"clusterName": "c1", "poolRef": POOL}
    assert owned_by(body, "uid-1")
    assert not owned_by(body, "uid-2")


def test_bound_address_name() -> None:
    assert bound_address_name({"status": {"addressRef": {"name": "m-nic0"}}}) == "m-nic0"
    assert bound_address_name({"status": {}}) is None
    assert bound_address_name({}) is None


def test_address_of_reads_address_prefix_gateway() -> None:
    got = address_of(
        ip_address(address="10.231.0.50", prefix=24, gateway="10.231.0.1"), index=2, claim="x"
    )
    assert (got.address, got.prefix, got.gateway, got.cidr, got.index) == (
        "10.231.0.50",
        24,
        "10.231.0.1",
        "10.231.0.50/24",
        2,
    )
    assert address_of(ip_address(address="10.0.0.5", prefix=8), index=0, claim="x").gateway is None


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"address": "fd00::5", "prefix": 64}, "not IPv4"),
        ({"address": "banana", "prefix": 24}, "spec.address"),
        ({"address": "10.0.0.5"}, "spec.prefix"),
        ({"address": "10.0.0.5", "prefix": 33}, "spec.prefix"),
        ({"address": "10.0.0.5", "prefix": 24, "gateway": "10.0.1.1"}, "outside 10.0.0.5/24"),
        ({"address": "10.0.0.5", "prefix": 24, "gateway": "x\nAddress=1.2.3.4"}, "spec.gateway"),
    ],
)
def test_address_of_refuses_what_the_guest_cannot_use(fields: dict[str, Any], words: str) -> None:
    with pytest.raises(InvalidAddress, match="IPAddress m-nic0") as info:
        address_of(ip_address(**fields), index=0, claim="x")
    assert words in str(info.value)


def test_exhausted_reads_the_in_cluster_pool_counts() -> None:
    full = {"status": {"ipAddresses": {"free": 0, "used": 11, "total": 11}}}
    assert exhausted(full) == (11, 11)
    assert exhausted({"status": {"ipAddresses": {"free": 1, "used": 10, "total": 11}}}) is None
    assert exhausted({}) is None


def test_describe_names_namespace_only_for_namespaced_pools() -> None:
    nic = PoolNic(index=0, pool=IPPoolReference.model_validate(POOL))
    assert nic.describe("ns") == "InClusterIPPool ns/pool-a"
    glob = PoolNic(
        index=0, pool=IPPoolReference.model_validate({**POOL, "kind": "GlobalInClusterIPPool"})
    )
    assert glob.describe("ns") == "GlobalInClusterIPPool pool-a"


def test_effective_spec_sets_ip_only_for_dhcp_nics_and_leaves_the_original() -> None:
    s = spec({"addressesFromPools": [POOL]}, {"bridge": "br0", "addressesFromPools": [POOL]})
    addresses = {
        0: ClaimedAddress(index=0, address="192.168.10.7", prefix=24, gateway=None, claim="a"),
        1: ADDR,
    }
    out = effective_spec(s, addresses, dhcp=[0])
    plans = nic_plans(out, cluster_network="net", bridge_mode=False)
    assert [p.ip for p in plans] == ["192.168.10.7", None]
    assert s.network_interfaces is not None
    assert s.network_interfaces[0].ip is None
    assert effective_spec(s, addresses, dhcp=[]) is s


def test_outside_network() -> None:
    inside = ClaimedAddress(index=0, address="192.168.10.7", prefix=24, gateway=None, claim="a")
    assert not outside_network(inside, "192.168.10.0/24")
    assert outside_network(inside, "192.168.11.0/24")
    network_address = ClaimedAddress(
        index=0, address="192.168.10.0", prefix=24, gateway=None, claim="a"
    )
    assert outside_network(network_address, "192.168.10.0/24")
    assert not outside_network(inside, None)


def test_networkd_unit() -> None:
    assert networkd_unit("52:54:00:aa:bb:cc", ADDR) == (
        "[Match]\nMACAddress=52:54:00:aa:bb:cc\n\n[Network]\nAddress=10.231.0.50/24\n"
        "DHCP=no\nGateway=10.231.0.1\n"
    )


def _unit_files(config: dict[str, Any]) -> dict[str, str]:
    out = {}
    for f in config["storage"]["files"]:
        source = f["contents"]["source"]
        assert source.startswith("data:,")
        out[f["path"]] = urllib.parse.unquote(source[len("data:,") :])
    return out


def test_ignition_gets_a_networkd_unit_and_keeps_everything_else() -> None:
    original = {
        "ignition": {"version": "3.4.0"},
        "storage": {"files": [{"path": "/etc/hostname", "contents": {"source": "data:,n"}}]},
        "systemd": {"units": [{"name": "kubeadm.service", "enabled": True}]},
    }
    out = json.loads(
        ignition_with_network(json.dumps(original).encode(), [("52:54:00:aa:bb:cc", ADDR)])
    )
    assert out["systemd"] == original["systemd"]
    files = _unit_files(out)
    assert files["/etc/hostname"] == "n"
    unit = files["/etc/systemd/network/10-capl-nic1.network"]
    assert "MACAddress=52:54:00:aa:bb:cc" in unit
    assert "Address=10.231.0.50/24" in unit
    entry = next(f for f in out["storage"]["files"] if f["path"].endswith(".network"))
    assert entry["overwrite"] is True
    assert entry["mode"] == 0o644
    # again: replaced, not duplicated
    twice = json.loads(
        ignition_with_network(json.dumps(out).encode(), [("52:54:00:aa:bb:cc", ADDR)])
    )
    assert len(twice["storage"]["files"]) == 2


def test_ignition_v2_entries_name_the_root_filesystem() -> None:
    out = json.loads(
        ignition_with_network(b'{"ignition":{"version":"2.3.0"}}', [("52:54:00:aa:bb:cc", ADDR)])
    )
    (entry,) = out["storage"]["files"]
    assert entry["filesystem"] == "root"
    assert "overwrite" not in entry


def test_network_config_v2() -> None:
    doc = yaml.safe_load(network_config_v2([("52:54:00:aa:bb:cc", ADDR)]))
    assert doc == {
        "version": 2,
        "ethernets": {
            "nic1": {
                "match": {"macaddress": "52:54:00:aa:bb:cc"},
                "dhcp4": False,
                "addresses": ["10.231.0.50/24"],
                "routes": [{"to": "0.0.0.0/0", "via": "10.231.0.1"}],
            }
        },
    }


def test_with_static_addresses_per_format() -> None:
    nics = [("52:54:00:aa:bb:cc", ADDR)]
    cloud = BootstrapData(format=c.BootstrapFormat.CLOUD_CONFIG, data=b"#cloud-config\n")
    got = with_static_addresses(cloud, nics)
    assert got.data == cloud.data
    assert got.network_config == network_config_v2(nics)
    ign = BootstrapData(format=c.BootstrapFormat.IGNITION, data=b'{"ignition":{"version":"3.4.0"}}')
    got = with_static_addresses(ign, nics)
    assert got.network_config is None
    assert b"10-capl-nic1.network" in got.data
    assert with_static_addresses(cloud, []) is cloud
    assert "10.231" not in repr(got)  # the bootstrap data's repr never shows content


def test_ipam_addresses_come_first_in_status_addresses() -> None:
    from capl.controllers.machine.plan_ipam import with_ipam_first

    addresses = [
        {"type": "InternalIP", "address": "10.0.0.23"},
        {"type": "InternalIP", "address": "10.0.0.50"},
        {"type": "Hostname", "address": "m"},
    ]
    assert with_ipam_first(addresses, ["10.0.0.50"]) == [
        {"type": "InternalIP", "address": "10.0.0.50"},
        {"type": "InternalIP", "address": "10.0.0.23"},
        {"type": "Hostname", "address": "m"},
    ]
    assert with_ipam_first(addresses, []) == addresses
