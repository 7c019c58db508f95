"""Work queue semantics on a fake clock: merge, exclusivity, backoff, rate limit, add_after."""

from __future__ import annotations

import asyncio

import pytest

from capl.runtime.clock import FakeClock
from capl.runtime.metrics import RuntimeMetrics
from capl.runtime.workqueue import (
    BucketRateLimiter,
    ItemExponentialFailureRateLimiter,
    MaxOfRateLimiter,
    ShutDown,
    WorkQueue,
    default_rate_limiter,
)
from tests.fixtures.runtime import eventually


def make_queue(clock: FakeClock, **kwargs: object) -> WorkQueue[str]:
    return WorkQueue(name="test", clock=clock, **kwargs)  # type: ignore[arg-type]


def drain(queue: WorkQueue[str]) -> list[str]:
    keys = []
    while (key := queue.get_nowait()) is not None:
        keys.append(key)
    return keys


def test_adds_of_one_key_merge() -> None:
    q = make_queue(FakeClock())
    for _ in range(5):
        q.add("a")
    q.add("b")
    assert q.depth() == 2
    assert drain(q) == ["a", "b"]
    assert q.merged == 4


def test_key_being_processed_is_not_handed_out_again() -> None:
    q = make_queue(FakeClock())
    q.add("a")
    assert q.get_nowait() == "a"
    for _ in range(10):
        q.add("a")  # N events during the reconcile
    assert q.get_nowait() is None  # exclusivity: no second worker gets it
    assert q.is_dirty("a")
    q.done("a")
    assert q.get_nowait() == "a"  # exactly one re-run
    q.done("a")
    assert q.get_nowait() is None
    assert q.depth() == 0


def test_fifo_order_and_done_requeues_at_the_back() -> None:
    q = make_queue(FakeClock())
    q.add("a")
    q.add("b")
    assert q.get_nowait() == "a"
    q.add("a")
    q.add("c")
    q.done("a")
    assert drain(q) == ["b", "c", "a"]


async def test_concurrent_workers_never_share_a_key() -> None:
    q = make_queue(FakeClock())
    running: set[str] = set()
    overlaps = 0
    runs: dict[str, int] = {}

    async def worker() -> None:
        nonlocal overlaps
        while True:
            try:
                key = await q.get()
            except ShutDown:
                return
            if key in running:
                overlaps += 1
            running.add(key)
            runs[key] = runs.get(key, 0) + 1
            await asyncio.sleep(0)
            q.add(key) if runs[key] < 3 else None  # re-add while processing
            await asyncio.sleep(0)
            running.discard(key)
            q.done(key)

    for i in range(20):
        q.add(f"k{i % 5}")
    workers = [asyncio.create_task(worker()) for _ in range(4)]
    await eventually(lambda: not (q.depth() or q.processing))
    q.shutdown()
    await asyncio.gather(*workers)
    assert overlaps == 0
    assert runs == {f"k{i}": 3 for i in range(5)}


def test_exponential_backoff_sequence_and_forget() -> None:
    rl: ItemExponentialFailureRateLimiter[str] = ItemExponentialFailureRateLimiter(
        base_delay=0.005, max_delay=1000.0
    )
    delays = [rl.when("a") for _ in range(20)]
    assert delays[:5] == [0.005, 0.01, 0.02, 0.04, 0.08]
    assert delays[-1] == 1000.0  # capped
    assert max(delays) == 1000.0
    assert rl.retries("a") == 20
    assert rl.when("b") == 0.005  # per key
    rl.forget("a")
    assert rl.retries("a") == 0
    assert rl.when("a") == 0.005


def test_token_bucket_burst_then_qps() -> None:
    clock = FakeClock()
    rl: BucketRateLimiter[str] = BucketRateLimiter(qps=10, burst=100, clock=clock)
    assert [rl.when(str(i)) for i in range(100)] == [0.0] * 100
    assert rl.when("x") == pytest.approx(0.1)
    assert rl.when("y") == pytest.approx(0.2)
    clock.advance(20.0)  # pays back the two reservations, refills, never beyond the burst
    assert [rl.when(str(i)) for i in range(100)] == [0.0] * 100
    assert rl.when("z") == pytest.approx(0.1)


def test_default_limiter_is_max_of_backoff_and_bucket() -> None:
    clock = FakeClock()
    rl: MaxOfRateLimiter[str] = default_rate_limiter(clock=clock, qps=10, burst=2)
    assert rl.when("a") == 0.005  # backoff dominates while the bucket has tokens
    assert rl.when("a") == 0.01
    assert rl.when("b") == pytest.approx(0.1)  # bucket empty now: its delay dominates
    rl.forget("a")
    assert rl.retries("a") == 0


def test_add_rate_limited_waits_for_the_backoff() -> None:
    clock = FakeClock()
    q = make_queue(clock)
    q.add_rate_limited("a")
    assert q.get_nowait() is None
    clock.advance(0.004)
    assert q.get_nowait() is None
    clock.advance(0.001)
    assert q.get_nowait() == "a"
    q.done("a")
    q.add_rate_limited("a")  # second failure: 10 ms
    clock.advance(0.009)
    assert q.get_nowait() is None
    clock.advance(0.001)
    assert q.get_nowait() == "a"
    q.done("a")
    q.forget("a")
    assert q.num_requeues("a") == 0


