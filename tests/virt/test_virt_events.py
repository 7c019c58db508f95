"""Events and connections: lifecycle events reach asyncio, connection loss is reported and
healed, unreachable hosts fail fast, credential files follow the host's lifetime."""

from __future__ import annotations

import asyncio
import os
import secrets
import uuid
from pathlib import Path

import pytest

from capl.ports.errors import HostUnreachable
from capl.ports.virt import (
    DomainEvent,
    DomainEventKind,
    DomainOwner,
    DomainSpec,
    HostEvent,
    HostEventKind,
    VirtEvent,
)
from capl.virt import LibvirtHost, LibvirtHosts, events
from tests.fixtures.virt import EventRecorder

URI = "test:///default"
DEADLINE = 30.0


def _spec() -> DomainSpec:
    owner = DomainOwner(cluster="ev", namespace="ns", name="m-" + secrets.token_hex(3), uid="u")
    return DomainSpec(
        name="capl-test-" + secrets.token_hex(4),
        uuid=str(uuid.uuid4()),
        owner=owner,
        vcpus=1,
        memory_mib=64,
        domain_type="test",
    )


def _domain_event(uuid_: str, kind: DomainEventKind) -> object:
    return lambda e: isinstance(e, DomainEvent) and e.uuid == uuid_ and e.kind is kind


async def test_lifecycle_events_reach_the_subscriber(hosts: LibvirtHosts) -> None:
    recorder = EventRecorder()
    subscription = hosts.subscribe(recorder)
    host = hosts.get(uri=URI)
    spec = _spec()
    await host.define_domain(spec)
    connected = await recorder.wait_for(
        lambda e: isinstance(e, HostEvent) and e.kind is HostEventKind.CONNECTED, "connected"
    )
    assert connected.host_id == "test:///default"
    await recorder.wait_for(_domain_event(spec.uuid, DomainEventKind.DEFINED), "defined")
    await host.start_domain(spec.uuid, owner=spec.owner)
    started = await recorder.wait_for(_domain_event(spec.uuid, DomainEventKind.STARTED), "started")
    assert isinstance(started, DomainEvent)
    assert (started.host_id, started.name, started.detail) == (host.host_id, spec.name, "booted")
    await host.destroy_domain(spec.uuid, owner=spec.owner)
    stopped = await recorder.wait_for(_domain_event(spec.uuid, DomainEventKind.STOPPED), "stopped")
    assert isinstance(stopped, DomainEvent)
    assert stopped.detail == "destroyed"
    subscription.close()
    seen = len(recorder.events)
    await host.undefine_domain(spec.uuid, owner=spec.owner)
    # a second subscriber still gets events; the closed one gets none
    other = EventRecorder()
    hosts.subscribe(other)
    again = _spec()
    await host.define_domain(again)
    await other.wait_for(_domain_event(again.uuid, DomainEventKind.DEFINED), "defined")
    assert len(recorder.events) == seen
    await host.undefine_domain(again.uuid, owner=again.owner)


async def test_a_failing_listener_does_not_break_delivery(hosts: LibvirtHosts) -> None:
    def broken(_event: VirtEvent) -> None:
        raise RuntimeError("listener bug")

    hosts.subscribe(broken)
    recorder = EventRecorder()
    hosts.subscribe(recorder)
    host = hosts.get(uri=URI)
    spec = _spec()
    await host.define_domain(spec)
    await recorder.wait_for(_domain_event(spec.uuid, DomainEventKind.DEFINED), "defined")
    await host.undefine_domain(spec.uuid, owner=spec.owner)


async def test_lost_connection_is_reported_and_reestablished(hosts: LibvirtHosts) -> None:
    recorder = EventRecorder()
    hosts.subscribe(recorder)
    host = hosts.get(uri=URI)
    assert await host.reachable()
    connection = host.connection
    generation = connection.generation
    # what the close callback does when libvirt reports a dropped connection (the test
    # driver never fires it; tests/libvirtd drops a real one with virt-admin)
    connection.mark_lost("simulated EOF")
    await recorder.wait_for(
        lambda e: isinstance(e, HostEvent) and e.kind is HostEventKind.DISCONNECTED, "disconnect"
    )
    await recorder.wait_for(
        lambda e: (
            isinstance(e, HostEvent)
            and e.kind is HostEventKind.CONNECTED
            and connection.generation > generation
        ),
        "reconnect",
    )
    # events are registered again on the new connection
    spec = _spec()
    await host.define_domain(spec)
    await recorder.wait_for(
        _domain_event(spec.uuid, DomainEventKind.DEFINED), "defined after reconnect"
    )
    await host.undefine_domain(spec.uuid, owner=spec.owner)


