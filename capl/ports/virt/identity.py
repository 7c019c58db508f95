"""Identities: a host's id and the owners capl writes into what it creates.

How capl recognises what it created (domains, networks, pools, volumes) is told in the
package docstring (``capl.ports.virt``); these are the values that carry it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NewType

__all__ = ["CAPL_XML_NAMESPACE", "CAPL_XML_PREFIX", "ClusterOwner", "DomainOwner", "HostId"]

CAPL_XML_NAMESPACE = "https://capl.dev/xmlns/v1alpha1"
CAPL_XML_PREFIX = "capl"

HostId = NewType("HostId", str)
"""A host's stable identity in logs, events and maps: its URI without query parameters."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterOwner:
    """The LibvirtCluster that owns a network or pool; compared by namespace/name only."""

    namespace: str
    name: str
    uid: str = ""

    def same_cluster(self, other: ClusterOwner) -> bool:
        return (self.namespace, self.name) == (other.namespace, other.name)


@dataclass(frozen=True, slots=True, kw_only=True)
class DomainOwner:
    """The identity written into a domain's capl metadata and checked before any change."""

    cluster: str
    namespace: str
    name: str
    uid: str
    kind: str = "LibvirtMachine"

    def matches(self, other: DomainOwner, *, ignore_uid: bool = False) -> bool:
        same = (self.cluster, self.namespace, self.name, self.kind) == (
            other.cluster,
            other.namespace,
            other.name,
            other.kind,
        )
        return same and (ignore_uid or self.uid == other.uid)
