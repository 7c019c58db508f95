"""Leader election on the in-memory API with a fake clock."""

from __future__ import annotations

import asyncio

import pytest

from capl.runtime.clock import FakeClock
from capl.runtime.errors import TransportError
from capl.runtime.leaderelection import LeaderElectionConfig, LeaderElector, micro_time
from capl.runtime.objects import ObjectKey
from capl.runtime.resources import LEASE
from tests.fixtures.runtime import FakeApi, FakeClient, advance_until, eventually

KEY = ObjectKey("ns", "lock")


def elector(api: FakeApi, clock: FakeClock, identity: str) -> LeaderElector:
    return LeaderElector(
        FakeClient(api).resource(LEASE),
        LeaderElectionConfig(name="lock", namespace="ns", identity=identity),
        clock=clock,
    )


def holder(api: FakeApi) -> str:
    return str(api.objects[LEASE][KEY]["spec"].get("holderIdentity") or "")


def test_micro_time() -> None:
    assert micro_time(1.5) == "1970-01-01T00:00:01.500000Z"


def test_config_validates_timings() -> None:
    with pytest.raises(ValueError, match="lease_duration > renew_deadline"):
        LeaderElectionConfig(name="l", namespace="n", identity="i", renew_deadline=20)


async def test_acquire_create_then_standby_waits_for_expiry() -> None:
    api, clock = FakeApi(), FakeClock()
    a, b = elector(api, clock, "a"), elector(api, clock, "b")
    await a.acquire()
    assert a.is_leader
    assert holder(api) == "a"
    spec = api.objects[LEASE][KEY]["spec"]
    assert spec["leaseDurationSeconds"] == 15
    assert spec["leaseTransitions"] == 0
    b_task = asyncio.create_task(b.acquire())
    await eventually(lambda: b.observed_holder == "a")
    # a dies silently (no renewals): b takes over only after leaseDuration of local time
    waited = await advance_until(clock, b_task.done, step=0.5)
    assert 15.0 <= waited <= 15.0 + 2 * 2.2 + 0.5
    await b_task
    assert b.is_leader
    assert holder(api) == "b"
    assert api.objects[LEASE][KEY]["spec"]["leaseTransitions"] == 1


async def test_renewals_keep_the_standby_out() -> None:
    api, clock = FakeApi(), FakeClock()
    a, b = elector(api, clock, "a"), elector(api, clock, "b")
    await a.acquire()
    hold = asyncio.create_task(a.hold())
    b_task = asyncio.create_task(b.acquire())
    with pytest.raises(AssertionError):
        await advance_until(clock, b_task.done, step=0.5, limit=80)
    assert holder(api) == "a"
    assert a.is_leader
    b_task.cancel()
    hold.cancel()
    await asyncio.gather(b_task, hold, return_exceptions=True)


async def test_losing_renewals_ends_hold_within_the_renew_deadline() -> None:
    api, clock = FakeApi(), FakeClock()
    a = elector(api, clock, "a")
    await a.acquire()
    acquired_at = clock.now()
    hold = asyncio.create_task(a.hold())
    api.fail("get", TransportError("apiserver down"), times=1000)
    await advance_until(clock, hold.done, step=0.25)
    await hold
    assert not a.is_leader
    # detected no later than the renew deadline (+ one retry period for the first sleep)
    assert clock.now() - acquired_at <= 10.0 + 2.0


async def test_release_lets_the_standby_take_over_at_once() -> None:
    api, clock = FakeApi(), FakeClock()
    a, b = elector(api, clock, "a"), elector(api, clock, "b")
    await a.acquire()
    b_task = asyncio.create_task(b.acquire())
    await eventually(lambda: b.observed_holder == "a")
    assert await a.release()
    assert holder(api) == ""
    waited = await advance_until(clock, b_task.done, step=0.25)
    assert waited <= 2 * 2.2 + 0.25  # b's next poll, long before a's lease would have expired
    await b_task
    assert b.is_leader


async def test_racing_candidates_get_one_winner() -> None:
    api, clock = FakeApi(), FakeClock()
    api.put(LEASE, {"metadata": {"name": "lock", "namespace": "ns"}, "spec": {}})
    electors = [elector(api, clock, f"c{i}") for i in range(5)]
    results = await asyncio.gather(*(e._try_acquire_or_renew() for e in electors))
    assert sum(results) == 1


async def test_cancelling_hold_during_a_renewal_request_ends_it() -> None:
    """The manager stops `hold` by cancelling it; a renewal request in flight at that moment
    must not turn the cancellation into a failed renewal (`hold` would go on renewing and the
    manager's shutdown wait for it forever: seen in tests/kube)."""
    api, clock = FakeApi(), FakeClock()
    a = elector(api, clock, "a")
    await a.acquire()
    requested = asyncio.Event()
    never = asyncio.Event()

    async def hanging_get(key: ObjectKey) -> object:
        requested.set()
        await never.wait()  # a request the API server does not answer
        raise AssertionError("not reached")

    a.client.get = hanging_get  # type: ignore[method-assign]
    hold = asyncio.create_task(a.hold())
    await advance_until(clock, requested.is_set, step=0.25)
    hold.cancel()
    done, _ = await asyncio.wait({hold}, timeout=5.0)
    assert done, "hold went on after being cancelled"
    assert hold.cancelled()
