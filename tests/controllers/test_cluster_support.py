"""LibvirtCluster test helpers on top of `capl.testing.harness.ControllerHarness`
(no tests here; imported by the cluster tests in tests/controllers and tests/libvirtd).

- `clusters` fixture: the `harness` with the LibvirtCluster controller started (fast
  retries, no periodic health requeue); at teardown, while the controller still runs, every
  LibvirtMachine/Machine and LibvirtCluster of the namespace is deleted so capl removes what
  it created on the hosts, then left-over finalizers are stripped.
- Object helpers for what the harness's builders do not cover: a LibvirtCluster with any
  spec (adopted/bridged network, explicit endpoint, annotations, no owner), control-plane
  LibvirtMachines whose InternalIP the test writes itself (as the machine controller would),
  the control-plane label on the Machine only.
- Waiting: on conditions of the LibvirtCluster (API reads through `h.api`, which is not
  counted), on the controller's queue being idle, and on one more reconcile of a key.
"""

from __future__ import annotations

import contextlib
import functools
import secrets
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest

from capl.api import constants as c
from capl.controllers import libvirtcluster
from capl.controllers.libvirtcluster import LibvirtClusterOptions
from capl.runtime.controller import Controller
from capl.runtime.errors import NotFound
from capl.runtime.objects import Obj, ObjectKey, get_path
from capl.runtime.resources import CLUSTER, LIBVIRT_CLUSTER, LIBVIRT_MACHINE, MACHINE, SECRET
from capl.testing.harness import ControllerHarness, Setup
from capl.testing.objects import b64, cluster_obj, libvirt_machine_obj, machine_obj, owner_ref
from tests.fixtures.common import eventually as common_eventually
from tests.fixtures.runtime import eventually

FAST = LibvirtClusterOptions(
    health_interval=None, unreachable_retry=1.0, terminal_retry=5.0, host_timeout=30.0
)
SETUP: Setup = functools.partial(libvirtcluster.setup, options=FAST)


def random_cidr() -> str:
    """A random /24 in 10.100-249.x (apart from the default/bed networks)."""
    return f"10.{secrets.randbelow(150) + 100}.{secrets.randbelow(256)}.0/24"


def unique(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(3)}"


# --- running ---------------------------------------------------------------------------------


def controller(h: ControllerHarness) -> Controller:
    return h.controller(libvirtcluster.CONTROLLER_NAME)


async def settle(h: ControllerHarness, *, within: float = 30.0) -> None:
    """The cluster controller's queue is empty and nothing is being processed."""
    ctl = controller(h)
    await eventually(
        lambda: ctl.queue.depth() == 0 and not ctl.queue.processing,
        within=within,
        message="controller queue idle",
    )


async def caught_up(h: ControllerHarness, name: str, *, within: float = 30.0) -> None:
    """The controller is idle and its cache holds the LibvirtCluster `name` as the API server
    does. A reconcile that reads an older copy (its own last status patch not yet seen through
    the watch, which lags on a loaded machine) writes that status again: write counts taken
    before this would count such a catch-up write as the reconcile's."""

    async def same_version() -> bool:
        await settle(h, within=within)
        fresh = await h.get(LIBVIRT_CLUSTER, name)
        held = cached(h, name)
        return (
            fresh is not None
            and held is not None
            and held["metadata"]["resourceVersion"] == fresh["metadata"]["resourceVersion"]
        )

    await common_eventually(same_version, within=within, what=f"the cache holds {name} as stored")


async def reconcile_again(h: ControllerHarness, name: str, *, within: float = 30.0) -> None:
    """Enqueue the LibvirtCluster `name` (once the cache has caught up with it, see
    `caught_up`) and wait until that reconcile has finished."""
    ctl = controller(h)
    await caught_up(h, name, within=within)
    before = ctl.reconciles
    ctl.enqueue(ObjectKey(h.namespace, name))
    await eventually(lambda: ctl.reconciles > before, within=within)
    await settle(h, within=within)


async def delete_everything(h: ControllerHarness, *, within: float = 90.0) -> None:
    """Delete the namespace's machines and LibvirtClusters with the controllers running, so
    they clean up libvirt; strip finalizers of whatever is left afterwards."""
    for resource in (LIBVIRT_MACHINE, MACHINE, LIBVIRT_CLUSTER):
        for obj in (await h.api.resource(resource).list(namespace=h.namespace)).items:
            await h.delete(resource, obj["metadata"]["name"])
    deadline = time.monotonic() + within
    for resource in (LIBVIRT_MACHINE, LIBVIRT_CLUSTER):
        while (await h.api.resource(resource).list(namespace=h.namespace)).items:
            if time.monotonic() > deadline:
                break
            await h.manager.clock.sleep(0.1)
        for obj in (await h.api.resource(resource).list(namespace=h.namespace)).items:
            with contextlib.suppress(NotFound):
                await h.patch(resource, obj["metadata"]["name"], {"metadata": {"finalizers": None}})


@pytest.fixture
async def clusters(harness: ControllerHarness) -> AsyncIterator[ControllerHarness]:
    """The harness running the LibvirtCluster controller."""
    await harness.start(SETUP)
    try:
        yield harness
    finally:
        await delete_everything(harness)


# --- objects ---------------------------------------------------------------------------------


