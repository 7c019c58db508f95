"""What the scale-out benchmarks read from the manager's metrics (bench/runs.py)."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, generate_latest

from bench.runs import events_dropped
from capl.runtime.metrics import EventCollector


@dataclass
class _Recorder:
    written: int = 0
    aggregated: int = 0
    dropped: int = 0


def _exposition(recorder: _Recorder) -> str:
    registry = CollectorRegistry()
    registry.register(EventCollector(recorder))  # type: ignore[arg-type]
    return generate_latest(registry).decode()


def test_the_events_the_recorder_dropped_are_read_from_the_managers_metric() -> None:
    text = _exposition(_Recorder(written=2091, aggregated=3, dropped=909))
    assert events_dropped(text) == 909.0


def test_no_dropped_events_read_as_zero() -> None:
    assert events_dropped(_exposition(_Recorder(written=1000))) == 0.0
    assert events_dropped("") == 0.0
