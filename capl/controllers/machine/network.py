"""A machine's entries in its cluster network: DHCP reservations and the DNS host record.

At creation (`reserve_addresses`): per NIC on the cluster network a DHCP reservation
(LIVE|CONFIG; the IP picked by the host under its per-network lock, excluding the IPs other
LibvirtMachines report: an index of the cache, not a scan), the DNS host record
`<name>.<dnsDomain>` merged into the first one in the same locked update. MACs are derived
(`plan.nic_mac`); a reservation of that MAC held by another host name makes the next
candidate be tried (see `plan`: MACs).

Re-created networks (`ensure_network_entries`). The reservations and records live in the
network's definition: when the network is destroyed and defined again (the LibvirtCluster
controller re-creates a network of its own that vanished; someone runs virsh), they are gone,
and a guest would get another address at its next lease and its name would not resolve. The
LibvirtCluster reports each host's network UUID (status.hosts[].networkUUID) and the machine
records the UUID its entries were made or restored in (status.networkUUID). The
LibvirtCluster watch requeues the cluster's machines when status.hosts changes; a machine
whose recorded UUID differs restores its reservations with the MACs its domain's definition
holds (a collision fallback included) and the addresses it had (spec, lease/agent by MAC,
else its InternalIPs in the CIDR: `plan_addresses.restore_plan`) plus its DNS name:
idempotent (present entries are only read), then the new UUID is recorded (a Normal event
`NetworkEntriesRestored` names what was ensured). Nothing polls libvirt for this: a settled
machine whose network keeps its UUID makes no call. A failure is a Warning event
(`NetworkEntriesRestoreFailed`) and a retry with backoff; the conditions do not change (the
domain itself is fine).

Deletion (`remove_network_entries`): the reservations with one of the machine's candidate
MACs *and* its name, and its DNS name; not-found is success.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Final

import structlog

from capl.api.machine import LibvirtMachineSpec
from capl.controllers.machine.indexes import INDEX_INTERNAL_IP
from capl.controllers.machine.options import LOGGER
from capl.controllers.machine.plan import (
    NicPlan,
    classify,
    fault_point,
    mac_candidates,
    nic_mac,
    nic_plans,
)
from capl.controllers.machine.plan_addresses import RecordedIps, internal_ips, restore_plan
from capl.controllers.machine.scope import Context, MachineScope
from capl.controllers.machine.target import Identity, Target
from capl.ports.errors import AddressConflict, NetworkNotFound, Unsupported, VirtError
from capl.ports.virt import Host, InterfaceAddress
from capl.runtime.controller import Result
from capl.runtime.objects import ObjectKey, meta
from capl.runtime.resources import LIBVIRT_MACHINE

__all__ = [
    "NETWORK_RESTORED_REASON",
    "NETWORK_RESTORE_FAILED_REASON",
    "default_nic",
    "ensure_network_entries",
    "remove_network_entries",
    "reserve_addresses",
    "reserve_nic",
]

log = structlog.get_logger(LOGGER)

NETWORK_RESTORED_REASON: Final = "NetworkEntriesRestored"
NETWORK_RESTORE_FAILED_REASON: Final = "NetworkEntriesRestoreFailed"


# -- at creation ------------------------------------------------------------------------------


async def reserve_addresses(
    ctx: Context, target: Target, spec: LibvirtMachineSpec, ident: Identity, fqdn: str | None
) -> list[tuple[NicPlan, str]]:
    """MACs, DHCP reservations (LIVE|CONFIG) and the DNS name: [(NIC, MAC)]."""
    host = target.host
    nics: list[tuple[NicPlan, str]] = []
    first_ip: str | None = None
    exclude: RecordedIps | None = None
    for nic in nic_plans(
        spec, cluster_network=target.network or "", bridge_mode=target.bridge_mode
    ):
        if nic.cluster_network and target.network:
            if exclude is None:
                exclude = _recorded_ips(ctx, ident)
            # the machine's DNS name goes with the first reservation, in the same
            # locked read-modify-write of the network
            dns = (fqdn,) if fqdn and first_ip is None else ()
            mac, ip = await _reserve(host, target.network, nic, ident, exclude, dns)
            if ip is not None:
                exclude.add(ip)
                if first_ip is None:
                    first_ip = ip
        else:
            mac = nic.mac or nic_mac(
                cluster=ident.cluster,
                namespace=ident.namespace,
                name=ident.name,
                index=nic.index,
                attempt=0,
            )
        nics.append((nic, mac))
    fault_point("dhcp-reserved")
    fault_point("dns-recorded")
    return nics


async def reserve_nic(ctx: Context, target: Target, nic: NicPlan, ident: Identity) -> str:
    """The MAC of a NIC added to an existing machine (capl.controllers.machine.day2), with
    its DHCP reservation when it is on the cluster network (as `reserve_addresses`)."""
    if nic.cluster_network and target.network:
        mac, _ip = await _reserve(
            target.host, target.network, nic, ident, _recorded_ips(ctx, ident), ()
        )
        return mac
    return nic.mac or nic_mac(
        cluster=ident.cluster,
        namespace=ident.namespace,
        name=ident.name,
        index=nic.index,
        attempt=0,
    )


def _recorded_ips(ctx: Context, ident: Identity) -> RecordedIps:
    """The InternalIPs other LibvirtMachines report (plan_addresses.recorded_ips), from the
    cache's index instead of a scan, and without a copy of it."""
    cache = ctx.cache
    key = ObjectKey(ident.namespace, ident.name)
    own = cache.get(LIBVIRT_MACHINE, key)
    mine: list[str] = []
    if own is not None and meta(own).get("uid") == ident.uid:
        store = cache.store(LIBVIRT_MACHINE)
        mine = [ip for ip in internal_ips(own) if store.index_keys(INDEX_INTERNAL_IP, ip) == [key]]
    return RecordedIps(cache.index_view(LIBVIRT_MACHINE, INDEX_INTERNAL_IP), mine)


