"""The indexes of the informer cache the machine controller reads instead of scanning.

Nothing in a reconcile scans every LibvirtMachine: the addresses other machines report
(`INDEX_INTERNAL_IP`) and the machines placed but not provisioned on a host (committed
memory, `INDEX_PENDING_HOST`) come from indexes, so a scale-out of N machines costs O(N)
here, not O(N^2) (bench/machines_testdriver.py measures it). libvirt events find their
machine by domain UUID (`INDEX_DOMAIN_UUID`), host events by host (`INDEX_HOST`), bootstrap
Secret events by the Machines naming them (`INDEX_BOOTSTRAP_SECRET`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Final

from capl.api import constants as c
from capl.controllers.machine.plan_addresses import internal_ips
from capl.controllers.machine.plan_placement import pending_on_host
from capl.runtime.handlers import field_indexer
from capl.runtime.informer import Cache
from capl.runtime.objects import Obj, get_path, labels, meta
from capl.runtime.resources import LIBVIRT_CLUSTER

__all__ = [
    "INDEX_BOOTSTRAP_SECRET",
    "INDEX_DOMAIN_UUID",
    "INDEX_HOST",
    "INDEX_INTERNAL_IP",
    "INDEX_PENDING_HOST",
    "bootstrap_secret_indexer",
    "cluster_name_of_libvirt_cluster",
    "host_index_value",
    "index_domain_uuid",
    "index_host",
    "index_internal_ip",
    "index_pending_host",
    "libvirt_cluster_raw",
]

INDEX_DOMAIN_UUID: Final = "libvirtmachine.domain-uuid"
INDEX_HOST: Final = "libvirtmachine.host"
INDEX_BOOTSTRAP_SECRET: Final = "libvirtmachine.bootstrap-secret"
INDEX_INTERNAL_IP: Final = "libvirtmachine.internal-ip"
INDEX_PENDING_HOST: Final = "libvirtmachine.pending-host"


def index_domain_uuid(obj: Obj) -> Iterable[str]:
    value = get_path(obj, "spec", "domainUUID")
    return (str(value).lower(),) if value else ()


def host_index_value(namespace: str, cluster: str, host: str) -> str:
    return f"{namespace}/{cluster}/{host}"


def index_host(obj: Obj) -> Iterable[str]:
    host = get_path(obj, "spec", "hostName")
    cluster = labels(obj).get(c.CLUSTER_NAME_LABEL)
    if not host or not cluster:
        return ()
    return (host_index_value(meta(obj).get("namespace") or "", cluster, str(host)),)


def index_internal_ip(obj: Obj) -> Iterable[str]:
    """The addresses a machine reports: excluded when another machine's address is picked."""
    return internal_ips(obj)


def index_pending_host(obj: Obj) -> Iterable[str]:
    """Like index_host, only while the machine is placed and not provisioned yet (its
    memory counts as committed on that host when the next machine is placed)."""
    return index_host(obj) if pending_on_host(obj) else ()


bootstrap_secret_indexer: Callable[[Obj], Iterable[str]] = field_indexer(
    "spec", "bootstrap", "dataSecretName"
)
"""Machine index: the bootstrap data Secret a Machine names."""


def cluster_name_of_libvirt_cluster(obj: Obj) -> str | None:
    """The Cluster a LibvirtCluster belongs to: its cluster-name label, else its owner."""
    name = labels(obj).get(c.CLUSTER_NAME_LABEL)
    if name:
        return name
    for ref in meta(obj).get("ownerReferences") or ():
        if ref.get("kind") == "Cluster" and str(ref.get("apiVersion", "")).startswith(
            c.CAPI_GROUP + "/"
        ):
            return str(ref.get("name"))
    return None


def libvirt_cluster_raw(cache: Cache, namespace: str, cluster_name: str) -> Obj | None:
    """The cached LibvirtCluster of Cluster namespace/cluster_name, raw."""
    for obj in cache.list(LIBVIRT_CLUSTER, namespace=namespace):
        if cluster_name_of_libvirt_cluster(obj) == cluster_name:
            return obj
    return None
