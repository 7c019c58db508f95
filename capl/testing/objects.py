"""Cluster API and capl objects as plain dicts, for the tests (tests/) and the benchmarks
(bench/).

Builders: a Cluster and its LibvirtCluster (`cluster_obj`, `libvirt_cluster_obj`, owned by
the Cluster), a bootstrap Secret, a Machine and its LibvirtMachine (`bootstrap_secret_obj`,
`machine_obj`, `libvirt_machine_obj` owned by the Machine, `libvirt_machine_spec` a small TCG
machine on the test base volume `BASE_VOLUME`), `owner_ref`, `b64`.

`create_cluster_objects(create, ...)` / `create_machine_objects(create, ...)` create them
through any `create(resource, obj)` (the controller harness's, a manager bed's, a
benchmark's). `is_ready` / `condition` / `condition_of` read conditions back;
`wait_for_object(get, resource, name, predicate, ...)` polls an object until it satisfies a
predicate and `wait_for_absence` until it is gone.

`random_cidr` / `random_mac`: a test network and a NIC address unlikely to collide with
another test's on the same host.
"""

from __future__ import annotations

import asyncio
import base64
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final

from capl.api import constants as c
from capl.runtime.objects import Obj
from capl.runtime.resources import (
    CLUSTER,
    LIBVIRT_CLUSTER,
    LIBVIRT_MACHINE,
    MACHINE,
    SECRET,
    Resource,
)

BASE_VOLUME = "capl-test-base.qcow2"
"""The small volume test machines boot from (by name, in the cluster's pool)."""


# --- object builders -------------------------------------------------------------------------


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def random_cidr() -> str:
    """A random /24 in 10.0.0.0/8 (test networks must not overlap on one host)."""
    return f"10.{secrets.randbelow(250) + 2}.{secrets.randbelow(256)}.0/24"


def random_mac() -> str:
    """A locally administered MAC in QEMU's 52:54:00 prefix."""
    return "52:54:00:" + ":".join(f"{b:02x}" for b in secrets.token_bytes(3))


def cluster_obj(name: str, namespace: str, *, libvirt_cluster: str, paused: bool = False) -> Obj:
    spec: dict[str, Any] = {
        "infrastructureRef": {
            "apiGroup": c.GROUP,
            "kind": c.Kind.LIBVIRT_CLUSTER.value,
            "name": libvirt_cluster,
        }
    }
    if paused:
        spec["paused"] = True
    return {
        "apiVersion": c.CAPI_API_VERSION,
        "kind": "Cluster",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


TEST_DRIVER_BRIDGE: Final = "eth1"
"""The one interface libvirt's test driver has by default: the bridge of bridge-mode clusters
on test-driver hosts (capl checks only that a bridge-mode network's bridge exists)."""
BRIDGE_ENDPOINT: Final[Mapping[str, Any]] = {"host": "10.250.9.10", "port": 6443}
"""The control-plane endpoint of bridge-mode test clusters (a VIP; nothing answers there)."""


def libvirt_cluster_obj(
    name: str,
    namespace: str,
    *,
    cluster: Obj,
    hosts: Sequence[Mapping[str, Any]],
    cidr: str | None = None,
    mode: str = "isolated",
    dns_domain: str | None = None,
    pool_path: str | None = None,
    bridge: str = TEST_DRIVER_BRIDGE,
    adopt_network: str | None = None,
) -> Obj:
    """A LibvirtCluster of `hosts`: a created `mode` network of `cidr`; in bridge mode one on
    `bridge` with the endpoint `BRIDGE_ENDPOINT` (bridge mode has no libvirt DNS to publish
    one); or, with `adopt_network`, that existing network. A created nat/isolated network on
    several hosts is refused (one island per host): several hosts take bridge mode or an
    adopted network. On test-driver hosts only the adopted network works for machines:
    libvirt 9.0's test driver crashes in interfaceAddresses for a domain on a forward-bridge
    network (a NULL IP definition), so bridge mode there is for cluster-only tests."""
    network: dict[str, Any] = {"mode": mode}
    if adopt_network is not None:
        network = {"name": adopt_network}
    elif mode == "bridge":
        network["bridge"] = bridge
    elif cidr is not None:
        network["cidr"] = cidr
    if dns_domain is not None:
        network["dnsDomain"] = dns_domain
    spec: dict[str, Any] = {"hosts": [dict(h) for h in hosts], "network": network}
    if mode == "bridge":
        spec["controlPlaneEndpoint"] = dict(BRIDGE_ENDPOINT)
    if pool_path is not None:
        spec["storagePool"] = {"path": pool_path}
    return {
        "apiVersion": c.API_VERSION,
        "kind": c.Kind.LIBVIRT_CLUSTER.value,
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {c.CLUSTER_NAME_LABEL: cluster["metadata"]["name"]},
            "ownerReferences": [owner_ref(cluster, controller=True)],
        },
        "spec": spec,
    }


