"""The pool driver seam on the test driver: a pool and its volumes are written by the driver
of the pool's type (capl.virt.pools), through the same storage code for every type.

``LogicalPool`` is a driver defined here for an LVM ``logical`` pool (the test driver keeps
metadata only, so no volume group is needed): a pool created with it is a logical pool, and
volumes created in it later are written by it, found by the pool's own type.
"""

from __future__ import annotations

import secrets
import xml.etree.ElementTree as ET
from typing import Any

import pytest

from capl.ports.errors import InvalidSpec
from capl.ports.virt import ClusterOwner, DiskSpec, PoolSpec, VolumeFormat
from capl.virt import LibvirtHost, storage
from capl.virt.pools import POOL_DRIVERS, DiskSource, PoolDrivers
from capl.virt.pools.base import VolumeRequest
from capl.virt.storagexml import PoolXml


class LogicalPool:
    def __init__(self) -> None:
        self.volumes: list[VolumeRequest] = []

    @property
    def pool_type(self) -> str:
        return "logical"

    def pool_xml(self, spec: PoolSpec) -> str:
        root = ET.Element("pool", type="logical")
        ET.SubElement(root, "name").text = spec.name
        ET.SubElement(ET.SubElement(root, "source"), "name").text = spec.name
        ET.SubElement(ET.SubElement(root, "target"), "path").text = spec.path
        return ET.tostring(root, encoding="unicode")

    def adoption_conflict(self, spec: PoolSpec, existing: PoolXml) -> str | None:
        return None

    def volume_xml(self, request: VolumeRequest) -> str:
        self.volumes.append(request)
        root = ET.Element("volume", type="block")
        ET.SubElement(root, "name").text = request.name
        ET.SubElement(root, "capacity", unit="bytes").text = str(request.capacity_bytes)
        return ET.tostring(root, encoding="unicode")

    def volume_path(self, volume: Any) -> str:
        return str(volume.path())  # a logical volume's key is not its path

    def disk_source(self, disk: DiskSpec, *, field: str) -> DiskSource:
        return DiskSource(disk_type="block", source=ET.Element("source", dev=disk.path))


async def test_a_pool_and_its_volumes_are_written_by_the_driver_of_its_type(
    host: LibvirtHost,
) -> None:
    driver = LogicalPool()
    registry = {**POOL_DRIVERS, "logical": driver}
    owner = ClusterOwner(namespace="ns", name="c-" + secrets.token_hex(3))
    name = "capl-test-lv-" + secrets.token_hex(4)
    spec = PoolSpec(name=name, path=f"/dev/{name}", owner=owner, pool_type="logical")
    conn = host.connection

    created = await conn.run(
        "ensure", lambda c: storage.ensure_pool(c, spec, drivers=PoolDrivers(registry))
    )
    assert (created.created, created.pool_type, created.path) == (True, "logical", spec.path)
    assert created.owned_by(owner)  # the owner marker was written by the driver as well
    assert [v.name for v in driver.volumes] == [created.owner_markers[0]]

    # a host that did not create the pool learns its type from the pool itself
    volume = await conn.run(
        "create",
        lambda c: storage.create_volume(
            c,
            name,
            "capl-root",
            drivers=PoolDrivers(registry),
            capacity_bytes=1 << 20,
            format=VolumeFormat.QCOW2,
        ),
    )
    assert driver.volumes[-1] == VolumeRequest(
        name="capl-root", capacity_bytes=1 << 20, format=VolumeFormat.QCOW2
    )
    assert volume.path == f"/dev/{name}/capl-root"  # a logical volume, not a file

    assert await host.delete_pool(name=name, owner=owner)
    assert await host.get_pool(name) is None


async def test_a_pool_type_without_a_driver_is_refused_before_anything_is_defined(
    host: LibvirtHost,
) -> None:
    owner = ClusterOwner(namespace="ns", name="c-" + secrets.token_hex(3))
    name = "capl-test-rbd-" + secrets.token_hex(4)
    with pytest.raises(InvalidSpec, match="'rbd' is not supported"):
        await host.ensure_pool(PoolSpec(name=name, path="/x", owner=owner, pool_type="rbd"))
    assert await host.get_pool(name) is None
