"""The LibvirtCluster's work on one host: converge network, pool and endpoint records, or
remove what capl created. One coroutine per host; the reconciler runs them concurrently.

Every host's work ends in a `HostReport`, never in an exception: an unreachable host, bad
credentials or a libvirt error become `Problem`s of that host (reason from
`capl.api.constants.Reason`, a message naming the host and the real cause, and whether only a
change of spec or host can cure it), so one host never stops the others. A per-host timeout
bounds a host that hangs instead of failing (the libvirt call itself keeps its worker
thread; the connection layer's keepalive ends it).

Order on a host: host info (connects; an unreachable host stops there), network, storage
pool, endpoint DNS records. The network and the pool are independent: a bad network spec
does not keep the pool from being created, and each failing object is left absent (the port
removes whatever a failed create had defined). DNS records need the network.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import structlog

from capl.api.constants import Reason
from capl.controllers.cluster_dns import (
    DnsChange,
    DnsNames,
    addresses_in_network,
    api_names,
    plan_api_records,
)
from capl.controllers.common import CredentialsMissing
from capl.ports.errors import (
    AlreadyExists,
    BridgeNotFound,
    CredentialsError,
    ForeignObjectError,
    HostUnreachable,
    InvalidSpec,
    NetworkNotFound,
    NetworkOverlap,
    PoolNotFound,
    StorageError,
    VirtError,
)
from capl.ports.virt import (
    ClusterOwner,
    Host,
    HostInfo,
    NetworkInfo,
    NetworkMode,
    NetworkSpec,
    PoolInfo,
    PoolSpec,
)

__all__ = [
    "ApiPlan",
    "HostPlan",
    "HostReport",
    "Problem",
    "clean_host",
    "converge_host",
    "has_dns",
    "problem_of",
]

log = structlog.get_logger("capl.controllers.libvirtcluster")


@dataclass(frozen=True, slots=True)
class Problem:
    """Why one step on one host did not work."""

    reason: str
    message: str
    terminal: bool = False
    """Only a change of the spec, the Secret or the host cures it: retry slowly."""
    unreachable: bool = False
    """The host (or its credentials) could not be used at all."""


_RETRY_NOTE = re.compile(r"\s*\(next attempt in [^)]*\)\s*$")


def problem_of(exc: BaseException, *, host: str) -> Problem:
    """Classify an error of a host's work; the message names the host and the cause.

    The connection layer appends its reconnect schedule ("(next attempt in 2s)") to
    HostUnreachable; that part is dropped so that an unchanged outage gives an unchanged
    condition (and no status patch)."""
    text = f"host {host}: {_RETRY_NOTE.sub('', str(exc))}"
    match exc:
        case CredentialsMissing() | CredentialsError():
            return Problem(Reason.CREDENTIALS_INVALID, text, terminal=True, unreachable=True)
        case HostUnreachable():
            return Problem(Reason.UNREACHABLE, text, unreachable=True)
        case TimeoutError():
            return Problem(Reason.UNREACHABLE, f"host {host}: did not answer", unreachable=True)
        case NetworkOverlap():
            return Problem(Reason.NETWORK_CONFLICT, text, terminal=True)
        case BridgeNotFound():
            return Problem(Reason.BRIDGE_NOT_FOUND, text, terminal=True)
        case NetworkNotFound():
            return Problem(Reason.NETWORK_NOT_FOUND, text, terminal=True)
        case ForeignObjectError() | AlreadyExists():
            return Problem(Reason.NAME_COLLISION, text, terminal=True)
        case PoolNotFound():
            return Problem(Reason.STORAGE_UNAVAILABLE, text)
        case StorageError():
            return Problem(Reason.STORAGE_UNAVAILABLE, text, terminal=True)
        case InvalidSpec():
            return Problem(Reason.INVALID_SPEC, text, terminal=True)
        case VirtError():
            return Problem(Reason.LIBVIRT_ERROR, text)
        case _:
            return Problem(Reason.INTERNAL_ERROR, f"host {host}: {type(exc).__name__}: {exc}")


@dataclass(frozen=True, slots=True)
class ApiPlan:
    """The capl-managed endpoint: DNS domain and the control-plane machines' addresses."""

    dns_domain: str
    addresses: tuple[str, ...]
    """InternalIP addresses of the live control-plane machines (all networks; each host
    keeps those inside its network's CIDR)."""


@dataclass(frozen=True, slots=True)
class HostPlan:
    """What one host should hold for the cluster."""

    name: str
    host_id: str
    control_plane: bool
    owner: ClusterOwner
    network: NetworkSpec
    adopt_network: bool
    pool: PoolSpec
    api: ApiPlan | None
    """None: capl does not manage endpoint records (user endpoint, or not decided yet)."""
    forget_api_domain: str | None = None
    """On delete: the DNS domain whose endpoint names are removed from adopted networks."""
    cordoned: bool = False
    """The host is in maintenance (spec.hosts[].maintenance): its failure domain is not
    offered to control planes (`cluster_status.failure_domains`)."""

    @property
    def label(self) -> str:
        """How messages name the host: its name and URI (without query or credentials)."""
        return f"{self.name} ({self.host_id})"


