"""Prometheus metrics with controller-runtime / client-go names, on a dedicated registry.

`RuntimeMetrics` owns one `CollectorRegistry` (the manager serves it on --metrics-bind-address),
so several managers in one process (tests) never collide on the global registry. Metric names
and labels follow controller-runtime so existing dashboards work:

- controller_runtime_reconcile_total{controller,result}, controller_runtime_reconcile_errors_total,
  controller_runtime_reconcile_time_seconds, controller_runtime_active_workers,
  controller_runtime_max_concurrent_reconciles
- workqueue_depth, workqueue_adds_total, workqueue_queue_duration_seconds,
  workqueue_work_duration_seconds, workqueue_retries_total, workqueue_unfinished_work_seconds,
  workqueue_longest_running_processor_seconds (labels controller and name, same value)
- rest_client_requests_total{code,method,host} and rest_client_request_duration_seconds{verb,host}
  from `RequestStats`, which also keeps in-process counters (per object when asked) that tests and
  benchmarks read directly.
- leader_election_master_status{name}
- capl_events_total{result}: Events written, aggregated into an existing Event's count, or
  dropped because the recorder's queue was full (bounded like client-go's broadcaster; a
  burst of thousands of new machines drops some of their Events)
"""

from __future__ import annotations

import bisect
from collections import Counter as _Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from capl.runtime.objects import ObjectKey
from capl.runtime.resources import Resource

WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_RECONCILE_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.6, 0.7, 0.8,
    0.9, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5, 6, 7, 8, 9, 10, 15, 20, 25, 30,
    40, 50, 60,
)  # fmt: skip
_QUEUE_BUCKETS = tuple(1e-8 * 10**i for i in range(12))


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """Per-object request counter key."""

    method: str
    resource: str
    key: ObjectKey | None
    subresource: str


