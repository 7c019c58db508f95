"""Domains (blocking; runs in worker threads).

Identity before destruction: every call that changes a domain first looks it up by UUID
and reads the capl owner tag from its metadata; a domain without the tag, or with another
machine's identity (cluster, namespace, name, UID), raises ``ForeignDomainError`` before
anything is changed. Lookups go by UUID only; names are just for people.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Collection
from typing import Any

import libvirt

from capl.ports.errors import AlreadyExists, DomainNotFound, ForeignDomainError
from capl.ports.virt import (
    CAPL_XML_NAMESPACE,
    CAPL_XML_PREFIX,
    AddressSource,
    DomainInfo,
    DomainNic,
    DomainOwner,
    DomainSpec,
    DomainState,
    HostId,
    InterfaceAddress,
)
from capl.virt.domainxml import build_domain_xml, owner_from_metadata_xml, owner_metadata_xml
from capl.virt.errors import is_unsupported_flags
from capl.virt.states import state_of, state_reason_name
from capl.virt.support import code_of, lookup
from capl.virt.xmlutil import parse

__all__ = [
    "define",
    "define_and_start",
    "destroy",
    "domain_addresses",
    "get",
    "get_by_name",
    "list_owned",
    "nics",
    "nics_from_xml",
    "request_shutdown",
    "retag",
    "start",
    "state",
    "undefine",
]

log = logging.getLogger(__name__)

_NO_DOMAIN = libvirt.VIR_ERR_NO_DOMAIN
_NO_METADATA = libvirt.VIR_ERR_NO_DOMAIN_METADATA
_BOOTED = libvirt.VIR_DOMAIN_RUNNING_BOOTED

_UNDEFINE_FLAG_SETS = (
    libvirt.VIR_DOMAIN_UNDEFINE_NVRAM
    | libvirt.VIR_DOMAIN_UNDEFINE_SNAPSHOTS_METADATA
    | libvirt.VIR_DOMAIN_UNDEFINE_MANAGED_SAVE
    | libvirt.VIR_DOMAIN_UNDEFINE_CHECKPOINTS_METADATA,
    libvirt.VIR_DOMAIN_UNDEFINE_NVRAM
    | libvirt.VIR_DOMAIN_UNDEFINE_SNAPSHOTS_METADATA
    | libvirt.VIR_DOMAIN_UNDEFINE_MANAGED_SAVE,
    libvirt.VIR_DOMAIN_UNDEFINE_SNAPSHOTS_METADATA | libvirt.VIR_DOMAIN_UNDEFINE_MANAGED_SAVE,
    0,
)


def _by_uuid(c: Any, uuid: str) -> Any | None:
    return lookup(lambda: c.lookupByUUIDString(uuid), _NO_DOMAIN)


def owner_of(domain: Any) -> DomainOwner | None:
    try:
        document = domain.metadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, CAPL_XML_NAMESPACE, 0)
    except libvirt.libvirtError as exc:
        if code_of(exc) == _NO_METADATA:
            return None
        raise
    return owner_from_metadata_xml(document)


def _info(host_id: HostId, domain: Any, owner: DomainOwner | None) -> DomainInfo:
    code, reason = domain.state(0)
    current = state_of(code)
    return DomainInfo(
        host_id=host_id,
        name=domain.name(),
        uuid=domain.UUIDString(),
        state=current,
        reason=state_reason_name(current, reason),
        persistent=bool(domain.isPersistent()),
        autostart=bool(domain.autostart()),
        owner=owner,
    )


def _foreign(domain: Any, owner: DomainOwner | None, expected: DomainOwner) -> ForeignDomainError:
    held_by = (
        f"machine {owner.namespace}/{owner.name} (uid {owner.uid}, cluster {owner.cluster})"
        if owner
        else "no capl owner tag"
    )
    return ForeignDomainError(
        f"domain {domain.name()!r} ({domain.UUIDString()}) is not owned by machine "
        f"{expected.namespace}/{expected.name} (uid {expected.uid}): it has {held_by}; "
        "it is left untouched",
        name=domain.name(),
    )


def checked(c: Any, uuid: str, expected: DomainOwner) -> Any | None:
    """The domain with ``uuid`` if it exists and carries ``expected``'s tag; None if absent."""
    domain = _by_uuid(c, uuid)
    if domain is None:
        return None
    owner = owner_of(domain)
    if owner is None or not owner.matches(expected):
        raise _foreign(domain, owner, expected)
    return domain


