"""Controller behaviour on the in-memory API: predicates, mapping, results, errors, metrics."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest
import structlog

from capl.runtime.clock import FakeClock
from capl.runtime.controller import (
    TRANSIENT_RETRY_MAX,
    Controller,
    ControllerOptions,
    Result,
    Watch,
    label_filter,
)
from capl.runtime.errors import ApiError, Conflict, TransportError
from capl.runtime.handlers import (
    SkipStatusOnlyUpdates,
    field_indexer,
    map_by_name_index,
    map_cluster_members,
    map_owner,
    map_ref,
    map_via,
)
from capl.runtime.informer import Cache
from capl.runtime.metrics import RuntimeMetrics
from capl.runtime.objects import CLUSTER_NAME_LABEL, Obj, ObjectKey, copy_obj
from capl.runtime.patch import apply_patch
from capl.runtime.resources import CLUSTER, CONFIG_MAP, LIBVIRT_MACHINE, MACHINE, SECRET, Resource
from tests.fixtures.runtime import FakeApi, FakeClient, eventually


class Toy:
    """Sets status.observed = spec.value; optional scripted outcomes per call."""

    def __init__(self, cache: Cache, client: FakeClient, resource: Any = CONFIG_MAP) -> None:
        self.cache = cache
        self.client = client
        self.resource = resource
        self.calls: list[ObjectKey] = []
        self.script: list[Any] = []
        self.running = 0
        self.max_running = 0
        self.gate: asyncio.Event | None = None
        self.contexts: list[dict[str, Any]] = []

    async def reconcile(self, key: ObjectKey) -> Result:
        self.calls.append(key)
        self.contexts.append(structlog.contextvars.get_contextvars())
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        try:
            if self.gate is not None:
                await self.gate.wait()
            if self.script:
                outcome = self.script.pop(0)
                if isinstance(outcome, BaseException):
                    raise outcome
                if isinstance(outcome, Result):
                    return outcome
            obj = self.cache.get(self.resource, key)
            if obj is None:
                return Result()
            desired = copy_obj(obj)
            desired["status"] = {"observed": obj.get("spec", {}).get("value")}
            await apply_patch(self.client.resource(self.resource), obj, desired)
            return Result()
        finally:
            self.running -= 1


def thing(name: str, value: int = 1, ns: str = "ns", labels: dict[str, str] | None = None) -> Obj:
    return {
        "metadata": {"name": name, "namespace": ns, "labels": labels or {}},
        "spec": {"value": value},
    }


@pytest.fixture
async def env() -> AsyncIterator[tuple[FakeApi, FakeClient, Cache, FakeClock, RuntimeMetrics]]:
    api = FakeApi()
    client = FakeClient(api)
    clock = FakeClock()
    cache = Cache(client, clock=clock)
    yield api, client, cache, clock, RuntimeMetrics()
    await cache.stop()


def controller(
    env: Any,
    toy: Toy,
    *,
    name: str = "toy",
    for_: Resource = CONFIG_MAP,
    watches: Sequence[Watch] = (),
    metrics: bool = False,
    **options: Any,
) -> Controller:
    """A Controller of `toy` on the env's cache and fake clock (`options`: ControllerOptions;
    `metrics`: count into the env's RuntimeMetrics)."""
    _, _, cache, clock, runtime_metrics = env
    return Controller(
        name,
        for_=for_,
        reconciler=toy,
        cache=cache,
        clock=clock,
        watches=watches,
        metrics=runtime_metrics if metrics else None,
        options=ControllerOptions(**options),
    )


async def start(ctrl: Controller) -> asyncio.Task[None]:
    task = asyncio.create_task(ctrl.run())
    await ctrl.wait_synced()
    return task


