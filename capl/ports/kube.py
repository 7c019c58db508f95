"""The workload-cluster port: what the machine controller asks of a cluster it built.

There is no cloud-controller-manager for libvirt, so capl makes sure the workload Node of a
machine carries its providerID and, like a cloud provider, the topology labels of where the
machine runs (zone = its host, the failure domain; region from the LibvirtCluster). It
reaches the workload cluster with the kubeconfig that Cluster API keeps in the Secret
`<cluster>-kubeconfig` (key `value`); capl.kube implements this port, caching one client
per cluster and dropping it when the kubeconfig changes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol


class WorkloadClusters(Protocol):
    async def ensure_node_provider_id(
        self,
        *,
        cluster: str,
        kubeconfig: bytes,
        node_name: str,
        provider_id: str,
        labels: Mapping[str, str] | None = None,
    ) -> bool:
        """Set `spec.providerID` of Node `node_name` when it exists with none, and the given
        `labels` (e.g. topology.kubernetes.io/zone) where they differ, in one patch.

        Returns True when the Node carries `provider_id` and the labels afterwards, False
        when the Node does not exist (yet), carries another providerID (not ours: left
        alone) or the workload API server cannot be reached. Never raises for an
        unreachable workload cluster: it is retried on a later reconcile.
        """
        ...

    async def forget(self, *, cluster: str) -> None:
        """Drop the cached client of a cluster (deleted, or moved away)."""
        ...