async def create_cluster(
    h: ControllerHarness,
    name: str,
    spec: Mapping[str, Any],
    *,
    owned: bool = True,
    paused: bool = False,
    annotations: Mapping[str, str] | None = None,
) -> str:
    """A Cluster and its LibvirtCluster with `spec` (owner reference and cluster label set, as
    Cluster API would, unless `owned` is False); returns once the controller's cache has it."""
    cluster = await h.create(
        CLUSTER, cluster_obj(name, h.namespace, libvirt_cluster=name, paused=paused)
    )
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": h.namespace,
        "labels": {c.CLUSTER_NAME_LABEL: name},
    }
    if owned:
        metadata["ownerReferences"] = [owner_ref(cluster, controller=True)]
    if annotations:
        metadata["annotations"] = dict(annotations)
    await h.create(
        LIBVIRT_CLUSTER,
        {
            "apiVersion": c.API_VERSION,
            "kind": c.Kind.LIBVIRT_CLUSTER.value,
            "metadata": metadata,
            "spec": dict(spec),
        },
    )
    await eventually(lambda: cached(h, name) is not None, within=30, message=f"{name} cached")
    return name


async def create_machine(
    h: ControllerHarness,
    name: str,
    *,
    cluster: str,
    control_plane: bool,
    label_on: str = "both",
    addresses: list[str] | None = None,
    spec: Mapping[str, Any] | None = None,
    bootstrap: bytes | None = None,
    failure_domain: str | None = None,
) -> None:
    """Machine + LibvirtMachine (owned by it); the control-plane label on "both", only the
    "machine" or only the "libvirtmachine"; InternalIP `addresses` written to the
    LibvirtMachine's status (standing in for the machine controller)."""
    secret_name = f"{name}-bootstrap"
    if bootstrap is not None:
        await h.create(
            SECRET,
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": secret_name, "namespace": h.namespace},
                "type": "cluster.x-k8s.io/secret",
                "data": {c.BOOTSTRAP_DATA_KEY: b64(bootstrap)},
            },
        )
    machine = await h.create(
        MACHINE,
        machine_obj(
            name,
            h.namespace,
            cluster=cluster,
            infra_name=name,
            bootstrap_secret=secret_name,
            failure_domain=failure_domain,
            control_plane=control_plane and label_on in ("both", "machine"),
        ),
    )
    await h.create(
        LIBVIRT_MACHINE,
        libvirt_machine_obj(
            name,
            h.namespace,
            cluster=cluster,
            machine=machine,
            spec=spec or {"image": {"volume": "base.qcow2"}},
            control_plane=control_plane and label_on in ("both", "libvirtmachine"),
        ),
    )
    if addresses:
        await set_addresses(h, name, addresses)


async def set_addresses(h: ControllerHarness, name: str, addresses: list[str]) -> None:
    await h.patch_status(
        LIBVIRT_MACHINE,
        name,
        {"status": {"addresses": [{"type": "InternalIP", "address": a} for a in addresses]}},
    )


async def delete_machine(h: ControllerHarness, name: str) -> None:
    """Delete a LibvirtMachine and its Machine (without waiting)."""
    await h.delete(LIBVIRT_MACHINE, name)
    await h.delete(MACHINE, name)


async def create_secret(h: ControllerHarness, name: str, data: Mapping[str, bytes]) -> Obj:
    return await h.create(
        SECRET,
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name, "namespace": h.namespace},
            "data": {k: b64(v) for k, v in data.items()},
        },
    )


# --- reading ---------------------------------------------------------------------------------


def cached(h: ControllerHarness, name: str) -> Obj | None:
    """The LibvirtCluster as the controller's cache holds it."""
    return h.manager.cache.get(LIBVIRT_CLUSTER, ObjectKey(h.namespace, name))


def condition_of(obj: Obj | None, type_: str) -> dict[str, Any]:
    """The condition `type_` of an object ({} when absent)."""
    for cond in get_path(obj or {}, "status", "conditions") or []:
        if cond.get("type") == type_:
            return dict(cond)
    return {}


def conditions_of(obj: Obj | None) -> dict[str, tuple[str, str]]:
    return {
        cond["type"]: (cond["status"], cond["reason"])
        for cond in get_path(obj or {}, "status", "conditions") or []
    }


def has_condition(obj: Obj, type_: str, status: str, reason: str | None = None) -> bool:
    cond = condition_of(obj, type_)
    return cond.get("status") == status and (reason is None or cond.get("reason") == reason)


async def wait_condition(
    h: ControllerHarness,
    name: str,
    type_: str,
    status: str,
    reason: str | None = None,
    *,
    within: float = 30.0,
) -> dict[str, Any]:
    obj = await h.wait_for(
        LIBVIRT_CLUSTER,
        name,
        lambda o: has_condition(o, type_, status, reason),
        within=within,
        what=f"{type_}={status} ({reason or 'any reason'})",
    )
    return condition_of(obj, type_)


async def wait_provisioned(h: ControllerHarness, name: str, *, within: float = 30.0) -> Obj:
    return await h.wait_for(
        LIBVIRT_CLUSTER,
        name,
        lambda o: get_path(o, "status", "initialization", "provisioned") is True,
        within=within,
        what="provisioned",
    )


def writes(h: ControllerHarness, name: str) -> dict[str, int]:
    """The controllers' writes to the LibvirtCluster `name` ({"PATCH": n, "PATCH/status": m})."""
    return h.writes(LIBVIRT_CLUSTER, name)
