"""Cluster API IPAM for LibvirtMachine NICs: claim, wait, use, release (see `plan_ipam` for
what the guest gets).

Steps of `claim_addresses` (before placement, so nothing is made while it waits):
1. per NIC with `addressesFromPools`: the IPAddressClaim `<machine>-nic<i>` exists (created
   when missing; owned by the LibvirtMachine, cluster-name label, spec.clusterName);
2. each claim is bound (status.addressRef) to an IPAddress with a usable IPv4 address;
3. otherwise the condition `IPAddressesClaimed` is False: `WaitingForIPAddress` naming the
   claim and pool, or `PoolExhausted` when the pool (an in-cluster provider pool, whose
   status counts free addresses) has none left (with a Warning Event once); the machine is
   requeued every `WAIT_POLL` seconds and recovers by itself when the provider binds the
   claim (e.g. after another machine released its address).

The claims and addresses are read with GETs, not informers: the IPAM CRDs exist only where an
IPAM provider is installed, and an informer on a kind that does not exist would never sync.
Machines without pools make no IPAM request at all; a settled machine makes none either.

`place_addresses` (after placement) decides per NIC: on the cluster network in nat/isolated
mode the address becomes the NIC's DHCP reservation (it must lie in the network's CIDR, else
`AddressOutsideNetwork`, nothing made); elsewhere the address goes into the bootstrap data as
static configuration (`scope.ipam_static`, applied by `create`).

`release` deletes the claims once the domain is gone (deletion), so the pool gets the
addresses back; not for `clusterctl move` (the claims move with their owner).
"""

from __future__ import annotations

from typing import Final

import structlog

from capl.api import constants as c
from capl.controllers.machine.options import LOGGER
from capl.controllers.machine.plan import nic_plans
from capl.controllers.machine.plan_ipam import (
    ClaimedAddress,
    InvalidAddress,
    PoolNic,
    address_of,
    bound_address_name,
    claim_body,
    claim_name,
    effective_spec,
    exhausted,
    nic_mac_for,
    outside_network,
    owned_by,
    pool_nics,
    pool_resource,
)
from capl.controllers.machine.scope import MachineScope
from capl.controllers.machine.target import Target
from capl.runtime.conditions import get_condition
from capl.runtime.controller import Result
from capl.runtime.errors import AlreadyExists, ApiError, NotFound
from capl.runtime.objects import Obj, ObjectKey
from capl.runtime.resources import IP_ADDRESS, IP_ADDRESS_CLAIM

__all__ = ["WAIT_POLL", "claim_addresses", "place_addresses", "release"]

log = structlog.get_logger(LOGGER)

WAIT_POLL: Final = 2.0
"""Seconds between looks at an unbound claim (the IPAM provider usually binds in < 1 s)."""
EXHAUSTED_POLL: Final = 5.0
"""Seconds between looks while the pool has no free address."""


class _Waiting(Exception):
    def __init__(self, reason: str, message: str, retry: float) -> None:
        super().__init__(message)
        self.reason, self.message, self.retry = reason, message, retry


async def claim_addresses(scope: MachineScope) -> dict[int, ClaimedAddress] | Result:
    """The bound address of every pool NIC (empty without pools), or the Result to wait
    with (the condition says why)."""
    nics = pool_nics(scope.lm.spec)
    if not nics:
        return {}
    found: dict[int, ClaimedAddress] = {}
    try:
        for nic in nics:
            try:
                found[nic.index] = await _bound(scope, nic)
            except ApiError as exc:
                if exc.code != 403:
                    raise
                raise _Waiting(
                    c.Reason.WAITING_FOR_IP_ADDRESS,
                    f"networkInterfaces[{nic.index}].addressesFromPools: forbidden ({exc});"
                    " the manager's role must grant IPAM access (config/rbac)",
                    EXHAUSTED_POLL,
                ) from None
    except _Waiting as waiting:
        _report_waiting(scope, waiting)
        return Result(requeue_after=waiting.retry)
    except InvalidAddress as exc:
        scope.set(
            c.ConditionType.IP_ADDRESSES_CLAIMED, False, c.Reason.INVALID_IP_ADDRESS, str(exc)
        )
        _warn_once(scope, c.Reason.INVALID_IP_ADDRESS, str(exc))
        return Result(requeue_after=EXHAUSTED_POLL)
    summary = ", ".join(f"nic{a.index} {a.cidr}" for a in found.values())
    scope.set(c.ConditionType.IP_ADDRESSES_CLAIMED, True, c.Reason.CLAIMED, summary)
    return found