async def test_reconciles_each_object_once_and_skips_its_own_status_writes(env: Any) -> None:
    api, client, cache, _clock, metrics = env
    for i in range(20):
        api.put(CONFIG_MAP, thing(f"t{i}", i))
    toy = Toy(cache, client)
    ctrl = controller(env, toy, metrics=True, concurrency=4)
    task = await start(ctrl)
    await eventually(lambda: all(o.get("status") for o in api.objects[CONFIG_MAP].values()))
    await eventually(lambda: all(o.get("status") for o in cache.list(CONFIG_MAP)))
    await eventually(lambda: ctrl.queue.depth() == 0 and not ctrl.queue.processing)
    assert len(toy.calls) == 20
    for i in range(20):
        assert api.stats.writes(resource=CONFIG_MAP, key=ObjectKey("ns", f"t{i}")) == 1
    # a resync with nothing to do: every key reconciled again, zero writes
    writes = api.stats.writes_total()
    cache.informer(CONFIG_MAP).resync()
    await eventually(lambda: len(toy.calls) == 40)
    await eventually(lambda: ctrl.queue.depth() == 0 and not ctrl.queue.processing)
    assert api.stats.writes_total() == writes
    # a spec change is reconciled
    await client.resource(CONFIG_MAP).patch(ObjectKey("ns", "t3"), {"spec": {"value": 99}})
    await eventually(
        lambda: api.objects[CONFIG_MAP][ObjectKey("ns", "t3")]["status"] == {"observed": 99}
    )
    reg = metrics.registry
    assert reg.get_sample_value(
        "controller_runtime_reconcile_total", {"controller": "toy", "result": "success"}
    ) == len(toy.calls)
    assert (
        reg.get_sample_value("controller_runtime_max_concurrent_reconciles", {"controller": "toy"})
        == 4
    )
    assert reg.get_sample_value("controller_runtime_active_workers", {"controller": "toy"}) == 0
    await ctrl.shutdown()
    await task


async def test_logging_context_is_bound_per_reconcile(env: Any) -> None:
    api, client, cache, _clock, _ = env
    api.put(CONFIG_MAP, thing("a"))
    toy = Toy(cache, client)
    ctrl = controller(env, toy)
    task = await start(ctrl)
    await eventually(lambda: len(toy.calls) == 1)
    ctx = toy.contexts[0]
    assert ctx["controller"] == "toy"
    assert ctx["kind"] == "ConfigMap"
    assert (ctx["namespace"], ctx["name"]) == ("ns", "a")
    assert len(ctx["reconcileID"]) == 36
    await ctrl.shutdown()
    await task


async def test_results_and_errors(env: Any) -> None:
    api, client, cache, clock, metrics = env
    api.put(CONFIG_MAP, thing("a"))
    toy = Toy(cache, client)
    toy.script = [
        RuntimeError("boom"),
        Conflict(409, "Conflict", "modified"),
        Result(requeue=True),
        Result(requeue_after=30.0),
    ]
    ctrl = controller(env, toy, metrics=True)
    task = await start(ctrl)
    key = ObjectKey("ns", "a")
    await eventually(lambda: len(toy.calls) == 1)
    await eventually(lambda: key in ctrl.queue.waiting)
    assert ctrl.queue.num_requeues(key) == 1
    clock.advance(0.005)  # first backoff
    await eventually(lambda: len(toy.calls) == 2)  # conflict
    await eventually(lambda: key in ctrl.queue.waiting)
    clock.advance(0.01)
    await eventually(lambda: len(toy.calls) == 3)  # requeue=True
    await eventually(lambda: key in ctrl.queue.waiting)
    clock.advance(0.02)
    await eventually(lambda: len(toy.calls) == 4)  # requeue_after=30
    await eventually(lambda: key in ctrl.queue.waiting)
    assert ctrl.queue.num_requeues(key) == 0  # forgotten
    clock.advance(29.9)
    assert len(toy.calls) == 4
    clock.advance(0.1)
    await eventually(lambda: len(toy.calls) == 5)  # the real reconcile
    reg = metrics.registry

    def total(result: str) -> Any:
        return reg.get_sample_value(
            "controller_runtime_reconcile_total", {"controller": "toy", "result": result}
        )

    await eventually(lambda: total("success") == 1)
    assert total("error") == 1
    assert total("requeue") == 2
    assert total("requeue_after") == 1
    assert (
        reg.get_sample_value("controller_runtime_reconcile_errors_total", {"controller": "toy"})
        == 1
    )
    await ctrl.shutdown()
    await task