def get(c: Any, host_id: HostId, uuid: str) -> DomainInfo | None:
    domain = _by_uuid(c, uuid)
    return _info(host_id, domain, owner_of(domain)) if domain is not None else None


def get_by_name(c: Any, host_id: HostId, name: str) -> DomainInfo | None:
    domain = lookup(lambda: c.lookupByName(name), _NO_DOMAIN)
    return _info(host_id, domain, owner_of(domain)) if domain is not None else None


def define(c: Any, host_id: HostId, spec: DomainSpec, *, absent: bool = False) -> DomainInfo:
    """Define (see ``Host.define_domain``). ``absent``: the caller found neither the UUID nor
    the name a moment ago (in the same reconcile); the two look-ups are not repeated, and
    defineXML's own refusals (a UUID known under another name, a name held by another UUID)
    stand in for them in a race."""
    xml = build_domain_xml(spec, pretty=False)  # validates the spec before any call
    existing = None if absent else checked(c, spec.uuid, spec.owner)
    if existing is not None:
        if not existing.autostart():
            existing.setAutostart(1)
        return _info(host_id, existing, spec.owner)
    holder = None if absent else lookup(lambda: c.lookupByName(spec.name), _NO_DOMAIN)
    if holder is not None:
        owner = owner_of(holder)
        if owner is None or not owner.matches(spec.owner):
            raise _foreign(holder, owner, spec.owner)
        raise AlreadyExists(
            f"domain name {spec.name!r} is held by this machine's domain {holder.UUIDString()}, "
            f"not by {spec.uuid}: the recorded domain UUID is stale"
        )
    return _defined(c.defineXML(xml), host_id, spec)


def _defined(domain: Any, host_id: HostId, spec: DomainSpec) -> DomainInfo:
    domain.setAutostart(1)
    return DomainInfo(  # known without asking: saves three calls per machine
        host_id=host_id,
        name=spec.name,
        uuid=domain.UUIDString(),
        state=DomainState.SHUTOFF,
        reason="unknown",
        persistent=True,
        autostart=True,
        owner=spec.owner,
    )


def define_and_start(
    c: Any,
    host_id: HostId,
    spec: DomainSpec,
    *,
    absent: bool,
    on_defined: Callable[[], None] | None = None,
) -> tuple[DomainInfo, list[InterfaceAddress]]:
    """``define`` with ``absent``, then ``start`` of what it defined, then its addresses, on
    the same handle (see ``Host.create_domain``): the domain just defined is started and
    asked for its addresses through the object defineXML returned, without a look-up by UUID
    in between. ``on_defined`` runs between the definition and the start. A domain started
    here is asked for its DHCP lease only: its guest agent cannot answer yet (it starts
    with the guest, seconds later at the earliest), and the address polls ask both."""
    if not absent:
        info = define(c, host_id, spec)
        if on_defined is not None:
            on_defined()
        info = start(c, host_id, spec.uuid, spec.owner, defined=info)
        running = info.state is DomainState.RUNNING
        return info, (domain_addresses(c, spec.uuid) if running else [])
    xml = build_domain_xml(spec, pretty=False)  # validates the spec before any call
    domain = c.defineXML(xml)
    info = _defined(domain, host_id, spec)
    if on_defined is not None:
        on_defined()
    info = _start_object(domain, host_id, spec.owner, info)
    running = info.state is DomainState.RUNNING
    return info, (_addresses(domain, spec.uuid, _SOURCES[:1]) if running else [])


def _require(c: Any, uuid: str, owner: DomainOwner) -> Any:
    domain = checked(c, uuid, owner)
    if domain is None:
        raise DomainNotFound(f"domain {uuid} does not exist")
    return domain