async def _bound(scope: MachineScope, nic: PoolNic) -> ClaimedAddress:
    namespace, lm = scope.namespace, scope.lm
    name = claim_name(lm.metadata.name or "", nic.index)
    claims = scope.ctx.deps.client.resource(IP_ADDRESS_CLAIM)
    pool = nic.describe(namespace)
    try:
        claim: Obj = await claims.get(ObjectKey(namespace, name))
    except NotFound:
        body = claim_body(
            name=name,
            namespace=namespace,
            cluster=scope.cluster_name,
            owner_name=lm.metadata.name or "",
            owner_uid=lm.metadata.uid or "",
            pool=nic.pool,
        )
        try:
            claim = await claims.create(body)
        except AlreadyExists:
            raise _Waiting(c.Reason.WAITING_FOR_IP_ADDRESS, "", WAIT_POLL) from None
        except NotFound:
            # the kind itself is not served (no Cluster API IPAM CRDs): never let this 404
            # look like the LibvirtMachine vanishing (the reconciler would clean it up)
            raise _Waiting(
                c.Reason.WAITING_FOR_IP_ADDRESS,
                f"networkInterfaces[{nic.index}].addressesFromPools: the API server does not"
                f" serve {IP_ADDRESS_CLAIM} (are the Cluster API IPAM CRDs installed?)",
                EXHAUSTED_POLL,
            ) from None
        log.info("IPAddressClaim created", claim=name, pool=pool)
    if not owned_by(claim, lm.metadata.uid or ""):
        raise InvalidAddress(
            f"IPAddressClaim {namespace}/{name} exists and is not owned by this LibvirtMachine"
            " (left over from an earlier machine of the same name?); delete it"
        )
    address_name = bound_address_name(claim)
    if address_name is None:
        raise await _unbound(scope, nic, name, pool)
    try:
        address = await scope.ctx.deps.client.resource(IP_ADDRESS).get(
            ObjectKey(namespace, address_name)
        )
    except NotFound:
        raise _Waiting(
            c.Reason.WAITING_FOR_IP_ADDRESS,
            f"IPAddressClaim {name} names IPAddress {address_name}, which does not exist (yet)",
            WAIT_POLL,
        ) from None
    return address_of(address, index=nic.index, claim=name)


async def _unbound(scope: MachineScope, nic: PoolNic, claim: str, pool: str) -> _Waiting:
    resource = pool_resource(nic.pool)
    if resource is not None:
        key = ObjectKey(scope.namespace if resource.namespaced else "", nic.pool.name)
        try:
            obj = await scope.ctx.deps.client.resource(resource).get(key)
        except NotFound:
            return _Waiting(
                c.Reason.WAITING_FOR_IP_ADDRESS,
                f"networkInterfaces[{nic.index}].addressesFromPools: {pool} not found",
                EXHAUSTED_POLL,
            )
        full = exhausted(obj)
        if full is not None:
            used, total = full
            return _Waiting(
                c.Reason.POOL_EXHAUSTED,
                f"networkInterfaces[{nic.index}].addressesFromPools: {pool} has no free"
                f" address ({used} of {total} in use); IPAddressClaim {claim} waits",
                EXHAUSTED_POLL,
            )
    return _Waiting(
        c.Reason.WAITING_FOR_IP_ADDRESS,
        f"waiting for IPAddressClaim {claim} to be bound to an address from {pool}",
        WAIT_POLL,
    )