async def test_unavailable_api_server_retries_without_traceback_and_capped_delay(
    env: Any,
) -> None:
    """An outage long enough to push the key's exponential backoff past the cap: every retry
    still comes within TRANSIENT_RETRY_MAX, each failure logs one warning without a
    traceback; a plain error afterwards is still reported with its traceback."""
    api, client, cache, clock, _ = env
    api.put(CONFIG_MAP, thing("a"))
    toy = Toy(cache, client)
    outage = 16  # 0.005 s * 2**15 is far past the cap
    toy.script = [
        *(TransportError("connection refused") for _ in range(outage - 1)),
        ApiError(503, "ServiceUnavailable", "etcd is gone"),
        RuntimeError("boom"),
    ]
    ctrl = controller(env, toy)
    key = ObjectKey("ns", "a")
    with structlog.testing.capture_logs() as logs:
        task = await start(ctrl)
        for attempt in range(1, outage + 1):
            await eventually(lambda n=attempt: len(toy.calls) == n)
            await eventually(lambda: key in ctrl.queue.waiting)
            clock.advance(TRANSIENT_RETRY_MAX)
        await eventually(lambda: len(toy.calls) == outage + 1)
        await eventually(lambda: key in ctrl.queue.waiting)
    warnings = [e for e in logs if e["event"] == "API server unavailable"]
    assert len(warnings) == outage
    assert all(e["log_level"] == "warning" and "exc_info" not in e for e in warnings)
    assert max(e["retry_in"] for e in warnings) == TRANSIENT_RETRY_MAX
    failed = [e for e in logs if e["event"] == "reconcile failed"]
    assert len(failed) == 1
    assert failed[0].get("exc_info")
    await ctrl.shutdown()
    await task


async def test_events_during_a_reconcile_give_one_rerun(env: Any) -> None:
    api, client, cache, _clock, _ = env
    api.put(CONFIG_MAP, thing("a"))
    toy = Toy(cache, client)
    toy.gate = asyncio.Event()
    ctrl = controller(env, toy, concurrency=3)
    task = await start(ctrl)
    await eventually(lambda: len(toy.calls) == 1)
    rc = client.resource(CONFIG_MAP)
    for v in range(2, 7):
        await rc.patch(ObjectKey("ns", "a"), {"spec": {"value": v}})
    await eventually(lambda: cache.get(CONFIG_MAP, ObjectKey("ns", "a"))["spec"]["value"] == 6)
    assert len(toy.calls) == 1
    assert toy.max_running == 1
    toy.gate.set()
    await eventually(lambda: len(toy.calls) == 2)
    await eventually(lambda: ctrl.queue.depth() == 0 and not ctrl.queue.processing)
    assert len(toy.calls) == 2
    assert toy.max_running == 1
    await ctrl.shutdown()
    await task


def test_status_only_predicate() -> None:
    p = SkipStatusOnlyUpdates()
    old = {"metadata": {"name": "a", "resourceVersion": "1", "generation": 1}, "spec": {}}
    status_only = copy_obj(old)
    status_only["metadata"]["resourceVersion"] = "2"
    status_only["status"] = {"x": 1}
    assert not p.update(old, status_only)
    assert p.update(old, old)  # resync
    for change in (
        {"generation": 2},
        {"labels": {"a": "b"}},
        {"annotations": {"a": "b"}},
        {"finalizers": ["f"]},
        {"deletionTimestamp": "now"},
        {"ownerReferences": [{"uid": "u"}]},
    ):
        new = copy_obj(status_only)
        new["metadata"].update(change)
        assert p.update(old, new), change
    # kinds without generation: anything but status counts
    a = {"metadata": {"name": "a", "resourceVersion": "1"}, "data": {"k": "1"}}
    b = copy_obj(a)
    b["metadata"]["resourceVersion"] = "2"
    assert not p.update(a, b)
    b["data"]["k"] = "2"
    assert p.update(a, b)


