"""`capl migrate MACHINE`: live-migrate a machine to another host of its cluster, like
`virtctl migrate`; `capl migrate --cancel NAME` aborts a migration, like `virtctl
migrate-cancel`.

MACHINE is a LibvirtMachine, or a Cluster API Machine whose ``infrastructureRef`` is one.
Before anything is created the command refuses, naming the cause (exit 3 for what does not
exist, 1 otherwise), when:

- the machine does not exist (3), is being deleted, has no domain yet (``spec.hostName``,
  ``spec.domainUUID``), is not provisioned yet, or is migrating already
  (``spec.migrationTarget`` is set) - what the migration controller would refuse too;
- its LibvirtCluster cannot be found (3);
- ``--to`` names no host of that cluster (3), the host the machine is on, a host in
  maintenance, a host with ``controlPlane: false`` for a control-plane machine, or one the
  LibvirtCluster reports unreachable; without ``--to``, when no other host of the cluster
  could take it on those grounds;
- an unfinished LibvirtMachineMigration of the machine exists (not Succeeded or Failed,
  including one being deleted, which is being aborted).

Then it creates a LibvirtMachineMigration ``<machine>-<5 random characters>`` (generateName)
in the machine's namespace, labelled with the machine's cluster. The checks and the create are
two steps: two `capl migrate` at once can both pass the checks; the API server then lets only
one migration at a time set the machine's ``spec.migrationTarget`` (a CEL rule), and capl's
manager decides what happens to the other.

``--wait`` follows the migration (a watch, bounded by ``--timeout``) and prints every phase
change and the data remaining, until Succeeded (exit 0) or Failed (exit 1, with the reason);
leaving the wait (timeout, Ctrl-C) does not stop the migration.

``--cancel NAME`` deletes an unfinished migration, which makes capl abort it (its finalizer
holds it until the domain runs in exactly one place). NAME is a LibvirtMachineMigration, else
a machine whose unfinished migration is meant. A finished migration is refused: deleting it
would only remove its record. With ``--wait`` the command returns once it is gone.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from capl.commands.follow import follow, format_bytes
from capl.commands.raw import (
    CLUSTER_NAME_LABEL,
    CONTROL_PLANE_LABEL,
    dig,
    has_label,
    obj_label,
    obj_meta,
    obj_name,
    obj_owner,
    text,
)
from capl.commands.shared import (
    add_api_flags,
    api_failure,
    connect,
    formatter,
    list_kind,
    positive_duration,
    scope_namespace,
)
from capl.commands.target import find_libvirt_machine, get_or_none, libvirt_cluster_of
from capl.errors import EXIT_FAILED, EXIT_NOT_FOUND, EXIT_OK, EXIT_USAGE, CliError

if TYPE_CHECKING:
    from capl.kube.client import KubeClient
    from capl.runtime.objects import Obj, ObjectKey

__all__ = ["progress_line", "register"]

TERMINAL = frozenset({"Succeeded", "Failed"})
_DEFAULT_TIMEOUT = 3600.0


# --- the command -------------------------------------------------------------------------------


def _bandwidth(value: str) -> int:
    from pydantic import ValidationError

    from capl.api.migration import LibvirtMachineMigrationSpec

    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid integer {value!r}") from None
    try:
        LibvirtMachineMigrationSpec(machine_name="m", bandwidth_mib_per_second=number)
    except ValidationError as exc:
        detail = exc.errors()[0].get("msg", "invalid")
        raise argparse.ArgumentTypeError(f"invalid bandwidth {value}: {detail}") from None
    return number


def register(sub: Any) -> None:
    p = sub.add_parser(
        "migrate",
        help="live-migrate a machine to another host (or cancel a migration)",
        formatter_class=formatter,
        description=(
            "Create a LibvirtMachineMigration for MACHINE (a LibvirtMachine or Machine):\n"
            "capl moves its running domain to --to, or to a host it chooses. Refused,\n"
            "before anything is created, for a host that is not the cluster's, the host\n"
            "the machine is on, a host in maintenance, or while another migration of the\n"
            "machine is unfinished. --cancel NAME deletes an unfinished migration (NAME:\n"
            "the migration, or its machine), which aborts it."
        ),
        epilog=(
            "examples:\n"
            "  capl migrate demo-md-0-7x2kq --to kvm2 --wait\n"
            "  capl migrate demo-control-plane-abcde -n team-a --bandwidth 200\n"
            "  capl migrate --cancel demo-md-0-7x2kq-f8k2p\n"
            "  capl migrate --cancel demo-md-0-7x2kq --wait   the machine's migration\n"
            "\n"
            "exit codes: 0 created (with --wait: succeeded), 1 refused, failed or timed out,\n"
            "3 no such machine, host or migration, 4 API server unreachable"
        ),
    )
    p.add_argument(
        "name",
        metavar="MACHINE",
        help="LibvirtMachine or Machine (with --cancel: a LibvirtMachineMigration, or a machine)",
    )
    p.add_argument("--to", default=None, metavar="HOST", help="target host (default: capl picks)")
    p.add_argument(
        "--bandwidth",
        type=_bandwidth,
        default=None,
        metavar="MiB/s",
        help="cap on the transfer rate in MiB/s (default: unlimited)",
    )
    p.add_argument("--cancel", action="store_true", help="delete (abort) an unfinished migration")
    p.add_argument("--wait", action="store_true", help="follow until it is finished (or gone)")
    p.add_argument(
        "--timeout",
        type=positive_duration,
        default=_DEFAULT_TIMEOUT,
        help="give up waiting after this long (1h); the migration goes on",
    )
    p.add_argument("-n", "--namespace", default=None, help="namespace (default: context's)")
    add_api_flags(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.cancel and (args.to is not None or args.bandwidth is not None):
        raise CliError("--cancel takes no --to or --bandwidth", code=EXIT_USAGE)
    namespace = scope_namespace(args)
    assert namespace is not None
    return asyncio.run(_run(args, namespace))


async def _run(args: argparse.Namespace, namespace: str) -> int:
    client = await connect(args.kubeconfig, context=args.context)
    async with client:
        if args.cancel:
            return await _cancel(client, namespace, args.name, wait=args.wait, limit=args.timeout)
        plan = await _plan(client, namespace, args.name, to=args.to)
        created = await _create(client, plan, bandwidth=args.bandwidth)
        name = obj_name(created)
        where = plan.to or "a host capl chooses"
        print(
            f"migration {namespace}/{name} created: moves {plan.machine} from {plan.source} "
            f"to {where}",
            flush=True,
        )
        if not args.wait:
            return EXIT_OK
        return await _wait_finished(client, namespace, name, limit=args.timeout)


# --- the checks --------------------------------------------------------------------------------


class _Plan:
    """A migration that passed the checks."""

    def __init__(self, lm: Obj, source: str, to: str | None) -> None:
        self.lm = lm
        self.namespace = str(lm["metadata"]["namespace"])
        self.machine = obj_name(lm)
        self.source = source
        self.to = to


async def _plan(client: KubeClient, namespace: str, name: str, *, to: str | None) -> _Plan:
    """The machine and its target, or a CliError naming why it cannot be migrated."""
    lm = await find_libvirt_machine(client, namespace=namespace, name=name)
    if lm is None:
        raise CliError(
            f"machine {namespace}/{name} not found (no LibvirtMachine or Machine of that name)",
            code=EXIT_NOT_FOUND,
        )
    machine = obj_name(lm)
    if obj_meta(lm).get("deletionTimestamp"):
        raise CliError(f"LibvirtMachine {namespace}/{machine} is being deleted")
    source = text(dig(lm, "spec", "hostName"))
    if source is None or not dig(lm, "spec", "domainUUID"):
        raise CliError(
            f"LibvirtMachine {namespace}/{machine} has no domain yet (spec.domainUUID and "
            "spec.hostName are set once the domain is defined): there is nothing to migrate"
        )
    if dig(lm, "status", "initialization", "provisioned") is not True:
        raise CliError(
            f"LibvirtMachine {namespace}/{machine} is not provisioned yet "
            "(status.initialization.provisioned): migrate it once it runs"
        )
    moving = text(dig(lm, "spec", "migrationTarget"))
    if moving is not None:
        raise CliError(
            f"LibvirtMachine {namespace}/{machine} is migrating already "
            f"(spec.migrationTarget: {moving})"
        )
    lc = await libvirt_cluster_of(client, lm, source)
    control_plane = await _is_control_plane(client, lm)
    _check_target(lc, machine=machine, source=source, to=to, control_plane=control_plane)
    await _check_no_unfinished(client, namespace, machine)
    return _Plan(lm, source, to)


async def _is_control_plane(client: KubeClient, lm: Obj) -> bool:
    from capl.runtime.resources import MACHINE

    if has_label(lm, CONTROL_PLANE_LABEL):
        return True
    owner = obj_owner(lm, "Machine")
    if owner is None:
        return False
    machine = await get_or_none(client, MACHINE, str(lm["metadata"]["namespace"]), owner)
    return has_label(machine, CONTROL_PLANE_LABEL)


def _unfit(
    host: Mapping[str, Any], status: Mapping[str, Any] | None, *, control_plane: bool
) -> str | None:
    """Why a host of the cluster cannot take the machine, None when it can (the migration
    controller's reasons that the LibvirtCluster shows; not whether the host runs another
    control-plane machine of the cluster, which the controller checks)."""
    name = host.get("name")
    maintenance = host.get("maintenance")
    if isinstance(maintenance, Mapping):
        reason = text(maintenance.get("reason"))
        return f"host {name} is in maintenance" + (f" ({reason})" if reason else "")
    if control_plane and host.get("controlPlane") is False:
        return f"host {name} takes no control-plane machines (controlPlane: false)"
    if dig(status, "reachable") is False:
        why = text(dig(status, "message"))
        return f"host {name} is unreachable" + (f" ({why})" if why else "")
    return None


def _check_target(
    lc: Obj, *, machine: str, source: str, to: str | None, control_plane: bool
) -> None:
    """The target (or, without one, some host) fits; CliError naming the cause otherwise."""
    where = f"LibvirtCluster {lc['metadata']['namespace']}/{obj_name(lc)}"
    hosts = [h for h in dig(lc, "spec", "hosts") or () if isinstance(h, Mapping)]
    names = [str(h.get("name")) for h in hosts]
    statuses = {
        h.get("name"): h for h in dig(lc, "status", "hosts") or () if isinstance(h, Mapping)
    }

    def unfit(host: Mapping[str, Any]) -> str | None:
        return _unfit(host, statuses.get(host.get("name")), control_plane=control_plane)

    if to is not None:
        if to not in names:
            raise CliError(
                f"{where} has no host {to!r} (its hosts: {', '.join(names)})",
                code=EXIT_NOT_FOUND,
            )
        if to == source:
            raise CliError(
                f"LibvirtMachine {machine} runs on {source} already: --to must name another "
                f"host of {where}"
            )
        why = unfit(hosts[names.index(to)])
        if why is not None:
            raise CliError(f"cannot migrate {machine} to {to}: {why}")
        return
    others = [h for h in hosts if h.get("name") != source]
    reasons = [r for r in (unfit(h) for h in others) if r]
    if len(reasons) == len(others):
        detail = "; ".join(reasons) if reasons else f"it is the only host of {where}"
        raise CliError(f"no other host can take {machine} (it runs on {source}): {detail}")


async def _check_no_unfinished(client: KubeClient, namespace: str, machine: str) -> None:
    for migration in await _migrations(client, namespace):
        if dig(migration, "spec", "machineName") != machine or _finished(migration):
            continue
        state = (
            "being aborted"
            if obj_meta(migration).get("deletionTimestamp")
            else f"phase {text(dig(migration, 'status', 'phase')) or 'Pending'}"
        )
        raise CliError(
            f"LibvirtMachine {machine} has an unfinished migration already: "
            f"LibvirtMachineMigration {namespace}/{obj_name(migration)} ({state}); wait for it, "
            f"or cancel it with capl migrate --cancel {obj_name(migration)}"
        )


def _finished(migration: Mapping[str, Any]) -> bool:
    return dig(migration, "status", "phase") in TERMINAL


async def _migrations(client: KubeClient, namespace: str) -> list[Obj]:
    from capl.runtime.resources import LIBVIRT_MACHINE_MIGRATION

    found = await list_kind(client, LIBVIRT_MACHINE_MIGRATION, namespace=namespace)
    if found is None:
        raise CliError(
            "the LibvirtMachineMigration CRD is not installed on this API server "
            "(install capl's CRDs of this version)",
            code=EXIT_NOT_FOUND,
        )
    return found


async def _create(client: KubeClient, plan: _Plan, *, bandwidth: int | None) -> Obj:
    from capl.api.constants import API_VERSION, Kind
    from capl.api.migration import LibvirtMachineMigrationSpec
    from capl.runtime.errors import ApiError
    from capl.runtime.resources import LIBVIRT_MACHINE_MIGRATION

    spec = LibvirtMachineMigrationSpec(
        machine_name=plan.machine, target_host=plan.to, bandwidth_mib_per_second=bandwidth
    )
    metadata: dict[str, Any] = {"generateName": f"{plan.machine}-", "namespace": plan.namespace}
    cluster = obj_label(plan.lm, CLUSTER_NAME_LABEL)
    if cluster:
        metadata["labels"] = {CLUSTER_NAME_LABEL: cluster}
    body = {
        "apiVersion": API_VERSION,
        "kind": Kind.LIBVIRT_MACHINE_MIGRATION.value,
        "metadata": metadata,
        "spec": spec.model_dump(
            mode="json", by_alias=True, exclude_none=True, exclude_defaults=True
        ),
    }
    try:
        return await client.resource(LIBVIRT_MACHINE_MIGRATION).create(body)
    except ApiError as exc:
        raise api_failure(
            exc,
            server=str(client.configuration.host),
            what=f"create a LibvirtMachineMigration for {plan.namespace}/{plan.machine}",
        ) from exc


# --- --wait ------------------------------------------------------------------------------------


def progress_line(migration: Mapping[str, Any]) -> str:
    """``Running (kvm1 -> kvm2), 512.0 MiB of 2.0 GiB left`` / ``Failed: <message>``."""
    status = dig(migration, "status") or {}
    phase = text(status.get("phase")) or "Pending"
    line = phase
    source, target = text(status.get("sourceHost")), text(status.get("targetHost"))
    if source and target:
        line += f" ({source} -> {target})"
    remaining = dig(status, "state", "dataRemainingBytes")
    if phase == "Running" and isinstance(remaining, int):
        total = dig(status, "state", "dataTotalBytes")
        of = f" of {format_bytes(total)}" if isinstance(total, int) else ""
        line += f", {format_bytes(remaining)}{of} left"
    downtime = dig(status, "state", "downtimeMs")
    if phase == "Succeeded" and isinstance(downtime, int):
        line += f", downtime {downtime} ms"
    if obj_meta(migration).get("deletionTimestamp") and phase not in TERMINAL:
        line += ", being aborted"
    message = text(status.get("message"))
    if message:
        line += f": {' '.join(message.split())}"
    return line


async def _wait_finished(client: KubeClient, namespace: str, name: str, *, limit: float) -> int:
    """Print each change of the migration until it is finished: 0 Succeeded, 1 Failed."""
    from capl.runtime.objects import ObjectKey
    from capl.runtime.resources import LIBVIRT_MACHINE_MIGRATION

    key = ObjectKey(namespace, name)
    last = ""

    def step(state: Mapping[ObjectKey, Obj]) -> int | None:
        nonlocal last
        migration = state.get(key)
        if migration is None:
            raise CliError(f"migration {key} was deleted before it finished (deleting aborts it)")
        line = progress_line(migration)
        if line != last:
            print(f"migration {name}: {line}", flush=True)
            last = line
        phase = dig(migration, "status", "phase")
        if phase == "Succeeded":
            return EXIT_OK
        return EXIT_FAILED if phase == "Failed" else None

    try:
        async with asyncio.timeout(limit):
            return await follow(
                client, LIBVIRT_MACHINE_MIGRATION, namespace=namespace, name=name, step=step
            )
    except TimeoutError:
        raise CliError(
            f"timed out after {limit:g}s waiting for migration {key} ({last}); it goes on: "
            f"capl migrate --cancel {name} -n {namespace} aborts it"
        ) from None


# --- --cancel ----------------------------------------------------------------------------------


async def _cancel(
    client: KubeClient, namespace: str, name: str, *, wait: bool, limit: float
) -> int:
    """Delete the unfinished migration NAME, or those of machine NAME (see the docstring)."""
    doomed = await _to_cancel(client, namespace, name)
    for migration in doomed:
        await _delete(client, migration)
    if wait:
        await _wait_gone(client, namespace, doomed, limit=limit)
    return EXIT_OK


async def _to_cancel(client: KubeClient, namespace: str, name: str) -> list[Obj]:
    from capl.runtime.resources import LIBVIRT_MACHINE_MIGRATION

    migration = await get_or_none(client, LIBVIRT_MACHINE_MIGRATION, namespace, name)
    if migration is not None:
        if _finished(migration):
            phase = dig(migration, "status", "phase")
            raise CliError(
                f"migration {namespace}/{name} is finished ({phase}): there is nothing to "
                "cancel (kubectl delete removes its record)"
            )
        return [migration]
    lm = await find_libvirt_machine(client, namespace=namespace, name=name)
    machine = obj_name(lm) if lm is not None else name
    unfinished = [
        m
        for m in await _migrations(client, namespace)
        if dig(m, "spec", "machineName") == machine and not _finished(m)
    ]
    if not unfinished:
        raise CliError(
            f"no LibvirtMachineMigration {namespace}/{name}, and no unfinished migration of a "
            f"machine {name}",
            code=EXIT_NOT_FOUND,
        )
    return sorted(unfinished, key=obj_name)


async def _delete(client: KubeClient, migration: Obj) -> None:
    from capl.runtime.errors import ApiError, NotFound
    from capl.runtime.objects import key_of
    from capl.runtime.resources import LIBVIRT_MACHINE_MIGRATION

    key = key_of(migration)
    was = progress_line(migration)
    if obj_meta(migration).get("deletionTimestamp"):
        print(f"migration {key} is being cancelled already ({was})", flush=True)
        return
    try:
        await client.resource(LIBVIRT_MACHINE_MIGRATION).delete(
            key, uid=str(obj_meta(migration).get("uid") or "") or None
        )
    except NotFound:
        print(f"migration {key} is gone already", flush=True)
        return
    except ApiError as exc:
        raise api_failure(
            exc, server=str(client.configuration.host), what=f"delete migration {key}"
        ) from exc
    print(
        f"migration {key} deleted ({was}): capl aborts it, and removes it once the domain "
        "runs in one place",
        flush=True,
    )


async def _wait_gone(
    client: KubeClient, namespace: str, doomed: list[Obj], *, limit: float
) -> None:
    from capl.runtime.objects import key_of
    from capl.runtime.resources import LIBVIRT_MACHINE_MIGRATION

    keys = {key_of(m): progress_line(m) for m in doomed}

    def step(state: Mapping[ObjectKey, Obj]) -> bool | None:
        for key in list(keys):
            migration = state.get(key)
            if migration is None:
                print(f"migration {key} is gone (last: {keys.pop(key)})", flush=True)
                continue
            line = progress_line(migration)
            if line != keys[key]:
                print(f"migration {key.name}: {line}", flush=True)
                keys[key] = line
        return True if not keys else None

    only = next(iter(keys)).name if len(keys) == 1 else None
    try:
        async with asyncio.timeout(limit):
            await follow(
                client, LIBVIRT_MACHINE_MIGRATION, namespace=namespace, name=only, step=step
            )
    except TimeoutError:
        left = ", ".join(f"{k} ({line})" for k, line in keys.items())
        raise CliError(f"timed out after {limit:g}s waiting for {left} to go away") from None
