"""Event recorder: core/v1 Events, aggregation of repeats, never failing the caller."""

from __future__ import annotations

from capl.runtime.clock import FakeClock
from capl.runtime.errors import ApiError
from capl.runtime.events import EventRecorder
from capl.runtime.metrics import EventCollector, RuntimeMetrics
from capl.runtime.resources import EVENT
from tests.fixtures.runtime import FakeApi, FakeClient

OBJ = {
    "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1",
    "kind": "LibvirtMachine",
    "metadata": {"name": "m1", "namespace": "ns", "uid": "u1", "resourceVersion": "7"},
}


async def test_identical_events_are_aggregated() -> None:
    api, clock = FakeApi(), FakeClock()
    rec = EventRecorder(FakeClient(api).resource(EVENT), clock=clock, instance="host-1")
    for _ in range(3):
        rec.event(OBJ, "Normal", "DomainCreated", "domain m1 defined")
    rec.event(OBJ, "Warning", "BootFailed", "no bootable disk")
    await rec.flush()
    events = list(api.objects[EVENT].values())
    assert len(events) == 2
    created = next(e for e in events if e["reason"] == "DomainCreated")
    assert created["count"] == 3
    assert created["type"] == "Normal"
    assert created["involvedObject"] == {
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1",
        "kind": "LibvirtMachine",
        "name": "m1",
        "namespace": "ns",
        "uid": "u1",
        "resourceVersion": "7",
    }
    assert created["reportingComponent"] == "capl"
    assert created["source"] == {"component": "capl", "host": "host-1"}
    assert created["metadata"]["namespace"] == "ns"
    assert rec.written == 2
    assert rec.aggregated == 2
    # after the window a new Event object is created
    clock.advance(601)
    rec.event(OBJ, "Normal", "DomainCreated", "domain m1 defined")
    await rec.flush()
    assert len(api.objects[EVENT]) == 3
    await rec.close()


async def test_event_errors_never_reach_the_caller() -> None:
    api = FakeApi()
    rec = EventRecorder(FakeClient(api).resource(EVENT), clock=FakeClock())
    api.fail("create", ApiError(500, "InternalError", "etcd down"))
    rec.event(OBJ, "Warning", "X", "y")  # must not raise
    await rec.flush()
    assert rec.written == 0
    rec.event(OBJ, "Warning", "X", "y")
    await rec.flush()
    assert rec.written == 1
    await rec.close()


async def test_deleted_event_is_recreated() -> None:
    api = FakeApi()
    client = FakeClient(api).resource(EVENT)
    rec = EventRecorder(client, clock=FakeClock())
    rec.event(OBJ, "Normal", "A", "b")
    await rec.flush()
    (key,) = api.objects[EVENT]
    await client.delete(key)
    rec.event(OBJ, "Normal", "A", "b")
    await rec.flush()
    assert [e["count"] for e in api.objects[EVENT].values()] == [1]
    await rec.close()


async def test_events_beyond_the_queue_are_dropped_and_counted_in_metrics() -> None:
    api = FakeApi()
    rec = EventRecorder(
        FakeClient(api).resource(EVENT), clock=FakeClock(), instance="h", max_pending=2
    )
    metrics = RuntimeMetrics()
    metrics.register_collector(EventCollector(rec))
    for i in range(4):  # nothing is written before the first await: two fit, two do not
        rec.event({**OBJ, "metadata": {**OBJ["metadata"], "name": f"m{i}"}}, "Normal", "R", "m")
    rec.event({**OBJ, "metadata": {**OBJ["metadata"], "name": "m0"}}, "Normal", "R", "m")
    await rec.flush()
    assert (rec.written, rec.dropped) == (2, 3)
    text = metrics.exposition().decode()
    assert 'capl_events_total{result="written"} 2.0' in text
    assert 'capl_events_total{result="dropped"} 3.0' in text
    assert 'capl_events_total{result="aggregated"} 0.0' in text
