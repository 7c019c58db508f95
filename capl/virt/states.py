"""Names for libvirt's numeric domain states, state reasons and event details.

Built from the binding's own constants (``VIR_DOMAIN_RUNNING_BOOTED`` -> "booted"), so a
newer binding's additions are named without a code change.
"""

from __future__ import annotations

import libvirt

from capl.ports.virt import DomainEventKind, DomainState

__all__ = [
    "close_reason_name",
    "event_detail_name",
    "event_kind",
    "state_of",
    "state_reason_name",
]

_STATES = {
    libvirt.VIR_DOMAIN_NOSTATE: DomainState.NOSTATE,
    libvirt.VIR_DOMAIN_RUNNING: DomainState.RUNNING,
    libvirt.VIR_DOMAIN_BLOCKED: DomainState.BLOCKED,
    libvirt.VIR_DOMAIN_PAUSED: DomainState.PAUSED,
    libvirt.VIR_DOMAIN_SHUTDOWN: DomainState.SHUTDOWN,
    libvirt.VIR_DOMAIN_SHUTOFF: DomainState.SHUTOFF,
    libvirt.VIR_DOMAIN_CRASHED: DomainState.CRASHED,
    libvirt.VIR_DOMAIN_PMSUSPENDED: DomainState.PMSUSPENDED,
}

_STATE_PREFIXES = {
    DomainState.NOSTATE: "VIR_DOMAIN_NOSTATE_",
    DomainState.RUNNING: "VIR_DOMAIN_RUNNING_",
    DomainState.BLOCKED: "VIR_DOMAIN_BLOCKED_",
    DomainState.PAUSED: "VIR_DOMAIN_PAUSED_",
    DomainState.SHUTDOWN: "VIR_DOMAIN_SHUTDOWN_",
    DomainState.SHUTOFF: "VIR_DOMAIN_SHUTOFF_",
    DomainState.CRASHED: "VIR_DOMAIN_CRASHED_",
    DomainState.PMSUSPENDED: "VIR_DOMAIN_PMSUSPENDED_",
}

_EVENT_PREFIXES = {
    libvirt.VIR_DOMAIN_EVENT_DEFINED: "VIR_DOMAIN_EVENT_DEFINED_",
    libvirt.VIR_DOMAIN_EVENT_UNDEFINED: "VIR_DOMAIN_EVENT_UNDEFINED_",
    libvirt.VIR_DOMAIN_EVENT_STARTED: "VIR_DOMAIN_EVENT_STARTED_",
    libvirt.VIR_DOMAIN_EVENT_SUSPENDED: "VIR_DOMAIN_EVENT_SUSPENDED_",
    libvirt.VIR_DOMAIN_EVENT_RESUMED: "VIR_DOMAIN_EVENT_RESUMED_",
    libvirt.VIR_DOMAIN_EVENT_STOPPED: "VIR_DOMAIN_EVENT_STOPPED_",
    libvirt.VIR_DOMAIN_EVENT_SHUTDOWN: "VIR_DOMAIN_EVENT_SHUTDOWN_",
    libvirt.VIR_DOMAIN_EVENT_PMSUSPENDED: "VIR_DOMAIN_EVENT_PMSUSPENDED_",
    libvirt.VIR_DOMAIN_EVENT_CRASHED: "VIR_DOMAIN_EVENT_CRASHED_",
}


def _table(prefix: str) -> dict[int, str]:
    table: dict[int, str] = {}
    for attr in dir(libvirt):
        if attr.startswith(prefix) and not attr.endswith("_LAST"):
            value = getattr(libvirt, attr)
            if isinstance(value, int) and value not in table:
                table[value] = attr[len(prefix) :].lower().replace("_", "-")
    return table


_REASONS = {state: _table(prefix) for state, prefix in _STATE_PREFIXES.items()}
_DETAILS = {event: _table(prefix) for event, prefix in _EVENT_PREFIXES.items()}


def state_of(code: int) -> DomainState:
    return _STATES.get(code, DomainState.UNKNOWN)


def state_reason_name(state: DomainState, reason: int) -> str:
    return _REASONS.get(state, {}).get(reason, str(reason))


def event_detail_name(event: int, detail: int) -> str:
    return _DETAILS.get(event, {}).get(detail, str(detail))


_EVENT_KINDS = {
    libvirt.VIR_DOMAIN_EVENT_DEFINED: DomainEventKind.DEFINED,
    libvirt.VIR_DOMAIN_EVENT_UNDEFINED: DomainEventKind.UNDEFINED,
    libvirt.VIR_DOMAIN_EVENT_STARTED: DomainEventKind.STARTED,
    libvirt.VIR_DOMAIN_EVENT_SUSPENDED: DomainEventKind.SUSPENDED,
    libvirt.VIR_DOMAIN_EVENT_RESUMED: DomainEventKind.RESUMED,
    libvirt.VIR_DOMAIN_EVENT_STOPPED: DomainEventKind.STOPPED,
    libvirt.VIR_DOMAIN_EVENT_SHUTDOWN: DomainEventKind.SHUTDOWN,
    libvirt.VIR_DOMAIN_EVENT_PMSUSPENDED: DomainEventKind.PMSUSPENDED,
    libvirt.VIR_DOMAIN_EVENT_CRASHED: DomainEventKind.CRASHED,
}
_CLOSE_REASONS = {0: "error", 1: "end of file", 2: "keepalive timeout", 3: "client closed"}


def event_kind(event: int) -> DomainEventKind:
    """The kind of a domain lifecycle event (UNKNOWN for codes newer than capl)."""
    return _EVENT_KINDS.get(event, DomainEventKind.UNKNOWN)


def close_reason_name(reason: int) -> str:
    """Why libvirt closed a connection (``registerCloseCallback``'s reason)."""
    return _CLOSE_REASONS.get(reason, str(reason))
