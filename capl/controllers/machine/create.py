"""Creating a machine whose domain does not exist, and rolling back a failed attempt.

Only while no domain with the machine's UUID exists; each step idempotent, each a
fault-injection point (`CAPL_FAULT`, see `plan.fault_point`):

    base image (shared import) -> name-collision check, root overlay, extra disks and
    bootstrap volume (Ignition file for fw_cfg, or NoCloud ISO; re-uploaded on every attempt
    until the domain exists, never afterwards: a changed Secret never recreates the VM), in
    one operation on the pool's thread (`Host.create_machine_volumes`) -> DHCP reservations
    and the DNS name (`capl.controllers.machine.network`) -> define -> start.

Storage comes first: it is what usually fails (image, space), and then no address was
reserved for nothing. A failed attempt rolls back what it created (volumes, reservations,
record; not the shared base image), so bad input leaves nothing behind; the reconciler
reports the libvirt error in DomainProvisioned (`classify`) with one Warning event, and
retries with backoff. The same removal (`remove_resources`) serves deletion and the
clean-up of vanished objects.

The bootstrap data comes from the Machine's data Secret (key `value`, optional `format`,
`bootstrap_data`): missing, it leaves BootstrapDataDelivered and DomainProvisioned at
`WaitingForBootstrapData`; unusable, at `BootstrapDataInvalid` (one Warning event).
"""

from __future__ import annotations

import posixpath

import structlog

from capl.api import constants as c
from capl.api.machine import LibvirtMachineSpec
from capl.controllers.machine.network import remove_network_entries, reserve_addresses
from capl.controllers.machine.options import LOGGER
from capl.controllers.machine.plan import (
    BootstrapData,
    BootstrapProblem,
    Failure,
    build_domain_spec,
    classify,
    fault_point,
    image_plan,
    read_bootstrap,
)
from capl.controllers.machine.plan_ipam import with_static_addresses
from capl.controllers.machine.scope import Context, MachineScope
from capl.controllers.machine.target import Identity, Target
from capl.ports.bootstrap import build_nocloud_iso
from capl.ports.errors import ForeignDomainError, PoolNotFound, VirtError
from capl.ports.naming import MachineNames
from capl.ports.virt import (
    DomainInfo,
    DomainOwner,
    Host,
    InterfaceAddress,
    MachineVolumePaths,
    MachineVolumes,
)
from capl.runtime.conditions import get_condition
from capl.runtime.objects import ObjectKey
from capl.runtime.resources import SECRET

__all__ = ["bootstrap_data", "create", "remove_resources", "start_domain"]

log = structlog.get_logger(LOGGER)


def bootstrap_data(scope: MachineScope) -> BootstrapData | None:
    """The bootstrap data, or None with the condition saying what is missing."""
    machine = scope.machine
    assert machine is not None, "the owner Machine comes first"
    namespace = scope.namespace
    secret_name = machine.spec.bootstrap.data_secret_name
    if not secret_name:
        message = "Machine.spec.bootstrap.dataSecretName is not set yet"
        secret = None
    else:
        secret = scope.ctx.cache.get(SECRET, ObjectKey(namespace, secret_name))
        message = f"bootstrap data Secret {namespace}/{secret_name} not found"
    both = (c.ConditionType.BOOTSTRAP_DATA_DELIVERED, c.ConditionType.DOMAIN_PROVISIONED)
    if secret is None:
        for type_ in both:
            scope.set(type_, False, c.Reason.WAITING_FOR_BOOTSTRAP_DATA, message)
        return None
    try:
        return read_bootstrap(secret)
    except BootstrapProblem as problem:
        cond = get_condition(scope.current, c.ConditionType.BOOTSTRAP_DATA_DELIVERED)
        for type_ in both:
            scope.set(type_, False, problem.reason, problem.message)
        if cond is None or cond.get("message") != problem.message:
            scope.event("Warning", problem.reason, problem.message)
        return None


async def create(
    scope: MachineScope, bootstrap: BootstrapData
) -> tuple[DomainInfo, list[InterfaceAddress]]:
    """Create everything of a machine whose domain does not exist; roll back on a
    failure retrying will not fix soon. Each step is idempotent. The running domain and the
    addresses the host reports for it right after its start (`Host.create_domain`)."""
    on = scope.on
    try:
        return await _create_steps(scope, bootstrap)
    except VirtError as exc:
        await _rollback(on.target, scope.lm.spec, on.ident, on.fqdn, classify(exc))
        raise


async def _create_steps(
    scope: MachineScope, bootstrap: BootstrapData
) -> tuple[DomainInfo, list[InterfaceAddress]]:
    on, spec = scope.on, scope.lm.spec
    target, ident, domain_uuid = on.target, on.ident, on.domain_uuid
    host, names = target.host, ident.names
    info = target.info or await host.info()
    target.info = info
    # storage first: it is what usually fails (image, space), and then no address was
    # reserved for nothing
    # IPAM addresses of NICs outside capl's DHCP: static configuration (ipam, plan_ipam)
    bootstrap = with_static_addresses(bootstrap, scope.ipam_static)
    volumes = await _create_storage(target, spec, ident, domain_uuid, bootstrap)
    nics = await reserve_addresses(scope.ctx, target, spec, ident, on.fqdn)
    domain_type = info.best_domain_type if spec.domain_type == "auto" else spec.domain_type
    ignition = bootstrap.format is c.BootstrapFormat.IGNITION
    domain_spec = build_domain_spec(
        names=names,
        uuid=domain_uuid,
        owner=ident.owner(),
        spec=spec,
        domain_type=domain_type,
        arch=info.arch or "x86_64",
        root_path=volumes.root,
        extra_paths=[
            (disk.name, path)
            for disk, path in zip(spec.extra_disks or (), volumes.extras, strict=True)
        ],
        ignition_path=volumes.bootstrap if ignition else None,
        cidata_path=None if ignition else volumes.bootstrap,
        nics=nics,
        console_log=posixpath.join(posixpath.dirname(volumes.root), names.console_log),
    )
    # neither the UUID (ensure_domain, or fresh) nor the name (the volumes' check) exists:
    # no look-up again; defined and started in one operation (its STARTED event is our own
    # echo)
    starts = scope.ctx.memory.own_starts
    starts.add(domain_uuid, now=scope.ctx.deps.clock.now())
    try:
        started = await host.create_domain(
            domain_spec, absent=volumes.holder is None, on_defined=_domain_defined
        )
    except BaseException:
        starts.discard(domain_uuid)
        raise
    fault_point("domain-started")
    return started