def test_mappers() -> None:
    machine = {
        "metadata": {"name": "m", "namespace": "ns"},
        "spec": {
            "infrastructureRef": {
                "apiGroup": "infrastructure.cluster.x-k8s.io",
                "kind": "LibvirtMachine",
                "name": "lm",
            }
        },
    }
    assert list(map_ref("spec", "infrastructureRef", kind="LibvirtMachine")(machine)) == [
        ObjectKey("ns", "lm")
    ]
    assert list(map_ref("spec", "infrastructureRef", kind="Other")(machine)) == []
    assert list(
        map_ref("spec", "infrastructureRef", api_group="infrastructure.cluster.x-k8s.io")(machine)
    ) == [ObjectKey("ns", "lm")]
    assert list(map_ref("spec", "missing")(machine)) == []
    owned = {
        "metadata": {
            "name": "x",
            "namespace": "ns",
            "ownerReferences": [
                {
                    "apiVersion": "cluster.x-k8s.io/v1beta2",
                    "kind": "Machine",
                    "name": "m1",
                    "uid": "1",
                },
                {"apiVersion": "v1", "kind": "Other", "name": "o", "uid": "2"},
            ],
        }
    }
    assert list(map_owner("Machine", api_group="cluster.x-k8s.io")(owned)) == [
        ObjectKey("ns", "m1")
    ]


async def test_secondary_watches_map_to_primary_keys(env: Any) -> None:
    api, client, cache, _clock, _ = env
    api.put(LIBVIRT_MACHINE, thing("lm1", labels={CLUSTER_NAME_LABEL: "c1"}))
    api.put(LIBVIRT_MACHINE, thing("lm2", labels={CLUSTER_NAME_LABEL: "c1"}))
    api.put(LIBVIRT_MACHINE, thing("lm3", labels={CLUSTER_NAME_LABEL: "c2"}))
    toy = Toy(cache, client, LIBVIRT_MACHINE)
    ctrl = controller(
        env,
        toy,
        name="lm",
        for_=LIBVIRT_MACHINE,
        watches=[
            Watch(MACHINE, map_ref("spec", "infrastructureRef", kind="LibvirtMachine")),
            Watch(CLUSTER, map_cluster_members(cache, LIBVIRT_MACHINE)),
            Watch(
                SECRET,
                lambda s: [ObjectKey("ns", "lm3")] if s["metadata"]["name"] == "boot" else [],
            ),
        ],
    )
    task = await start(ctrl)
    await eventually(lambda: len(toy.calls) == 3)
    await eventually(lambda: ctrl.queue.depth() == 0 and not ctrl.queue.processing)
    toy.calls.clear()
    await client.resource(MACHINE).create(
        {
            "metadata": {"name": "m1", "namespace": "ns"},
            "spec": {"infrastructureRef": {"kind": "LibvirtMachine", "name": "lm1"}},
        }
    )
    await eventually(lambda: toy.calls == [ObjectKey("ns", "lm1")])
    await eventually(lambda: not ctrl.queue.processing)
    toy.calls.clear()
    await client.resource(CLUSTER).create({"metadata": {"name": "c1", "namespace": "ns"}})
    await eventually(lambda: sorted(toy.calls) == [ObjectKey("ns", "lm1"), ObjectKey("ns", "lm2")])
    await eventually(lambda: not ctrl.queue.processing)
    toy.calls.clear()
    # status-only updates of secondaries still map (e.g. Cluster infrastructure provisioned)
    await client.resource(CLUSTER).patch_status(ObjectKey("ns", "c1"), {"status": {"x": 1}})
    await eventually(lambda: sorted(toy.calls) == [ObjectKey("ns", "lm1"), ObjectKey("ns", "lm2")])
    await eventually(lambda: not ctrl.queue.processing)
    toy.calls.clear()
    await client.resource(SECRET).create({"metadata": {"name": "boot", "namespace": "ns"}})
    await eventually(lambda: toy.calls == [ObjectKey("ns", "lm3")])
    await ctrl.shutdown()
    await task