async def _reserve(
    host: Host,
    network: str,
    nic: NicPlan,
    ident: Identity,
    exclude: Collection[str],
    dns: tuple[str, ...],
) -> tuple[str, str | None]:
    """(MAC, reserved IP) of a NIC on the cluster network (see plan: MACs); `dns` names
    join the reserved address's DNS record once the reservation is ours."""
    dhcp_name = nic.dhcp_name(ident.hostname)
    tried: list[str] = []
    for mac in mac_candidates(
        nic, cluster=ident.cluster, namespace=ident.namespace, name=ident.name
    ):
        tried.append(mac)
        try:
            reservation = await host.ensure_dhcp_host(
                network=network,
                mac=mac,
                name=dhcp_name,
                ip=nic.ip,
                exclude=exclude,
                dns_hostnames=dns,
            )
        except AddressConflict as exc:
            if nic.mac or exc.field != "mac":
                raise
            continue
        except Unsupported:
            return mac, None  # no DHCP managed by libvirt on this network
        if reservation.name == dhcp_name:
            return mac, reservation.ip
        if nic.mac:
            raise AddressConflict(
                f"network {network!r}: MAC {mac} is reserved for host "
                f"{reservation.name or '(unnamed)'} ({reservation.ip})",
                field="mac",
                value=mac,
            )
    raise AddressConflict(
        f"network {network!r}: the {len(tried)} MAC addresses derived for this "
        "machine are all reserved by other hosts; set spec.networkInterfaces[].mac",
        field="mac",
        value=tried[-1],
    )


# -- after the network was re-created -----------------------------------------------------------


async def ensure_network_entries(
    scope: MachineScope, observed: list[InterfaceAddress], *, made: bool
) -> Result | None:
    """Restore the DHCP reservations and DNS record after the network was re-created (see
    the module docstring); a retry on failure, else None.

    Runs only when the LibvirtCluster reports another network UUID for the host than the
    one recorded in status.networkUUID: a settled machine makes no libvirt call."""
    on = scope.on
    target = on.target
    wanted = target.network_uuid
    if not wanted or not target.network or target.bridge_mode:
        return None
    status = scope.status
    previous = status.get("networkUUID")
    if previous == wanted:
        return None
    if made:  # the reservations were made just now, in the network as it is
        status["networkUUID"] = wanted
        return None
    try:
        restored = await _restore_reservations(
            scope, observed, recorded=internal_ips(scope.current)
        )
    except VirtError as exc:
        failure = classify(exc)
        record = scope.record
        if record.failures == 0:
            scope.event(
                "Warning",
                NETWORK_RESTORE_FAILED_REASON,
                f"restoring the DHCP reservations and DNS record in network "
                f"{target.network} on host {target.name}: {failure.message}",
            )
        delay = scope.ctx.options.backoff(record.failures)
        record.failures += 1
        return Result(requeue_after=delay)
    status["networkUUID"] = wanted
    if previous:
        fqdn = on.fqdn
        message = (
            f"network {target.network} on host {target.name} was re-created "
            f"(UUID {previous} -> {wanted}); ensured DHCP reservation(s) "
            f"{', '.join(restored) or '(none)'}"
            + (f" and DNS name {fqdn}" if fqdn and restored else "")
        )
        log.info("network entries restored", network=target.network, host=target.name)
        scope.event("Normal", NETWORK_RESTORED_REASON, message)
    return None