class RequestStats:
    """Counts API requests; a prometheus collector for rest_client_* metrics.

    With `track_objects=True` it also counts requests per (method, resource, object, subresource),
    which is what tests use to assert "one status patch per object". Tracking grows with the number
    of distinct objects, so it is off by default.
    """

    def __init__(self, *, host: str = "", track_objects: bool = False) -> None:
        self.host = host
        self.track_objects = track_objects
        self._by_code: _Counter[tuple[str, str]] = _Counter()
        self._by_object: _Counter[RequestRecord] = _Counter()
        self._lat_buckets: dict[str, list[int]] = {}
        self._lat_sum: dict[str, float] = {}

    def record(
        self,
        method: str,
        code: int,
        *,
        resource: Resource | None = None,
        key: ObjectKey | None = None,
        subresource: str = "",
        duration: float | None = None,
    ) -> None:
        self._by_code[(method, "<error>" if code == 0 else str(code))] += 1
        if self.track_objects and resource is not None:
            self._by_object[RequestRecord(method, str(resource), key, subresource)] += 1
        if duration is not None:
            buckets = self._lat_buckets.get(method)
            if buckets is None:
                buckets = self._lat_buckets[method] = [0] * (len(_LATENCY_BUCKETS) + 1)
                self._lat_sum[method] = 0.0
            buckets[bisect.bisect_left(_LATENCY_BUCKETS, duration)] += 1
            self._lat_sum[method] += duration

    def total(self, *, method: str | None = None, code: int | None = None) -> int:
        return sum(
            n
            for (m, c), n in self._by_code.items()
            if (method is None or m == method) and (code is None or c == str(code))
        )

    def writes_total(self) -> int:
        return sum(n for (m, _), n in self._by_code.items() if m in WRITE_METHODS)

    def object_counts(
        self,
        *,
        resource: Resource | None = None,
        key: ObjectKey | None = None,
        method: str | None = None,
        subresource: str | None = None,
    ) -> dict[RequestRecord, int]:
        """Per-object counters (only with track_objects) matching the filters."""
        res = None if resource is None else str(resource)
        return {
            r: n
            for r, n in self._by_object.items()
            if (res is None or r.resource == res)
            and (key is None or r.key == key)
            and (method is None or r.method == method)
            and (subresource is None or r.subresource == subresource)
        }

    def writes(self, *, resource: Resource | None = None, key: ObjectKey | None = None) -> int:
        """Write requests (POST/PUT/PATCH/DELETE) for a resource and/or object."""
        return sum(
            n
            for r, n in self.object_counts(resource=resource, key=key).items()
            if r.method in WRITE_METHODS
        )

    def reset(self) -> None:
        self._by_code.clear()
        self._by_object.clear()
        self._lat_buckets.clear()
        self._lat_sum.clear()

    def describe(self) -> Iterable[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        requests = CounterMetricFamily(
            "rest_client_requests_total",
            "Number of HTTP requests, partitioned by status code, method, and host.",
            labels=["code", "method", "host"],
        )
        for (method, code), n in sorted(self._by_code.items()):
            requests.add_metric([code, method, self.host], n)
        yield requests
        latency = HistogramMetricFamily(
            "rest_client_request_duration_seconds",
            "Request latency in seconds. Broken down by verb, and host.",
            labels=["verb", "host"],
        )
        for method, counts in sorted(self._lat_buckets.items()):
            cumulative: list[tuple[str, float]] = []
            acc = 0
            for bound, n in zip((*_LATENCY_BUCKETS, float("inf")), counts, strict=True):
                acc += n
                cumulative.append(("+Inf" if bound == float("inf") else repr(bound), acc))
            latency.add_metric([method, self.host], cumulative, self._lat_sum[method])
        yield latency


class QueueGauges(Protocol):
    """What a work queue exposes for the depth/unfinished gauges (read at scrape time)."""

    name: str

    def depth(self) -> int: ...

    def unfinished_work_seconds(self) -> float: ...

    def longest_running_processor_seconds(self) -> float: ...


class QueueMetrics:
    """The per-queue handles a WorkQueue updates (histogram children looked up once)."""

    def __init__(self, metrics: RuntimeMetrics | None, name: str) -> None:
        self.name = name
        if metrics is None:
            self.enabled = False
            return
        self.enabled = True
        self.adds = metrics.workqueue_adds.labels(name, name)
        self.retries = metrics.workqueue_retries.labels(name, name)
        self.queue_duration = metrics.workqueue_queue_duration.labels(name, name)
        self.work_duration = metrics.workqueue_work_duration.labels(name, name)


class _QueueCollector:
    def __init__(self) -> None:
        self.queues: list[QueueGauges] = []

    def describe(self) -> Iterable[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        depth = GaugeMetricFamily(
            "workqueue_depth", "Current depth of workqueue", labels=["controller", "name"]
        )
        unfinished = GaugeMetricFamily(
            "workqueue_unfinished_work_seconds",
            "How many seconds of work has been done that is in progress and hasn't been "
            "observed by work_duration.",
            labels=["controller", "name"],
        )
        longest = GaugeMetricFamily(
            "workqueue_longest_running_processor_seconds",
            "How many seconds has the longest running processor for workqueue been running.",
            labels=["controller", "name"],
        )
        for q in self.queues:
            depth.add_metric([q.name, q.name], q.depth())
            unfinished.add_metric([q.name, q.name], q.unfinished_work_seconds())
            longest.add_metric([q.name, q.name], q.longest_running_processor_seconds())
        yield depth
        yield unfinished
        yield longest


class EventCounts(Protocol):
    """What an event recorder has done so far (``capl.runtime.events.EventRecorder``)."""

    written: int
    aggregated: int
    dropped: int


class EventCollector:
    """``capl_events_total{result}``, read from an event recorder at scrape time."""

    def __init__(self, recorder: EventCounts) -> None:
        self.recorder = recorder

    def describe(self) -> Iterable[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        family = CounterMetricFamily(
            "capl_events", "Kubernetes Events by what became of them", labels=["result"]
        )
        family.add_metric(["written"], self.recorder.written)
        family.add_metric(["aggregated"], self.recorder.aggregated)
        family.add_metric(["dropped"], self.recorder.dropped)
        yield family


class RuntimeMetrics:
    """All runtime metrics on one registry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.reconcile_total = Counter(
            "controller_runtime_reconcile_total",
            "Total number of reconciliations per controller",
            ["controller", "result"],
            registry=r,
        )
        self.reconcile_errors = Counter(
            "controller_runtime_reconcile_errors_total",
            "Total number of reconciliation errors per controller",
            ["controller"],
            registry=r,
        )
        self.reconcile_time = Histogram(
            "controller_runtime_reconcile_time_seconds",
            "Length of time per reconciliation per controller",
            ["controller"],
            buckets=_RECONCILE_BUCKETS,
            registry=r,
        )
        self.active_workers = Gauge(
            "controller_runtime_active_workers",
            "Number of currently used workers per controller",
            ["controller"],
            registry=r,
        )
        self.max_concurrent_reconciles = Gauge(
            "controller_runtime_max_concurrent_reconciles",
            "Maximum number of concurrent reconciles per controller",
            ["controller"],
            registry=r,
        )
        self.workqueue_adds = Counter(
            "workqueue_adds_total",
            "Total number of adds handled by workqueue",
            ["controller", "name"],
            registry=r,
        )
        self.workqueue_retries = Counter(
            "workqueue_retries_total",
            "Total number of retries handled by workqueue",
            ["controller", "name"],
            registry=r,
        )
        self.workqueue_queue_duration = Histogram(
            "workqueue_queue_duration_seconds",
            "How long in seconds an item stays in workqueue before being requested",
            ["controller", "name"],
            buckets=_QUEUE_BUCKETS,
            registry=r,
        )
        self.workqueue_work_duration = Histogram(
            "workqueue_work_duration_seconds",
            "How long in seconds processing an item from workqueue takes.",
            ["controller", "name"],
            buckets=_QUEUE_BUCKETS,
            registry=r,
        )
        self.leader_election_master_status = Gauge(
            "leader_election_master_status",
            "Gauge of if the reporting system is master of the relevant lease, 0 indicates "
            "backup, 1 indicates master. 'name' is the string used to identify the lease.",
            ["name"],
            registry=r,
        )
        self._queues = _QueueCollector()
        r.register(self._queues)
        self._extra: list[object] = []

    def queue(self, name: str, gauges: QueueGauges | None = None) -> QueueMetrics:
        """Handles for a named work queue; `gauges` is read at scrape time for depth etc."""
        if gauges is not None:
            self._queues.queues.append(gauges)
        return QueueMetrics(self, name)

    def forget_queue(self, gauges: QueueGauges) -> None:
        if gauges in self._queues.queues:
            self._queues.queues.remove(gauges)

    def register_collector(self, collector: object) -> None:
        """Add a custom collector (e.g. a client's RequestStats) once."""
        if any(c is collector for c in self._extra):
            return
        self._extra.append(collector)
        self.registry.register(collector)  # type: ignore[arg-type]

    def exposition(self) -> bytes:
        from prometheus_client import generate_latest

        data: bytes = generate_latest(self.registry)
        return data
