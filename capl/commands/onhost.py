"""A machine's domain and a live connection to its host, for the commands that act on the
domain through libvirt (`capl vnc`, `capl snapshot`); errors become exit codes like
`capl console`'s: 3 no such machine, domain or snapshot, 4 the API server or the host is
unreachable, 1 anything else libvirt refused."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from capl.commands.shared import connect
from capl.commands.target import ConsoleTarget, resolve_target
from capl.errors import EXIT_FAILED, EXIT_NOT_FOUND, EXIT_UNREACHABLE, CliError

if TYPE_CHECKING:
    from capl.virt import LibvirtHost

__all__ = ["machine_host"]


@contextlib.asynccontextmanager
async def machine_host(
    args: argparse.Namespace, namespace: str
) -> AsyncIterator[tuple[ConsoleTarget, LibvirtHost]]:
    """The target of ``args.machine`` and its host (the connection is closed on leaving)."""
    from capl.ports.errors import CredentialsError, HostUnreachable, NotFound, VirtError
    from capl.virt import LibvirtHosts

    client = await connect(args.kubeconfig, context=args.context)
    async with client:
        target = await resolve_target(client, namespace=namespace, name=args.machine)
    hosts = LibvirtHosts(max_workers_per_host=2)
    try:
        yield target, target.host.connect(hosts)
    except NotFound as exc:
        raise CliError(str(exc), code=EXIT_NOT_FOUND) from exc
    except HostUnreachable as exc:
        raise CliError(str(exc), code=EXIT_UNREACHABLE) from exc
    except (CredentialsError, VirtError) as exc:
        raise CliError(str(exc), code=EXIT_FAILED) from exc
    finally:
        await hosts.close()
