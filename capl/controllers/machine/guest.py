"""After the domain runs: its addresses, the workload Node's providerID, bootstrap success.

Addresses come from the DHCP leases and the guest agent (merged, `plan_addresses`; the last
known IP kept while they report nothing). AddressAssigned=True/`Assigned` once an IP is
known (and status.initialization.provisioned), else `WaitingForAddress` with a short
requeue (`address_poll`), slowing down (`address_slow_poll`) after `address_timeout` with a
message that says where to look. Once Ready nothing polls: domain lifecycle and host
connection events (Hosts.subscribe) requeue the machine.

The workload Node gets the providerID and, like a cloud provider would set them, the labels
`topology.kubernetes.io/zone` (the machine's host: its failure domain) and, when the
LibvirtCluster has spec.region, `topology.kubernetes.io/region`, through the
`<cluster>-kubeconfig` Secret (the Node named by the Machine's nodeRef, else the machine's
hostname; requeued every `node_poll` until the Node exists; remembered per providerID and
labels once done, so a live migration — spec.hostName changes — moves the zone label with
the machine). BootstrapSucceeded is read through the guest agent
(`capl.controllers.machine.bootstrap`).
"""

from __future__ import annotations

import datetime
from typing import Final

from capl.api import constants as c
from capl.controllers.machine.bootstrap import BootstrapSubject, sooner
from capl.controllers.machine.placement import secret_bytes
from capl.controllers.machine.plan_addresses import merge_addresses
from capl.controllers.machine.plan_ipam import with_ipam_first
from capl.controllers.machine.plan_placement import topology_labels
from capl.controllers.machine.scope import DONE, MachineScope
from capl.ports.virt import InterfaceAddress
from capl.runtime.conditions import get_condition
from capl.runtime.controller import Result
from capl.runtime.objects import ObjectKey
from capl.runtime.resources import SECRET

__all__ = ["KUBECONFIG_SUFFIX", "report_addresses", "watch_bootstrap", "workload_node"]

KUBECONFIG_SUFFIX: Final = "-kubeconfig"


def report_addresses(scope: MachineScope, observed: list[InterfaceAddress]) -> tuple[Result, bool]:
    """status.addresses and AddressAssigned; (the requeue it needs, whether an IP is known)."""
    on, status = scope.on, scope.status
    addresses, have_ip = merge_addresses(
        observed, previous=status.get("addresses"), hostname=on.ident.hostname, fqdn=on.fqdn
    )
    if have_ip and scope.ipam_addresses:
        addresses = with_ipam_first(addresses, scope.ipam_addresses)
    status["addresses"] = addresses
    if not have_ip:
        return _waiting_for_address(scope), False
    scope.set(c.ConditionType.ADDRESS_ASSIGNED, True, c.Reason.ASSIGNED)
    status.setdefault("initialization", {})["provisioned"] = True
    return DONE, True


def _waiting_for_address(scope: MachineScope) -> Result:
    options = scope.ctx.options
    cond = get_condition(scope.current, c.ConditionType.ADDRESS_ASSIGNED)
    waited = 0.0
    if cond is not None and cond.get("status") == "False" and cond.get("lastTransitionTime"):
        waited = scope.ctx.deps.clock.wall() - _parse_time(str(cond["lastTransitionTime"]))
    if waited > options.address_timeout:
        scope.set(
            c.ConditionType.ADDRESS_ASSIGNED,
            False,
            c.Reason.WAITING_FOR_ADDRESS,
            f"no address from the DHCP lease or the guest agent after "
            f"{options.address_timeout:.0f} s: check that the guest boots and runs "
            "DHCP on the cluster network (serial console log in the pool directory)",
        )
        return Result(requeue_after=options.address_slow_poll)
    message = "waiting for the guest's DHCP lease or guest agent to report an address"
    if cond is not None and cond.get("status") == "False":
        message = str(cond.get("message") or message)
    scope.set(c.ConditionType.ADDRESS_ASSIGNED, False, c.Reason.WAITING_FOR_ADDRESS, message)
    return Result(requeue_after=options.address_poll)


async def workload_node(scope: MachineScope) -> Result | None:
    """Give the workload Node its providerID and topology labels (zone: the machine's host;
    region: the LibvirtCluster's spec.region); a requeue while the Node is missing."""
    on = scope.on
    machine, ident = on.machine, on.ident
    provider_id = c.PROVIDER_ID_PREFIX + on.domain_uuid
    region = scope.lcluster.spec.region if scope.lcluster is not None else None
    labels = topology_labels(host=on.target.name, region=region)
    done = provider_id + " " + " ".join(f"{k}={v}" for k, v in sorted(labels.items()))
    if done in scope.record.nodes_done:
        return None
    node_ref = machine.status.node_ref
    node_name = node_ref.name if node_ref is not None and node_ref.name else ident.hostname
    secret = scope.ctx.cache.get(
        SECRET, ObjectKey(ident.namespace, ident.cluster + KUBECONFIG_SUFFIX)
    )
    if secret is None:
        return None
    kubeconfig = secret_bytes(secret, c.BOOTSTRAP_DATA_KEY)
    if not kubeconfig:
        return None
    if await scope.ctx.deps.workload.ensure_node_provider_id(
        cluster=f"{ident.namespace}/{ident.cluster}",
        kubeconfig=kubeconfig,
        node_name=node_name,
        provider_id=provider_id,
        labels=labels,
    ):
        scope.record.nodes_done = {done}
        return None
    if node_ref is not None and node_ref.name:
        return None  # joined: the labels follow on the next reconcile (no polling)
    return Result(requeue_after=scope.ctx.options.node_poll)


async def watch_bootstrap(scope: MachineScope, result: Result) -> Result:
    """BootstrapSucceeded through the guest agent: `result`, or sooner when it asks."""
    on, ctx, record = scope.on, scope.ctx, scope.record
    subject = BootstrapSubject(
        obj=scope.desired,
        host=on.target.host,
        domain_uuid=on.domain_uuid,
        pool=on.target.pool,
        console_volume=on.ident.names.console_log,
        node_joined=on.machine.status.node_ref is not None,
    )
    record.bootstrap = ctx.watcher.memory_for(record.bootstrap, scope.desired)
    return sooner(result, await ctx.watcher.observe(subject, record.bootstrap))


def _parse_time(value: str) -> float:
    try:
        return datetime.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0