async def _restore_reservations(
    scope: MachineScope, observed: list[InterfaceAddress], *, recorded: Iterable[str]
) -> list[str]:
    """ensure_dhcp_host for every cluster-network NIC with the MAC the domain uses and the
    address the machine had, the DNS name with the first one (idempotent: present entries
    are only read). Returns "mac=ip" per reservation."""
    on = scope.on
    target, ident, fqdn = on.target, on.ident, on.fqdn
    host, network = target.host, target.network
    assert network is not None
    plans = nic_plans(scope.lm.spec, cluster_network=network, bridge_mode=target.bridge_mode)
    if not any(p.cluster_network for p in plans):
        return []
    nics = await host.domain_nics(on.domain_uuid)
    items = restore_plan(
        plans, nics, network=network, observed=observed, recorded=list(recorded), cidr=target.cidr
    )
    exclude: RecordedIps | set[str] = (
        _recorded_ips(scope.ctx, ident) if any(i.ip is None for i in items) else set()
    )
    done: list[str] = []
    for index, item in enumerate(items):
        dhcp_name = item.plan.dhcp_name(ident.hostname)
        dns = (fqdn,) if fqdn and index == 0 else ()
        try:
            try:
                reservation = await host.ensure_dhcp_host(
                    network=network,
                    mac=item.mac,
                    name=dhcp_name,
                    ip=item.ip,
                    exclude=exclude,
                    dns_hostnames=dns,
                )
            except AddressConflict as exc:
                if exc.field != "mac" or item.plan.ip:
                    raise
                # the MAC is reserved already, for another address than the one the
                # machine reported: that reservation stands (checked by name below)
                reservation = await host.ensure_dhcp_host(
                    network=network, mac=item.mac, name=dhcp_name, dns_hostnames=dns
                )
        except Unsupported:
            return done  # no DHCP managed by libvirt on this network
        if reservation.name != dhcp_name:
            raise AddressConflict(
                f"network {network!r}: MAC {item.mac} of the domain is reserved for host "
                f"{reservation.name or '(unnamed)'} ({reservation.ip})",
                field="mac",
                value=item.mac,
            )
        exclude.add(reservation.ip)
        done.append(f"{reservation.mac}={reservation.ip}")
    return done


# -- deletion ---------------------------------------------------------------------------------


async def remove_network_entries(
    host: Host,
    network: str,
    spec: LibvirtMachineSpec | None,
    ident: Identity,
    fqdn: str | None,
) -> None:
    """The machine's DNS name and DHCP reservations (candidate MAC and name), if present.

    The DNS name goes first: the reservation is what keeps its address from being handed to
    a new machine, so it is released last. The other order, interrupted between the two
    (a killed manager), leaves a record of the address without a reservation; a new machine
    given that address would share that record, and the resumed removal's replacement of
    it (delete, then add), interrupted again, would take the new machine's name with it:
    the path found for a Ready machine without its DNS name in
    tests/chaos/test_manager_kill.py."""
    try:
        info = await host.get_network(network)
    except NetworkNotFound:
        info = None
    if info is None:
        return
    ours: dict[str, set[str]] = {}
    plans = (
        nic_plans(spec, cluster_network=network, bridge_mode=False)
        if spec is not None
        else [default_nic(network)]
    )
    for nic in plans:
        if nic.cluster_network:
            ours[nic.dhcp_name(ident.hostname)] = set(
                mac_candidates(
                    nic, cluster=ident.cluster, namespace=ident.namespace, name=ident.name
                )
            )
    if fqdn:
        for record in info.dns_hosts:
            if fqdn in record.hostnames:
                await host.remove_dns_hostnames(network=network, ip=record.ip, hostnames=[fqdn])
    for reservation in info.dhcp_hosts:
        if reservation.mac in ours.get(reservation.name or "", ()):
            await host.remove_dhcp_host(network=network, mac=reservation.mac)


def default_nic(network: str) -> NicPlan:
    """The one NIC on the cluster network a machine without spec.networkInterfaces has."""
    return NicPlan(index=0, network=network, bridge=None, cluster_network=True, mac=None, ip=None)
