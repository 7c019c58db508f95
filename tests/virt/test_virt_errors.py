"""Real libvirt errors from the test driver come out as typed errors with the libvirt text."""

from __future__ import annotations

import secrets
import uuid

import pytest

from capl.ports import errors as e
from capl.ports.virt import ClusterOwner, DomainOwner, DomainSpec, PoolSpec
from capl.virt import LibvirtHost


async def test_not_found_family(host: LibvirtHost) -> None:
    with pytest.raises(e.PoolNotFound) as pool:
        await host.get_volume(pool="capl-test-nopool", name="x")
    assert pool.value.reason == "StoragePoolNotFound"
    assert pool.value.host == "test:///default"
    with pytest.raises(e.NetworkNotFound):
        await host.ensure_dhcp_host(network="capl-test-nonet", mac="52:54:00:00:00:01")
    with pytest.raises(e.DomainNotFound):
        await host.retag_domain(
            str(uuid.uuid4()), owner=DomainOwner(cluster="c", namespace="n", name="m", uid="u")
        )
    assert await host.get_pool("capl-test-nopool") is None
    assert await host.get_network("capl-test-nonet") is None
    assert not await host.delete_volume(pool="capl-test-nopool", name="x")


async def test_unsupported_by_the_driver(host: LibvirtHost) -> None:
    with pytest.raises(e.Unsupported) as info:
        await host.dhcp_leases(network="default")
    assert "virNetworkGetDHCPLeases" in str(info.value)
    assert info.value.reason == "Unsupported"


async def test_configuration_libvirt_refuses(host: LibvirtHost) -> None:
    owner = DomainOwner(cluster="c", namespace="n", name="m-" + secrets.token_hex(3), uid="u")
    spec = DomainSpec(
        name="capl-test-" + secrets.token_hex(4),
        uuid=str(uuid.uuid4()),
        owner=owner,
        vcpus=1,
        memory_mib=64,
        domain_type="no-such-type",
    )
    with pytest.raises(e.Unsupported) as info:  # VIR_ERR_CONFIG_UNSUPPORTED
        await host.define_domain(spec)
    assert "invalid domain type no-such-type" in str(info.value)
    assert info.value.code == 67
    assert await host.get_domain(spec.uuid) is None


async def test_existing_pool_with_another_path(host: LibvirtHost) -> None:
    with pytest.raises(e.AlreadyExists, match="target path"):
        await host.ensure_pool(
            PoolSpec(
                name="default-pool", path="/not/there", owner=ClusterOwner(namespace="n", name="c")
            )
        )