async def test_key_filter_and_external_trigger(env: Any) -> None:
    api, client, cache, _clock, _ = env
    api.put(CONFIG_MAP, thing("mine", labels={"cluster.x-k8s.io/watch-filter": "x"}))
    api.put(CONFIG_MAP, thing("other"))
    toy = Toy(cache, client)
    ctrl = controller(env, toy, key_filter=label_filter("cluster.x-k8s.io/watch-filter", "x"))
    task = await start(ctrl)
    await eventually(lambda: toy.calls == [ObjectKey("ns", "mine")])
    await eventually(lambda: not ctrl.queue.processing)
    ctrl.enqueue(ObjectKey("ns", "external"))
    await eventually(lambda: toy.calls[-1] == ObjectKey("ns", "external"))
    await eventually(lambda: not ctrl.queue.processing)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, ctrl.enqueue_threadsafe, ObjectKey("ns", "from-thread"))
    await eventually(lambda: toy.calls[-1] == ObjectKey("ns", "from-thread"))
    await ctrl.shutdown()
    await task


async def test_graceful_shutdown_waits_for_in_flight_reconciles(env: Any) -> None:
    api, client, cache, _clock, _ = env
    api.put(CONFIG_MAP, thing("a"))
    api.put(CONFIG_MAP, thing("b"))
    toy = Toy(cache, client)
    toy.gate = asyncio.Event()
    ctrl = controller(env, toy, concurrency=1)
    task = await start(ctrl)
    await eventually(lambda: len(toy.calls) == 1)
    stopping = asyncio.create_task(ctrl.shutdown(grace=30))
    await asyncio.sleep(0)
    assert not stopping.done()
    toy.gate.set()
    await stopping
    await task
    assert len(toy.calls) == 1  # b was never started: no new work after shutdown
    assert api.stats.writes_total() == 1  # a finished its write


async def test_secret_to_machine_to_libvirt_machine(env: Any) -> None:
    api, client, cache, _clock, _ = env
    cache.informer(MACHINE).add_indexer(
        "bootstrap-secret", field_indexer("spec", "bootstrap", "dataSecretName")
    )
    api.put(LIBVIRT_MACHINE, thing("lm1"))
    api.put(LIBVIRT_MACHINE, thing("lm2"))
    for machine, infra, secret in (("m1", "lm1", "boot-1"), ("m2", "lm2", "boot-2")):
        api.put(
            MACHINE,
            {
                "metadata": {"name": machine, "namespace": "ns"},
                "spec": {
                    "bootstrap": {"dataSecretName": secret},
                    "infrastructureRef": {"kind": "LibvirtMachine", "name": infra},
                },
            },
        )
    toy = Toy(cache, client, LIBVIRT_MACHINE)
    mapper = map_via(
        cache,
        MACHINE,
        map_by_name_index(cache, MACHINE, "bootstrap-secret"),
        map_ref("spec", "infrastructureRef", kind="LibvirtMachine"),
    )
    ctrl = controller(
        env,
        toy,
        name="lm",
        for_=LIBVIRT_MACHINE,
        watches=[
            Watch(MACHINE, map_ref("spec", "infrastructureRef", kind="LibvirtMachine")),
            Watch(SECRET, mapper),
        ],
    )
    task = await start(ctrl)
    await eventually(lambda: len(toy.calls) == 2)
    await eventually(lambda: not ctrl.queue.processing and ctrl.queue.depth() == 0)
    toy.calls.clear()
    await client.resource(SECRET).create({"metadata": {"name": "boot-2", "namespace": "ns"}})
    await eventually(lambda: toy.calls == [ObjectKey("ns", "lm2")])
    await ctrl.shutdown()
    await task
