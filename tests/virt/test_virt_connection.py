"""The connection layer of one host (capl/virt/connection.py): handles, limits, loss.

- which URIs run the driver in this process (one shared handle, no keepalive) and which
  speak RPC (keepalive asked for, one handle per concurrent call, reused afterwards);
- a stream keeps its handle out of the pool until it is finished or aborted;
- the time limit of a call: the caller gets ``HostUnreachable`` naming host and action while
  the thread stays behind; the cap on calls in flight;
- a lost host fails new calls at once until the reconnector succeeds (``generation`` bumps).

The RPC cases use libvirtd's shared test driver (``test+unix:///default``); no test sleeps for
synchronisation (threading events and conditions with deadlines).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from capl.ports.errors import HostUnreachable
from capl.ports.virt import HostEvent, HostEventKind, HostOptions
from capl.virt import LibvirtHosts
from capl.virt.connection import HostConnection, in_process
from capl.virt.uri import plan_connection
from tests.fixtures.virt import EventRecorder

LOCAL = "test:///default"
DEADLINE = 10.0


async def eventually(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {DEADLINE} s: {what}")
        await asyncio.sleep(0.01)


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("test:///default", True),
        ("test:///tmp/fixture.xml", True),
        ("test+unix:///default", False),
        ("test+tcp://h.invalid/default", False),
        ("test+tls://10.0.0.2:16514/default", False),
        ("qemu:///system", False),
        ("qemu+ssh://root@h.invalid/system", False),
    ],
)
def test_only_the_local_test_driver_runs_in_process(uri: str, expected: bool) -> None:
    plan = plan_connection(uri, options=HostOptions(allow_insecure_tcp=True))
    try:
        assert in_process(plan) is expected
    finally:
        plan.cleanup()


async def test_in_process_driver_shares_one_handle_without_keepalive(
    hosts: LibvirtHosts,
) -> None:
    host = hosts.get(uri=LOCAL)
    seen: set[int] = set()
    barrier = threading.Barrier(3, timeout=DEADLINE)

    def op(c: Any) -> None:
        seen.add(id(c._target))
        barrier.wait()  # all three run at once

    await asyncio.gather(*(host.connection.run("probe", op) for _ in range(3)))
    assert len(seen) == 1
    counts = hosts.calls.snapshot()[host.host_id]
    assert counts["virConnect.open"] == 1
    assert "virConnect.setKeepAlive" not in counts


async def test_rpc_connection_gives_each_concurrent_call_its_own_handle(
    hosts: LibvirtHosts, shared_test_driver: str
) -> None:
    host = hosts.get(uri=shared_test_driver)
    connection = host.connection
    seen: list[int] = []
    barrier = threading.Barrier(4, timeout=DEADLINE)

    def op(c: Any) -> None:
        seen.append(id(c._target))
        barrier.wait()  # all four are in a call at once
        c.getLibVersion()

    await asyncio.gather(*(connection.run("probe", op) for _ in range(4)))
    assert len(set(seen)) == 4, "two concurrent calls shared a connection"
    counts = hosts.calls.snapshot()[host.host_id]
    assert counts["virConnect.open"] == 4
    assert counts["virConnect.setKeepAlive"] == 4  # asked for on every RPC handle
    assert counts["virConnect.domainEventRegisterAny"] == 1  # on the primary only
    assert connection.handles == 4
    for _ in range(3):  # sequential calls reuse the pool
        await host.info()
    assert hosts.calls.snapshot()[host.host_id]["virConnect.open"] == 4


async def test_a_stream_keeps_its_handle_until_it_ends(
    hosts: LibvirtHosts, shared_test_driver: str
) -> None:
    connection = hosts.get(uri=shared_test_driver).connection
    await connection.run("ping", lambda c: c.getLibVersion())
    assert connection.handles == 1
    stream = await connection.run("new stream", lambda c: c.newStream(0))
    assert connection.handles == 0  # lent to the stream
    opened = hosts.calls.snapshot()[connection.host_id]["virConnect.open"]
    await connection.run("ping", lambda c: c.getLibVersion())  # needs another handle
    assert hosts.calls.snapshot()[connection.host_id]["virConnect.open"] == opened + 1
    await connection.run("abort stream", lambda _c: stream.abort())
    assert connection.handles == 2  # the stream's handle is back


async def test_call_past_its_time_limit_fails_while_the_thread_stays_behind(
    hosts: LibvirtHosts,
) -> None:
    connection = hosts.get(uri=LOCAL).connection
    release = threading.Event()
    try:
        with pytest.raises(HostUnreachable) as caught:
            await connection.run("read something slow", lambda _c: release.wait(), time_limit=0.2)
        assert caught.value.host == LOCAL
        assert "read something slow on test:///default" in str(caught.value)
        assert "no answer from the host within 0.2 s" in str(caught.value)
        assert connection.inflight == 1  # still in libvirt
        assert await connection.run("ping", lambda c: c.getLibVersion()) > 0
    finally:
        release.set()
    await eventually(lambda: connection.inflight == 0, "the left-behind call finished")


async def test_a_call_given_up_on_while_queued_never_runs(hosts: LibvirtHosts) -> None:
    connection = hosts.get(uri=LOCAL).connection
    release = threading.Event()
    ran: list[str] = []
    first = asyncio.create_task(
        connection.run("hold the key", lambda _c: release.wait(), serial="k", time_limit=DEADLINE)
    )
    try:
        await eventually(lambda: connection.inflight == 1, "the first call runs")
        with pytest.raises(HostUnreachable, match=r"within 0\.2 s"):
            await connection.run(
                "queued", lambda _c: ran.append("queued"), serial="k", time_limit=0.2
            )
        queued = asyncio.create_task(
            connection.run("cancelled", lambda _c: ran.append("cancelled"), serial="k")
        )
        await eventually(lambda: connection.inflight == 2, "the second call is queued")
        queued.cancel()
        with pytest.raises(asyncio.CancelledError):
            await queued
    finally:
        release.set()
    assert await first
    assert await connection.run("after", lambda _c: "ran", serial="k") == "ran"
    await eventually(lambda: connection.inflight == 0, "every call accounted for")
    assert ran == []  # neither the expired nor the cancelled call reached libvirt


async def test_long_calls_get_the_long_time_limit() -> None:
    hosts = LibvirtHosts(call_timeout=0.2, long_call_timeout=DEADLINE)
    try:
        connection = hosts.get(uri=LOCAL).connection
        release = threading.Event()

        def slow(_c: Any) -> bool:
            release.wait(0.5)
            return True

        with pytest.raises(HostUnreachable, match=r"within 0\.2 s"):
            await connection.run("ordinary", slow)
        with connection.long_calls():
            task = asyncio.create_task(connection.run("long", slow))  # inherits the context
        assert await task
        release.set()
    finally:
        await hosts.close()


async def test_calls_in_flight_are_capped_per_host() -> None:
    hosts = LibvirtHosts(max_inflight_per_host=2)
    release = threading.Event()
    try:
        host = hosts.get(uri=LOCAL)
        blocked = [
            asyncio.create_task(host.connection.run("wait", lambda _c: release.wait()))
            for _ in range(2)
        ]
        await eventually(lambda: host.connection.inflight == 2, "two calls in flight")
        # the two calls never end before `release`: a third that waited for a slot would
        # run into the deadline instead of being refused
        with pytest.raises(HostUnreachable, match=r"2 calls to the host are still unanswered"):
            await asyncio.wait_for(
                host.connection.run("one more", lambda c: c.getLibVersion()), DEADLINE
            )
        assert host.connection.inflight == 2
        release.set()
        await asyncio.gather(*blocked)
        assert await host.connection.run("ping", lambda c: c.getLibVersion()) > 0
    finally:
        release.set()
        await hosts.close()


async def test_lost_host_fails_fast_until_the_reconnect_succeeds(
    hosts: LibvirtHosts, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorder = EventRecorder()
    hosts.subscribe(recorder)
    host = hosts.get(uri=LOCAL)
    connection: HostConnection = host.connection
    assert await host.reachable()
    generation = connection.generation
    attempting = threading.Event()
    unblock = threading.Event()
    real_connect = connection.pool._connect

    def hanging_connect() -> Any:
        # like a host whose TCP connect hangs: the attempt lasts until the test lets it fail
        attempting.set()
        unblock.wait(DEADLINE * 3)
        raise HostUnreachable(f"connect to {LOCAL}: no route to host", host=LOCAL)

    monkeypatch.setattr(connection.pool, "_connect", hanging_connect)
    try:
        connection.mark_lost("keepalive timeout")
        await recorder.wait_for(
            lambda e: isinstance(e, HostEvent) and e.kind is HostEventKind.DISCONNECTED,
            "disconnect",
        )
        await eventually(attempting.is_set, "a reconnect attempt")
        # the attempt hangs: calls that waited for it would run into the deadline
        for _ in range(5):
            with pytest.raises(HostUnreachable) as caught:
                await asyncio.wait_for(host.info(), DEADLINE)
            assert caught.value.host == LOCAL
            assert "reconnecting" in str(caught.value) or "next attempt in" in str(caught.value)
        assert not connection.connected
        monkeypatch.setattr(connection.pool, "_connect", real_connect)
    finally:
        unblock.set()
    await recorder.wait_for(
        lambda e: (
            isinstance(e, HostEvent)
            and e.kind is HostEventKind.CONNECTED
            and connection.generation > generation
        ),
        "reconnect",
    )
    assert (await host.info()).hypervisor
    assert connection.connected


async def test_close_does_not_wait_for_a_stuck_call(hosts: LibvirtHosts) -> None:
    host = hosts.get(uri=LOCAL)
    release = threading.Event()
    stuck = asyncio.create_task(host.connection.run("stuck", lambda _c: release.wait()))
    try:
        await eventually(lambda: host.connection.inflight == 1, "the call runs")
        # the call never ends before `release`: close returning at all shows it did not
        # wait (the generous deadline only keeps a regression from hanging the run)
        await asyncio.wait_for(hosts.close(), timeout=DEADLINE * 6)
        assert not stuck.done()
        with pytest.raises(HostUnreachable, match="closed"):
            await host.info()
    finally:
        release.set()
        await stuck


async def test_an_unchanged_outage_reads_the_same_whether_connecting_or_backing_off(
    hosts: LibvirtHosts,
) -> None:
    """A host that cannot be reached fails a call that tries to connect and a call refused
    during the backoff after it with the same words (only the schedule is added): the cluster
    controller reports the text in a condition, and a different text per retry was a status
    write per retry (seen in tests/controllers/test_cluster_controller.py)."""
    host = hosts.get(uri="qemu+unix:///session?socket=/nonexistent/capl-test.sock")
    with pytest.raises(HostUnreachable) as connecting:
        await host.info()
    with pytest.raises(HostUnreachable) as backing_off:
        await host.info()
    assert "next attempt in" in str(backing_off.value)
    assert str(backing_off.value).startswith(str(connecting.value))


async def test_host_info_without_free_memory_answers_from_what_it_knows(
    hosts: LibvirtHosts,
) -> None:
    """Placement on a one-host cluster weighs nothing: its info comes without a call once
    known (and the free memory is read whenever it is asked for)."""
    host = hosts.get(uri=LOCAL)
    first = await host.info(free_memory=False)  # nothing known yet: read
    calls = hosts.calls.total(host.host_id)
    assert await host.info(free_memory=False) == first
    assert hosts.calls.total(host.host_id) == calls
    await host.info()
    assert hosts.calls.snapshot()[host.host_id]["virConnect.getFreeMemory"] == 2
