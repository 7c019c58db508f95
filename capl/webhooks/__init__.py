"""Admission webhooks for capl's kinds: validation and defaulting, served by the manager.

- `validation`: pure `validate_*` functions returning a `Verdict` (field errors, warnings);
- `patch`: RFC 6902 patches for defaulting responses;
- `server`: `create_app()` (aiohttp, AdmissionReview v1) and `WebhookServer` (TLS runner
  with certificate reload), plus the Protocols the manager implements for cross-object
  checks (`LibvirtClusterLister`, `ImageSizeLookup`).

The defaulting itself lives in `capl.api.defaults`, because the controllers apply the same
defaults when no webhook is installed. This package imports capl.api (and nothing of the
Kubernetes client or libvirt).
"""

from capl.webhooks.server import (
    Admission,
    ImageSizeLookup,
    LibvirtClusterLister,
    ReloadingTLS,
    WebhookServer,
    create_app,
)
from capl.webhooks.validation import (
    FieldError,
    Verdict,
    host_key,
    is_topology_dry_run,
    validate_libvirt_cluster,
    validate_libvirt_cluster_template,
    validate_libvirt_machine,
    validate_libvirt_machine_template,
)

__all__ = [
    "Admission",
    "FieldError",
    "ImageSizeLookup",
    "LibvirtClusterLister",
    "ReloadingTLS",
    "Verdict",
    "WebhookServer",
    "create_app",
    "host_key",
    "is_topology_dry_run",
    "validate_libvirt_cluster",
    "validate_libvirt_cluster_template",
    "validate_libvirt_machine",
    "validate_libvirt_machine_template",
]