def start(
    c: Any, host_id: HostId, uuid: str, owner: DomainOwner, *, defined: DomainInfo | None = None
) -> DomainInfo:
    """Start unless running (see ``Host.start_domain``). ``defined``: what ``define`` just
    returned for this domain, shut off and tagged ``owner``: the tag and the state are not
    read again, and the answer is known without asking (2 calls instead of 7)."""
    if defined is not None and defined.state is DomainState.SHUTOFF:
        if defined.uuid.lower() != uuid.lower() or defined.owner != owner:
            raise ValueError(f"start: the definition given is not that of {uuid} for {owner}")
        return _start_defined(c, host_id, uuid, owner, defined)
    domain = _require(c, uuid, owner)
    code, _ = domain.state(0)
    current = state_of(code)
    if current is DomainState.PAUSED:
        domain.resume()
    elif current in (DomainState.SHUTOFF, DomainState.CRASHED, DomainState.NOSTATE):
        if current is DomainState.CRASHED and domain.isActive():
            domain.destroy()
        try:
            domain.create()
        except libvirt.libvirtError as exc:
            # started by someone else (autostart, a racing reconcile) in the meantime
            if code_of(exc) != libvirt.VIR_ERR_OPERATION_INVALID or not domain.isActive():
                raise
    return _info(host_id, domain, owner)


def _start_defined(
    c: Any, host_id: HostId, uuid: str, owner: DomainOwner, defined: DomainInfo
) -> DomainInfo:
    domain = _by_uuid(c, uuid)
    if domain is None:
        raise DomainNotFound(f"domain {uuid} does not exist")
    return _start_object(domain, host_id, owner, defined)


def _start_object(
    domain: Any, host_id: HostId, owner: DomainOwner, defined: DomainInfo
) -> DomainInfo:
    try:
        domain.create()
    except libvirt.libvirtError:
        # started by someone else in the meantime (qemu: operation invalid; the test
        # driver: internal error): read what it is now
        if not domain.isActive():
            raise
        return _info(host_id, domain, owner)
    running = DomainState.RUNNING
    return dataclasses.replace(defined, state=running, reason=state_reason_name(running, _BOOTED))


def state(c: Any, uuid: str) -> DomainState | None:
    domain = _by_uuid(c, uuid)
    if domain is None:
        return None
    code, _ = domain.state(0)
    return state_of(code)


def request_shutdown(c: Any, uuid: str, owner: DomainOwner) -> bool:
    """ACPI power button; False when the domain is absent or not running."""
    domain = checked(c, uuid, owner)
    if domain is None or not domain.isActive():
        return False
    try:
        domain.shutdownFlags(libvirt.VIR_DOMAIN_SHUTDOWN_ACPI_POWER_BTN)
    except libvirt.libvirtError as exc:
        if code_of(exc) == libvirt.VIR_ERR_OPERATION_INVALID:  # stopped meanwhile
            return False
        if not is_unsupported_flags(exc):
            raise
        domain.shutdown()
    return True


def destroy(c: Any, uuid: str, owner: DomainOwner) -> bool:
    domain = checked(c, uuid, owner)
    if domain is None or not domain.isActive():
        return False
    try:
        domain.destroy()
    except libvirt.libvirtError as exc:
        if code_of(exc) in (_NO_DOMAIN, libvirt.VIR_ERR_OPERATION_INVALID):
            return False
        raise
    return True


def undefine(c: Any, uuid: str, owner: DomainOwner) -> bool:
    domain = checked(c, uuid, owner)
    if domain is None:
        return False
    if domain.isActive():
        try:
            domain.destroy()
        except libvirt.libvirtError as exc:
            if code_of(exc) not in (_NO_DOMAIN, libvirt.VIR_ERR_OPERATION_INVALID):
                raise
    for flags in _UNDEFINE_FLAG_SETS:
        try:
            domain.undefineFlags(flags)
            return True
        except libvirt.libvirtError as exc:
            if code_of(exc) == _NO_DOMAIN:
                return False
            if flags and is_unsupported_flags(exc):
                log.debug("undefine flags %#x refused (%s), trying fewer", flags, exc)
                continue
            raise
    return True  # pragma: no cover - the last flag set is 0 and either returns or raises


def retag(c: Any, host_id: HostId, uuid: str, owner: DomainOwner) -> DomainInfo:
    domain = _by_uuid(c, uuid)
    if domain is None:
        raise DomainNotFound(f"domain {uuid} does not exist")
    current = owner_of(domain)
    if current is None or not current.matches(owner, ignore_uid=True):
        raise _foreign(domain, current, owner)
    if current.uid != owner.uid:
        flags = libvirt.VIR_DOMAIN_AFFECT_CONFIG
        if domain.isActive():
            flags |= libvirt.VIR_DOMAIN_AFFECT_LIVE
        domain.setMetadata(
            libvirt.VIR_DOMAIN_METADATA_ELEMENT,
            owner_metadata_xml(owner),
            CAPL_XML_PREFIX,
            CAPL_XML_NAMESPACE,
            flags,
        )
    return _info(host_id, domain, owner)


