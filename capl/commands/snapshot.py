"""`capl snapshot create|list|revert|delete MACHINE`: external snapshots of a machine's domain.

The machine and its host are found as for `capl console` (``capl.commands.onhost``); the
snapshots are ``capl.virt.snapshot.LibvirtSnapshots`` (see there how a revert works on
libvirt 9.0). ``create`` takes a disk-only snapshot, or with ``--memory`` the guest's RAM
too; ``revert`` discards everything written after the snapshot (and later snapshots) and
starts the domain as it ran (a memory snapshot resumes the guest where it was);
``delete`` merges the snapshot's overlay into the image below it (nothing is lost).

The manager does not know about snapshots; a revert stops and starts the domain, which the
machine's status shows as any restart.

Exit codes: 0 done, 1 refused (e.g. a name taken, a memory snapshot of a stopped domain),
2 usage, 3 no such machine, domain or snapshot, 4 the API server or the host is unreachable.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from capl.commands.onhost import machine_host
from capl.commands.shared import add_api_flags, align_columns, default_namespace, formatter
from capl.errors import EXIT_NOT_FOUND, EXIT_OK, EXIT_USAGE, CliError

__all__ = ["register"]


def register(sub: Any) -> None:
    p = sub.add_parser(
        "snapshot",
        help="external snapshots of a machine: create, list, revert, delete",
        formatter_class=formatter,
        description=(
            "External snapshots of a machine's libvirt domain. MACHINE is a LibvirtMachine or\n"
            "a Cluster API Machine. A revert discards what was written after the snapshot."
        ),
        epilog=(
            "examples:\n"
            "  capl snapshot create worker-0 before-upgrade\n"
            "  capl snapshot create worker-0 live --memory     with the guest's RAM\n"
            "  capl snapshot list worker-0\n"
            "  capl snapshot revert worker-0 before-upgrade\n"
            "  capl snapshot delete worker-0 before-upgrade    merge it (keep the changes)\n"
            "\n"
            "exit codes: 0 done, 1 refused, 3 no such machine, domain or snapshot, 4 unreachable"
        ),
    )
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    for action, text, example in (
        ("create", "take a snapshot (disk-only; --memory: with RAM)", "worker-0 before-upgrade"),
        ("list", "list the snapshots, oldest first", "worker-0 -n default"),
        ("revert", "go back to a snapshot", "worker-0 before-upgrade --no-start"),
        ("delete", "merge a snapshot into the disk below it and forget it", "worker-0 s1"),
    ):
        a = actions.add_parser(
            action,
            help=text,
            description=text[:1].upper() + text[1:] + ".",
            formatter_class=formatter,
            epilog=f"examples:\n  capl snapshot {action} {example}",
        )
        a.add_argument("machine", metavar="MACHINE", help="LibvirtMachine or Machine name")
        if action != "list":
            a.add_argument("name", metavar="NAME", help="snapshot name")
        a.add_argument("-n", "--namespace", default=None, help="namespace (default: context's)")
        add_api_flags(a)
        if action == "create":
            a.add_argument("--memory", action="store_true", help="save the guest's RAM too")
            a.add_argument("--description", default="", help="free text kept with it")
        if action == "revert":
            start = a.add_mutually_exclusive_group()
            start.add_argument("--start", dest="start", action="store_const", const=True)
            start.add_argument("--no-start", dest="start", action="store_const", const=False)
        a.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from capl.ports.errors import InvalidSpec
    from capl.ports.virt.snapshots import DAY2_SNAPSHOT, check_snapshot_name

    if getattr(args, "name", None) is not None:
        try:
            check_snapshot_name(args.name)
        except InvalidSpec as exc:
            raise CliError(str(exc), code=EXIT_USAGE) from None
        if args.action == "create" and args.name == DAY2_SNAPSHOT:
            raise CliError(
                f"snapshot name {DAY2_SNAPSHOT!r} is reserved for the manager's day-2 changes"
                " (it merges or reverts it): choose another name",
                code=EXIT_USAGE,
            )
    namespace = args.namespace or default_namespace(args.kubeconfig, context=args.context)
    return asyncio.run(_act(args, namespace))


async def _act(args: argparse.Namespace, namespace: str) -> int:
    from capl.virt.snapshot import LibvirtSnapshots

    async with machine_host(args, namespace) as (target, host):
        snapshots = LibvirtSnapshots(host)
        machine = f"{namespace}/{target.machine}"
        if args.action == "create":
            info = await snapshots.create_snapshot(
                target.uuid, args.name, memory=args.memory, description=args.description
            )
            print(f"snapshot {info.name} ({info.kind}) of {machine} created")
        elif args.action == "list":
            infos = await snapshots.list_snapshots(target.uuid)
            rows = [
                [
                    i.name,
                    str(i.kind),
                    i.created.strftime("%Y-%m-%dT%H:%M:%SZ"),
                    i.state,
                    i.parent or "-",
                    "*" if i.current else "",
                ]
                for i in infos
            ]
            header = ["NAME", "KIND", "CREATED", "STATE", "PARENT", "CURRENT"]
            print("\n".join(align_columns(header, rows)))
        elif args.action == "revert":
            info = await snapshots.revert_snapshot(target.uuid, args.name, start=args.start)
            print(f"{machine} reverted to snapshot {info.name}")
        else:
            if not await snapshots.delete_snapshot(target.uuid, args.name):
                raise CliError(f"{machine} has no snapshot {args.name!r}", code=EXIT_NOT_FOUND)
            print(f"snapshot {args.name} of {machine} merged and deleted")
    return EXIT_OK