def _domain_defined() -> None:
    """Between the definition and the start (on the libvirt worker thread)."""
    fault_point("domain-defined")


async def _create_storage(
    target: Target,
    spec: LibvirtMachineSpec,
    ident: Identity,
    domain_uuid: str,
    bootstrap: BootstrapData,
) -> MachineVolumePaths:
    """Base image, then in one operation the name check, root overlay, extra disks and
    bootstrap volume (Ignition file or NoCloud ISO). A domain of the machine's name with
    another UUID: ForeignDomainError, nothing made."""
    host, names = target.host, ident.names
    plan = image_plan(spec)
    base = await host.ensure_base_image(pool=target.pool, name=plan.volume, source=plan.source)
    fault_point("base-image")
    if bootstrap.format is c.BootstrapFormat.IGNITION:
        bootstrap_name, data = names.ignition_volume, bootstrap.data
    else:
        bootstrap_name = names.cidata_volume
        data = build_nocloud_iso(
            user_data=bootstrap.data,
            instance_id=ident.uid,
            hostname=ident.hostname,
            network_config=bootstrap.network_config,
        )
    volumes = await host.create_machine_volumes(
        MachineVolumes(
            pool=target.pool,
            domain_name=names.domain,
            domain_uuid=domain_uuid,
            root=names.root_volume,
            backing=base,
            root_capacity_bytes=spec.root_volume.size_gib * 1024**3 if spec.root_volume else 0,
            extras=tuple(
                (names.extra_volume(index), disk.size_gib * 1024**3)
                for index, disk in enumerate(spec.extra_disks or ())
            ),
            bootstrap=bootstrap_name,
            bootstrap_data=data,
        ),
        on_step=fault_point,
    )
    holder = volumes.holder
    if holder is not None and holder.uuid.lower() != domain_uuid:
        held_by = (
            f"machine {holder.owner.namespace}/{holder.owner.name}"
            if holder.owner
            else "no capl owner tag"
        )
        raise ForeignDomainError(
            f"a domain named {names.domain!r} ({holder.uuid}, {held_by}) already exists on "
            f"host {target.name}; it is left untouched",
            name=names.domain,
        )
    return volumes


async def start_domain(
    ctx: Context,
    host: Host,
    domain_uuid: str,
    owner: DomainOwner,
    *,
    defined: DomainInfo | None = None,
) -> DomainInfo:
    """Start the domain; its STARTED event is known as our own echo (`OwnStarts`).
    `defined`: what define_domain has just returned (saves reading the domain again)."""
    starts = ctx.memory.own_starts
    starts.add(domain_uuid, now=ctx.deps.clock.now())
    try:
        if defined is None:
            return await host.start_domain(domain_uuid, owner=owner)
        return await host.start_domain(domain_uuid, owner=owner, defined=defined)
    except BaseException:
        starts.discard(domain_uuid)
        raise


async def _rollback(
    target: Target,
    spec: LibvirtMachineSpec,
    ident: Identity,
    fqdn: str | None,
    failure: Failure,
) -> None:
    """Undo what a failed creation attempt made (the domain does not exist)."""
    if failure.reason == c.Reason.UNREACHABLE:
        return  # nothing can be done on the host; the next attempt carries on
    try:
        await remove_resources(
            target.host,
            pool=target.pool,
            network=target.network,
            spec=spec,
            ident=ident,
            fqdn=fqdn,
        )
    except VirtError as exc:
        log.warning("rollback after a failed creation incomplete", error=str(exc))


async def remove_resources(
    host: Host,
    *,
    pool: str | None,
    network: str | None,
    spec: LibvirtMachineSpec | None,
    ident: Identity,
    fqdn: str | None,
) -> None:
    """Volumes, DHCP reservations and the DNS name of a machine (not-found is fine).

    Storage and network are cleaned independently: a failure in one does not keep the
    other from being cleaned; the first error is raised at the end."""
    errors: list[VirtError] = []
    if pool:
        try:
            await _remove_volumes(host, pool, ident.names)
        except VirtError as exc:
            errors.append(exc)
    if network:
        try:
            await remove_network_entries(host, network, spec, ident, fqdn)
        except VirtError as exc:
            errors.append(exc)
    if errors:
        raise errors[0]


async def _remove_volumes(host: Host, pool: str, names: MachineNames) -> None:
    try:
        refs = await host.list_volumes(pool=pool, prefix=names.prefix + "-", refresh=True)
    except PoolNotFound:
        return
    for ref in refs:
        if names.owns_volume(ref.name):
            await host.delete_volume(pool=pool, name=ref.name)
