"""What of a demo cluster is still on its host, and its removal through the libvirt port.

After capl's own clean-up the demo looks at the host (``find_leftovers``) and force-removes
whatever of *this* demo cluster is still there (``force_clean``): only objects carrying
capl's ownership tags for it (domain metadata, network tag, pool marker), through the same
ownership-checked operations capl uses, and says so.

A demo that was killed (SIGKILL, OOM) cannot clean up: its child processes die with it
(PR_SET_PDEATHSIG), and the next ``capl demo`` finds its work directory
(``capl.commands.demo.workdirs``), removes its libvirt objects by the same path
(``sweep_stale``) and deletes the directory.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from capl.commands.demo.plan import is_test_driver
from capl.commands.demo.workdirs import other_demos

if TYPE_CHECKING:
    from capl.commands.demo.ui import Ui
    from capl.virt import LibvirtHost


__all__ = ["Leftovers", "find_leftovers", "force_clean", "sweep_stale"]


@dataclass(slots=True)
class Leftovers:
    """What of a demo cluster is still on its host."""

    domains: list[str] = field(default_factory=list)
    volumes: list[str] = field(default_factory=list)
    network: str | None = None
    pool: str | None = None

    @property
    def empty(self) -> bool:
        return not (self.domains or self.volumes or self.network or self.pool)

    def describe(self) -> str:
        parts = [f"domain {d}" for d in self.domains]
        parts += [f"{len(self.volumes)} volume(s)"] if self.volumes else []
        parts += [f"network {self.network}"] if self.network else []
        parts += [f"pool {self.pool}"] if self.pool else []
        return ", ".join(parts) or "nothing"


async def find_leftovers(
    host: LibvirtHost, *, namespace: str, cluster: str, network: str, pool: str
) -> Leftovers:
    found = Leftovers()
    for domain in await host.list_domains(cluster=cluster):
        if domain.owner is not None and domain.owner.namespace == namespace:
            found.domains.append(domain.name)
    info = await host.get_network(network)
    if info is not None and info.owner is not None and info.owner.name == cluster:
        found.network = network
    pool_info = await host.get_pool(pool)
    if pool_info is not None:
        found.pool = pool
        found.volumes = [v.name for v in await host.list_volumes(pool=pool, refresh=True)]
    return found


async def force_clean(
    host: LibvirtHost, *, namespace: str, cluster: str, network: str, pool: str
) -> Leftovers:
    """Remove what of the demo cluster is left, through ownership-checked operations only;
    returns what could not be removed."""
    from capl.ports.virt import ClusterOwner

    owner = ClusterOwner(namespace=namespace, name=cluster)
    for domain in await host.list_domains(cluster=cluster):
        if domain.owner is not None and domain.owner.namespace == namespace:
            await host.undefine_domain(domain.uuid, owner=domain.owner)
    await host.delete_pool(name=pool, owner=owner)
    await host.delete_network(name=network, owner=owner)
    return await find_leftovers(
        host, namespace=namespace, cluster=cluster, network=network, pool=pool
    )


async def sweep_stale(ui: Ui) -> None:
    """Remove what demos that were killed left behind (their work directory and, on a real
    libvirt host, their tagged domains, volumes, network and pool)."""
    from capl.virt import LibvirtHosts

    for workdir, state, alive in other_demos():
        if alive:
            continue
        uri = str(state.get("uri") or "")
        names = [state.get(k) for k in ("namespace", "cluster", "network", "pool")]
        if uri and not is_test_driver(uri) and all(isinstance(n, str) and n for n in names):
            namespace, cluster, network, pool = (str(n) for n in names)
            hosts = LibvirtHosts()
            try:
                left = await force_clean(
                    hosts.get(uri=uri),
                    namespace=namespace,
                    cluster=cluster,
                    network=network,
                    pool=pool,
                )
            except Exception as exc:
                ui.warn(
                    f"could not remove what an earlier, killed demo ({workdir}) left on {uri}: "
                    f"{exc} (the next `capl demo` tries again)"
                )
                continue
            finally:
                await hosts.close()
            if not left.empty:
                ui.warn(f"an earlier demo left on {uri}: {left.describe()} (not removable)")
                continue
            ui.say(f"removed what an earlier, killed demo left on {uri} (cluster {cluster})")
        shutil.rmtree(workdir, ignore_errors=True)
