"""What both reconcilers share: their dependencies, the Cluster API gates, and host access.

A reconciler gets a `Deps` bundle of Protocols and runtime pieces — the informer cache for
reads, the API client for writes, the event recorder, the libvirt `Hosts` port, the workload
cluster port and a clock — and never the adapters behind them (import-linter enforces that
controllers import neither capl.kube nor capl.virt). Tests build a `Deps` from the real test
driver or apiserver, or from small fakes.

The gates follow the Cluster API contract (../shared/reference/capi-contract.md): owner
reference, externally managed annotation, finalizer, pause. Objects are read as raw dicts from
the cache (shared, read-only: copy before changing) and parsed into `capl.api` models for
reading; writes change a copy of the raw object so fields this version does not model are
never dropped by a patch.
"""

from __future__ import annotations

import base64
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from capl.api import constants as c
from capl.api.capi import Cluster, is_paused
from capl.api.cluster import LibvirtCluster, LibvirtHost
from capl.api.defaults import default_libvirt_cluster
from capl.api.meta import ObjectMeta, OwnerReference
from capl.ports.kube import WorkloadClusters
from capl.ports.virt import Host, HostOptions, Hosts
from capl.ports.virt.snapshots import SnapshotsOf
from capl.runtime.client import Client
from capl.runtime.clock import Clock
from capl.runtime.events import Recorder
from capl.runtime.informer import Cache
from capl.runtime.objects import Obj, ObjectKey
from capl.runtime.resources import LIBVIRT_CLUSTER, SECRET

CAPI_GROUP = "cluster.x-k8s.io"

M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True, slots=True, kw_only=True)
class Deps:
    """Everything a reconciler talks to."""

    cache: Cache
    client: Client
    recorder: Recorder
    hosts: Hosts
    workload: WorkloadClusters
    clock: Clock
    snapshots: SnapshotsOf | None = None
    """The external snapshots of a host (`capl.virt.snapshot.snapshots_of` in the manager):
    a day-2 change is made under a snapshot and reverted when it fails
    (`capl.controllers.machine.day2_snapshot`); None: no snapshot is taken."""


class InvalidObject(Exception):
    """An object from the API server that this version cannot read (reported, not retried)."""


def parse(model: type[M], obj: Mapping[str, Any]) -> M:
    """Parse a raw object into its model; a clear InvalidObject instead of a traceback."""
    try:
        return model.model_validate(obj)
    except ValidationError as exc:
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": str(exc)}
        where = ".".join(str(p) for p in first.get("loc", ()))
        raise InvalidObject(f"{where}: {first.get('msg')}") from None


PARSED_CACHE_SIZE = 512
"""How many parsed objects `parse_cached` keeps (least recently used go first)."""

_parsed: OrderedDict[tuple[object, str, str], Any] = OrderedDict()


def parse_cached(model: type[M], obj: Mapping[str, Any]) -> M:
    """`parse` of an object as the informer cache holds it (never a changed copy): the model
    is kept by (model, uid, resourceVersion) and shared, so the caller only reads it. Every
    write gives a new resourceVersion, so a kept model is never stale; an object without
    either is parsed afresh. Saves the pydantic validation of the Cluster, LibvirtCluster and
    Machine that every machine reconcile reads (issue 16)."""
    return _cached(model, obj, lambda: parse(model, obj))


def _cached(kind: object, obj: Mapping[str, Any], build: Callable[[], M]) -> M:
    metadata = obj.get("metadata") or {}
    uid, rv = metadata.get("uid"), metadata.get("resourceVersion")
    if not uid or not rv:
        return build()
    key = (kind, uid, rv)
    found = _parsed.get(key)
    if found is not None:
        _parsed.move_to_end(key)
        return found  # type: ignore[no-any-return]
    made = build()
    _parsed[key] = made
    if len(_parsed) > PARSED_CACHE_SIZE:
        _parsed.popitem(last=False)
    return made


def owner(meta: ObjectMeta, *, kind: str) -> OwnerReference | None:
    """The Cluster API owner of `kind` (any API version of cluster.x-k8s.io)."""
    return meta.owner(kind=kind, group=CAPI_GROUP)


