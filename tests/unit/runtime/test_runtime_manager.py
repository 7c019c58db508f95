"""Manager on the in-memory API: probes, metrics endpoint, leader election between two managers."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from capl.runtime.clock import FakeClock
from capl.runtime.controller import Result
from capl.runtime.errors import TransportError
from capl.runtime.manager import LeadershipLost, Manager, ManagerOptions
from capl.runtime.objects import ObjectKey
from capl.runtime.resources import CONFIG_MAP, LEASE
from capl.runtime.serving import BindAddress, parse_bind_address
from tests.fixtures.runtime import FakeApi, FakeClient, advance_until, eventually


class Counting:
    def __init__(self, name: str) -> None:
        self.name = name
        self.calls: list[ObjectKey] = []

    async def reconcile(self, key: ObjectKey) -> Result:
        self.calls.append(key)
        return Result()


def options(**kw: Any) -> ManagerOptions:
    base: dict[str, Any] = {
        "metrics_bind_address": "127.0.0.1:0",
        "health_probe_bind_address": "127.0.0.1:0",
        "handle_signals": False,
        "graceful_shutdown_timeout": 5,
        "concurrency": 2,
    }
    base.update(kw)
    return ManagerOptions(**base)


async def get(port: int | None, path: str) -> tuple[int, str]:
    assert port
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}{path}") as r:
        return r.status, await r.text()


def test_parse_bind_address() -> None:
    assert parse_bind_address("0") is None
    assert parse_bind_address(":8080") == BindAddress("0.0.0.0", 8080)
    assert parse_bind_address("127.0.0.1:0") == BindAddress("127.0.0.1", 0)
    assert parse_bind_address("[::1]:9") == BindAddress("::1", 9)
    with pytest.raises(ValueError, match="port"):
        parse_bind_address("host:x")


async def test_probes_and_metrics() -> None:
    api, clock = FakeApi(), FakeClock()
    api.put(CONFIG_MAP, {"metadata": {"name": "a", "namespace": "ns"}})
    api.fail("list", TransportError("not yet"))
    mgr = Manager(options(), FakeClient(api), clock=clock)
    rec = Counting("toy")
    mgr.add_controller("toy", for_=CONFIG_MAP, reconciler=rec)
    run = asyncio.create_task(mgr.run())
    await eventually(lambda: mgr.metrics_port is not None and mgr.health_port is not None)
    assert await get(mgr.health_port, "/healthz") == (200, "ok")
    await eventually(lambda: mgr.cache.informer(CONFIG_MAP).errors == 1)
    status, body = await get(mgr.health_port, "/readyz")
    assert status == 500
    assert "informers" in body
    await advance_until(clock, lambda: mgr.ready)  # the list retry on the fake clock
    assert await get(mgr.health_port, "/readyz") == (200, "ok")
    await eventually(lambda: rec.calls == [ObjectKey("ns", "a")])
    _, text = await get(mgr.metrics_port, "/metrics")
    for name in (
        'controller_runtime_reconcile_total{controller="toy",result="success"} 1.0',
        "controller_runtime_reconcile_errors_total",
        "controller_runtime_reconcile_time_seconds_bucket",
        'controller_runtime_max_concurrent_reconciles{controller="toy"} 2.0',
        "controller_runtime_active_workers",
        'workqueue_depth{controller="toy",name="toy"}',
        'workqueue_adds_total{controller="toy",name="toy"} 1.0',
        "workqueue_queue_duration_seconds_bucket",
        "workqueue_work_duration_seconds_bucket",
        "workqueue_retries_total",
        'rest_client_requests_total{code="200",host="fake",method="GET"}',
    ):
        assert name in text, name
    mgr.stop()
    await run
    with pytest.raises(aiohttp.ClientConnectionError):
        await get(mgr.health_port, "/healthz")


async def test_two_managers_one_leader_and_handover_on_stop() -> None:
    api, clock = FakeApi(), FakeClock()
    for i in range(3):
        api.put(CONFIG_MAP, {"metadata": {"name": f"o{i}", "namespace": "ns"}})
    recs = [Counting("a"), Counting("b")]
    managers = []
    for i, rec in enumerate(recs):
        m = Manager(
            options(
                leader_elect=True,
                leader_election_namespace="ns",
                identity=f"m{i}",
                metrics_bind_address="0",
                health_probe_bind_address="0",
            ),
            FakeClient(api),
            clock=clock,
        )
        m.add_controller("toy", for_=CONFIG_MAP, reconciler=rec)
        managers.append(m)
    runs = [asyncio.create_task(managers[0].run())]
    await eventually(lambda: managers[0].leading.is_set())
    runs.append(asyncio.create_task(managers[1].run()))
    await eventually(lambda: len(recs[0].calls) == 3)
    with pytest.raises(AssertionError):  # 30 s of renewals: the standby stays out
        await advance_until(clock, lambda: managers[1].leading.is_set(), limit=30)
    assert recs[1].calls == []
    assert not managers[1].cache.informer(CONFIG_MAP).running  # no cache before leading
    managers[0].stop()  # SIGTERM: releases the lease
    await runs[0]
    assert (
        api.objects[LEASE][ObjectKey("ns", managers[0].options.leader_election_id)]["spec"][
            "holderIdentity"
        ]
        == ""
    )
    waited = await advance_until(clock, lambda: len(recs[1].calls) == 3, step=0.25)
    assert waited < 5.0  # the next poll, not a whole lease duration
    managers[1].stop()
    await runs[1]


async def test_lost_lease_stops_controllers_and_raises() -> None:
    api, clock = FakeApi(), FakeClock()
    m = Manager(
        options(
            leader_elect=True,
            leader_election_namespace="ns",
            metrics_bind_address="0",
            health_probe_bind_address="0",
        ),
        FakeClient(api),
        clock=clock,
    )
    m.add_controller("toy", for_=CONFIG_MAP, reconciler=Counting("x"))
    run = asyncio.create_task(m.run())
    await eventually(lambda: m.leading.is_set())
    api.fail("get", TransportError("partitioned"), times=10_000)
    waited = await advance_until(clock, run.done, step=0.25)
    assert waited <= 10.0 + 2.0 + 0.5
    with pytest.raises(LeadershipLost):
        await run
    assert m.controllers[0].queue.shutting_down