def list_owned(
    c: Any, host_id: HostId, cluster: str | None, skip_uuids: Collection[str] = ()
) -> list[DomainInfo]:
    """The tagged domains (of `cluster`); those in `skip_uuids` are not read (the UUID comes
    with the listing, the tag costs a call)."""
    result = []
    for domain in c.listAllDomains(0):
        if skip_uuids and domain.UUIDString().lower() in skip_uuids:
            continue
        try:
            owner = owner_of(domain)
            if owner is None or (cluster is not None and owner.cluster != cluster):
                continue
            result.append(_info(host_id, domain, owner))
        except libvirt.libvirtError as exc:
            if code_of(exc) == _NO_DOMAIN:  # undefined meanwhile
                continue
            raise
    return sorted(result, key=lambda d: d.name)


_SOURCES = (
    (AddressSource.LEASE, libvirt.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_LEASE),
    (AddressSource.AGENT, libvirt.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_AGENT),
)


def domain_addresses(c: Any, uuid: str) -> list[InterfaceAddress]:
    """Addresses from the DHCP lease and the guest agent. A domain that is not running has
    none: both queries fail then (no isActive round trip first; a failing source counts as
    reporting nothing, as an agent that does not answer does)."""
    domain = _by_uuid(c, uuid)
    if domain is None:
        raise DomainNotFound(f"domain {uuid} does not exist")
    return _addresses(domain, uuid)


def _addresses(
    domain: Any, uuid: str, sources: tuple[tuple[AddressSource, int], ...] = _SOURCES
) -> list[InterfaceAddress]:
    found: dict[tuple[AddressSource, str, str], InterfaceAddress] = {}
    for source, flag in sources:
        try:
            interfaces = domain.interfaceAddresses(flag, 0) or {}
        except libvirt.libvirtError as exc:
            # no agent, agent not answering, no lease support, domain stopped meanwhile
            log.debug("addresses of %s from %s: %s", uuid, source, exc.get_error_message())
            continue
        for ifname, details in interfaces.items():
            mac = str(details.get("hwaddr") or "").lower()
            for address in details.get("addrs") or []:
                ip = str(address.get("addr", ""))
                family = 6 if address.get("type") == libvirt.VIR_IP_ADDR_TYPE_IPV6 else 4
                if not ip or ip.startswith(("127.", "fe80:")) or ip == "::1":
                    continue
                found[(source, mac, ip)] = InterfaceAddress(
                    mac=mac,
                    ip=ip,
                    prefix=int(address.get("prefix", 0) or 0),
                    source=source,
                    interface=None if source is AddressSource.LEASE else str(ifname),
                    family=family,
                )
    return sorted(found.values(), key=lambda a: (a.source != AddressSource.LEASE, a.mac, a.ip))


def nics_from_xml(document: str) -> list[DomainNic]:
    """The ``<interface>`` devices of a domain definition, in document (guest) order.
    Interfaces of other types (user, direct, ...) are listed with neither network nor
    bridge; an interface without a MAC is skipped (libvirt always writes one)."""
    result: list[DomainNic] = []
    for element in parse(document).findall("./devices/interface"):
        mac_element = element.find("mac")
        mac = (mac_element.get("address") if mac_element is not None else None) or ""
        if not mac:
            continue
        source = element.find("source")
        kind = element.get("type")
        network = source.get("network") if source is not None and kind == "network" else None
        bridge = source.get("bridge") if source is not None and kind == "bridge" else None
        result.append(DomainNic(mac=mac.lower(), network=network, bridge=bridge))
    return result


def nics(c: Any, uuid: str) -> list[DomainNic]:
    """The NICs of the persistent definition (``VIR_DOMAIN_XML_INACTIVE``: what the next
    boot uses); one XMLDesc, nothing changed."""
    domain = _by_uuid(c, uuid)
    if domain is None:
        raise DomainNotFound(f"domain {uuid} does not exist")
    try:  # a transient domain answers with its live definition
        document = domain.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)
    except libvirt.libvirtError as exc:
        if code_of(exc) == _NO_DOMAIN:
            raise DomainNotFound(f"domain {uuid} does not exist") from None
        raise
    return nics_from_xml(str(document))
