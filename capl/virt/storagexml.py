"""Storage pool and volume XML as capl reads it back, plus the host capability documents.

The documents capl writes (``<pool>``, ``<volume>``, a disk's ``<source>``) depend on the pool
type and come from its driver (``capl.virt.pools``); what is read back here is the same for
every type.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass

from capl.ports.virt import VolumeInfo
from capl.virt.xmlutil import child_text, parse

__all__ = [
    "DomainCaps",
    "HostCaps",
    "PoolXml",
    "parse_domain_caps",
    "parse_host_caps",
    "parse_pool_xml",
    "parse_volume_xml",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolXml:
    name: str
    uuid: str
    pool_type: str
    path: str


def parse_pool_xml(document: str) -> PoolXml:
    root = parse(document)
    return PoolXml(
        name=child_text(root, "name") or "",
        uuid=child_text(root, "uuid") or "",
        pool_type=root.get("type", ""),
        path=child_text(root, "target/path") or "",
    )


def _bytes(element: ET.Element | None) -> int:
    if element is None or not element.text:
        return 0
    unit = element.get("unit", "bytes").lower()
    scale = {
        "b": 1,
        "bytes": 1,
        "k": 1024,
        "kib": 1024,
        "m": 1024**2,
        "mib": 1024**2,
        "g": 1024**3,
        "gib": 1024**3,
        "kb": 1000,
        "mb": 1000**2,
        "gb": 1000**3,
    }.get(unit, 1)
    return int(element.text.strip()) * scale


def parse_volume_xml(document: str, *, pool: str) -> VolumeInfo:
    root = parse(document)
    backing = root.find("backingStore")
    backing_path = child_text(backing, "path") if backing is not None else None
    backing_format_element = backing.find("format") if backing is not None else None
    format_element = root.find("target/format")
    return VolumeInfo(
        pool=pool,
        name=child_text(root, "name") or "",
        path=child_text(root, "target/path") or child_text(root, "key") or "",
        format=format_element.get("type", "raw") if format_element is not None else "raw",
        capacity_bytes=_bytes(root.find("capacity")),
        allocation_bytes=_bytes(root.find("allocation")),
        backing_path=backing_path or None,
        backing_format=(
            backing_format_element.get("type") if backing_format_element is not None else None
        ),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class HostCaps:
    arch: str
    domain_types: tuple[str, ...]
    uuid: str = ""
    """The host's UUID (``host_uuid`` in libvirtd.conf, else from DMI): two URIs that show
    the same one reach the same host."""


def parse_host_caps(document: str) -> HostCaps:
    """Host arch and the domain types offered for hvm guests of that arch."""
    root = parse(document)
    arch = child_text(root, "host/cpu/arch") or ""
    types: list[str] = []
    fallback: list[str] = []
    for guest in root.findall("guest"):
        if child_text(guest, "os_type") != "hvm":
            continue
        arch_element = guest.find("arch")
        if arch_element is None:
            continue
        found = [d.get("type", "") for d in arch_element.findall("domain") if d.get("type")]
        target = types if arch_element.get("name") == arch else fallback
        target.extend(t for t in found if t not in target)
    return HostCaps(
        arch=arch,
        domain_types=tuple(types or fallback),
        uuid=(child_text(root, "host/uuid") or "").lower(),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class DomainCaps:
    efi: bool
    loaders: tuple[str, ...]


def parse_domain_caps(document: str) -> DomainCaps:
    root = parse(document)
    os_element = root.find("os")
    if os_element is None or os_element.get("supported") != "yes":
        return DomainCaps(efi=False, loaders=())
    firmware = [(v.text or "").strip() for v in os_element.findall("enum[@name='firmware']/value")]
    loaders = tuple((v.text or "").strip() for v in os_element.findall("loader/value") if v.text)
    return DomainCaps(efi="efi" in firmware or bool(loaders), loaders=loaders)