def owner_ref(obj: Obj, *, controller: bool = False) -> dict[str, Any]:
    ref = {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "name": obj["metadata"]["name"],
        "uid": obj["metadata"]["uid"],
    }
    if controller:
        ref["controller"] = True
        ref["blockOwnerDeletion"] = True
    return ref


def bootstrap_secret_obj(
    name: str, namespace: str, *, data: bytes, format: str | None = None, cluster: str = ""
) -> Obj:
    payload = {c.BOOTSTRAP_DATA_KEY: b64(data)}
    if format is not None:
        payload[c.BOOTSTRAP_FORMAT_KEY] = b64(format.encode())
    labels = {c.CLUSTER_NAME_LABEL: cluster} if cluster else {}
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "type": "cluster.x-k8s.io/secret",
        "data": payload,
    }


def machine_obj(
    name: str,
    namespace: str,
    *,
    cluster: str,
    infra_name: str,
    bootstrap_secret: str | None,
    failure_domain: str | None = None,
    control_plane: bool = False,
) -> Obj:
    labels = {c.CLUSTER_NAME_LABEL: cluster}
    if control_plane:
        labels[c.CONTROL_PLANE_LABEL] = ""
    bootstrap: dict[str, Any] = {}
    if bootstrap_secret is not None:
        bootstrap["dataSecretName"] = bootstrap_secret
    else:
        bootstrap["configRef"] = {
            "apiGroup": "bootstrap.cluster.x-k8s.io",
            "kind": "KubeadmConfig",
            "name": name,
        }
    spec: dict[str, Any] = {
        "clusterName": cluster,
        "bootstrap": bootstrap,
        "infrastructureRef": {
            "apiGroup": c.GROUP,
            "kind": c.Kind.LIBVIRT_MACHINE.value,
            "name": infra_name,
        },
    }
    if failure_domain is not None:
        spec["failureDomain"] = failure_domain
    return {
        "apiVersion": c.CAPI_API_VERSION,
        "kind": "Machine",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": spec,
    }


def libvirt_machine_spec(**overrides: Any) -> dict[str, Any]:
    """A small TCG machine booting from the test base volume (test driver defaults)."""
    spec: dict[str, Any] = {
        "image": {"volume": BASE_VOLUME},
        "cpus": 1,
        "memoryMiB": 128,
        "domainType": "qemu",
    }
    spec.update(overrides)
    return spec


def libvirt_machine_obj(
    name: str,
    namespace: str,
    *,
    cluster: str,
    machine: Obj | None,
    spec: Mapping[str, Any],
    control_plane: bool = False,
) -> Obj:
    labels = {c.CLUSTER_NAME_LABEL: cluster}
    if control_plane:
        labels[c.CONTROL_PLANE_LABEL] = ""
    metadata: dict[str, Any] = {"name": name, "namespace": namespace, "labels": labels}
    if machine is not None:
        metadata["ownerReferences"] = [owner_ref(machine, controller=True)]
    return {
        "apiVersion": c.API_VERSION,
        "kind": c.Kind.LIBVIRT_MACHINE.value,
        "metadata": metadata,
        "spec": dict(spec),
    }


Create = Callable[[Resource, Obj], Awaitable[Obj]]


