"""A toy CRD and a toy reconciler: capl's controller runtime against a real API server
without capl's own controllers, for the runtime tests (tests/kube) and the benchmarks
(bench/runtime_toy.py, bench/machines_testdriver.py).

This is a hand-written stand-in, not a part of capl: `Toy` (test.capl.dev/v1, namespaced,
with a status subresource, spec and status free-form) exists only here, and `ToyReconciler`
is the smallest useful reconciler — one status merge patch per object — so that what is
measured or tested is the runtime around it (informer list + watch, queue, predicates, diff,
metrics, logs).

- `ensure_toy_crd(client)`: install the CRD (idempotent), wait until it is served.
- `toy(name, namespace, value, **labels)`: a Toy object as a plain dict.
- `ToyReconciler(cache, client)`: drives status.observed to spec.value.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from capl.runtime.client import Client
from capl.runtime.controller import Result
from capl.runtime.errors import AlreadyExists, NotFound
from capl.runtime.informer import Cache
from capl.runtime.objects import Obj, ObjectKey, copy_obj
from capl.runtime.patch import apply_patch
from capl.runtime.resources import CUSTOM_RESOURCE_DEFINITION, Resource

TOY = Resource("test.capl.dev", "v1", "Toy", "toys")

TOY_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "toys.test.capl.dev"},
    "spec": {
        "group": "test.capl.dev",
        "scope": "Namespaced",
        "names": {"plural": "toys", "singular": "toy", "kind": "Toy", "listKind": "ToyList"},
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "x-kubernetes-preserve-unknown-fields": True,
                            },
                            "status": {
                                "type": "object",
                                "x-kubernetes-preserve-unknown-fields": True,
                            },
                        },
                    }
                },
            }
        ],
    },
}


def _established(crd: Obj) -> bool:
    return any(
        c.get("type") == "Established" and c.get("status") == "True"
        for c in (crd.get("status") or {}).get("conditions") or ()
    )


async def ensure_toy_crd(client: Client, *, within: float = 60.0) -> Resource:
    """Install the Toy CRD (idempotent) and wait until it is established and served."""
    crds = client.resource(CUSTOM_RESOURCE_DEFINITION)
    with contextlib.suppress(AlreadyExists):
        await crds.create(TOY_CRD)
    deadline = time.monotonic() + within
    while True:
        crd = await crds.get(ObjectKey("", "toys.test.capl.dev"))
        if _established(crd):
            try:
                await client.resource(TOY).list(namespace="default", limit=1)
                return TOY
            except NotFound:
                pass
        if time.monotonic() > deadline:
            raise AssertionError("Toy CRD not established")
        await asyncio.sleep(0.1)


def toy(name: str, namespace: str, value: int = 1, **labels: str) -> Obj:
    """A Toy with spec.value `value`."""
    return {
        "apiVersion": TOY.api_version,
        "kind": TOY.kind,
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"value": value},
    }


class ToyReconciler:
    """Drives status.observed to spec.value with one status patch (and status.by to
    `identity`, when given); records its calls and the (start, end) wall time of each."""

    def __init__(self, cache: Cache, client: Client, *, identity: str = "") -> None:
        self.cache = cache
        self.client = client.resource(TOY)
        self.identity = identity
        self.calls = 0
        self.intervals: list[tuple[float, float]] = []

    async def reconcile(self, key: ObjectKey) -> Result:
        started = time.time()
        self.calls += 1
        try:
            obj = self.cache.get(TOY, key)
            if obj is None:
                return Result()
            desired = copy_obj(obj)
            status = desired.setdefault("status", {})
            status["observed"] = (obj.get("spec") or {}).get("value")
            if self.identity:
                status["by"] = self.identity
            await apply_patch(self.client, obj, desired)
            return Result()
        finally:
            self.intervals.append((started, time.time()))
