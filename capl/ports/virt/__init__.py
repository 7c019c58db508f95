"""The infrastructure port: what the controllers ask of a KVM host.

The machine and cluster controllers program against the Protocols and frozen value types in
this package; ``capl.virt`` implements them on libvirt, tests may implement them with fakes.
Nothing here imports libvirt. Everything is importable from ``capl.ports.virt``; each module
holds one object kind, its values and its part of the ``Host`` Protocol together:

- ``identity``: ``HostId``, the owners (``ClusterOwner``, ``DomainOwner``), the XML namespace;
- ``storage``: pools, volumes, base images (``HostStorage``);
- ``networks``: networks, DHCP reservations, DNS records, leases (``HostNetworks``);
- ``day2``: changes of a defined domain without replacing it (``HostDay2``);
- ``domains``: the domain spec and what is read back: state, NICs, addresses, guest files
  (``HostDomains``);
- ``events``: domain lifecycle and host connection events, ``Subscription``;
- ``hosts``: ``HostOptions``, ``HostInfo``, ``Host`` (info + the three parts) and ``Hosts``;
- ``migration``: live migration between two hosts (``Migrations``, its options, progress,
  results and errors).

Shape of the API
----------------
``Hosts`` is the process-wide registry: ``hosts.get(uri=..., credentials=...)`` returns a
``Host`` without I/O (the connection opens lazily on the first call, in a thread, and is
shared by every caller of that URI). A ``Host`` offers idempotent, level-friendly operations
grouped by object kind: host info, storage pools and volumes, networks (plus DHCP/DNS
entries), and domains. Every ``Host`` method is a coroutine; blocking libvirt calls run in a
bounded per-host thread pool. Errors are the typed hierarchy of ``capl.ports.errors``.

Ownership (how capl recognises what it created)
-----------------------------------------------
- Domains carry a ``<capl:machine>`` element in their libvirt ``<metadata>`` (namespace
  ``https://capl.dev/xmlns/v1alpha1``) with cluster, machine namespace/name/UID and owner
  kind. Every destructive domain call takes the expected ``DomainOwner`` and raises
  ``ForeignDomainError`` (touching nothing) unless the tag matches, UID included.
- Networks carry a ``<capl:network>`` element in the network ``<metadata>`` (kept by libvirt
  9.0's network XML) naming the owning cluster (namespace/name; the UID is recorded but not
  compared, so ownership survives ``clusterctl move``).
- Storage pool XML has no metadata. A pool capl created holds a zero-byte marker volume
  ``.capl-owner.<namespace>.<name>`` (see ``capl.ports.naming.pool_owner_marker``).
- Volumes cannot carry metadata: their names are deterministic, derived from the machine
  (``capl.ports.naming.MachineNames``) and start with ``capl-``; a name is the ownership.

  The marker is written right after the pool starts; a crash in between leaves an empty pool
  that later reconciles adopt instead of owning (it is never deleted by capl then).
- Domains moved by ``clusterctl move`` get new machine UIDs: ``retag_domain`` rewrites the tag
  when cluster/namespace/name match.

Events
------
``Hosts.subscribe(listener)`` delivers ``DomainEvent`` (lifecycle: defined, started, stopped,
...) and ``HostEvent`` (connected / disconnected) for every host, on the asyncio loop that
subscribed. They are triggers to requeue keys; state is always read again.

Idempotency contract
--------------------
``ensure_*`` converges (create what is missing, adopt/keep what exists); ``delete_*``,
``remove_*`` treat not-found as success and return whether something was removed;
``get_*`` return ``None`` for not-found.
"""

from __future__ import annotations

