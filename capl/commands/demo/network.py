"""The demo network: a free /24 on the host, found before anything starts.

``pick_network`` asks the libvirt host (the ``Host`` port, ``capl.virt``'s adapter) for its
domain types (the ``--domain-type`` must be one of them) and the CIDR of every network it has
(``network_cidrs``, what ``ensure_network`` checks a new network against), adds this machine's
routes when the host is this machine, and picks the first /24 that overlaps none of them
(``pick_cidr``, searching 10.213.0.0/16 first).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import struct
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Final

from capl.commands.demo.plan import is_local_uri, is_test_driver
from capl.errors import EXIT_UNREACHABLE, EXIT_USAGE, CliError

__all__ = ["local_routes", "pick_cidr", "pick_network"]

CIDR_SEARCH: Final = (ipaddress.IPv4Network("10.213.0.0/16"), ipaddress.IPv4Network("10.0.0.0/8"))
"""Where the demo looks for a free /24, in order."""


async def pick_network(uri: str, *, domain_type: str) -> str:
    """A /24 that overlaps no libvirt network on the host (and no local route). CliError
    when the host cannot be reached (exit 4) or does not offer ``domain_type`` (exit 2)."""
    from capl.ports.errors import VirtError
    from capl.virt import LibvirtHosts

    hosts = LibvirtHosts()
    try:
        host = hosts.get(uri=uri)
        try:
            info = await host.info()
            taken = [
                ipaddress.IPv4Network(cidr, strict=False) for cidr in await host.network_cidrs()
            ]
        except VirtError as exc:
            raise CliError(
                f"cannot reach the libvirt host {uri}: {exc} (on this machine: "
                "`make libvirt-host` starts libvirtd)",
                code=EXIT_UNREACHABLE,
            ) from None
    finally:
        await hosts.close()
    offered = info.domain_types or (domain_type,)
    if not is_test_driver(uri) and domain_type != "auto" and domain_type not in offered:
        raise CliError(
            f"{uri} offers domain types {', '.join(info.domain_types)}, not "
            f"{domain_type} (--domain-type)",
            code=EXIT_USAGE,
        )
    if is_local_uri(uri) and not is_test_driver(uri):
        with contextlib.suppress(OSError):
            taken += local_routes(await asyncio.to_thread(Path("/proc/net/route").read_text))
    return pick_cidr(taken)


def local_routes(proc_net_route: str) -> list[ipaddress.IPv4Network]:
    """The destinations of /proc/net/route (little-endian hex), default route excluded."""
    networks = []
    for line in proc_net_route.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 8:
            continue
        try:
            dest = ipaddress.IPv4Address(struct.pack("<I", int(fields[1], 16)))
            mask = ipaddress.IPv4Address(struct.pack("<I", int(fields[7], 16)))
        except ValueError:
            continue
        if int(mask) == 0:
            continue
        with contextlib.suppress(ValueError):
            networks.append(ipaddress.IPv4Network(f"{dest}/{mask}", strict=False))
    return networks


def pick_cidr(
    taken: Iterable[ipaddress.IPv4Network], *, search: Sequence[ipaddress.IPv4Network] = CIDR_SEARCH
) -> str:
    """The first /24 in ``search`` that overlaps none of ``taken``."""
    busy = list(taken)
    for space in search:
        for candidate in space.subnets(new_prefix=24):
            if not any(candidate.overlaps(other) for other in busy):
                return str(candidate)
    raise CliError("no free /24 for the demo network in 10.0.0.0/8: pass --network-cidr")
