"""`WorkloadClusters` on kubernetes_asyncio: reach workload clusters through their kubeconfig.

One `KubeClient` per cluster key ("namespace/name"), built from the kubeconfig bytes of the
cluster's `<cluster>-kubeconfig` Secret and kept while those bytes stay the same (compared by
SHA-256; a rotated kubeconfig replaces the client, `forget` drops it). The kubeconfig is
parsed in memory; client certificates and keys embedded in it are written by
kubernetes_asyncio's loader into a private 0700 directory of this process (it needs files for
TLS), never logged.

`ensure_node_provider_id` reads the Node and, when it exists without a providerID or without
the wanted labels (topology.kubernetes.io/zone and /region), merge-patches what is missing in
one request (with the resourceVersion read as precondition). Every failure (API server not
up yet, TLS, timeouts, RBAC, a conflict) is answered with False and retried by the caller's
next reconcile: the workload cluster's API server is routinely unreachable while its first
control-plane machine boots. A Node that
already carries a *different* providerID is left alone (False, with a warning in the log).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import yaml
from kubernetes_asyncio.client import Configuration
from kubernetes_asyncio.config.kube_config import load_kube_config_from_dict

from capl.kube.client import KubeClient
from capl.kube.config import private_temp_dir
from capl.runtime.errors import ApiError, NotFound
from capl.runtime.objects import ObjectKey
from capl.runtime.resources import NODE

__all__ = ["KubeWorkloadClusters"]

log = logging.getLogger(__name__)


class KubeWorkloadClusters:
    """`capl.ports.kube.WorkloadClusters` with one cached client per cluster."""

    def __init__(self, *, request_timeout: float = 10.0) -> None:
        self._request_timeout = request_timeout
        self._clients: dict[str, tuple[str, KubeClient]] = {}
        self._lock = asyncio.Lock()

    async def _client(self, cluster: str, kubeconfig: bytes) -> KubeClient:
        digest = hashlib.sha256(kubeconfig).hexdigest()
        async with self._lock:
            current = self._clients.get(cluster)
            if current is not None and current[0] == digest:
                return current[1]
            config: Any = yaml.safe_load(kubeconfig.decode("utf-8"))
            if not isinstance(config, dict):
                raise ValueError("the kubeconfig is not a YAML mapping")
            configuration = Configuration()
            await load_kube_config_from_dict(
                config, client_configuration=configuration, temp_file_path=private_temp_dir()
            )
            client = KubeClient(
                configuration,
                pool_size=4,
                user_agent="capl-workload",
                request_timeout=self._request_timeout,
            )
            self._clients[cluster] = (digest, client)
        if current is not None:
            await current[1].close()
        return client

    async def ensure_node_provider_id(
        self,
        *,
        cluster: str,
        kubeconfig: bytes,
        node_name: str,
        provider_id: str,
        labels: Mapping[str, str] | None = None,
    ) -> bool:
        try:
            client = await self._client(cluster, kubeconfig)
        except Exception as exc:  # a broken kubeconfig must not fail the reconcile
            log.warning("kubeconfig of cluster %s is unusable: %s", cluster, type(exc).__name__)
            return False
        nodes = client.resource(NODE)
        key = ObjectKey("", node_name)
        try:
            node = await nodes.get(key)
            current = (node.get("spec") or {}).get("providerID") or ""
            if current and current != provider_id:
                log.warning(
                    "node %s of cluster %s has providerID %s, not %s: left alone",
                    node_name,
                    cluster,
                    current,
                    provider_id,
                )
                return False
            patch: dict[str, Any] = {}
            if not current:
                patch["spec"] = {"providerID": provider_id}
            have = (node.get("metadata") or {}).get("labels") or {}
            changed = {k: v for k, v in (labels or {}).items() if have.get(k) != v}
            if changed:
                patch["metadata"] = {"labels": changed}
            if patch:
                # resourceVersion: a Node replaced meanwhile (same name) is looked at again
                patch.setdefault("metadata", {})["resourceVersion"] = (
                    node.get("metadata") or {}
                ).get("resourceVersion")
                await nodes.patch(key, patch)
                log.info(
                    "set %s of node %s in cluster %s",
                    ", ".join(["providerID"] * (not current) + sorted(changed)),
                    node_name,
                    cluster,
                )
            return True
        except NotFound:
            return False
        except (ApiError, TimeoutError, OSError) as exc:
            log.debug("workload cluster %s not reachable: %s", cluster, exc)
            return False

    async def forget(self, *, cluster: str) -> None:
        async with self._lock:
            current = self._clients.pop(cluster, None)
        if current is not None:
            await current[1].close()

    async def close(self) -> None:
        async with self._lock:
            clients = [client for _, client in self._clients.values()]
            self._clients.clear()
        for client in clients:
            await client.close()


if TYPE_CHECKING:
    from capl.ports.kube import WorkloadClusters

    def _implements_the_port(clusters: KubeWorkloadClusters) -> WorkloadClusters:
        """mypy checks here that the adapter satisfies the port's Protocol."""
        return clusters
