"""A toy controller on the real API server: 1,000 objects driven to a status value with exactly
one status patch each, no writes on a resync with nothing to do; probes and metrics served."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from capl.kube import KubeClient
from capl.runtime.manager import Manager, ManagerOptions
from capl.runtime.objects import ObjectKey
from capl.testing.toy import TOY, ToyReconciler, toy
from tests.fixtures.runtime import eventually

pytestmark = pytest.mark.apiserver

N = 1000


async def create_many(kube: KubeClient, namespace: str, n: int) -> None:
    toys = kube.resource(TOY)
    sem = asyncio.Semaphore(16)

    async def one(i: int) -> None:
        async with sem:
            await toys.create(toy(f"toy-{i:04d}", namespace, i))

    await asyncio.gather(*(one(i) for i in range(n)))


async def http_get(port: int | None, path: str) -> tuple[int, str]:
    assert port
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}{path}") as r:
        return r.status, await r.text()


async def test_thousand_objects_one_status_patch_each(kube: KubeClient, namespace: str) -> None:
    await create_many(kube, namespace, N)
    kube.stats.reset()
    manager = Manager(
        ManagerOptions(
            namespace=namespace,
            concurrency=10,
            metrics_bind_address="127.0.0.1:0",
            health_probe_bind_address="127.0.0.1:0",
            handle_signals=False,
        ),
        kube,
    )
    reconciler = ToyReconciler(manager.cache, kube)
    controller = manager.add_controller("toy", for_=TOY, reconciler=reconciler)
    run = asyncio.create_task(manager.run())
    try:
        await eventually(lambda: manager.ready, within=60)
        assert await http_get(manager.health_port, "/readyz") == (200, "ok")
        informer = manager.cache.informer(TOY)

        def all_observed() -> bool:
            objs = informer.store.list()
            return len(objs) == N and all(
                (o.get("status") or {}).get("observed") == o["spec"]["value"] for o in objs
            )

        await eventually(all_observed, within=300)
        await eventually(lambda: controller.queue.depth() == 0 and not controller.queue.processing)
        assert reconciler.calls == N  # own status writes did not trigger reconciles
        for i in range(N):
            key = ObjectKey(namespace, f"toy-{i:04d}")
            counts = {
                (r.method, r.subresource): n
                for r, n in kube.stats.object_counts(resource=TOY, key=key).items()
            }
            assert counts == {("PATCH", "status"): 1}, (key, counts)
        assert kube.stats.writes_total() == N

        # a resync with nothing to do: every key is reconciled again, zero writes
        informer.resync()
        await eventually(lambda: reconciler.calls == 2 * N, within=120)
        await eventually(lambda: controller.queue.depth() == 0 and not controller.queue.processing)
        assert kube.stats.writes_total() == N

        _, metrics = await http_get(manager.metrics_port, "/metrics")
        assert (
            f'controller_runtime_reconcile_total{{controller="toy",result="success"}} {2 * N}.0'
            in metrics
        )
        assert 'rest_client_requests_total{code="200",host=' in metrics
        assert 'method="PATCH"} 1000.0' in metrics
        assert 'workqueue_adds_total{controller="toy",name="toy"}' in metrics
        assert "workqueue_queue_duration_seconds_bucket" in metrics
    finally:
        manager.stop()
        await run
