"""Events: domain lifecycle and host connection events, triggers to requeue keys."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from capl.ports.virt.identity import HostId

__all__ = [
    "DomainEvent",
    "DomainEventKind",
    "HostEvent",
    "HostEventKind",
    "Subscription",
    "VirtEvent",
    "VirtEventListener",
]


class DomainEventKind(enum.StrEnum):
    DEFINED = "defined"
    UNDEFINED = "undefined"
    STARTED = "started"
    SUSPENDED = "suspended"
    RESUMED = "resumed"
    STOPPED = "stopped"
    SHUTDOWN = "shutdown"
    PMSUSPENDED = "pmsuspended"
    CRASHED = "crashed"
    UNKNOWN = "unknown"


class HostEventKind(enum.StrEnum):
    CONNECTED = "connected"
    """A connection was (re)established; events are registered again."""
    DISCONNECTED = "disconnected"
    """The connection dropped (keepalive timeout, daemon restart, EOF)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DomainEvent:
    host_id: HostId
    uuid: str
    name: str
    kind: DomainEventKind
    detail: str


@dataclass(frozen=True, slots=True, kw_only=True)
class HostEvent:
    host_id: HostId
    kind: HostEventKind
    message: str = ""


VirtEvent = DomainEvent | HostEvent
VirtEventListener = Callable[[VirtEvent], None]


@runtime_checkable
class Subscription(Protocol):
    def close(self) -> None:
        """Stop delivering events to the listener (idempotent)."""
