"""`capl maintenance start|stop HOST`: put a KVM host into maintenance or end it, in the spirit
of `kubectl cordon` + `kubectl drain` for the machines capl runs there.

``start`` sets ``spec.hosts[i].maintenance`` (``{reason}``) of every LibvirtCluster in scope
(``-n``, ``-A``, or only ``--cluster``) that has a host named HOST; capl's manager then
places nothing new on the host and moves or replaces its machines by their
``evictionStrategy``, reporting in ``status.hosts[i].maintenance``. ``stop`` removes the
field. Each cluster's change (or that nothing changed) is printed. ``start --wait`` follows
the clusters (a watch, bounded by ``--timeout``) until every one reports ``Evacuated`` for
the generation that asked for it; ``Blocked`` prints what blocks and exits 1.

How the field is written, and why so: one JSON patch (RFC 6902) per cluster,

    test    /spec/hosts/<i>/name == HOST          the index still names the host
    replace /metadata/resourceVersion = <read>    precondition: 409 if anything changed
    add     /spec/hosts/<i>/maintenance = {...}   (stop: remove)

so exactly one field of one host is written, and only onto the object as it was read; on a
409 or a failed test the cluster is read again, the change decided again (the host may now
be elsewhere in the list, or already in maintenance) and retried. Nothing a concurrent
writer did is ever overwritten. The alternatives clobber or entangle: a JSON merge patch
replaces the whole ``hosts`` list (CRDs have no strategic merge), so it would undo a host
added or changed since the read; server-side apply (a field manager "capl-cli") merges per
host but makes capl-cli a co-owner of the host's entry (its ``name`` key), so a GitOps tool
or ``kubectl apply --server-side`` that later drops the host from its configuration would no
longer remove it, and ``stop`` could not remove a maintenance another manager set without
forcing ownership.

A host name is per cluster: when the clusters in scope give HOST different URIs they are
different machines, and the command refuses (choose one with ``--cluster``).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from capl.commands.follow import follow
from capl.commands.raw import CLUSTER_NAME_LABEL, dig, obj_label, obj_meta, obj_name, obj_ns, text
from capl.commands.shared import (
    add_api_flags,
    add_scope_flags,
    api_failure,
    connect,
    formatter,
    list_kind,
    positive_duration,
    scope_namespace,
)
from capl.errors import EXIT_FAILED, EXIT_NOT_FOUND, EXIT_OK, EXIT_USAGE, CliError

if TYPE_CHECKING:
    from capl.kube.client import KubeClient
    from capl.runtime.objects import Obj, ObjectKey

__all__ = ["register"]

JSON_PATCH = "application/json-patch+json"
_ATTEMPTS = 5
_DEFAULT_TIMEOUT = 3600.0


@dataclass(slots=True, kw_only=True)
class _Outcome:
    """What one cluster's write did."""

    key: ObjectKey
    text: str
    generation: int | None = None
    """The metadata.generation that holds the requested state (for --wait)."""


# --- the command -------------------------------------------------------------------------------


def _reason(value: str) -> str:
    from pydantic import ValidationError

    from capl.api.cluster import HostMaintenance

    try:
        HostMaintenance(reason=value)
    except ValidationError as exc:
        detail = exc.errors()[0].get("msg", "invalid")
        raise argparse.ArgumentTypeError(f"invalid reason: {detail}") from None
    return value


def _add_verb(verbs: Any, name: str, *, help: str, description: str, epilog: str) -> Any:
    p = verbs.add_parser(
        name, help=help, formatter_class=formatter, description=description, epilog=epilog
    )
    p.add_argument("host", metavar="HOST", help="host name (spec.hosts[].name)")
    p.add_argument(
        "--cluster", default=None, help="only this LibvirtCluster (or Cluster API cluster)"
    )
    add_scope_flags(p, all_help="the clusters of every namespace")
    add_api_flags(p)
    p.set_defaults(run=run, start=name == "start")
    return p


