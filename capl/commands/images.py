"""`capl images import URL --host HOST --pool POOL`: put a base image into a host's pool ahead
of time, exactly as the machine controller would.

The import goes through the infrastructure port (``Host.ensure_base_image``), so it is the
same streamed, checksum-verified, crash-safe import the controller runs, and by default the
volume gets the name the controller derives from the image (``capl.ports.naming.
base_image_volume_name`` of the URL's file name and the checksum): machines that use this URL
(and checksum) find the image imported already and start without downloading it. Running
the command again is a no-op ("already imported").

``--host`` is a libvirt URI, or with ``--cluster`` the name of one of that LibvirtCluster's
hosts (then the URI, credentials Secret and transport opt-ins come from the cluster, read
through ``--kubeconfig``). ``URL`` is an http(s) URL or an absolute path of a file on the
host.

Progress: the port has no progress hook, so the command watches the volume grow (its
allocation, read every half second) against the size the server announces (an HTTP HEAD);
a bar on a terminal, a line per quarter otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import posixpath
import re
import sys
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from capl.commands.shared import add_api_flags, api_failure, connect, default_namespace, formatter
from capl.commands.target import HostAccess, host_access
from capl.errors import EXIT_FAILED, EXIT_NOT_FOUND, EXIT_OK, EXIT_UNREACHABLE, EXIT_USAGE, CliError

if TYPE_CHECKING:
    from capl.ports.virt import BaseImage, ImageSource
    from capl.virt import LibvirtHost

__all__ = ["register"]

_CHECKSUM = re.compile(r"^sha256:([0-9a-fA-F]{64})$")
_POLL = 0.5
_MIB = 1024 * 1024


def register(sub: Any) -> None:
    images = sub.add_parser(
        "images",
        help="manage base images on hosts",
        formatter_class=formatter,
        description="Base images in the hosts' storage pools.",
        epilog=(
            "examples:\n"
            "  capl images import https://example.org/os.qcow2 --host qemu:///system --pool demo\n"
            "  capl images import URL --cluster demo --host kvm1 --pool capl-default-demo"
        ),
    )
    verbs = images.add_subparsers(dest="verb", metavar="VERB", parser_class=type(images))
    p = verbs.add_parser(
        "import",
        help="import a base image into a host's storage pool",
        formatter_class=formatter,
        description=(
            "Import a base image into a storage pool as the machine controller would\n"
            "(streamed, verified, under the volume name the controller looks for)."
        ),
        epilog=(
            "examples:\n"
            "  capl images import https://example.org/os.qcow2 --host qemu:///system \\\n"
            "      --pool capl-default-demo --checksum sha256:<64 hex digits>\n"
            "  capl images import https://example.org/os.qcow2 --cluster demo -n team-a \\\n"
            "      --host kvm1 --pool capl-team-a-demo\n"
            "  capl images import /var/lib/images/os.qcow2 --host qemu+ssh://root@kvm1/system \\\n"
            "      --pool default --name my-base\n"
            "\n"
            "exit codes: 0 imported (or already there), 1 failed (download, checksum, storage),\n"
            "3 no such pool, host or cluster, 4 host or API server unreachable"
        ),
    )
    p.add_argument("url", metavar="URL", help="http(s) URL, or an absolute path on the host")
    p.add_argument(
        "--host",
        required=True,
        help="libvirt URI, or a host name of the LibvirtCluster given with --cluster",
    )
    p.add_argument("--pool", required=True, help="storage pool on the host")
    p.add_argument(
        "--checksum", default=None, metavar="sha256:HEX", help="verify the image's digest"
    )
    p.add_argument(
        "--name", default=None, help="volume name (default: the name the controller uses)"
    )
    p.add_argument("--format", choices=("qcow2", "raw"), default=None, help="expected disk format")
    p.add_argument("--cluster", default=None, help="take --host from this LibvirtCluster")
    p.add_argument("-n", "--namespace", default=None, help="namespace of --cluster")
    add_api_flags(p)
    p.set_defaults(run=run_import)
    images.set_defaults(run=lambda _args: _usage(images))


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return EXIT_USAGE


def plan(
    url: str, *, checksum: str | None, name: str | None, format: str | None
) -> tuple[str, ImageSource]:
    """The volume name and the port's image source for the command's arguments."""
    from capl.ports.naming import base_image_volume_name
    from capl.ports.virt import ImageFromPath, ImageFromURL, VolumeFormat

    digest = None
    if checksum is not None:
        match = _CHECKSUM.match(checksum.strip())
        if match is None:
            raise CliError(
                f"--checksum {checksum!r}: expected sha256:<64 hex digits>", code=EXIT_USAGE
            )
        digest = match.group(1).lower()
    fmt = VolumeFormat(format) if format else None
    parts = urlsplit(url)
    source: ImageSource
    if parts.scheme in ("http", "https") and parts.netloc:
        label = posixpath.basename(parts.path) or "image"
        source = ImageFromURL(url=url, sha256=digest, format=fmt)
    elif url.startswith("/"):
        if digest is not None:
            raise CliError(
                "--checksum is verified on downloads only (a host path is copied by libvirt)",
                code=EXIT_USAGE,
            )
        label = posixpath.basename(url) or "image"
        source = ImageFromPath(path=url, format=fmt)
    else:
        raise CliError(f"{url!r} is neither an http(s) URL nor an absolute path", code=EXIT_USAGE)
    return name or base_image_volume_name(image=label, digest=digest, url=url), source


def run_import(args: argparse.Namespace) -> int:
    volume, source = plan(args.url, checksum=args.checksum, name=args.name, format=args.format)
    return asyncio.run(_import(args, volume, source))


async def _access(args: argparse.Namespace) -> HostAccess:

    if args.cluster is None:
        if "://" not in args.host:
            raise CliError(
                f"--host {args.host!r} is not a libvirt URI; give one (qemu:///system, "
                "qemu+ssh://user@host/system) or name the LibvirtCluster with --cluster",
                code=EXIT_USAGE,
            )
        return HostAccess(name=args.host, uri=args.host, credentials=None)
    from capl.runtime.errors import ApiError, NotFound
    from capl.runtime.objects import ObjectKey
    from capl.runtime.resources import LIBVIRT_CLUSTER

    namespace = args.namespace or default_namespace(args.kubeconfig, context=args.context)
    client = await connect(args.kubeconfig, context=args.context)
    async with client:
        try:
            cluster = await client.resource(LIBVIRT_CLUSTER).get(ObjectKey(namespace, args.cluster))
        except NotFound:
            raise CliError(
                f"LibvirtCluster {namespace}/{args.cluster} not found", code=EXIT_NOT_FOUND
            ) from None
        except ApiError as exc:
            raise api_failure(
                exc,
                server=str(client.configuration.host),
                what=f"read LibvirtCluster {namespace}/{args.cluster}",
            ) from exc
        return await host_access(client, cluster, args.host)


async def _import(args: argparse.Namespace, volume: str, source: ImageSource) -> int:
    from capl.ports.errors import HostUnreachable, NotFound, VirtError
    from capl.ports.virt import ImageFromURL
    from capl.virt import LibvirtHosts

    access = await _access(args)
    hosts = LibvirtHosts(max_workers_per_host=4)
    try:
        host = access.connect(hosts)
        pool = await host.get_pool(args.pool)
        if pool is None:
            raise CliError(
                f"storage pool {args.pool!r} does not exist on {host.host_id}",
                code=EXIT_NOT_FOUND,
            )
        where = f"pool {args.pool} on {host.host_id}"
        if await _complete(host, pool=args.pool, volume=volume):
            image = await host.ensure_base_image(pool=args.pool, name=volume, source=source)
            print(f"already imported: {volume} in {where} at {image.volume.path}")
            return EXIT_OK
        total = await _announced_size(source.url) if isinstance(source, ImageFromURL) else None
        task = asyncio.ensure_future(
            host.ensure_base_image(pool=args.pool, name=volume, source=source)
        )
        image = await _with_progress(task, host, pool=args.pool, volume=volume, total=total)
        size = image.volume.allocation_bytes
        state = "imported" if image.imported else "using the existing volume"
        print(
            f"{state}: {volume} in {where} ({image.volume.format}, "
            f"{size / _MIB:.1f} MiB on disk, virtual size {image.virtual_size_bytes / _MIB:.0f} "
            f"MiB) at {image.volume.path}"
        )
        return EXIT_OK
    except HostUnreachable as exc:
        raise CliError(str(exc), code=EXIT_UNREACHABLE) from exc
    except NotFound as exc:
        raise CliError(str(exc), code=EXIT_NOT_FOUND) from exc
    except VirtError as exc:
        raise CliError(str(exc), code=EXIT_FAILED) from exc
    finally:
        await hosts.close()


async def _complete(host: LibvirtHost, *, pool: str, volume: str) -> bool:
    """Whether capl imported this volume completely before (its completion marker exists)."""
    from capl.virt.images import COMPLETE_SUFFIX

    return await host.get_volume(pool=pool, name=volume + COMPLETE_SUFFIX) is not None


async def _announced_size(url: str) -> int | None:
    """Content-Length of a HEAD request (None when the server does not say)."""
    import aiohttp

    try:
        timeout = aiohttp.ClientTimeout(total=30)
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.head(url, allow_redirects=True) as response,
        ):
            return response.content_length if response.status == 200 else None
    except (aiohttp.ClientError, TimeoutError):
        return None  # the import reports the real problem


async def _with_progress(
    task: asyncio.Future[BaseImage],
    host: LibvirtHost,
    *,
    pool: str,
    volume: str,
    total: int | None,
) -> BaseImage:
    """Await the import, showing how much of the volume is written."""
    from capl.ports.errors import VirtError

    if sys.stderr.isatty():
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TimeElapsedColumn,
            TransferSpeedColumn,
        )

        with Progress(
            "[progress.description]{task.description}",
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeElapsedColumn(),
            transient=True,
        ) as progress:
            bar = progress.add_task(f"importing {volume}", total=total)
            while not task.done():
                await asyncio.wait([task], timeout=_POLL)
                try:
                    info = await host.get_volume(pool=pool, name=volume)
                except VirtError:
                    info = None
                if info is not None:
                    progress.update(bar, completed=info.allocation_bytes)
            return task.result()
    announced = f" of {total / _MIB:.1f} MiB" if total else ""
    print(f"importing {volume}{announced} into pool {pool}...", file=sys.stderr, flush=True)
    shown = 0
    while not task.done():
        await asyncio.wait([task], timeout=_POLL)
        if not total or task.done():
            continue
        try:
            info = await host.get_volume(pool=pool, name=volume)
        except VirtError:
            continue
        quarter = min(3, 4 * (info.allocation_bytes if info else 0) // total)
        if quarter > shown:
            shown = quarter
            print(f"  {25 * quarter}%", file=sys.stderr, flush=True)
    return task.result()
