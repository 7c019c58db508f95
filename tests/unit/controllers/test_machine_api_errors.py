"""The LibvirtMachine reconciler when the API server does not answer: a capped backoff of its
own and one log line, never the work queue's growing backoff with a traceback."""

from __future__ import annotations

from typing import Any

import pytest
import structlog

from capl.controllers.common import Deps
from capl.controllers.machine import LibvirtMachineReconciler, MachineOptions
from capl.runtime.clock import FakeClock
from capl.runtime.controller import Result
from capl.runtime.errors import ApiError, Conflict, TransportError
from capl.runtime.events import NullRecorder
from capl.runtime.objects import ObjectKey


class _Client:
    def resource(self, resource: object) -> object:
        return object()


def _reconciler(options: MachineOptions) -> LibvirtMachineReconciler:
    deps = Deps(
        cache=object(),  # type: ignore[arg-type]
        client=_Client(),  # type: ignore[arg-type]
        recorder=NullRecorder(),
        hosts=object(),  # type: ignore[arg-type]
        workload=object(),  # type: ignore[arg-type]
        clock=FakeClock(),
    )
    return LibvirtMachineReconciler(deps, options=options)


async def test_unavailable_api_server_backs_off_capped_in_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reconciler = _reconciler(MachineOptions(retry_first=1.0, api_retry_max=5.0))
    errors: list[ApiError] = [
        TransportError("connection refused"),
        ApiError(503, "ServiceUnavailable", "etcd"),
        ApiError(429, "TooManyRequests", "slow down"),
        TransportError("reset"),
        TransportError("reset"),
    ]
    outcome: list[Any] = []

    async def failing(key: ObjectKey) -> Result:
        if errors:
            raise errors.pop(0)
        return Result()

    monkeypatch.setattr(reconciler, "_reconcile", failing)
    key = ObjectKey("ns", "m")
    with structlog.testing.capture_logs() as logs:
        for _ in range(6):
            outcome.append(await reconciler.reconcile(key))
    delays = [r.requeue_after for r in outcome]
    assert delays == [1.0, 2.0, 4.0, 5.0, 5.0, None]
    warnings = [entry for entry in logs if entry["log_level"] == "warning"]
    assert len(warnings) == 5
    assert all("exc_info" not in entry for entry in warnings)
    # success resets the backoff
    errors.append(TransportError("again"))
    assert (await reconciler.reconcile(key)).requeue_after == 1.0


async def test_other_api_errors_still_reach_the_controller(monkeypatch: pytest.MonkeyPatch) -> None:
    reconciler = _reconciler(MachineOptions())

    async def conflict(key: ObjectKey) -> Result:
        raise Conflict(409, "Conflict", "stale")

    monkeypatch.setattr(reconciler, "_reconcile", conflict)
    with pytest.raises(Conflict):
        await reconciler.reconcile(ObjectKey("ns", "m"))