def register(sub: Any) -> None:
    group = sub.add_parser(
        "maintenance",
        help="put a KVM host into maintenance, or end it",
        formatter_class=formatter,
        description=(
            "Host maintenance, like kubectl cordon + drain: nothing new is placed on the\n"
            "host and its machines are moved (live migration) or replaced, each by its\n"
            "evictionStrategy. `capl hosts` shows how it goes."
        ),
        epilog=(
            "examples:\n"
            "  capl maintenance start kvm1 --reason 'kernel update' --wait\n"
            "  capl maintenance stop kvm1"
        ),
    )
    verbs = group.add_subparsers(dest="verb", metavar="VERB", parser_class=type(group))
    start = _add_verb(
        verbs,
        "start",
        help="put a host into maintenance",
        description=(
            "Set spec.hosts[].maintenance of HOST in every LibvirtCluster in scope that has\n"
            "it (or only in --cluster). With --wait, follow until every one of them reports\n"
            "the host Evacuated; Blocked (a machine that cannot leave) exits 1."
        ),
        epilog=(
            "examples:\n"
            "  capl maintenance start kvm1 --reason 'kernel update'\n"
            "  capl maintenance start kvm1 --cluster demo -n team-a --wait --timeout 30m\n"
            "  capl maintenance start kvm1 -A           every cluster of every namespace\n"
            "\n"
            "exit codes: 0 done (with --wait: evacuated), 1 failed, blocked or timed out,\n"
            "3 no such cluster or host, 4 API server unreachable"
        ),
    )
    start.add_argument(
        "--reason", type=_reason, default=None, help="why (shown by capl hosts and in Events)"
    )
    start.add_argument(
        "--wait", action="store_true", help="follow until the host is evacuated (or blocked)"
    )
    start.add_argument(
        "--timeout",
        type=positive_duration,
        default=_DEFAULT_TIMEOUT,
        help="give up waiting after this long (1h)",
    )
    _add_verb(
        verbs,
        "stop",
        help="end a host's maintenance",
        description=(
            "Remove spec.hosts[].maintenance of HOST in every LibvirtCluster in scope that\n"
            "has it (or only in --cluster): machines may be placed on the host again.\n"
            "Machines that were moved away stay where they are."
        ),
        epilog=(
            "examples:\n"
            "  capl maintenance stop kvm1\n"
            "  capl maintenance stop kvm1 --cluster demo -n team-a\n"
            "\n"
            "exit codes: 0 done, 1 failed, 3 no such cluster or host, 4 unreachable"
        ),
    )
    group.set_defaults(run=lambda _args: _usage(group))


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return EXIT_USAGE


def run(args: argparse.Namespace) -> int:
    return asyncio.run(_run(args, scope_namespace(args)))


async def _run(args: argparse.Namespace, namespace: str | None) -> int:
    from capl.runtime.resources import LIBVIRT_CLUSTER

    client = await connect(args.kubeconfig, context=args.context)
    async with client:
        listed = await list_kind(client, LIBVIRT_CLUSTER, namespace=namespace)
        if listed is None:
            raise CliError(
                "capl's CRDs (LibvirtCluster) are not installed on this API server",
                code=EXIT_NOT_FOUND,
            )
        where = "any namespace" if namespace is None else f"namespace {namespace}"
        targets = _targets(listed, host=args.host, cluster=args.cluster, where=where)
        outcomes: list[_Outcome] = []
        failures: list[CliError] = []
        for lc in targets:
            try:
                outcome = await _write(client, lc, args.host, start=args.start, reason=_of(args))
            except CliError as exc:
                print(f"LibvirtCluster {obj_ns(lc)}/{obj_name(lc)}: {exc}", flush=True)
                failures.append(exc)
                continue
            print(f"LibvirtCluster {outcome.key}: {outcome.text}", flush=True)
            outcomes.append(outcome)
        if failures:
            raise CliError(
                f"the maintenance of host {args.host} was not changed in "
                f"{len(failures)} of {len(targets)} LibvirtCluster(s) (see above)",
                code=failures[0].code,
            )
        if args.start and args.wait:
            await _wait_evacuated(client, args.host, outcomes, limit=args.timeout)
    return EXIT_OK


def _of(args: argparse.Namespace) -> str | None:
    return getattr(args, "reason", None)


# --- which clusters ----------------------------------------------------------------------------


def _host_names(lc: Mapping[str, Any]) -> list[str]:
    return [
        str(h.get("name"))
        for h in dig(lc, "spec", "hosts") or ()
        if isinstance(h, Mapping) and h.get("name")
    ]


def _host_index(lc: Mapping[str, Any], host: str) -> int | None:
    for index, entry in enumerate(dig(lc, "spec", "hosts") or ()):
        if isinstance(entry, Mapping) and entry.get("name") == host:
            return index
    return None