@dataclass(slots=True)
class HostReport:
    """What happened on one host in this reconcile."""

    plan: HostPlan
    info: HostInfo | None = None
    connect: Problem | None = None
    network: NetworkInfo | None = None
    network_problem: Problem | None = None
    pool: PoolInfo | None = None
    pool_problem: Problem | None = None
    dns_problem: Problem | None = None
    dns_changes: list[DnsChange] = field(default_factory=list)
    """Endpoint record changes applied (converge) or removals done (clean)."""
    network_removed: bool = False
    pool_removed: bool = False

    @property
    def name(self) -> str:
        return self.plan.name

    @property
    def reachable(self) -> bool:
        return self.connect is None

    def problems(self) -> list[Problem]:
        found = (self.connect, self.network_problem, self.pool_problem, self.dns_problem)
        return [p for p in found if p is not None]

    @property
    def network_created_by_capl(self) -> bool | None:
        if self.network is None:
            return None
        return self.network.owner is not None and self.network.owner.same_cluster(self.plan.owner)

    @property
    def pool_created_by_capl(self) -> bool | None:
        return None if self.pool is None else self.pool.owned_by(self.plan.owner)


def has_dns(network: NetworkInfo) -> bool:
    """Whether libvirt runs dnsmasq for the network (NAT/isolated/routed with an address)."""
    return network.mode is not NetworkMode.BRIDGE and network.cidr is not None


async def _step(report: HostReport, action: Callable[[], Awaitable[None]]) -> Problem | None:
    """Run one step; a host-level failure (unreachable) is recorded on the report and
    re-raised so the remaining steps are skipped."""
    try:
        await action()
    except (HostUnreachable, CredentialsError):
        raise
    except Exception as exc:
        problem = problem_of(exc, host=report.plan.label)
        if problem.reason == Reason.INTERNAL_ERROR:
            log.exception("unexpected error on host", host=report.plan.name)
        return problem
    return None


async def _apply_dns(host: Host, network: str, changes: Sequence[DnsChange]) -> None:
    for change in changes:
        if change.remove:
            await host.remove_dns_hostnames(network=network, ip=change.ip, hostnames=change.remove)
        if change.add:
            await host.add_dns_hostnames(network=network, ip=change.ip, hostnames=change.add)


async def _run_guarded(
    report: HostReport,
    connect: Callable[[], Host],
    work: Callable[[Host], Awaitable[None]],
    time_limit: float | None,
) -> HostReport:
    try:
        host = connect()
        await asyncio.wait_for(work(host), time_limit)
    except Exception as exc:
        report.connect = problem_of(exc, host=report.plan.label)
        if report.connect.reason == Reason.INTERNAL_ERROR:
            log.exception("unexpected error on host", host=report.plan.name)
    return report


async def converge_host(
    plan: HostPlan, connect: Callable[[], Host], *, time_limit: float | None = None
) -> HostReport:
    """Make the host hold the cluster's network, pool and endpoint records; never raises."""
    report = HostReport(plan=plan)

    async def work(host: Host) -> None:
        report.info = await host.info()

        async def network() -> None:
            report.network = await host.ensure_network(plan.network, adopt=plan.adopt_network)

        async def pool() -> None:
            report.pool = await host.ensure_pool(plan.pool)

        report.network_problem = await _step(report, network)
        report.pool_problem = await _step(report, pool)
        info = report.network
        if plan.api is None or info is None or not has_dns(info):
            return
        names = api_names(
            dns_domain=plan.api.dns_domain,
            network_domain=info.dns_domain,
            exclusive=bool(report.network_created_by_capl),
        )
        changes = plan_api_records(
            info.dns_hosts, addresses_in_network(plan.api.addresses, info.cidr), names
        )

        async def dns() -> None:
            await _apply_dns(host, info.name, changes)
            report.dns_changes = list(changes)

        report.dns_problem = await _step(report, dns)

    return await _run_guarded(report, connect, work, time_limit)


async def clean_host(
    plan: HostPlan, connect: Callable[[], Host], *, time_limit: float | None = None
) -> HostReport:
    """Remove what capl created on the host for the cluster; never raises.

    A network capl created (tagged with the cluster) is destroyed and undefined, records and
    all; an adopted one only loses the endpoint names capl added. The pool goes only if it
    holds the cluster's owner marker and no foreign volume (the port checks both)."""
    report = HostReport(plan=plan)

    async def work(host: Host) -> None:
        async def network() -> None:
            if plan.adopt_network:
                await _forget_api_records(host, plan, report)
            else:
                report.network_removed = await host.delete_network(
                    name=plan.network.name, owner=plan.owner
                )

        async def pool() -> None:
            report.pool_removed = await host.delete_pool(name=plan.pool.name, owner=plan.owner)

        report.network_problem = await _step(report, network)
        report.pool_problem = await _step(report, pool)

    return await _run_guarded(report, connect, work, time_limit)


async def _forget_api_records(host: Host, plan: HostPlan, report: HostReport) -> None:
    if plan.forget_api_domain is None:
        return
    info = await host.get_network(plan.network.name)
    if info is None or not has_dns(info):
        return
    names: DnsNames = api_names(
        dns_domain=plan.forget_api_domain, network_domain=info.dns_domain, exclusive=False
    )
    changes = plan_api_records(info.dns_hosts, (), names)
    await _apply_dns(host, info.name, changes)
    report.dns_changes = changes
