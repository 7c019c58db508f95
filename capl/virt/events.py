"""The process-wide libvirt event loop and the fan-out of events to asyncio.

libvirt delivers domain events, close callbacks and keepalive only while an event loop
implementation runs. ``libvirtaio`` would bind that to one asyncio loop, once per process,
which breaks under pytest's loop-per-test and couples libvirt's timers to our loop's health.
Instead (libvirt-notes.md): ``virEventRegisterDefaultImpl()`` once per process, before the
first connection, and one daemon thread running ``virEventRunDefaultImpl()`` forever.

That thread runs at a lower priority than the rest of the process (``EVENT_THREAD_NICE``
above the process's nice value). Every libvirt call from a worker thread switches the
connection's socket watch off and on again around its own I/O, and each switch wakes the
event loop. At the same priority the woken loop preempted the worker each time, ran, slept
and was woken again: per machine created, about 63 wake-ups of the loop and 60 preemptions
of workers (issue 16's scale-out, 10 clusters of 100 machines on the test driver). At a
lower priority it runs when a core is free, and one iteration sees both switches: 25,000
wake-ups per 1,000 machines instead of 63,000, a third of the preemptions, and 4 % less
manager CPU per kube-apiserver CPU in alternating runs. The loop needs little CPU and gets
it within milliseconds on a loaded host, far inside keepalive's 15 s. Where the change is
refused (a seccomp profile), the thread keeps the process's priority.

Callbacks run on that thread and must not block or call back into libvirt over RPC; they
only build a value object and hand it to every subscriber with
``loop.call_soon_threadsafe``. Each subscription remembers the loop that was running when it
was made, so subscribers on different (test) loops each get events on their own loop, and a
subscription whose loop has closed is dropped.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Callable

import libvirt

from capl.ports.virt import VirtEvent, VirtEventListener

__all__ = ["EVENT_THREAD_NICE", "EventHub", "EventSubscription", "ensure_event_loop"]

log = logging.getLogger(__name__)

EVENT_THREAD_NICE = 10
"""How much nicer than the process the event loop thread runs (see the module docstring)."""

_started = False
_start_lock = threading.Lock()
event_thread_id: int | None = None
"""The event loop thread's native id, once it runs."""


def _ignore_error(_ctx: object, _err: object) -> None:
    """libvirt's default handler prints every error to stderr; we raise typed errors instead."""


def _lower_priority() -> None:
    """This thread EVENT_THREAD_NICE nicer than the process (Linux: per thread)."""
    global event_thread_id
    event_thread_id = threading.get_native_id()
    try:
        base = os.getpriority(os.PRIO_PROCESS, os.getpid())
        os.setpriority(os.PRIO_PROCESS, event_thread_id, min(19, base + EVENT_THREAD_NICE))
    except (OSError, AttributeError) as exc:  # refused, or no per-thread priority here
        log.info("libvirt event loop thread keeps the process's priority: %s", exc)


def _run_forever() -> None:
    _lower_priority()
    while True:
        try:
            libvirt.virEventRunDefaultImpl()
        except Exception:  # the thread must survive anything a callback raises
            log.exception("libvirt event loop iteration failed")


def ensure_event_loop() -> None:
    """Register the default event implementation and start its thread (idempotent)."""
    global _started
    if _started:
        return
    with _start_lock:
        if _started:
            return
        libvirt.registerErrorHandler(_ignore_error, None)
        libvirt.virEventRegisterDefaultImpl()
        thread = threading.Thread(target=_run_forever, name="libvirt-events", daemon=True)
        thread.start()
        _started = True


class EventSubscription:
    __slots__ = ("_closed", "_hub", "listener", "loop", "wants")

    def __init__(
        self,
        hub: EventHub,
        listener: VirtEventListener,
        loop: asyncio.AbstractEventLoop,
        wants: Callable[[VirtEvent], bool] | None = None,
    ) -> None:
        self._hub = hub
        self._closed = False
        self.listener = listener
        self.loop = loop
        self.wants = wants
        """Decides on the publishing thread: an event it refuses is not handed to the loop."""

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        self._closed = True
        self._hub.remove(self)

    def deliver(self, event: VirtEvent) -> None:
        if self._closed:
            return
        try:
            self.listener(event)
        except Exception:
            log.exception("event listener failed on %s", type(event).__name__)


def _wanted(subscription: EventSubscription, event: VirtEvent) -> bool:
    """The subscription's ``wants``; one that fails lets the event through (the listener
    decides again on its loop) and the other subscribers still get it."""
    wants = subscription.wants
    if wants is None:
        return True
    try:
        return wants(event)
    except Exception:
        log.exception("event filter failed on %s", type(event).__name__)
        return True


class EventHub:
    """Thread-safe list of subscribers; ``publish`` may be called from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._subscriptions: list[EventSubscription] = []

    def subscribe(
        self, listener: VirtEventListener, *, wants: Callable[[VirtEvent], bool] | None = None
    ) -> EventSubscription:
        subscription = EventSubscription(self, listener, asyncio.get_running_loop(), wants)
        with self._lock:
            self._subscriptions.append(subscription)
        return subscription

    def remove(self, subscription: EventSubscription) -> None:
        with self._lock:
            if subscription in self._subscriptions:
                self._subscriptions.remove(subscription)

    def publish(self, event: VirtEvent) -> None:
        with self._lock:
            subscriptions = list(self._subscriptions)
        for subscription in subscriptions:
            if subscription.closed:
                continue
            if not _wanted(subscription, event):
                continue  # no hand-off to a loop that would drop it
            try:
                subscription.loop.call_soon_threadsafe(subscription.deliver, event)
            except RuntimeError:  # its loop is closed: the subscriber is gone
                self.remove(subscription)

    def __len__(self) -> int:
        with self._lock:
            return len(self._subscriptions)
