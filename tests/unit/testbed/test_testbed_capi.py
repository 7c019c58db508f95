"""Pure parts of capl.testbed.capi: webhook re-pointing, stand-in CRDs, local repositories.

No binaries needed; they pin the rewriting rules the e2e fixtures depend on.
"""

from __future__ import annotations

import base64
import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from capl.testbed.capi import CapiMissing, provider_webhook_objects
from capl.testbed.clusterctl import core_metadata, find_local_provider
from capl.testbed.manifests import cert_manager_crds, loopback_client_config, point_object_at

BASE = "https://127.0.0.1:9443"
CA = base64.b64encode(b"-----BEGIN CERTIFICATE-----\n").decode()


def crd(conversion: dict[str, Any] | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"group": "cluster.x-k8s.io"}
    if conversion is not None:
        spec["conversion"] = conversion
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "clusters.cluster.x-k8s.io"},
        "spec": spec,
    }


def test_crd_conversion_service_becomes_a_loopback_url() -> None:
    obj = crd(
        {
            "strategy": "Webhook",
            "webhook": {
                "clientConfig": {
                    "service": {"name": "capi-webhook-service", "namespace": "capi-system",
                                "path": "/convert"},
                },
                "conversionReviewVersions": ["v1"],
            },
        }
    )  # fmt: skip
    assert point_object_at(obj, base_url=BASE, ca_bundle=CA)
    webhook = obj["spec"]["conversion"]["webhook"]
    assert webhook["clientConfig"] == {"url": f"{BASE}/convert", "caBundle": CA}
    assert webhook["conversionReviewVersions"] == ["v1"]
    # Idempotent; and a later port change keeps the path.
    assert not point_object_at(obj, base_url=BASE, ca_bundle=CA)
    assert point_object_at(obj, base_url="https://127.0.0.1:1234/", ca_bundle=CA)
    assert webhook["clientConfig"]["url"] == "https://127.0.0.1:1234/convert"


def test_crd_without_conversion_webhook_is_left_alone() -> None:
    for conversion in (None, {"strategy": "None"}):
        obj = crd(conversion)
        before = copy.deepcopy(obj)
        assert not point_object_at(obj, base_url=BASE, ca_bundle=CA)
        assert obj == before


def test_every_admission_webhook_is_pointed_at_its_own_path() -> None:
    config = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "capi-validating-webhook-configuration"},
        "webhooks": [
            {
                "name": f"validation.{kind}.cluster.x-k8s.io",
                "clientConfig": {
                    "service": {"name": "capi-webhook-service", "namespace": "capi-system",
                                "path": f"/validate-cluster-x-k8s-io-v1beta2-{kind}"},
                },
                "failurePolicy": "Fail",
            }
            for kind in ("cluster", "machine")
        ],
    }  # fmt: skip
    assert point_object_at(config, base_url=BASE, ca_bundle=CA)
    assert [w["clientConfig"] for w in config["webhooks"]] == [
        loopback_client_config(
            base_url=BASE, path="/validate-cluster-x-k8s-io-v1beta2-cluster", ca_bundle=CA
        ),
        loopback_client_config(
            base_url=BASE, path="/validate-cluster-x-k8s-io-v1beta2-machine", ca_bundle=CA
        ),
    ]
    assert all(w["failurePolicy"] == "Fail" for w in config["webhooks"])


def test_only_crds_and_webhook_configurations_are_taken() -> None:
    manifests = [
        {"kind": "Namespace"},
        crd(None),
        {"kind": "Deployment"},
        {"kind": "MutatingWebhookConfiguration"},
        {"kind": "ValidatingWebhookConfiguration"},
        {"kind": "Certificate"},
    ]
    kinds = [m["kind"] for m in provider_webhook_objects(manifests)]
    assert kinds == [
        "CustomResourceDefinition",
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
    ]


def test_cert_manager_stand_in_covers_the_kinds_providers_ship() -> None:
    crds = {c["spec"]["names"]["kind"]: c for c in cert_manager_crds()}
    assert set(crds) == {"Certificate", "CertificateRequest", "Issuer", "ClusterIssuer"}
    assert crds["ClusterIssuer"]["spec"]["scope"] == "Cluster"
    for c in crds.values():
        assert c["spec"]["group"] == "cert-manager.io"
        assert [v["name"] for v in c["spec"]["versions"]] == ["v1"]
        # No clusterctl cert-manager label: clusterctl treats it as externally managed.
        assert "clusterctl.cluster.x-k8s.io/core" not in c["metadata"].get("labels", {})


def test_core_metadata_names_the_v1beta2_contract() -> None:
    meta = core_metadata("v1.13.6")
    assert meta["releaseSeries"] == [{"major": 1, "minor": 13, "contract": "v1beta2"}]
    assert core_metadata("v1.10.2")["releaseSeries"][0]["contract"] == "v1beta1"


def _release(root: Path, version: str, *, metadata: bool = True) -> Path:
    directory = root / "infrastructure-libvirt" / version
    directory.mkdir(parents=True)
    (directory / "infrastructure-components.yaml").write_text("---\n")
    if metadata:
        (directory / "metadata.yaml").write_text(yaml.safe_dump({"kind": "Metadata"}))
    return directory


def test_local_provider_is_the_highest_version(tmp_path: Path) -> None:
    _release(tmp_path, "v0.2.0")
    _release(tmp_path, "v0.10.0")
    (tmp_path / "infrastructure-libvirt" / "latest-notes").mkdir()
    provider = find_local_provider(tmp_path)
    assert provider.version == "v0.10.0"
    assert provider.type == "InfrastructureProvider"
    assert provider.components.name == "infrastructure-components.yaml"
    assert find_local_provider(tmp_path, version="v0.2.0").version == "v0.2.0"


def test_local_provider_needs_components_and_metadata(tmp_path: Path) -> None:
    with pytest.raises(CapiMissing, match="make release-manifests"):
        find_local_provider(tmp_path)
    _release(tmp_path, "v0.1.0", metadata=False)
    with pytest.raises(CapiMissing, match=r"metadata\.yaml"):
        find_local_provider(tmp_path)
