"""Informer against the real API server: 410 after etcd compaction, an apiserver restart, and a
stalled (SIGSTOPped) apiserver. Each test ends by comparing the cache with a fresh list."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncGenerator
from typing import Any

import pytest

from capl.kube import KubeClient
from capl.runtime.client import ResourceClient, WatchEvent
from capl.runtime.errors import TransportError
from capl.runtime.informer import FuncHandler, Informer, InformerOptions
from capl.runtime.objects import Obj, ObjectKey
from capl.testbed import ControlPlane
from capl.testing.toy import TOY, toy
from tests.fixtures.runtime import eventually

pytestmark = pytest.mark.apiserver


class HoldableWatches:
    """Wraps a ResourceClient; `hold()` makes open watches drop events (as a connection that
    loses them would), `break_()` ends them with a transport error."""

    def __init__(self, inner: ResourceClient) -> None:
        self.inner = inner
        self.held = False
        self._break = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    @property
    def resource(self) -> Any:
        return self.inner.resource

    def hold(self) -> None:
        self.held = True

    def break_(self) -> None:
        self.held = False
        self._break.set()

    async def watch(self, **kwargs: Any) -> AsyncGenerator[WatchEvent, None]:
        self._break.clear()
        stream = self.inner.watch(**kwargs)
        async with contextlib.aclosing(stream):
            while True:
                nxt = asyncio.ensure_future(anext(stream))
                brk = asyncio.ensure_future(self._break.wait())
                done, _ = await asyncio.wait({nxt, brk}, return_when=asyncio.FIRST_COMPLETED)
                brk.cancel()
                if nxt not in done:
                    nxt.cancel()
                    with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                        await nxt
                    raise TransportError("connection broken (test)")
                try:
                    event = nxt.result()
                except StopAsyncIteration:
                    return
                if not self.held:
                    yield event


class Deltas:
    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    def handler(self) -> FuncHandler:
        return FuncHandler(
            add=lambda o: self.events.append(("add", o["metadata"]["name"])),
            update=lambda a, b: self.events.append(("update", b["metadata"]["name"])),
            delete=lambda o: self.events.append(("delete", o["metadata"]["name"])),
        )


async def fresh(kube: KubeClient, namespace: str) -> dict[ObjectKey, str]:
    result = await kube.resource(TOY).list(namespace=namespace)
    return {
        ObjectKey(namespace, o["metadata"]["name"]): o["metadata"]["resourceVersion"]
        for o in result.items
    }


def cached(informer: Informer) -> dict[ObjectKey, str]:
    out = {}
    for key in informer.store.list_keys():
        obj: Obj | None = informer.store.get(key)
        if obj is not None:
            out[key] = obj["metadata"]["resourceVersion"]
    return out


async def converged(informer: Informer, kube: KubeClient, namespace: str) -> None:
    for _ in range(100):
        if cached(informer) == await fresh(kube, namespace):
            return
        await asyncio.sleep(0.05)
    assert cached(informer) == await fresh(kube, namespace)


async def test_gone_after_compaction_relists_without_losing_keys(
    kube: KubeClient, namespace: str, control_plane: ControlPlane
) -> None:
    toys = kube.resource(TOY)
    for name in ("keep", "change", "remove"):
        await toys.create(toy(name, namespace))
    wrapper = HoldableWatches(toys)
    informer = Informer(
        wrapper,
        options=InformerOptions(namespace=namespace, backoff_initial=0.05),
    )
    deltas = Deltas()
    informer.add_handler(deltas.handler())
    informer.start()
    try:
        await informer.wait_synced()
        assert sorted(deltas.events) == [("add", "change"), ("add", "keep"), ("add", "remove")]
        wrapper.hold()  # the informer misses what follows
        await toys.patch(ObjectKey(namespace, "change"), {"spec": {"value": 2}})
        await toys.delete(ObjectKey(namespace, "remove"))
        await toys.create(toy("new", namespace))
        await control_plane.compact()
        wrapper.break_()  # resuming from the informer's old RV now needs history etcd dropped
        await eventually(lambda: informer.relists_after_gone >= 1, within=30)
        await converged(informer, kube, namespace)
        assert sorted(deltas.events[3:]) == [
            ("add", "new"),
            ("delete", "remove"),
            ("update", "change"),
        ]
        assert informer.lists == 2
        await toys.create(toy("after", namespace))  # the new watch works
        await eventually(lambda: ("add", "after") in deltas.events, within=30)
    finally:
        await informer.stop()


async def test_restarted_apiserver_loses_no_event(
    kube: KubeClient, namespace: str, control_plane: ControlPlane
) -> None:
    toys = kube.resource(TOY)
    informer = Informer(
        toys, options=InformerOptions(namespace=namespace, backoff_initial=0.1, backoff_max=1.0)
    )
    informer.start()
    try:
        await informer.wait_synced()
        for i in range(20):
            await toys.create(toy(f"before-{i}", namespace))
        # stop while events may still be in flight to the informer
        await control_plane.stop_apiserver(grace=5)
        await eventually(lambda: informer.errors >= 1, within=30)
        await control_plane.start_apiserver()
        for i in range(20):
            await toys.create(toy(f"after-{i}", namespace))
        await toys.patch(ObjectKey(namespace, "before-3"), {"spec": {"value": 7}})
        await toys.delete(ObjectKey(namespace, "before-4"))
        await converged(informer, kube, namespace)
        assert len(informer.store) == 39
    finally:
        await informer.stop()
        await control_plane.ensure_running()


async def test_stalled_watch_is_detected_and_restarted(
    kube: KubeClient, namespace: str, control_plane: ControlPlane
) -> None:
    toys = kube.resource(TOY)
    informer = Informer(
        toys,
        options=InformerOptions(
            namespace=namespace, inactivity_timeout=3.0, backoff_initial=0.1, backoff_max=1.0
        ),
    )
    informer.start()
    process = control_plane.apiserver_process
    assert process is not None
    assert process.pid is not None
    pid = process.pid
    try:
        await informer.wait_synced()
        await toys.create(toy("a", namespace))
        await eventually(lambda: len(informer.store) == 1, within=10)
        assert informer.stalls == 0
        os.kill(pid, signal.SIGSTOP)  # connections stay open, nothing arrives
        try:
            await eventually(lambda: informer.stalls >= 1, within=30)
        finally:
            os.kill(pid, signal.SIGCONT)
        await toys.create(toy("b", namespace))
        await converged(informer, kube, namespace)
        assert informer.watches >= 2
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
        await informer.stop()
