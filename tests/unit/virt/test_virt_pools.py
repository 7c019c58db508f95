"""The storage pool driver seam (capl.virt.pools): the pool XML, the volume XML and each
disk's source come from the driver of the pool's type.

A second driver defined here (``BlockPool``: an LVM-like pool whose volumes are block
devices) proves the seam: with it, the same domain builder writes ``<disk type='block'>``
with ``<source dev=...>``, and nothing else of the domain changes.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Any

import pytest

from capl.ports.errors import InvalidSpec
from capl.ports.virt import (
    DIR_POOL,
    ClusterOwner,
    DiskSpec,
    DomainOwner,
    DomainSpec,
    PoolSpec,
    VolumeFormat,
)
from capl.virt.domainxml import build_domain_xml
from capl.virt.pools import POOL_DRIVERS, DiskSource, PoolDriver, PoolDrivers, pool_driver
from capl.virt.pools.base import VolumeRequest
from capl.virt.pools.directory import DirPool
from capl.virt.storagexml import PoolXml, parse_pool_xml, parse_volume_xml

OWNER = ClusterOwner(namespace="ns", name="demo")
UUID = "5d9f6a5e-3b0c-4d4a-9a52-0c1d2e3f4a5b"


class BlockPool:
    """A fake ``logical`` pool driver: volumes are logical volumes reached as block devices."""

    @property
    def pool_type(self) -> str:
        return "logical"

    def pool_xml(self, spec: PoolSpec) -> str:
        root = ET.Element("pool", type="logical")
        ET.SubElement(root, "name").text = spec.name
        source = ET.SubElement(root, "source")
        ET.SubElement(source, "name").text = "vg0"
        ET.SubElement(ET.SubElement(root, "target"), "path").text = spec.path
        return ET.tostring(root, encoding="unicode")

    def adoption_conflict(self, spec: PoolSpec, existing: PoolXml) -> str | None:
        return None if existing.pool_type == "logical" else f"is a {existing.pool_type} pool"

    def volume_xml(self, request: VolumeRequest) -> str:
        root = ET.Element("volume", type="block")
        ET.SubElement(root, "name").text = request.name
        ET.SubElement(root, "capacity", unit="bytes").text = str(request.capacity_bytes)
        return ET.tostring(root, encoding="unicode")

    def volume_path(self, volume: Any) -> str:
        return str(volume.path())  # a logical volume's key is not its path

    def disk_source(self, disk: DiskSpec, *, field: str) -> DiskSource:
        return DiskSource(disk_type="block", source=ET.Element("source", dev=disk.path))


DRIVERS: dict[str, PoolDriver] = {**POOL_DRIVERS, "logical": BlockPool()}


def _domain(*disks: DiskSpec) -> DomainSpec:
    return DomainSpec(
        name="capl-ns-m-0",
        uuid=UUID,
        owner=DomainOwner(cluster="demo", namespace="ns", name="m-0", uid="u"),
        vcpus=1,
        memory_mib=512,
        disks=disks,
    )


def _disks(document: str) -> list[ET.Element]:
    return ET.fromstring(document).findall("devices/disk")


def test_every_registered_driver_serves_the_type_it_is_registered_for() -> None:
    assert set(POOL_DRIVERS) == {DIR_POOL}
    for pool_type, driver in POOL_DRIVERS.items():
        assert driver.pool_type == pool_type
    assert isinstance(pool_driver(DIR_POOL), DirPool)


def test_a_pool_type_without_a_driver_is_an_invalid_spec() -> None:
    with pytest.raises(InvalidSpec, match=r"'rbd' is not supported.*dir"):
        pool_driver("rbd")
    with pytest.raises(InvalidSpec, match="'rbd' is not supported"):
        build_domain_xml(_domain(DiskSpec(path="/p/root.qcow2", pool_type="rbd")))


def test_directory_driver_writes_a_dir_pool_and_file_volumes() -> None:
    driver = pool_driver(DIR_POOL)
    pool = parse_pool_xml(driver.pool_xml(PoolSpec(name="p", path="/var/p", owner=OWNER)))
    assert (pool.pool_type, pool.name, pool.path) == ("dir", "p", "/var/p")
    request = VolumeRequest(
        name="root",
        capacity_bytes=5,
        format=VolumeFormat.QCOW2,
        backing_path="/var/p/base",
        backing_format="qcow2",
    )
    document = driver.volume_xml(request)
    assert ET.fromstring(document).get("type") == "file"
    volume = parse_volume_xml(document, pool="p")
    assert (volume.format, volume.backing_path, volume.capacity_bytes) == (
        "qcow2",
        "/var/p/base",
        5,
    )


def test_directory_driver_adopts_only_the_same_directory() -> None:
    driver = pool_driver(DIR_POOL)
    spec = PoolSpec(name="p", path="/var/p/", owner=OWNER)
    same = PoolXml(name="p", uuid="u", pool_type="dir", path="/var/p")
    other = PoolXml(name="p", uuid="u", pool_type="dir", path="/srv/p")
    assert driver.adoption_conflict(spec, same) is None
    assert (
        driver.adoption_conflict(spec, other) == "exists with target path '/srv/p', not '/var/p/'"
    )


def test_disk_sources_come_from_the_driver_of_each_disks_pool() -> None:
    document = build_domain_xml(
        _domain(
            DiskSpec(path="/var/p/root.qcow2"),
            DiskSpec(path="/dev/vg0/data", format=VolumeFormat.RAW, pool_type="logical"),
        ),
        drivers=DRIVERS,
    )
    root_disk, data_disk = _disks(document)
    assert root_disk.get("type") == "file"
    assert root_disk.find("source").attrib == {"file": "/var/p/root.qcow2"}  # type: ignore[union-attr]
    assert data_disk.get("type") == "block"
    assert data_disk.find("source").attrib == {"dev": "/dev/vg0/data"}  # type: ignore[union-attr]
    # the rest of the disk is the builder's, whatever the pool: driver, target, order
    assert [child.tag for child in data_disk] == ["driver", "source", "target"]
    assert data_disk.find("driver").attrib == {  # type: ignore[union-attr]
        "name": "qemu",
        "type": "raw",
        "discard": "unmap",
    }
    assert data_disk.find("target").attrib == {"dev": "vdb", "bus": "virtio"}  # type: ignore[union-attr]


def test_the_default_registry_builds_what_the_directory_driver_says() -> None:
    disk = DiskSpec(path="/var/p/root.qcow2")
    with_default = build_domain_xml(_domain(disk))
    with_explicit = build_domain_xml(_domain(disk), drivers={DIR_POOL: DirPool()})
    assert with_default == with_explicit
    assert _disks(with_default)[0].get("type") == "file"


class _PoolHandle:
    """A pool handle as the adapter sees one: UUIDString is local, XMLDesc is a call."""

    def __init__(self, uuid: str, pool_type: str) -> None:
        self.uuid = uuid
        self.pool_type = pool_type
        self.reads = 0

    def UUIDString(self) -> str:
        return self.uuid

    def XMLDesc(self, flags: int) -> str:
        self.reads += 1
        return f"<pool type='{self.pool_type}'><name>p</name><uuid>{self.uuid}</uuid></pool>"


def test_pool_drivers_read_a_pools_type_once_and_know_noted_pools_without_a_read() -> None:
    drivers = PoolDrivers(DRIVERS)
    logical = _PoolHandle("AAAA-1", "logical")
    assert isinstance(drivers.of(logical), BlockPool)
    assert isinstance(drivers.of(logical), BlockPool)
    assert logical.reads == 1
    noted = _PoolHandle("bbbb-2", "logical")
    drivers.note("BBBB-2", "logical")  # e.g. by ensure_pool, which read the definition anyway
    assert isinstance(drivers.of(noted), BlockPool)
    assert noted.reads == 0


def test_an_existing_pool_of_a_type_without_a_driver_is_served_as_a_directory() -> None:
    drivers = PoolDrivers(DRIVERS)
    netfs: Any = _PoolHandle("cccc-3", "netfs")
    assert isinstance(drivers.of(netfs), DirPool)
    with pytest.raises(InvalidSpec):
        drivers.for_type("netfs")  # but capl does not create one
    assert isinstance(drivers.for_type("logical"), BlockPool)