def _report_waiting(scope: MachineScope, waiting: _Waiting) -> None:
    message = waiting.message or "waiting for an IPAddressClaim"
    scope.set(c.ConditionType.IP_ADDRESSES_CLAIMED, False, waiting.reason, message)
    if not _provisioned(scope):
        scope.set(c.ConditionType.DOMAIN_PROVISIONED, False, waiting.reason, message)
    if waiting.reason == c.Reason.POOL_EXHAUSTED:
        _warn_once(scope, waiting.reason, message)


def _warn_once(scope: MachineScope, reason: str, message: str) -> None:
    cond = get_condition(scope.current, c.ConditionType.IP_ADDRESSES_CLAIMED)
    if cond is None or cond.get("reason") != reason:
        scope.event("Warning", reason, message)


def _provisioned(scope: MachineScope) -> bool:
    init = scope.lm.status.initialization
    return bool(init and init.provisioned)


def place_addresses(
    scope: MachineScope, target: Target, addresses: dict[int, ClaimedAddress]
) -> Result | None:
    """Give the addresses to the NICs on `target` (see the module docstring); a Result when
    an address cannot be used there (condition and Warning Event say why), else None."""
    if not addresses:
        return None
    lm = scope.lm
    plans = nic_plans(lm.spec, cluster_network=target.network or "", bridge_mode=target.bridge_mode)
    dhcp: list[int] = []
    static: list[tuple[str, ClaimedAddress]] = []
    for plan in plans:
        address = addresses.get(plan.index)
        if address is None:
            continue
        if plan.cluster_network and target.network:
            if outside_network(address, target.cidr):
                message = (
                    f"networkInterfaces[{plan.index}]: the IPAM address {address.address}"
                    f" (IPAddressClaim {address.claim}) is outside the cluster network"
                    f" {target.network} ({target.cidr}) on host {target.name}, whose DHCP capl"
                    " runs: use a pool inside that CIDR"
                )
                scope.set(
                    c.ConditionType.IP_ADDRESSES_CLAIMED,
                    False,
                    c.Reason.ADDRESS_OUTSIDE_NETWORK,
                    message,
                )
                if not _provisioned(scope):
                    scope.set(
                        c.ConditionType.DOMAIN_PROVISIONED,
                        False,
                        c.Reason.ADDRESS_OUTSIDE_NETWORK,
                        message,
                    )
                _warn_once(scope, c.Reason.ADDRESS_OUTSIDE_NETWORK, message)
                return Result(requeue_after=EXHAUSTED_POLL)
            dhcp.append(plan.index)
        else:
            mac = nic_mac_for(
                plan,
                cluster=scope.cluster_name,
                namespace=scope.namespace,
                name=lm.metadata.name or "",
            )
            static.append((mac, address))
    scope.lm = lm.model_copy(update={"spec": effective_spec(lm.spec, addresses, dhcp=dhcp)})
    scope.ipam_static = tuple(static)
    scope.ipam_addresses = tuple(addresses[i].address for i in sorted(addresses))
    return None


async def release(scope: MachineScope) -> None:
    """Delete the machine's IPAddressClaims (not found is fine): the addresses go back to
    their pools. Only claims this incarnation owns."""
    lm = scope.lm
    claims = scope.ctx.deps.client.resource(IP_ADDRESS_CLAIM)
    for nic in pool_nics(lm.spec):
        name = claim_name(lm.metadata.name or "", nic.index)
        key = ObjectKey(scope.namespace, name)
        try:
            claim = await claims.get(key)
            if not owned_by(claim, lm.metadata.uid or ""):
                continue
            await claims.delete(key)
        except NotFound:
            continue
        log.info("IPAddressClaim deleted", claim=name)
