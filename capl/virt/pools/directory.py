"""The directory pool driver: a ``dir`` pool whose volumes are files.

Volumes are plain files in the pool's directory. An overlay is a qcow2 volume whose
``<backingStore>`` names the base image's path and format (never left to probing when capl
knows it); ``<compat>1.1</compat>`` gives the modern qcow2 header (lazy refcounts, zero
clusters). Uploaded payloads (Ignition, NoCloud ISO) and image downloads start as raw
volumes of capacity 0 that the upload stream grows; libvirt re-probes the real format when
the upload finishes. A domain reaches a volume as ``<disk type='file'>`` with the file's path
(AppArmor cannot resolve ``type='volume'``, libvirt-notes.md). An existing pool is adopted
when its target directory is the one asked for.
"""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from typing import Any

from capl.ports.virt import DIR_POOL, DiskSpec, PoolSpec, VolumeFormat
from capl.virt.pools.base import DiskSource, VolumeRequest
from capl.virt.storagexml import PoolXml
from capl.virt.xmlutil import line, serialize, sub

__all__ = ["DirPool", "build_pool_xml", "build_volume_xml"]


def build_pool_xml(*, name: str, path: str) -> str:
    """A ``dir`` pool over ``path`` (also the transient pool an image import reads a host
    file through)."""
    root = ET.Element("pool", type=DIR_POOL)
    sub(root, "name", line(name, field="pool name"))
    target = sub(root, "target")
    sub(target, "path", line(path, field="pool path"))
    return serialize(root)


def build_volume_xml(
    *,
    name: str,
    capacity_bytes: int,
    format: VolumeFormat,
    backing_path: str | None = None,
    backing_format: str | None = None,
    pretty: bool = False,
) -> str:
    """A file volume; compact unless ``pretty`` (golden files): libvirt alone reads it, two
    per machine, and indenting was most of its cost."""
    root = ET.Element("volume", type="file")
    sub(root, "name", line(name, field="volume name"))
    sub(root, "capacity", str(max(0, capacity_bytes)), unit="bytes")
    sub(root, "allocation", "0", unit="bytes")
    target = sub(root, "target")
    sub(target, "format", type=format.value)
    if format is VolumeFormat.QCOW2:
        sub(target, "compat", "1.1")
    if backing_path:
        backing = sub(root, "backingStore")
        sub(backing, "path", line(backing_path, field="backing store path"))
        if backing_format:
            sub(backing, "format", type=line(backing_format, field="backing store format"))
    return serialize(root, pretty=pretty)


def _norm(path: str) -> str:
    return os.path.normpath(path) if path else path


class DirPool:
    """``PoolDriver`` of ``dir`` pools (see the module docstring)."""

    @property
    def pool_type(self) -> str:
        return DIR_POOL

    def pool_xml(self, spec: PoolSpec) -> str:
        return build_pool_xml(name=spec.name, path=spec.path)

    def adoption_conflict(self, spec: PoolSpec, existing: PoolXml) -> str | None:
        if _norm(existing.path) == _norm(spec.path):
            return None
        return f"exists with target path {existing.path!r}, not {spec.path!r}"

    def volume_xml(self, request: VolumeRequest) -> str:
        return build_volume_xml(
            name=request.name,
            capacity_bytes=request.capacity_bytes,
            format=request.format,
            backing_path=request.backing_path,
            backing_format=request.backing_format,
        )

    def volume_path(self, volume: Any) -> str:
        # a directory pool's volume key is the volume's file path (libvirt sets one from the
        # other, for the test driver as well); the key comes with the handle, ``path()`` is a
        # call to the host
        return str(volume.key())

    def disk_source(self, disk: DiskSpec, *, field: str) -> DiskSource:
        source = ET.Element("source", file=line(disk.path, field=f"{field} path"))
        return DiskSource(disk_type="file", source=source)
