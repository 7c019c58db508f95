"""The LibvirtCluster's spec defaults and its control-plane endpoint.

`fill_spec_defaults` writes the names the webhook did not fill in (network name/DNS
domain/DHCP range, storage pool name/path, from `capl.api.defaults`) and the endpoint into a
copy of the raw object, only unset fields, before any host is touched (one spec patch with
the finalizer, so they survive `clusterctl move`, which restores no status). The endpoint is
the Cluster's `spec.controlPlaneEndpoint` when the user set it there (a VIP: no records),
else `api.<dnsDomain>:6443`.

For an adopted network the endpoint is decided once a host showed the network runs
libvirt's DNS (`decide_endpoint`; the endpoint is immutable once set, so it is never
guessed); its DNS domain then defaults to the derived `<name>.<namespace>.capl.internal`. In
bridge mode libvirt serves no DNS: the user must set the endpoint (condition
`ControlPlaneEndpointRequired` until then). `endpoint_condition` writes
ControlPlaneEndpointReady from that and from the hosts' DNS work.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from capl.api import constants as c
from capl.api.cluster import LibvirtCluster
from capl.api.defaults import default_libvirt_cluster, derived_dns_domain
from capl.api.meta import APIEndpoint
from capl.controllers.cluster_dns import API_PORT, endpoint_host
from capl.controllers.cluster_hosts import ApiPlan, HostReport, Problem, has_dns
from capl.controllers.cluster_status import join_messages
from capl.controllers.common import ClusterLayout
from capl.runtime.conditions import FALSE, TRUE, UNKNOWN, set_condition
from capl.runtime.objects import Obj, get_path

__all__ = [
    "decide_endpoint",
    "endpoint_condition",
    "fill_spec_defaults",
    "managed_api_domain",
    "spec_endpoint",
]


def fill_spec_defaults(
    obj: Obj, current: LibvirtCluster, *, cluster_endpoint: APIEndpoint | None = None
) -> None:
    """Write derived defaults the webhook did not (only unset fields) and the endpoint into a
    copied raw object: the Cluster's own `spec.controlPlaneEndpoint` when the user set it
    there, else for networks capl creates with DNS `api.<dnsDomain>:6443`."""
    defaulted = default_libvirt_cluster(current)
    spec: dict[str, Any] = obj.setdefault("spec", {})
    want = defaulted.spec.wire()
    network: dict[str, Any] = spec.setdefault("network", {})
    for field in ("name", "dnsDomain", "dhcp"):
        if field in want.get("network", {}) and field not in network:
            network[field] = want["network"][field]
    if want.get("storagePool"):
        pool: dict[str, Any] = spec.setdefault("storagePool", {})
        for field in ("name", "path"):
            if field in want["storagePool"] and field not in pool:
                pool[field] = want["storagePool"][field]
    endpoint = spec.get("controlPlaneEndpoint") or {}
    if endpoint.get("host"):
        if not endpoint.get("port"):
            spec["controlPlaneEndpoint"] = {**endpoint, "port": API_PORT}
        return
    if cluster_endpoint is not None and cluster_endpoint.host:
        spec["controlPlaneEndpoint"] = {
            "host": cluster_endpoint.host,
            "port": cluster_endpoint.port or endpoint.get("port") or API_PORT,
        }
        return
    net = defaulted.spec.network
    if net.cidr is not None and net.mode != "bridge" and net.dns_domain:
        spec["controlPlaneEndpoint"] = {
            "host": endpoint_host(net.dns_domain),
            "port": endpoint.get("port") or API_PORT,
        }


def spec_endpoint(obj: Obj) -> tuple[str, int] | None:
    host = get_path(obj, "spec", "controlPlaneEndpoint", "host")
    port = get_path(obj, "spec", "controlPlaneEndpoint", "port")
    return (str(host), int(port)) if host and port else None


def managed_api_domain(current: LibvirtCluster, obj: Obj) -> str | None:
    """The DNS domain when the endpoint is capl's (`api.<dnsDomain>`), else None."""
    endpoint = spec_endpoint(obj)
    domain = current.spec.network.dns_domain
    if endpoint is None or not domain or endpoint[0] != endpoint_host(domain):
        return None
    return domain


def decide_endpoint(
    obj: Obj,
    current: LibvirtCluster,
    lay: ClusterLayout,
    reports: Sequence[HostReport],
) -> tuple[tuple[str, int] | None, Problem | None]:
    """No endpoint in spec yet: set `api.<dnsDomain>:6443` for an adopted network once a
    host shows it runs libvirt's DNS; otherwise say why there is none."""
    net = current.spec.network
    if net.mode == "bridge":
        return None, Problem(
            c.Reason.CONTROL_PLANE_ENDPOINT_REQUIRED,
            f"network {lay.network} is in bridge mode, where libvirt serves no DNS: "
            "set spec.controlPlaneEndpoint (e.g. a kube-vip address)",
            terminal=True,
        )
    seen = [r.network for r in reports if r.network is not None]
    if any(has_dns(network) for network in seen):
        domain = lay.dns_domain or derived_dns_domain(
            namespace=current.metadata.namespace or "", name=current.metadata.name or ""
        )
        spec: dict[str, Any] = obj.setdefault("spec", {})
        spec.setdefault("network", {}).setdefault("dnsDomain", domain)
        spec["controlPlaneEndpoint"] = {"host": endpoint_host(domain), "port": API_PORT}
        return spec_endpoint(obj), None
    if seen:
        return None, Problem(
            c.Reason.CONTROL_PLANE_ENDPOINT_REQUIRED,
            f"network {lay.network} has no libvirt DNS (forward mode "
            f"{seen[0].forward_mode}): set spec.controlPlaneEndpoint",
            terminal=True,
        )
    return None, Problem(
        c.Reason.PROVISIONING, f"waiting for network {lay.network} on a reachable host"
    )


def endpoint_condition(
    obj: Obj,
    current: LibvirtCluster,
    lay: ClusterLayout,
    reports: Sequence[HostReport],
    api: ApiPlan | None,
    *,
    now: Callable[[], str],
) -> Problem | None:
    """Set ControlPlaneEndpointReady (deciding an adopted network's endpoint first);
    returns the problem that should shape the requeue, if any."""
    type_ = c.ConditionType.CONTROL_PLANE_ENDPOINT_READY
    endpoint = spec_endpoint(obj)
    if endpoint is None:
        endpoint, problem = decide_endpoint(obj, current, lay, reports)
        if endpoint is None:
            assert problem is not None
            set_condition(
                obj,
                type_,
                FALSE if problem.terminal else UNKNOWN,
                reason=problem.reason,
                message=problem.message,
                now=now,
            )
            # waiting: the hosts' own problems drive the requeue
            return problem if problem.terminal else None
    where = f"{endpoint[0]}:{endpoint[1]}"
    if api is None:
        managed = managed_api_domain(current, obj)
        message = where if managed else f"{where} (not managed by capl: no DNS records)"
        set_condition(obj, type_, TRUE, reason=c.Reason.READY, message=message, now=now)
        return None
    failed = [r.dns_problem for r in reports if r.dns_problem is not None]
    if failed:
        set_condition(
            obj,
            type_,
            FALSE,
            reason=failed[0].reason,
            message=join_messages([p.message for p in failed]),
            now=now,
        )
        return failed[0]
    targets = ", ".join(api.addresses) or "no control-plane machine address yet"
    set_condition(obj, type_, TRUE, reason=c.Reason.READY, message=f"{where} -> {targets}", now=now)
    return None
