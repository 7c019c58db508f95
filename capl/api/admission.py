"""Which admission webhooks capl serves, at which paths: shared by server and manifests.

The aiohttp application in capl.webhooks routes by these paths and crdgen renders
config/webhook/manifests.yaml from the same tuple, so the manifests cannot name a path the
server does not serve.

Mutating webhooks exist only where CRD defaults are not enough: LibvirtCluster (names derived
from the cluster's namespace and name) and LibvirtMachine (MAC addresses normalised to lower
case). Templates are never defaulted with derived names: every object created from a
template would share them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from capl.api.constants import GROUP, VERSION, Kind, Plural

Operation = Literal["CREATE", "UPDATE", "DELETE", "CONNECT"]
WEBHOOK_SERVICE_NAME = "webhook-service"
WEBHOOK_TIMEOUT_SECONDS = 10


@dataclass(frozen=True, kw_only=True)
class WebhookSpec:
    kind: Kind
    plural: Plural
    mutating: bool
    operations: tuple[Operation, ...] = ("CREATE", "UPDATE")

    @property
    def path(self) -> str:
        verb = "mutate" if self.mutating else "validate"
        return f"/{verb}-{GROUP.replace('.', '-')}-{VERSION}-{self.kind.lower()}"

    @property
    def name(self) -> str:
        prefix = "default" if self.mutating else "validation"
        return f"{prefix}.{self.kind.lower()}.{GROUP}"


WEBHOOKS: tuple[WebhookSpec, ...] = (
    WebhookSpec(kind=Kind.LIBVIRT_CLUSTER, plural=Plural.LIBVIRT_CLUSTERS, mutating=True),
    WebhookSpec(kind=Kind.LIBVIRT_MACHINE, plural=Plural.LIBVIRT_MACHINES, mutating=True),
    WebhookSpec(kind=Kind.LIBVIRT_CLUSTER, plural=Plural.LIBVIRT_CLUSTERS, mutating=False),
    WebhookSpec(
        kind=Kind.LIBVIRT_CLUSTER_TEMPLATE,
        plural=Plural.LIBVIRT_CLUSTER_TEMPLATES,
        mutating=False,
    ),
    WebhookSpec(kind=Kind.LIBVIRT_MACHINE, plural=Plural.LIBVIRT_MACHINES, mutating=False),
    WebhookSpec(
        kind=Kind.LIBVIRT_MACHINE_TEMPLATE,
        plural=Plural.LIBVIRT_MACHINE_TEMPLATES,
        mutating=False,
    ),
)


def webhook_for(*, kind: str, mutating: bool) -> WebhookSpec | None:
    for spec in WEBHOOKS:
        if spec.kind == kind and spec.mutating == mutating:
            return spec
    return None