def _targets(lcs: list[Obj], *, host: str, cluster: str | None, where: str) -> list[Obj]:
    """The LibvirtClusters to change: those in scope (of ``cluster``) with a host ``host``."""
    if cluster is not None:
        lcs = [lc for lc in lcs if cluster in (obj_name(lc), obj_label(lc, CLUSTER_NAME_LABEL))]
        if not lcs:
            raise CliError(f"LibvirtCluster {cluster!r} not found in {where}", code=EXIT_NOT_FOUND)
    found = sorted(
        (lc for lc in lcs if _host_index(lc, host) is not None),
        key=lambda lc: (obj_ns(lc), obj_name(lc)),
    )
    if not found:
        if cluster is not None and len(lcs) == 1:
            names = ", ".join(_host_names(lcs[0])) or "none"
            raise CliError(
                f"LibvirtCluster {obj_ns(lcs[0])}/{obj_name(lcs[0])} has no host {host!r} "
                f"(its hosts: {names})",
                code=EXIT_NOT_FOUND,
            )
        names = ", ".join(sorted({n for lc in lcs for n in _host_names(lc)})) or "none"
        clusters = f"of cluster {cluster!r} " if cluster is not None else ""
        raise CliError(
            f"no LibvirtCluster {clusters}in {where} has a host named {host!r} "
            f"(their hosts: {names})",
            code=EXIT_NOT_FOUND,
        )
    uris = {_uri(lc, host) for lc in found}
    if len(uris) > 1:
        each = ", ".join(f"{_uri(lc, host)} in {obj_ns(lc)}/{obj_name(lc)}" for lc in found)
        raise CliError(
            f"the host name {host!r} names different hosts in {where} ({each}): "
            "choose the cluster with --cluster",
            code=EXIT_FAILED,
        )
    return found


def _uri(lc: Mapping[str, Any], host: str) -> str:
    index = _host_index(lc, host)
    hosts = dig(lc, "spec", "hosts") or ()
    return str(hosts[index].get("uri") or "") if index is not None else ""


# --- the write ---------------------------------------------------------------------------------


def _decide(
    current: Any, *, host: str, start: bool, reason: str | None
) -> tuple[dict[str, Any] | None, str]:
    """(the maintenance to write, None to remove it; what that does). Unchanged: the current
    value itself."""
    had = isinstance(current, Mapping)
    old = text(current.get("reason")) if isinstance(current, Mapping) else None
    if not start:
        if not had:
            return None, f"host {host} is not in maintenance: unchanged"
        was = f" (it was: {old})" if old else ""
        return None, f"host {host} taken out of maintenance{was}"
    if not had:
        why = f" (reason: {reason})" if reason else ""
        return ({"reason": reason} if reason else {}), f"host {host} put into maintenance{why}"
    assert isinstance(current, Mapping)
    if reason is None or reason == old:
        why = f" (reason: {old})" if old else ""
        return dict(current), f"host {host} already in maintenance{why}: unchanged"
    return (
        {**current, "reason": reason},
        f"host {host} already in maintenance; reason changed from {old or '(none)'!r} "
        f"to {reason!r}",
    )


async def _write(
    client: KubeClient, lc: Obj, host: str, *, start: bool, reason: str | None
) -> _Outcome:
    """Set or remove one host's maintenance in one LibvirtCluster (see the module docstring)."""
    from capl.runtime.errors import ApiError, Conflict, Invalid, NotFound
    from capl.runtime.objects import key_of, resource_version

    key = key_of(lc)
    server = str(client.configuration.host)
    what = f"change the maintenance of host {host}"
    for _ in range(_ATTEMPTS):
        index = _host_index(lc, host)
        if index is None:
            raise CliError(f"host {host} was removed from the cluster meanwhile", code=EXIT_FAILED)
        current = lc["spec"]["hosts"][index].get("maintenance")
        desired, said = _decide(current, host=host, start=start, reason=reason)
        if desired == current:
            return _Outcome(key=key, text=said, generation=obj_meta(lc).get("generation"))
        ops: list[dict[str, Any]] = [
            {"op": "test", "path": f"/spec/hosts/{index}/name", "value": host},
            {"op": "replace", "path": "/metadata/resourceVersion", "value": resource_version(lc)},
            {"op": "add", "path": f"/spec/hosts/{index}/maintenance", "value": desired}
            if desired is not None
            else {"op": "remove", "path": f"/spec/hosts/{index}/maintenance"},
        ]
        try:
            patched = await _json_patch(client, key, ops)
            return _Outcome(key=key, text=said, generation=obj_meta(patched).get("generation"))
        except NotFound:
            raise CliError(
                "the LibvirtCluster was deleted meanwhile", code=EXIT_NOT_FOUND
            ) from None
        except Conflict:
            pass  # changed since the read: read again and decide again
        except Invalid as exc:
            latest = await _get(client, key, what=what)
            if resource_version(latest) == resource_version(lc):
                raise api_failure(exc, server=server, what=what) from exc
            lc = latest  # the test failed because the list changed: decide again
            continue
        except ApiError as exc:
            raise api_failure(exc, server=server, what=what) from exc
        lc = await _get(client, key, what=what)
    raise CliError(
        f"the LibvirtCluster changed {_ATTEMPTS} times while it was being updated; try again",
        code=EXIT_FAILED,
    )


