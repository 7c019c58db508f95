"""LibvirtMachineMigration: a request to live-migrate one LibvirtMachine to another host.

Design notes (after KubeVirt's VirtualMachineInstanceMigration):

- One object is one attempt. The spec is immutable; a finished migration (Succeeded or
  Failed) is never retried: create another. Deleting an unfinished one aborts it (the
  finalizer stays until the domain runs in exactly one place, on the source after an abort).
- `targetHost` empty: capl picks a host of the machine's cluster that is reachable, not in
  maintenance and, for a control-plane machine, runs no other control-plane machine of the
  same cluster.
- The progress of the job is in `status` (phase, data remaining, downtime); the machine's
  `Migrating` condition and Events tell the same story on the LibvirtMachine.
- What must survive a crash of the manager is written before the step it protects: the
  chosen target (status) and the machine's `spec.migrationTarget` before anything is done on
  the destination; the machine's `spec.hostName` after libvirt moved the domain.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from capl.api.base import DNSLabel, DNSSubdomain, K8sModel, Time, cel, map_list, schema_extra
from capl.api.constants import API_VERSION, Kind
from capl.api.meta import Condition, ObjectMeta

MigrationPhase = Literal[
    "Pending", "Scheduling", "PreparingTarget", "Running", "Finalizing", "Succeeded", "Failed"
]
TERMINAL_PHASES: frozenset[str] = frozenset({"Succeeded", "Failed"})


class LibvirtMachineMigrationSpec(K8sModel):
    """Which machine to move, where to, and how the job may run."""

    machine_name: DNSSubdomain
    """The LibvirtMachine (same namespace) to migrate."""
    target_host: DNSLabel | None = None
    """A host of the machine's LibvirtCluster (spec.hosts[].name), other than its current
    one. Empty: capl chooses."""
    bandwidth_mib_per_second: int | None = Field(
        default=None, ge=1, le=1048576, alias="bandwidthMiBPerSecond"
    )
    """Cap on the transfer rate (memory and disk copy). Default: unlimited."""
    completion_timeout_per_gib: int = Field(
        default=150, ge=1, le=86400, alias="completionTimeoutPerGiB"
    )
    """Seconds allowed per GiB of data to move (memory plus copied disks); past it the job is
    aborted and the machine keeps running on its host."""
    progress_timeout_seconds: int = Field(default=150, ge=1, le=86400)
    """Seconds without a new low of the data remaining before the job is aborted."""
    allow_auto_converge: bool = False
    """Let QEMU throttle the guest's vCPUs when memory is dirtied faster than it is sent."""
    allow_post_copy: bool = False
    """Switch to post-copy at the completion timeout instead of aborting. The guest is lost if
    the destination dies during post-copy: off unless asked for."""


class MigrationState(K8sModel):
    """The live numbers of the job, as libvirt reports them."""

    data_total_bytes: int | None = Field(default=None, ge=0)
    """Bytes to move (memory plus copied disks)."""
    data_remaining_bytes: int | None = Field(default=None, ge=0)
    """Bytes left to move, at the last sample."""
    data_processed_bytes: int | None = Field(default=None, ge=0)
    """Bytes moved so far."""
    downtime_ms: int | None = Field(default=None, ge=0)
    """Time the guest was paused for the switch-over (after success)."""


class LibvirtMachineMigrationStatus(K8sModel):
    """Observed state of a LibvirtMachineMigration."""

    phase: MigrationPhase | None = None
    """Pending (not looked at yet), Scheduling (choosing a target), PreparingTarget (volumes,
    files, DHCP and DNS on the destination), Running (libvirt moves the domain), Finalizing
    (the domain runs on the target: records and the source are being cleaned up), Succeeded,
    Failed (the machine runs on its source; the message says why)."""
    source_host: DNSLabel | None = None
    """The host the machine ran on when the migration started."""
    target_host: DNSLabel | None = None
    """The destination, once chosen."""
    copy_storage: bool | None = None
    """Whether disks are copied (the cluster's pools are not shared between the two hosts)."""
    start_time: Time | None = None
    """When the libvirt job started."""
    completion_time: Time | None = None
    """When the migration reached Succeeded or Failed."""
    cleanup_pending: Literal["Source", "Target"] | None = None
    """A host could not be cleaned when the migration ended (unreachable): the source after
    success, the target after a failure. capl retries until it is clean, then clears this;
    the finalizer stays until then."""
    abort_requested: bool | None = None
    """The migration was deleted (or its machine) while it ran; it is being aborted."""
    state: MigrationState | None = None
    """Progress of the libvirt job."""
    message: str | None = Field(default=None, max_length=2048)
    """What is happening, or why it failed."""
    observed_generation: int | None = Field(default=None, ge=0)
    """The metadata.generation last reconciled."""
    conditions: list[Condition] | None = Field(
        default=None, max_length=16, json_schema_extra=map_list("type")
    )
    """Succeeded (True once the machine runs on the target; False with the reason while it
    runs or after it failed)."""


class LibvirtMachineMigration(K8sModel):
    """A live migration of one LibvirtMachine to another KVM host of its cluster."""

    KIND: ClassVar[str] = Kind.LIBVIRT_MACHINE_MIGRATION

    api_version: Literal["infrastructure.cluster.x-k8s.io/v1alpha1"] = API_VERSION
    kind: Literal["LibvirtMachineMigration"] = "LibvirtMachineMigration"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: LibvirtMachineMigrationSpec = Field(
        json_schema_extra=schema_extra(
            rules=[
                cel(
                    "self == oldSelf",
                    "spec is immutable: delete the migration (which aborts it) and create another",
                    reason="FieldValueForbidden",
                )
            ]
        )
    )
    status: LibvirtMachineMigrationStatus = Field(default_factory=LibvirtMachineMigrationStatus)

    @property
    def finished(self) -> bool:
        return self.status.phase in TERMINAL_PHASES


class LibvirtMachineMigrationList(K8sModel):
    api_version: str = API_VERSION
    kind: Literal["LibvirtMachineMigrationList"] = "LibvirtMachineMigrationList"
    items: list[LibvirtMachineMigration] = Field(default_factory=list)