async def create_cluster_objects(
    create: Create,
    name: str,
    namespace: str,
    *,
    hosts: Sequence[Mapping[str, Any]],
    cidr: str | None,
    mode: str = "isolated",
    dns_domain: str | None = None,
    pool_path: str | None = None,
    paused: bool = False,
    bridge: str = TEST_DRIVER_BRIDGE,
    adopt_network: str | None = None,
) -> tuple[Obj, Obj]:
    """A Cluster and its LibvirtCluster (owned by it): (cluster, libvirt cluster)."""
    cluster = await create(
        CLUSTER, cluster_obj(name, namespace, libvirt_cluster=name, paused=paused)
    )
    libvirt_cluster = await create(
        LIBVIRT_CLUSTER,
        libvirt_cluster_obj(
            name,
            namespace,
            cluster=cluster,
            hosts=hosts,
            cidr=cidr,
            mode=mode,
            dns_domain=dns_domain,
            pool_path=pool_path,
            bridge=bridge,
            adopt_network=adopt_network,
        ),
    )
    return cluster, libvirt_cluster


async def create_machine_objects(
    create: Create,
    name: str,
    namespace: str,
    *,
    cluster: str,
    spec: Mapping[str, Any] | None = None,
    bootstrap: bytes | None = b"#cloud-config\n",
    format: str | None = None,
    failure_domain: str | None = None,
    control_plane: bool = False,
    owned: bool = True,
) -> tuple[Obj, Obj, Obj | None]:
    """Bootstrap Secret `<name>-bootstrap` (unless `bootstrap` is None) + Machine +
    LibvirtMachine owned by the Machine (unless `owned` is False): (machine, libvirt
    machine, secret)."""
    secret = None
    secret_name = None
    if bootstrap is not None:
        secret_name = f"{name}-bootstrap"
        secret = await create(
            SECRET,
            bootstrap_secret_obj(
                secret_name, namespace, data=bootstrap, format=format, cluster=cluster
            ),
        )
    machine = await create(
        MACHINE,
        machine_obj(
            name,
            namespace,
            cluster=cluster,
            infra_name=name,
            bootstrap_secret=secret_name,
            failure_domain=failure_domain,
            control_plane=control_plane,
        ),
    )
    libvirt_machine = await create(
        LIBVIRT_MACHINE,
        libvirt_machine_obj(
            name,
            namespace,
            cluster=cluster,
            machine=machine if owned else None,
            spec=spec or libvirt_machine_spec(),
            control_plane=control_plane,
        ),
    )
    return machine, libvirt_machine, secret


def is_ready(obj: Obj) -> bool:
    return condition(obj, c.ConditionType.READY) == "True"


def condition(obj: Obj, type_: str, field_: str = "status") -> str | None:
    for cond in (obj.get("status") or {}).get("conditions") or ():
        if cond.get("type") == type_:
            value = cond.get(field_)
            return None if value is None else str(value)
    return None


def condition_of(obj: Obj | None, type_: str) -> dict[str, Any]:
    """The condition `type_` of an object ({} when absent)."""
    for cond in ((obj or {}).get("status") or {}).get("conditions") or ():
        if cond.get("type") == type_:
            return dict(cond)
    return {}


async def wait_for_object(
    get: Callable[[Resource, str], Awaitable[Obj | None]],
    resource: Resource,
    name: str,
    predicate: Callable[[Obj], bool],
    *,
    namespace: str,
    within: float,
    what: str,
    interval: float = 0.25,
    max_interval: float = 0.25,
    absent_ok: bool = False,
) -> Obj:
    """Poll `get(resource, name)` until the object satisfies `predicate` and return it
    (`absent_ok`: or until it does not exist; then an empty dict). The interval grows from
    `interval` to `max_interval`; at the deadline the failure shows the object's status."""
    deadline = time.monotonic() + within
    delay = interval
    while True:
        last = await get(resource, name)
        if last is None and absent_ok:
            return {}
        if last is not None and predicate(last):
            return last
        if time.monotonic() > deadline:
            raise AssertionError(
                f"{resource.kind} {namespace}/{name} not {what} within {within:.0f}s; "
                f"status: {(last or {}).get('status')}"
            )
        await asyncio.sleep(delay)
        delay = min(delay * 1.5, max_interval)


async def wait_for_absence(
    get: Callable[[Resource, str], Awaitable[Obj | None]],
    resource: Resource,
    name: str,
    *,
    within: float,
    interval: float = 0.2,
) -> None:
    """Poll `get(resource, name)` until the object is gone."""
    deadline = time.monotonic() + within
    while await get(resource, name) is not None:
        if time.monotonic() > deadline:
            raise AssertionError(f"{resource.kind} {name} still exists after {within:.0f}s")
        await asyncio.sleep(interval)
