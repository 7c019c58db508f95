"""The host and the registry: the ``Host`` port (info plus the storage, network and domain
parts) and the process-wide ``Hosts``."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from capl.ports.virt.day2 import HostDay2
from capl.ports.virt.domains import HostDomains
from capl.ports.virt.events import Subscription, VirtEvent, VirtEventListener
from capl.ports.virt.hardware import HostHardwarePart
from capl.ports.virt.identity import HostId
from capl.ports.virt.networks import HostNetworks
from capl.ports.virt.storage import HostStorage

__all__ = ["Host", "HostInfo", "HostOptions", "Hosts"]


@dataclass(frozen=True, slots=True, kw_only=True)
class HostOptions:
    """Per-host connection choices that are not secrets.

    - ``allow_insecure_tcp``: permit ``qemu+tcp://`` (unauthenticated, effectively root on
      the host). Refused by default.
    - ``insecure_skip_host_key_verification``: for ``qemu+ssh``/``qemu+libssh*`` without a
      ``known_hosts`` key in the credentials Secret. Refused by default.
    """

    allow_insecure_tcp: bool = False
    insecure_skip_host_key_verification: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class HostInfo:
    host_id: HostId
    hostname: str
    arch: str
    cpus: int
    memory_total_bytes: int
    memory_free_bytes: int
    libvirt_version: str
    """The daemon's libvirt version, "9.0.0"."""
    hypervisor: str
    """The driver type: "QEMU", "TEST", ..."""
    hypervisor_version: str
    domain_types: tuple[str, ...]
    """Domain types the host's capabilities offer for ``arch`` (e.g. ("qemu", "kvm"))."""
    best_domain_type: str
    """"kvm" when offered, else "qemu" (else the first offered type)."""
    uefi_supported: bool
    uefi_loaders: tuple[str, ...]
    """Firmware paths the domain capabilities list (empty when not reported)."""


class Host(HostStorage, HostNetworks, HostDomains, HostHardwarePart, HostDay2, Protocol):
    """One KVM host. Coroutine methods; typed errors; not-found on delete is success."""

    @property
    def host_id(self) -> HostId: ...

    # -- host --
    async def info(self, *, free_memory: bool = True) -> HostInfo:
        """Connects if needed; raises HostUnreachable when the host cannot be reached.
        ``free_memory=False``: the caller does not weigh the free memory, which may then be
        the last value read (a connected host answers from what it knows, without a call)."""
        ...

    async def reachable(self) -> bool: ...


class Hosts(Protocol):
    """The process-wide registry of hosts and the event fan-out."""

    def get(
        self,
        *,
        uri: str,
        credentials: Mapping[str, bytes] | None = None,
        options: HostOptions | None = None,
    ) -> Host:
        """The Host for ``uri``; no I/O. Invalid URI/credentials raise CredentialsError.
        Changed credentials or options replace the host's connection."""
        ...

    def host_id(self, uri: str) -> HostId: ...

    def subscribe(
        self, listener: VirtEventListener, *, wants: Callable[[VirtEvent], bool] | None = None
    ) -> Subscription:
        """Deliver domain lifecycle and host connection events of every host to
        ``listener``, called on the event loop that was running when subscribing. ``wants``
        (pure and quick: it runs on the thread that publishes, libvirt's event thread)
        refuses events before they are handed to the loop."""
        ...

    async def forget(self, uri: str) -> None:
        """Close the host's connection and remove its credential files."""
        ...

    async def close(self) -> None: ...