async def _get(client: KubeClient, key: ObjectKey, *, what: str) -> Obj:
    from capl.runtime.errors import ApiError, NotFound
    from capl.runtime.resources import LIBVIRT_CLUSTER

    try:
        return await client.resource(LIBVIRT_CLUSTER).get(key)
    except NotFound:
        raise CliError("the LibvirtCluster was deleted meanwhile", code=EXIT_NOT_FOUND) from None
    except ApiError as exc:
        raise api_failure(exc, server=str(client.configuration.host), what=what) from exc


async def _json_patch(client: KubeClient, key: ObjectKey, ops: list[dict[str, Any]]) -> Obj:
    from capl.runtime.resources import LIBVIRT_CLUSTER as R

    path = (
        f"/apis/{R.group}/{R.version}/namespaces/{quote(key.namespace, safe='')}/"
        f"{R.plural}/{quote(key.name, safe='')}"
    )
    result: Obj = await client.request(
        "PATCH", path, body=ops, content_type=JSON_PATCH, resource=R, key=key
    )
    return result


# --- --wait ------------------------------------------------------------------------------------


def _progress(lc: Mapping[str, Any], host: str, generation: int | None) -> tuple[str | None, str]:
    """(phase, what to print) of one host's maintenance in one cluster, for --wait."""
    index = _host_index(lc, host)
    if index is None:
        raise CliError(f"host {host} was removed from the cluster while waiting")
    if not isinstance(lc["spec"]["hosts"][index].get("maintenance"), Mapping):
        raise CliError(f"the maintenance of host {host} was ended while waiting")
    observed = dig(lc, "status", "observedGeneration")
    if isinstance(generation, int) and not (isinstance(observed, int) and observed >= generation):
        return None, (
            f"waiting for capl's manager to see the maintenance (status.observedGeneration "
            f"{observed if observed is not None else 'unset'}, the change is generation "
            f"{generation})"
        )
    status = next(
        (
            h
            for h in dig(lc, "status", "hosts") or ()
            if isinstance(h, Mapping) and h.get("name") == host
        ),
        None,
    )
    phase = text(dig(status, "maintenance", "phase"))
    if phase is None:
        return None, f"host {host}: capl's manager has not reported the maintenance yet"
    left = dig(status, "maintenance", "machines")
    said = f"host {host} {phase}"
    if phase != "Evacuated" and isinstance(left, int):
        said += f", {left} machine{'' if left == 1 else 's'} left"
    message = text(dig(status, "maintenance", "message"))
    if message:
        said += f": {' '.join(message.split())}"
    return phase, said


async def _wait_evacuated(
    client: KubeClient, host: str, outcomes: list[_Outcome], *, limit: float
) -> None:
    """Follow the changed clusters until each reports the host Evacuated (see the module
    docstring); Blocked, a vanished cluster or the deadline: CliError."""
    from capl.runtime.resources import LIBVIRT_CLUSTER

    wanted = {o.key: o.generation for o in outcomes}
    said: dict[ObjectKey, str] = {}

    def step(state: Mapping[ObjectKey, Obj]) -> bool | None:
        done = 0
        for key, generation in wanted.items():
            lc = state.get(key)
            if lc is None:
                raise CliError(f"LibvirtCluster {key} was deleted while waiting")
            try:
                phase, line = _progress(lc, host, generation)
            except CliError as exc:
                raise CliError(f"LibvirtCluster {key}: {exc}") from None
            if said.get(key) != line:
                print(f"LibvirtCluster {key}: {line}", flush=True)
                said[key] = line
            if phase == "Blocked":
                raise CliError(
                    f"host {host} cannot be evacuated from LibvirtCluster {key}: "
                    "a machine cannot leave it (see above); move or delete it, or end the "
                    f"maintenance (capl maintenance stop {host})"
                )
            done += phase == "Evacuated"
        return True if done == len(wanted) else None

    namespaces = {key.namespace for key in wanted}
    only = next(iter(wanted)).name if len(wanted) == 1 else None
    try:
        async with asyncio.timeout(limit):
            await follow(
                client,
                LIBVIRT_CLUSTER,
                namespace=next(iter(namespaces)) if len(namespaces) == 1 else None,
                name=only,
                step=step,
            )
    except TimeoutError:
        last = "; ".join(f"{key}: {line}" for key, line in said.items())
        raise CliError(
            f"timed out after {limit:g}s waiting for host {host} to be evacuated ({last})"
        ) from None