async def test_unreachable_host_fails_fast_during_backoff(hosts: LibvirtHosts) -> None:
    host: LibvirtHost = hosts.get(uri="test+unix:///default?socket=/nonexistent/capl.sock")
    with pytest.raises(HostUnreachable) as first:
        await host.info()
    assert first.value.reason == "HostUnreachable"
    assert first.value.host == "test+unix:///default"
    assert "/nonexistent" in str(first.value)  # libvirt's own message names the socket
    with pytest.raises(HostUnreachable, match="next attempt in"):
        await host.info()
    assert not await host.reachable()


async def test_registry_reuses_and_replaces_hosts(hosts: LibvirtHosts) -> None:
    a = hosts.get(uri=URI)
    assert hosts.get(uri=URI) is a
    creds = {"ca.crt": b"CA", "tls.crt": b"C", "tls.key": b"K"}
    tls = hosts.get(uri="qemu+tls://h.invalid/system", credentials=creds)
    directory = tls.connection.plan.credential_dir
    assert directory is not None
    assert await asyncio.to_thread(Path(directory).is_dir)
    assert hosts.get(uri="qemu+tls://h.invalid/system", credentials=creds) is tls
    rotated = hosts.get(uri="qemu+tls://h.invalid/system", credentials={**creds, "tls.key": b"K2"})
    assert rotated is not tls
    await asyncio.wait_for(hosts.wait_closed(), timeout=DEADLINE)
    assert not await asyncio.to_thread(Path(directory).exists)  # old files removed
    new_directory = rotated.connection.plan.credential_dir
    assert new_directory is not None
    await hosts.forget("qemu+tls://h.invalid/system")
    assert not await asyncio.to_thread(Path(new_directory).exists)
    with pytest.raises(HostUnreachable, match="closed"):
        await rotated.info()


async def test_events_a_subscription_does_not_want_never_reach_its_loop(
    hosts: LibvirtHosts,
) -> None:
    """``wants`` decides on libvirt's event thread: the listener of a subscription that
    refuses definitions sees the start, and never the definition another subscriber sees."""
    everything, picky = EventRecorder(), EventRecorder()
    asked: list[VirtEvent] = []

    def no_definitions(event: VirtEvent) -> bool:
        asked.append(event)
        return not (isinstance(event, DomainEvent) and event.kind is DomainEventKind.DEFINED)

    first = hosts.subscribe(everything)
    second = hosts.subscribe(picky, wants=no_definitions)
    try:
        host = hosts.get(uri=URI)
        spec = _spec()
        await host.define_domain(spec)
        await host.start_domain(spec.uuid, owner=spec.owner)
        await everything.wait_for(_domain_event(spec.uuid, DomainEventKind.DEFINED), "defined")
        await picky.wait_for(_domain_event(spec.uuid, DomainEventKind.STARTED), "started")
        assert not any(_domain_event(spec.uuid, DomainEventKind.DEFINED)(e) for e in picky.events)
        assert any(_domain_event(spec.uuid, DomainEventKind.DEFINED)(e) for e in asked)
        await host.destroy_domain(spec.uuid, owner=spec.owner)
        await host.undefine_domain(spec.uuid, owner=spec.owner)
    finally:
        first.close()
        second.close()


async def test_a_failing_filter_lets_the_event_through(hosts: LibvirtHosts) -> None:
    """A ``wants`` that raises neither breaks delivery to others nor loses the event."""
    recorder, other = EventRecorder(), EventRecorder()

    def broken(_event: VirtEvent) -> bool:
        raise RuntimeError("filter bug")

    first = hosts.subscribe(recorder, wants=broken)
    second = hosts.subscribe(other)
    try:
        host = hosts.get(uri=URI)
        spec = _spec()
        await host.define_domain(spec)
        await recorder.wait_for(_domain_event(spec.uuid, DomainEventKind.DEFINED), "defined")
        await other.wait_for(_domain_event(spec.uuid, DomainEventKind.DEFINED), "defined")
        await host.undefine_domain(spec.uuid, owner=spec.owner)
    finally:
        first.close()
        second.close()


async def test_the_event_loop_thread_runs_nicer_than_the_process(hosts: LibvirtHosts) -> None:
    """Each libvirt call wakes the event loop twice (its socket watch off and on): at a lower
    priority the loop no longer preempts the worker thread each time (capl.virt.events)."""
    await hosts.get(uri=URI).info()  # the first connection starts the loop
    deadline = asyncio.get_running_loop().time() + DEADLINE
    while events.event_thread_id is None:
        assert asyncio.get_running_loop().time() < deadline, "the event loop thread did not start"
        await asyncio.sleep(0.01)
    process = os.getpriority(os.PRIO_PROCESS, os.getpid())
    wanted = min(19, process + events.EVENT_THREAD_NICE)
    assert os.getpriority(os.PRIO_PROCESS, events.event_thread_id) == wanted
    if process < 19:  # a process already at the lowest priority has nothing to lower
        assert os.getpriority(os.PRIO_PROCESS, events.event_thread_id) > process