def test_add_after_orders_by_deadline_and_earliest_wins() -> None:
    clock = FakeClock()
    q = make_queue(clock)
    q.add_after("a", 3.0)
    q.add_after("b", 1.0)
    q.add_after("c", 2.0)
    q.add_after("a", 5.0)  # later deadline for a parked key: ignored
    q.add_after("c", 0.5)  # earlier deadline wins
    assert q.waiting == {"a": clock.now() + 3.0, "b": clock.now() + 1.0, "c": clock.now() + 0.5}
    clock.advance(0.5)
    assert drain(q) == ["c"]
    clock.advance(0.5)
    assert drain(q) == ["b"]
    clock.advance(1.9)
    assert drain(q) == []
    clock.advance(0.1)
    assert drain(q) == ["a"]
    assert q.waiting == {}


def test_add_after_merges_with_a_queued_key() -> None:
    clock = FakeClock()
    q = make_queue(clock)
    q.add("a")
    q.add_after("a", 1.0)
    assert drain(q) == ["a"]
    q.done("a")
    clock.advance(1.0)
    assert drain(q) == ["a"]  # the delayed add still fires, once


def test_add_after_zero_is_immediate() -> None:
    q = make_queue(FakeClock())
    q.add_after("a", 0)
    assert drain(q) == ["a"]


async def test_get_waits_and_wakes() -> None:
    clock = FakeClock()
    q = make_queue(clock)
    getter = asyncio.create_task(q.get())
    await asyncio.sleep(0)
    assert not getter.done()
    q.add_after("a", 2.0)
    clock.advance(2.0)
    assert await getter == "a"


async def test_shutdown_without_drain() -> None:
    q = make_queue(FakeClock())
    q.add("a")
    q.add("b")
    getter_keys = [q.get_nowait()]
    waiting = asyncio.create_task(q.get())
    await asyncio.sleep(0)
    assert waiting.done()  # b was still queued
    q.shutdown()
    with pytest.raises(ShutDown):
        q.get_nowait()
    q.add("c")  # ignored
    q.add_after("d", 1)
    assert q.depth() == 0
    blocked = asyncio.create_task(q.get())
    await asyncio.sleep(0)
    with pytest.raises(ShutDown):
        await blocked
    assert getter_keys == ["a"]
    q.done("a")
    q.done(waiting.result())


async def test_shutdown_with_drain_hands_out_the_rest() -> None:
    q = make_queue(FakeClock())
    for key in "abc":
        q.add(key)
    q.shutdown(drain=True)
    assert drain_until_shutdown(q) == ["a", "b", "c"]


def drain_until_shutdown(q: WorkQueue[str]) -> list[str]:
    out: list[str] = []
    while True:
        try:
            key = q.get_nowait()
        except ShutDown:
            return out
        assert key is not None
        out.append(key)
        q.done(key)


async def test_shutdown_wakes_every_waiting_getter() -> None:
    q = make_queue(FakeClock())
    getters = [asyncio.create_task(q.get()) for _ in range(3)]
    await asyncio.sleep(0)
    q.shutdown()
    results = await asyncio.gather(*getters, return_exceptions=True)
    assert all(isinstance(r, ShutDown) for r in results)


async def test_wait_idle() -> None:
    q = make_queue(FakeClock())
    q.add("a")
    key = q.get_nowait()
    idle = asyncio.create_task(q.wait_idle())
    await asyncio.sleep(0)
    assert not idle.done()
    q.done(key)  # type: ignore[arg-type]
    await idle


def test_metrics_use_controller_runtime_names() -> None:
    clock = FakeClock()
    metrics = RuntimeMetrics()
    q: WorkQueue[str] = WorkQueue(name="toy", clock=clock, metrics=metrics)
    q.add("a")
    q.add("a")
    q.add("b")
    clock.advance(0.5)
    key = q.get_nowait()
    clock.advance(0.25)
    q.add_rate_limited("c")
    reg = metrics.registry
    labels = {"controller": "toy", "name": "toy"}
    assert reg.get_sample_value("workqueue_adds_total", labels) == 2
    assert reg.get_sample_value("workqueue_depth", labels) == 1
    assert reg.get_sample_value("workqueue_retries_total", labels) == 1
    assert reg.get_sample_value("workqueue_queue_duration_seconds_count", labels) == 1
    assert reg.get_sample_value("workqueue_queue_duration_seconds_sum", labels) == 0.5
    assert reg.get_sample_value("workqueue_unfinished_work_seconds", labels) == 0.25
    assert reg.get_sample_value("workqueue_longest_running_processor_seconds", labels) == 0.25
    q.done(key)  # type: ignore[arg-type]
    assert reg.get_sample_value("workqueue_work_duration_seconds_sum", labels) == 0.25