def libvirt_cluster_of(cache: Cache, cluster: Cluster) -> LibvirtCluster | None:
    """The LibvirtCluster the Cluster's infrastructureRef names, with derived defaults."""
    ref = cluster.spec.infrastructure_ref
    ns = cluster.metadata.namespace or ""
    if ref is None or ref.kind != c.Kind.LIBVIRT_CLUSTER or not ref.name:
        return None
    raw = cache.get(LIBVIRT_CLUSTER, ObjectKey(ns, ref.name))
    if raw is None:
        return None
    return _cached(
        default_libvirt_cluster, raw, lambda: default_libvirt_cluster(parse(LibvirtCluster, raw))
    )


def paused(cluster: Cluster | None, meta: ObjectMeta) -> bool:
    return is_paused(cluster=cluster, obj=meta)


def externally_managed(meta: ObjectMeta) -> bool:
    return meta.has_annotation(c.MANAGED_BY_ANNOTATION)


def add_finalizer(desired: Obj, finalizer: str) -> bool:
    """Add `finalizer` to a (copied) raw object; True when it was missing."""
    finalizers: list[str] = desired.setdefault("metadata", {}).setdefault("finalizers", [])
    if finalizer in finalizers:
        return False
    finalizers.append(finalizer)
    return True


def remove_finalizer(desired: Obj, finalizer: str) -> bool:
    """Remove `finalizer` from a (copied) raw object; True when it was there."""
    metadata = desired.setdefault("metadata", {})
    finalizers: list[str] = metadata.get("finalizers") or []
    if finalizer not in finalizers:
        return False
    metadata["finalizers"] = [f for f in finalizers if f != finalizer]
    return True


class CredentialsMissing(Exception):
    """The credentials Secret a host names is absent or lacks usable keys."""


def host_credentials(cache: Cache, *, namespace: str, host: LibvirtHost) -> dict[str, bytes] | None:
    """The decoded data of the host's credentials Secret (None when it names none).

    Raises CredentialsMissing naming the Secret (never its content) when it does not exist.
    """
    ref = host.credentials_ref
    if ref is None or not ref.name:
        return None
    raw = cache.get(SECRET, ObjectKey(namespace, ref.name))
    if raw is None:
        raise CredentialsMissing(f"credentials Secret {namespace}/{ref.name} not found")
    data: Mapping[str, str] = raw.get("data") or {}
    try:
        return {key: base64.b64decode(value) for key, value in data.items()}
    except (ValueError, TypeError):
        raise CredentialsMissing(
            f"credentials Secret {namespace}/{ref.name} holds data that is not base64"
        ) from None


def host_options(host: LibvirtHost) -> HostOptions:
    return HostOptions(
        allow_insecure_tcp=bool(getattr(host, "allow_insecure_tcp", False)),
        insecure_skip_host_key_verification=bool(
            getattr(host, "insecure_skip_host_key_verification", False)
        ),
    )


def connect_host(deps: Deps, *, namespace: str, host: LibvirtHost) -> Host:
    """The shared `Host` for one entry of a LibvirtCluster's spec.hosts (no I/O)."""
    return deps.hosts.get(
        uri=str(host.uri),
        credentials=host_credentials(deps.cache, namespace=namespace, host=host),
        options=host_options(host),
    )


def find_host(cluster: LibvirtCluster, name: str) -> LibvirtHost | None:
    return next((h for h in cluster.spec.hosts if h.name == name), None)


@dataclass(frozen=True, slots=True)
class ClusterLayout:
    """Names of what a LibvirtCluster owns or adopts on every host (defaults applied)."""

    network: str
    network_adopted: bool
    pool: str
    pool_path: str | None
    dns_domain: str | None
    cidr: str | None


def layout(cluster: LibvirtCluster) -> ClusterLayout:
    """Where a cluster's network and pool live; `cluster` must carry defaults
    (`libvirt_cluster_of` applies them)."""
    net = cluster.spec.network
    pool = cluster.spec.storage_pool
    if not net.name or pool is None or not pool.name:
        raise InvalidObject("spec.network.name/spec.storagePool.name: defaults not applied")
    return ClusterLayout(
        network=net.name,
        network_adopted=net.cidr is None and net.mode != "bridge",
        pool=pool.name,
        pool_path=pool.path,
        dns_domain=net.dns_domain,
        cidr=None if net.cidr is None else str(net.cidr),
    )
