"""Provider manifests on a kubelet-less test bed: render, re-point webhooks at loopback,
stand-in cert-manager CRDs.

- `render_kustomization` / `parse_manifests`: `kubectl kustomize <tree>/default`, exactly what
  clusterctl would install; `provider_webhook_objects` keeps the CRDs and webhook
  configurations.
- `point_provider_webhooks`: every `clientConfig` of a provider's CRDs (conversion) and
  mutating/validating webhook configurations is rewritten from a Service reference to
  `url: https://127.0.0.1:<port><path>` with the bundle of a CA made for the manager
  instance; objects that already exist (from `clusterctl init`, or an earlier start) keep
  everything else and only get their clientConfig replaced.
- cert-manager: `install_cert_manager_crds` pre-installs stand-in CRDs of the cert-manager.io/v1
  kinds (schemaless, no controller) so that `clusterctl init` finds cert-manager "installed"
  and the providers' Certificate/Issuer objects can be created (see `capl.testbed.clusterctl`);
  `finalize_namespace` finishes a namespace no namespace controller will.

kubectl only, no Kubernetes client library and no other capl layer.
"""

from __future__ import annotations

import base64
import json
import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

import yaml

from capl.testbed.capibuild import (
    CRD_RESOURCE,
    PROVIDER_LABEL,
    STAND_IN_LABEL,
    CapiError,
    base_env,
)
from capl.testbed.controlplane import ControlPlane, ControlPlaneError
from capl.testbed.kubectl import wait_established
from capl.testbed.process import run_captured

log = logging.getLogger(__name__)

# ------------------------------------------------------------------------------ manifests


YAML_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_MUTATING = "mutatingwebhookconfigurations.admissionregistration.k8s.io"
_VALIDATING = "validatingwebhookconfigurations.admissionregistration.k8s.io"
_RESOURCE_OF_KIND: Final = {
    "CustomResourceDefinition": CRD_RESOURCE,
    "MutatingWebhookConfiguration": _MUTATING,
    "ValidatingWebhookConfiguration": _VALIDATING,
}
_CA_INJECTION = "cert-manager.io/inject-ca-from"
_CONFLICT = re.compile(r"the object has been modified|AlreadyExists|already exists", re.I)


def parse_manifests(text: str) -> list[dict[str, Any]]:
    """The objects of a multi-document YAML stream (empty documents dropped)."""
    return [d for d in yaml.load_all(text, Loader=YAML_LOADER) if isinstance(d, dict)]


async def render_kustomization(*, kubectl: Path, directory: Path) -> str:
    """`kubectl kustomize <directory>` (YAML text)."""
    rc, out, err = await run_captured(
        [str(kubectl), "kustomize", str(directory)], env=base_env(), within=120
    )
    if rc != 0:
        raise CapiError(f"kubectl kustomize {directory} failed: {err.strip()}")
    return out