from capl.ports.virt.day2 import Applied, DomainDisk, DomainResources, HostDay2
from capl.ports.virt.domains import (
    AddressSource,
    DiskBus,
    DiskDevice,
    DiskSpec,
    DomainInfo,
    DomainNic,
    DomainSpec,
    DomainState,
    Firmware,
    FwCfgEntry,
    GuestFile,
    GuestFileState,
    HostDomains,
    InterfaceAddress,
    MachineVolumePaths,
    MachineVolumes,
    NicSpec,
    StopResult,
)
from capl.ports.virt.events import (
    DomainEvent,
    DomainEventKind,
    HostEvent,
    HostEventKind,
    Subscription,
    VirtEvent,
    VirtEventListener,
)
from capl.ports.virt.hardware import (
    CpuSpec,
    DomainHardware,
    HostCell,
    HostHardware,
    HostHardwarePart,
    HostMdev,
    HostPci,
    MdevSelector,
    NumaCellSpec,
    PciSelector,
    XmlPatchSpec,
)
from capl.ports.virt.hosts import (
    Host,
    HostInfo,
    HostOptions,
    Hosts,
)
from capl.ports.virt.identity import (
    CAPL_XML_NAMESPACE,
    CAPL_XML_PREFIX,
    ClusterOwner,
    DomainOwner,
    HostId,
)
from capl.ports.virt.migration import (
    AbortReason,
    DomainLocation,
    MigrationAborted,
    MigrationFailed,
    MigrationOptions,
    MigrationPhase,
    MigrationProgress,
    MigrationRequest,
    MigrationResult,
    Migrations,
    MigrationStorage,
    PreparedMigration,
    Whereabouts,
)
from capl.ports.virt.networks import (
    DhcpHost,
    DhcpLease,
    DnsHost,
    HostNetworks,
    NetworkInfo,
    NetworkMode,
    NetworkSpec,
)
from capl.ports.virt.storage import (
    DIR_POOL,
    BaseImage,
    HostStorage,
    ImageFromPath,
    ImageFromURL,
    ImageFromVolume,
    ImageSource,
    PoolInfo,
    PoolSpec,
    VolumeFormat,
    VolumeInfo,
    VolumeRef,
    VolumeTail,
)

__all__ = [
    "CAPL_XML_NAMESPACE",
    "CAPL_XML_PREFIX",
    "DIR_POOL",
    "AbortReason",
    "AddressSource",
    "Applied",
    "BaseImage",
    "ClusterOwner",
    "CpuSpec",
    "DhcpHost",
    "DhcpLease",
    "DiskBus",
    "DiskDevice",
    "DiskSpec",
    "DnsHost",
    "DomainDisk",
    "DomainEvent",
    "DomainEventKind",
    "DomainHardware",
    "DomainInfo",
    "DomainLocation",
    "DomainNic",
    "DomainOwner",
    "DomainResources",
    "DomainSpec",
    "DomainState",
    "Firmware",
    "FwCfgEntry",
    "GuestFile",
    "GuestFileState",
    "Host",
    "HostCell",
    "HostDay2",
    "HostDomains",
    "HostEvent",
    "HostEventKind",
    "HostHardware",
    "HostHardwarePart",
    "HostId",
    "HostInfo",
    "HostMdev",
    "HostNetworks",
    "HostOptions",
    "HostPci",
    "HostStorage",
    "Hosts",
    "ImageFromPath",
    "ImageFromURL",
    "ImageFromVolume",
    "ImageSource",
    "InterfaceAddress",
    "MachineVolumePaths",
    "MachineVolumes",
    "MdevSelector",
    "MigrationAborted",
    "MigrationFailed",
    "MigrationOptions",
    "MigrationPhase",
    "MigrationProgress",
    "MigrationRequest",
    "MigrationResult",
    "MigrationStorage",
    "Migrations",
    "NetworkInfo",
    "NetworkMode",
    "NetworkSpec",
    "NicSpec",
    "NumaCellSpec",
    "PciSelector",
    "PoolInfo",
    "PoolSpec",
    "PreparedMigration",
    "StopResult",
    "Subscription",
    "VirtEvent",
    "VirtEventListener",
    "VolumeFormat",
    "VolumeInfo",
    "VolumeRef",
    "VolumeTail",
    "Whereabouts",
    "XmlPatchSpec",
]
