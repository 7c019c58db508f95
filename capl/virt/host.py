"""``LibvirtHost``: the ``capl.ports.virt.Host`` implementation for one libvirt URI.

Every method runs its libvirt calls as one closure in the host's worker pool (see
``connection.HostConnection.run``: a connection of its own, a time limit, a fast
``HostUnreachable`` while the host is lost). Uploads and base image imports get the long
time limit. Read-modify-write sequences on one pool or network are
serialized: they run on that pool's or network's own thread, one after the other (so a busy
network never ties up worker threads that other operations need, and its queue drains
without waiting for the event loop in between), and the closure takes the per-pool or
per-network threading lock as well (shared with the base image importer). Waiting (graceful
shutdown) happens on the asyncio side with short polls, never by blocking a worker.

What does not change while connected is read once per connection (hostname, versions,
capabilities, the node's model/CPUs/memory size; ``info()`` asks only for free memory), and
each network's DHCP hosts and DNS records are kept in a ``NetworkCache`` that is only a cache
(see ``capl.virt.network_cache``: libvirt's own uniqueness checks guard every addition, removals
never trust it, a reconnect drops it).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any, TypeVar

import libvirt

from capl.ports.errors import InvalidSpec, VirtError
from capl.ports.virt import (
    BaseImage,
    ClusterOwner,
    DhcpHost,
    DhcpLease,
    DnsHost,
    DomainInfo,
    DomainNic,
    DomainOwner,
    DomainSpec,
    DomainState,
    GuestFile,
    HostHardware,
    HostId,
    HostInfo,
    ImageSource,
    InterfaceAddress,
    MachineVolumePaths,
    MachineVolumes,
    NetworkInfo,
    NetworkSpec,
    PoolInfo,
    PoolSpec,
    StopResult,
    VolumeFormat,
    VolumeInfo,
    VolumeRef,
    VolumeTail,
)
from capl.virt import agent, download, hardware, machine_volumes, network_hosts, storage
from capl.virt import domain as domains
from capl.virt import network as networks
from capl.virt.connection import HostConnection
from capl.virt.counting import forget_lookups
from capl.virt.day2 import Day2Operations
from capl.virt.errors import is_unsupported_flags
from capl.virt.images import ImageImporter
from capl.virt.pools import PoolDrivers
from capl.virt.storagexml import DomainCaps, parse_domain_caps, parse_host_caps
from capl.virt.support import LockTable

__all__ = ["LibvirtHost"]

T = TypeVar("T")

_SHUTDOWN_POLL_FIRST = 0.05
_SHUTDOWN_POLL_MAX = 1.0


def _version(number: int) -> str:
    major, rest = divmod(int(number), 1_000_000)
    minor, release = divmod(rest, 1000)
    return f"{major}.{minor}.{release}"


def _best_type(types: Sequence[str]) -> str:
    for preferred in ("kvm", "qemu"):
        if preferred in types:
            return preferred
    return types[0] if types else "qemu"


class LibvirtHost(Day2Operations):
    def __init__(self, connection: HostConnection, *, importer: ImageImporter) -> None:
        self._conn = connection
        self._importer = importer
        self._locks = LockTable()
        self._pools = PoolDrivers()
        self._networks = networks.NetworkCache()
        self._static: (
            tuple[str, str, str, str, str, tuple[str, ...], DomainCaps, tuple[Any, ...]] | None
        ) = None
        self._static_generation = -1
        self._known_info: tuple[int, HostInfo] | None = None  # the last answer of info()

    @property
    def host_id(self) -> HostId:
        return self._conn.host_id

    async def _serial(self, kind: str, name: str, action: str, fn: Callable[[Any], T]) -> T:
        """``fn`` on the serial thread of (kind, name): read-modify-write operations of one
        pool or network run one after the other, queued there and not in the shared pool
        (see ``HostConnection.run``). ``fn`` still takes the threading lock of (kind, name),
        which other paths (base image imports) share."""
        return await self._conn.run(action, fn, serial=f"{kind}:{name}")

    @property
    def connection(self) -> HostConnection:
        return self._conn

    async def close(self) -> None:
        await self._conn.close()

    # -- host -----------------------------------------------------------------------------

    async def info(self, *, free_memory: bool = True) -> HostInfo:
        known = self._known_info
        # without the free memory, a connected host answers from what it knows (a lost host
        # is asked, and refuses at once)
        if (
            not free_memory
            and known is not None
            and known[0] == self._conn.generation
            and self._conn.connected
        ):
            return known[1]

        def op(c: Any) -> HostInfo:
            generation = self._conn.generation
            if self._static is None or self._static_generation != generation:
                hostname = str(c.getHostname())
                lib = _version(c.getLibVersion())
                hypervisor = str(c.getType())
                hv_version = _version(c.getVersion())
                caps = parse_host_caps(c.getCapabilities())
                best = _best_type(caps.domain_types)
                try:
                    domcaps = parse_domain_caps(
                        c.getDomainCapabilities(None, caps.arch or None, None, best, 0)
                    )
                except libvirt.libvirtError as exc:
                    if not is_unsupported_flags(exc) and exc.get_error_code() not in (
                        libvirt.VIR_ERR_INVALID_ARG,
                        libvirt.VIR_ERR_INTERNAL_ERROR,
                    ):
                        raise
                    domcaps = DomainCaps(efi=False, loaders=())
                self._static = (
                    hostname,
                    lib,
                    hypervisor,
                    hv_version,
                    caps.arch,
                    caps.domain_types,
                    domcaps,
                    tuple(c.getInfo()),  # model, memory, CPUs: fixed while connected
                )
                self._static_generation = generation
            hostname, lib, hypervisor, hv_version, arch, types, domcaps, model_info = self._static
            free = int(c.getFreeMemory())
            info = HostInfo(
                host_id=self.host_id,
                hostname=hostname,
                arch=arch or str(model_info[0]),
                cpus=int(model_info[2]),
                memory_total_bytes=int(model_info[1]) * 1024 * 1024,
                memory_free_bytes=free,
                libvirt_version=lib,
                hypervisor=hypervisor,
                hypervisor_version=hv_version,
                domain_types=types,
                best_domain_type=_best_type(types),
                uefi_supported=domcaps.efi,
                uefi_loaders=domcaps.loaders,
            )
            self._known_info = (generation, info)
            return info

        return await self._conn.run("read host info", op)

    async def reachable(self) -> bool:
        try:
            await self._conn.run("ping", lambda c: c.getLibVersion())
        except VirtError as exc:
            return exc.reason != "HostUnreachable"
        return True

    # -- storage --------------------------------------------------------------------------

    async def ensure_pool(self, spec: PoolSpec) -> PoolInfo:
        def op(c: Any) -> PoolInfo:
            with self._locks.get("pool", spec.name):
                forget_lookups(c)  # (re)defined: handles look the pool up again
                self._importer.forget(self.host_id, spec.name)
                return storage.ensure_pool(c, spec, drivers=self._pools)

        return await self._serial("pool", spec.name, f"ensure storage pool {spec.name}", op)

    async def get_pool(self, name: str) -> PoolInfo | None:
        return await self._conn.run(
            f"read storage pool {name}", lambda c: storage.get_pool(c, name, drivers=self._pools)
        )

    async def delete_pool(self, *, name: str, owner: ClusterOwner) -> bool:
        def op(c: Any) -> bool:
            with self._locks.get("pool", name):
                forget_lookups(c)
                self._importer.forget(self.host_id, name)
                return storage.delete_pool(c, name, owner)

        return await self._serial("pool", name, f"delete storage pool {name}", op)

    async def ensure_base_image(self, *, pool: str, name: str, source: ImageSource) -> BaseImage:
        # an import copies or downloads a whole image: its calls get the long time limit
        with self._conn.long_calls():
            return await self._importer.ensure(
                self._conn, self._locks, self._pools, pool=pool, name=name, source=source
            )

    async def create_overlay(
        self, *, pool: str, name: str, backing: BaseImage, capacity_bytes: int
    ) -> VolumeInfo:
        base = backing.volume
        backing_format = base.format if base.format in ("qcow2", "raw") else None

        def op(c: Any) -> VolumeInfo:
            with self._locks.get("pool", pool):
                return storage.create_volume(
                    c,
                    pool,
                    name,
                    drivers=self._pools,
                    capacity_bytes=max(capacity_bytes, backing.virtual_size_bytes),
                    format=VolumeFormat.QCOW2,
                    backing_path=base.path,
                    backing_format=backing_format,
                )

        try:
            return await self._serial(
                "pool", pool, f"create overlay volume {name} in pool {pool}", op
            )
        except VirtError:  # the base image may be gone: check it again next time
            self._importer.forget(self.host_id, pool, base.name)
            raise

    async def create_machine_volumes(
        self, request: MachineVolumes, *, on_step: Callable[[str], None] | None = None
    ) -> MachineVolumePaths:
        pool = request.pool

        def op(c: Any) -> MachineVolumePaths:
            with self._locks.get("pool", pool):
                return machine_volumes.create_machine_volumes(
                    c, self.host_id, request, drivers=self._pools, on_step=on_step
                )

        try:
            return await self._conn.run(
                f"create the volumes of domain {request.domain_name} in pool {pool}",
                op,
                serial=f"pool:{pool}",
                time_limit=self._conn.long_call_timeout,  # it uploads the bootstrap volume
            )
        except VirtError:  # the base image may be gone: check it again next time
            self._importer.forget(self.host_id, pool, request.backing.volume.name)
            raise

    async def create_volume(
        self,
        *,
        pool: str,
        name: str,
        capacity_bytes: int,
        format: VolumeFormat = VolumeFormat.QCOW2,
    ) -> VolumeInfo:
        if capacity_bytes <= 0:
            raise InvalidSpec(f"volume {name}: capacity must be positive")

        def op(c: Any) -> VolumeInfo:
            with self._locks.get("pool", pool):
                return storage.create_volume(
                    c, pool, name, drivers=self._pools, capacity_bytes=capacity_bytes, format=format
                )

        return await self._serial("pool", pool, f"create volume {name} in pool {pool}", op)

    async def upload_volume(self, *, pool: str, name: str, data: bytes) -> VolumeInfo:
        def op(c: Any) -> VolumeInfo:
            with self._locks.get("pool", pool):
                return storage.upload_bytes(c, pool, name, data, drivers=self._pools)

        return await self._conn.run(
            f"upload volume {name} to pool {pool}",
            op,
            serial=f"pool:{pool}",
            time_limit=self._conn.long_call_timeout,
        )

    async def get_volume(self, *, pool: str, name: str) -> VolumeInfo | None:
        return await self._conn.run(
            f"read volume {name} in pool {pool}", lambda c: storage.get_volume(c, pool, name)
        )

    async def list_volumes(
        self, *, pool: str, prefix: str = "", refresh: bool = False
    ) -> list[VolumeRef]:
        def op(c: Any) -> list[VolumeRef]:
            if not refresh:
                return storage.list_volumes(c, pool, prefix, False)
            with self._locks.get("pool", pool):
                return storage.list_volumes(c, pool, prefix, True)

        return await self._conn.run(f"list volumes of pool {pool}", op)

    async def read_volume_tail(self, *, pool: str, name: str, limit: int) -> VolumeTail | None:
        def op(c: Any) -> VolumeTail | None:
            with self._locks.get("pool", pool):  # a rescan may be needed to see the file
                return download.read_tail(c, pool, name, limit)

        return await self._conn.run(f"read the end of volume {name} in pool {pool}", op)

    async def delete_volume(self, *, pool: str, name: str) -> bool:
        def op(c: Any) -> bool:
            with self._locks.get("pool", pool):
                self._importer.forget(self.host_id, pool, name)
                return storage.delete_volume(c, pool, name)

        return await self._serial("pool", pool, f"delete volume {name} in pool {pool}", op)

    # -- networks -------------------------------------------------------------------------

    @property
    def network_cache(self) -> networks.NetworkCache:
        """The DHCP/DNS entry cache of this host's networks (see capl.virt.network_cache)."""
        return self._networks

    async def ensure_network(self, spec: NetworkSpec, *, adopt: bool = False) -> NetworkInfo:
        def op(c: Any) -> NetworkInfo:
            with self._locks.get("network", spec.name):
                self._networks.drop(spec.name)
                forget_lookups(c)
                return networks.ensure_network(c, spec, adopt=adopt)

        return await self._serial("network", spec.name, f"ensure network {spec.name}", op)

    async def get_network(self, name: str) -> NetworkInfo | None:
        return await self._conn.run(f"read network {name}", lambda c: networks.get_network(c, name))

    async def network_cidrs(self) -> list[str]:
        return await self._conn.run("list networks", networks.network_cidrs)

    async def delete_network(self, *, name: str, owner: ClusterOwner) -> bool:
        def op(c: Any) -> bool:
            with self._locks.get("network", name):
                self._networks.drop(name)
                forget_lookups(c)
                return networks.delete_network(c, name, owner)

        return await self._serial("network", name, f"delete network {name}", op)

    async def ensure_dhcp_host(
        self,
        *,
        network: str,
        mac: str,
        name: str | None = None,
        ip: str | None = None,
        exclude: Collection[str] = (),
        dns_hostnames: Sequence[str] = (),
    ) -> DhcpHost:
        dns_names = tuple(dns_hostnames)

        def op(c: Any) -> DhcpHost:
            with self._locks.get("network", network):
                return network_hosts.ensure_dhcp_host(
                    c,
                    network,
                    mac=mac,
                    host_name=name,
                    ip=ip,
                    exclude=exclude,  # a live view (the port): not copied
                    dns_hostnames=dns_names,
                    cache=self._networks,
                    generation=self._conn.generation,
                )

        return await self._serial(
            "network", network, f"reserve DHCP address for {mac} in network {network}", op
        )

    async def remove_dhcp_host(self, *, network: str, mac: str) -> bool:
        def op(c: Any) -> bool:
            with self._locks.get("network", network):
                return network_hosts.remove_dhcp_host(
                    c, network, mac, cache=self._networks, generation=self._conn.generation
                )

        return await self._serial(
            "network", network, f"remove DHCP host {mac} from network {network}", op
        )

    async def add_dns_hostnames(
        self, *, network: str, ip: str, hostnames: Sequence[str]
    ) -> DnsHost:
        names = tuple(hostnames)

        def op(c: Any) -> DnsHost:
            with self._locks.get("network", network):
                return network_hosts.add_dns_hostnames(
                    c, network, ip, names, cache=self._networks, generation=self._conn.generation
                )

        return await self._serial("network", network, f"add DNS host {ip} to network {network}", op)

    async def remove_dns_hostnames(
        self, *, network: str, ip: str, hostnames: Sequence[str] | None = None
    ) -> bool:
        names = tuple(hostnames) if hostnames is not None else None

        def op(c: Any) -> bool:
            with self._locks.get("network", network):
                return network_hosts.remove_dns_hostnames(
                    c, network, ip, names, cache=self._networks, generation=self._conn.generation
                )

        return await self._serial(
            "network", network, f"remove DNS host {ip} from network {network}", op
        )

    async def dhcp_leases(self, *, network: str) -> list[DhcpLease]:
        return await self._conn.run(
            f"read DHCP leases of network {network}", lambda c: networks.dhcp_leases(c, network)
        )

    async def find_free_ip(self, *, network: str, exclude: Collection[str] = ()) -> str:
        excluded = frozenset(exclude)

        def op(c: Any) -> str:
            with self._locks.get("network", network):
                return network_hosts.find_free_ip(
                    c, network, excluded, cache=self._networks, generation=self._conn.generation
                )

        return await self._serial(
            "network", network, f"find a free address in network {network}", op
        )

    # -- domains --------------------------------------------------------------------------

    async def define_domain(self, spec: DomainSpec, *, absent: bool = False) -> DomainInfo:
        if not spec.hardware.pci and not spec.hardware.mdevs:
            return await self._conn.run(
                f"define domain {spec.name}",
                lambda c: domains.define(c, self.host_id, spec, absent=absent),
            )

        def op(c: Any) -> DomainInfo:
            # choosing free devices and defining in one serial section per host: two
            # machines never get one device
            resolved = hardware.resolve(hardware.read(c, skip_uuid=spec.uuid), spec)
            return domains.define(c, self.host_id, resolved, absent=absent)

        return await self._serial("devices", "host", f"define domain {spec.name}", op)

    async def create_domain(
        self,
        spec: DomainSpec,
        *,
        absent: bool = False,
        on_defined: Callable[[], None] | None = None,
    ) -> tuple[DomainInfo, list[InterfaceAddress]]:
        if not spec.hardware.pci and not spec.hardware.mdevs:
            return await self._conn.run(
                f"define and start domain {spec.name}",
                lambda c: domains.define_and_start(
                    c, self.host_id, spec, absent=absent, on_defined=on_defined
                ),
            )

        def op(c: Any) -> tuple[DomainInfo, list[InterfaceAddress]]:
            # as define_domain: devices chosen and the domain defined in one serial section
            resolved = hardware.resolve(hardware.read(c, skip_uuid=spec.uuid), spec)
            return domains.define_and_start(
                c, self.host_id, resolved, absent=absent, on_defined=on_defined
            )

        return await self._serial("devices", "host", f"define and start domain {spec.name}", op)

    async def hardware(self) -> HostHardware:
        return await self._conn.run("read the host's hardware", lambda c: hardware.read(c))

    async def get_domain(self, uuid: str) -> DomainInfo | None:
        return await self._conn.run(
            f"read domain {uuid}", lambda c: domains.get(c, self.host_id, uuid)
        )

    async def find_domain(self, name: str) -> DomainInfo | None:
        return await self._conn.run(
            f"look up domain {name}", lambda c: domains.get_by_name(c, self.host_id, name)
        )

    async def start_domain(
        self, uuid: str, *, owner: DomainOwner, defined: DomainInfo | None = None
    ) -> DomainInfo:
        return await self._conn.run(
            f"start domain {uuid}",
            lambda c: domains.start(c, self.host_id, uuid, owner, defined=defined),
        )

    async def request_shutdown(self, uuid: str, *, owner: DomainOwner) -> None:
        await self._conn.run(
            f"shut down domain {uuid}", lambda c: domains.request_shutdown(c, uuid, owner)
        )

    async def stop_domain(
        self, uuid: str, *, owner: DomainOwner, grace_period: float
    ) -> StopResult:
        requested = await self._conn.run(
            f"shut down domain {uuid}", lambda c: domains.request_shutdown(c, uuid, owner)
        )
        if not requested:
            return StopResult.ALREADY_STOPPED
        deadline = time.monotonic() + max(0.0, grace_period)
        delay = _SHUTDOWN_POLL_FIRST
        while True:
            current = await self._conn.run(
                f"read state of domain {uuid}", lambda c: domains.state(c, uuid)
            )
            if current in (None, DomainState.SHUTOFF):
                return StopResult.SHUTDOWN
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            await asyncio.sleep(min(delay, remaining))
            delay = min(delay * 2, _SHUTDOWN_POLL_MAX)
        destroyed = await self.destroy_domain(uuid, owner=owner)
        return StopResult.DESTROYED if destroyed else StopResult.SHUTDOWN

    async def destroy_domain(self, uuid: str, *, owner: DomainOwner) -> bool:
        return await self._conn.run(
            f"destroy domain {uuid}", lambda c: domains.destroy(c, uuid, owner)
        )

    async def undefine_domain(self, uuid: str, *, owner: DomainOwner) -> bool:
        return await self._conn.run(
            f"undefine domain {uuid}", lambda c: domains.undefine(c, uuid, owner)
        )

    async def retag_domain(self, uuid: str, *, owner: DomainOwner) -> DomainInfo:
        return await self._conn.run(
            f"retag domain {uuid}", lambda c: domains.retag(c, self.host_id, uuid, owner)
        )

    async def list_domains(
        self, *, cluster: str | None = None, skip_uuids: Collection[str] = ()
    ) -> list[DomainInfo]:
        return await self._conn.run(
            "list domains", lambda c: domains.list_owned(c, self.host_id, cluster, skip_uuids)
        )

    async def domain_addresses(self, uuid: str) -> list[InterfaceAddress]:
        return await self._conn.run(
            f"read addresses of domain {uuid}", lambda c: domains.domain_addresses(c, uuid)
        )

    async def domain_nics(self, uuid: str) -> list[DomainNic]:
        return await self._conn.run(
            f"read interfaces of domain {uuid}", lambda c: domains.nics(c, uuid)
        )

    async def read_guest_file(self, uuid: str, path: str, *, limit: int = 4096) -> GuestFile:
        if self._conn.plan.driver == "test":  # no agent: the answer needs no worker thread
            return agent.NO_AGENT
        return await self._conn.run(
            f"read a file in domain {uuid} through the guest agent",
            lambda c: agent.read_file(c, uuid, path, limit),
        )
