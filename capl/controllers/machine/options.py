"""The timings of the LibvirtMachine controller, and the name it logs under."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from capl.controllers.machine.bootstrap import BootstrapOptions

__all__ = ["LOGGER", "MachineOptions"]

LOGGER: Final = "capl.controllers.libvirtmachine"
"""Every module of the package logs under this name (the one operators filter on)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MachineOptions:
    """Timings of the machine controller (seconds)."""

    shutdown_timeout: float = 60.0
    """Graceful ACPI shutdown on delete, counted from metadata.deletionTimestamp; then destroy."""
    shutdown_poll: float = 2.0
    address_poll: float = 1.0
    """Requeue interval while the domain runs without an address."""
    address_timeout: float = 600.0
    """After this long without an address the condition says so and polling slows down."""
    address_slow_poll: float = 30.0
    node_poll: float = 20.0
    """Requeue interval while the workload Node has no providerID (kubeconfig Secret known)."""
    retry_first: float = 2.0
    retry_max: float = 120.0
    """Backoff of transient failures (host unreachable, pool busy/full, download failed)."""
    terminal_retry: float = 600.0
    """Requeue after a failure retrying cannot fix (checksum mismatch, foreign domain...)."""
    settled_ttl: float = 600.0
    """A settled machine (Ready, nothing happened) is re-checked against libvirt at most
    this often when it is reconciled without a change (resync)."""
    api_retry_max: float = 10.0
    """Cap of the retry delay while the API server does not answer (connection errors,
    429, 5xx): the reconcile is retried every few seconds, logged in one line."""
    orphan_sweep_interval: float = 60.0
    """How often the hosts are swept for domains of LibvirtMachines that no longer exist
    (0: never). The first sweep runs once the caches synced."""
    orphan_grace: float = 30.0
    """A domain is removed by the sweep only once it was reported orphaned by two consecutive
    sweeps and first seen at least this long ago."""
    bootstrap: BootstrapOptions = field(default_factory=BootstrapOptions)
    """The BootstrapSucceeded condition (capl.controllers.machine.bootstrap)."""

    def backoff(self, failures: int, *, cap: float | None = None) -> float:
        """The delay after `failures` failures in a row: `retry_first` doubling, capped."""
        limit = self.retry_max if cap is None else cap
        return min(limit, self.retry_first * float(2**failures))