def provider_webhook_objects(manifests: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The CRDs and admission webhook configurations among a provider's manifests."""
    return [dict(m) for m in manifests if m.get("kind") in _RESOURCE_OF_KIND]


def loopback_client_config(*, base_url: str, path: str, ca_bundle: str) -> dict[str, Any]:
    """A webhook clientConfig calling `base_url + path` and trusting `ca_bundle` (base64)."""
    return {"url": f"{base_url.rstrip('/')}{path}", "caBundle": ca_bundle}


def _client_config_path(config: Mapping[str, Any], default: str) -> str:
    service = config.get("service")
    if isinstance(service, Mapping) and service.get("path"):
        return str(service["path"])
    if config.get("url"):
        return urlsplit(str(config["url"])).path or default
    return default


def point_object_at(obj: dict[str, Any], *, base_url: str, ca_bundle: str) -> bool:
    """Rewrite the clientConfig(s) of a CRD's conversion webhook or of an admission webhook
    configuration to call `base_url` (same paths); in place. Returns whether it changed.

    Objects without webhooks (a CRD with conversion strategy None) are left alone.
    """
    changed = False
    kind = obj.get("kind")
    if kind == "CustomResourceDefinition":
        conversion = obj.get("spec", {}).get("conversion") or {}
        if conversion.get("strategy") != "Webhook":
            return False
        webhook = conversion.setdefault("webhook", {})
        old = webhook.get("clientConfig") or {}
        new = loopback_client_config(
            base_url=base_url, path=_client_config_path(old, "/convert"), ca_bundle=ca_bundle
        )
        if old != new:
            webhook["clientConfig"] = new
            changed = True
    elif kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        for hook in obj.get("webhooks") or []:
            old = hook.get("clientConfig") or {}
            new = loopback_client_config(
                base_url=base_url, path=_client_config_path(old, "/"), ca_bundle=ca_bundle
            )
            if old != new:
                hook["clientConfig"] = new
                changed = True
    return changed


def _as_list(items: Sequence[Mapping[str, Any]]) -> bytes:
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": list(items)}).encode()


def items_of(listing: str) -> list[dict[str, Any]]:
    """The objects of `kubectl get -o json` output (a List, one object, or nothing)."""
    if not listing.strip():
        return []
    parsed: dict[str, Any] = json.loads(listing)
    if parsed.get("kind") == "List" or "items" in parsed:
        return list(parsed.get("items") or [])
    return [parsed]


def _key(obj: Mapping[str, Any]) -> tuple[str, str]:
    return str(obj.get("kind")), str(obj.get("metadata", {}).get("name"))


async def point_provider_webhooks(
    plane: ControlPlane,
    *,
    provider: str,
    base_url: str,
    ca_pem: bytes,
    manifests: Sequence[Mapping[str, Any]] = (),
    within: float = 60.0,
    attempts: int = 5,
) -> list[str]:
    """Make a provider's CRD conversion and admission webhooks call `base_url`.

    Every CRD and (mutating/validating) webhook configuration labelled
    `cluster.x-k8s.io/provider=<provider>`, plus those in `manifests` (created when absent),
    gets its clientConfig(s) replaced by a URL on `base_url` with `ca_pem` as CA bundle; all
    other fields of existing objects (clusterctl's labels, annotations) stay as they are.
    Waits until the CRDs are Established and returns their names.
    """
    ca_bundle = base64.b64encode(ca_pem).decode()
    wanted = {_key(m): dict(m) for m in provider_webhook_objects(manifests)}
    for attempt in range(1, attempts + 1):
        existing: dict[tuple[str, str], dict[str, Any]] = {}
        listing = await plane.kubectl(
            "get", f"{CRD_RESOURCE},{_MUTATING},{_VALIDATING}",
            "-l", f"{PROVIDER_LABEL}={provider}", "-o", "json",
        )  # fmt: skip
        for item in items_of(listing):
            existing[_key(item)] = item
        named = [f"{_RESOURCE_OF_KIND[k]}/{n}" for k, n in wanted if (k, n) not in existing]
        if named:
            listing = await plane.kubectl("get", *named, "--ignore-not-found", "-o", "json")
            for item in items_of(listing):
                existing[_key(item)] = item

        to_create: list[dict[str, Any]] = []
        for key, manifest in wanted.items():
            if key in existing:
                continue
            obj = json.loads(json.dumps(manifest))
            obj.get("metadata", {}).get("annotations", {}).pop(_CA_INJECTION, None)
            point_object_at(obj, base_url=base_url, ca_bundle=ca_bundle)
            to_create.append(obj)
        to_replace: list[dict[str, Any]] = []
        for obj in existing.values():
            obj.get("metadata", {}).pop("managedFields", None)
            if point_object_at(obj, base_url=base_url, ca_bundle=ca_bundle):
                to_replace.append(obj)
        try:
            if to_create:
                await plane.kubectl("create", "-f", "-", "-o", "name", stdin=_as_list(to_create))
            if to_replace:
                await plane.kubectl("replace", "-f", "-", "-o", "name", stdin=_as_list(to_replace))
        except ControlPlaneError as e:
            if attempt < attempts and _CONFLICT.search(str(e)):
                log.info("webhook objects of %s changed meanwhile; retrying", provider)
                continue
            raise
        crds = sorted({n for k, n in [*existing, *wanted] if k == "CustomResourceDefinition"})
        if crds:
            await wait_established(
                plane.kubectl, [f"{CRD_RESOURCE}/{n}" for n in crds], within=within
            )
        log.info(
            "%s webhooks point at %s (%d created, %d re-pointed)",
            provider, base_url, len(to_create), len(to_replace),
        )  # fmt: skip
        return crds
    raise AssertionError("not reached")  # pragma: no cover


async def finalize_namespace(plane: ControlPlane, name: str) -> bool:
    """Finish deleting a Terminating namespace that holds nothing any more.

    The test bed has no namespace controller, so a deleted namespace stays Terminating with
    its `kubernetes` finalizer; this does the controller's last step. Returns whether the
    namespace was finalized (False: absent or not being deleted).
    """
    raw = await plane.kubectl("get", "namespace", name, "--ignore-not-found", "-o", "json")
    if not raw.strip():
        return False
    namespace = json.loads(raw)
    if not namespace.get("metadata", {}).get("deletionTimestamp"):
        return False
    namespace.setdefault("spec", {})["finalizers"] = []
    namespace.get("metadata", {}).pop("managedFields", None)
    await plane.kubectl(
        "replace", "--raw", f"/api/v1/namespaces/{name}/finalize", "-f", "-",
        stdin=json.dumps(namespace).encode(),
    )  # fmt: skip
    return True


# ------------------------------------------------------------------------------ cert-manager


_CERT_MANAGER_KINDS: Final[tuple[tuple[str, str, str, list[str]], ...]] = (
    # kind, plural, scope, short names
    ("Certificate", "certificates", "Namespaced", ["cert", "certs"]),
    ("CertificateRequest", "certificaterequests", "Namespaced", ["cr", "crs"]),
    ("Issuer", "issuers", "Namespaced", []),
    ("ClusterIssuer", "clusterissuers", "Cluster", []),
)


def cert_manager_crds() -> list[dict[str, Any]]:
    """Stand-in CRDs for the cert-manager.io/v1 kinds providers ship (schemaless, no
    controller behind them): enough for clusterctl's cert-manager check and for creating the
    providers' Certificate and Issuer objects, which nothing here acts on."""
    crds = []
    for kind, plural, scope, short in _CERT_MANAGER_KINDS:
        names: dict[str, Any] = {
            "kind": kind,
            "listKind": f"{kind}List",
            "plural": plural,
            "singular": kind.lower(),
            "categories": ["cert-manager"],
        }
        if short:
            names["shortNames"] = short
        crds.append(
            {
                "apiVersion": "apiextensions.k8s.io/v1",
                "kind": "CustomResourceDefinition",
                "metadata": {
                    "name": f"{plural}.cert-manager.io",
                    "labels": {STAND_IN_LABEL: "cert-manager"},
                },
                "spec": {
                    "group": "cert-manager.io",
                    "names": names,
                    "scope": scope,
                    "versions": [
                        {
                            "name": "v1",
                            "served": True,
                            "storage": True,
                            "subresources": {"status": {}},
                            "schema": {
                                "openAPIV3Schema": {
                                    "type": "object",
                                    "x-kubernetes-preserve-unknown-fields": True,
                                }
                            },
                        }
                    ],
                },
            }
        )
    return crds


async def install_cert_manager_crds(plane: ControlPlane, *, within: float = 60.0) -> list[str]:
    """Install the stand-in cert-manager CRDs (idempotent); returns their names."""
    crds = cert_manager_crds()
    await plane.kubectl(
        "apply", "--server-side", "--force-conflicts", "--field-manager=capl-testbed",
        "-f", "-", stdin=_as_list(crds),
    )  # fmt: skip
    names = [c["metadata"]["name"] for c in crds]
    await wait_established(plane.kubectl, [f"{CRD_RESOURCE}/{n}" for n in names], within=within)
    return names
