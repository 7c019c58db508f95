"""capl.webhooks.server: AdmissionReview handling, JSON patches and TLS serving (loopback)."""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer
from cryptography import x509

from capl import api
from capl.api import LibvirtCluster, LibvirtMachineSpec
from capl.api.admission import WEBHOOKS, webhook_for
from capl.testbed.certs import CertificateAuthority
from capl.webhooks import WebhookServer, create_app
from capl.webhooks.patch import apply_patch, json_patch

MUTATE_CLUSTER = "/mutate-infrastructure-cluster-x-k8s-io-v1alpha1-libvirtcluster"
MUTATE_MACHINE = "/mutate-infrastructure-cluster-x-k8s-io-v1alpha1-libvirtmachine"
VALIDATE_CLUSTER = "/validate-infrastructure-cluster-x-k8s-io-v1alpha1-libvirtcluster"
VALIDATE_MACHINE = "/validate-infrastructure-cluster-x-k8s-io-v1alpha1-libvirtmachine"
VALIDATE_MT = "/validate-infrastructure-cluster-x-k8s-io-v1alpha1-libvirtmachinetemplate"


class FakeClusters:
    def __init__(self, clusters: Sequence[LibvirtCluster] = ()) -> None:
        self.clusters = list(clusters)
        self.calls = 0

    async def list_libvirt_clusters(self) -> Sequence[LibvirtCluster]:
        self.calls += 1
        return self.clusters


class FakeImages:
    def __init__(self, size: int | None) -> None:
        self.size = size
        self.seen: list[tuple[str, str | None]] = []

    async def image_virtual_size(self, *, namespace: str, spec: LibvirtMachineSpec) -> int | None:
        self.seen.append((namespace, spec.image.url))
        return self.size


def cluster_obj(name: str = "c", cidr: str = "192.168.150.0/24", **extra: Any) -> dict[str, Any]:
    return {
        "apiVersion": api.API_VERSION,
        "kind": "LibvirtCluster",
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}"},
        "spec": {
            "hosts": [{"name": "h0", "uri": "qemu:///system", "controlPlane": True}],
            "network": {"cidr": cidr, "mode": "nat"},
            **extra,
        },
    }


def machine_obj(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": api.API_VERSION,
        "kind": "LibvirtMachine",
        "metadata": {"name": "m", "namespace": "ns"},
        "spec": {"image": {"url": "https://example.invalid/i.qcow2", "format": "qcow2"}, **spec},
    }


def review(
    kind: str,
    obj: dict[str, Any] | None,
    *,
    old: dict[str, Any] | None = None,
    operation: str = "CREATE",
    dry_run: bool = False,
) -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "0d5e3e2c-0000-4000-8000-000000000001",
            "kind": {"group": api.GROUP, "version": "v1alpha1", "kind": kind},
            "resource": {"group": api.GROUP, "version": "v1alpha1", "resource": kind.lower() + "s"},
            "requestKind": {"group": api.GROUP, "version": "v1alpha1", "kind": kind},
            "name": (obj or old or {}).get("metadata", {}).get("name"),
            "namespace": "ns",
            "operation": operation,
            "userInfo": {"username": "admin"},
            "object": obj,
            "oldObject": old,
            "dryRun": dry_run,
            "options": {},
        },
    }


@pytest.fixture
async def client() -> AsyncIterator[tuple[TestClient[Any, Any], FakeClusters, FakeImages]]:
    clusters = FakeClusters(
        [LibvirtCluster.model_validate(cluster_obj("other", "192.168.150.0/25"))]
    )
    images = FakeImages(size=3 * 1024**3)
    async with TestClient(TestServer(create_app(clusters=clusters, images=images))) as c:
        yield c, clusters, images


async def post(c: TestClient[Any, Any], path: str, body: dict[str, Any]) -> dict[str, Any]:
    resp = await c.post(path, json=body)
    assert resp.status == 200, await resp.text()
    data: dict[str, Any] = await resp.json()
    assert data["apiVersion"] == "admission.k8s.io/v1"
    assert data["kind"] == "AdmissionReview"
    assert data["response"]["uid"] == body["request"]["uid"]
    return data["response"]


def decoded_patch(response: dict[str, Any]) -> list[dict[str, Any]]:
    assert response["patchType"] == "JSONPatch"
    patch: list[dict[str, Any]] = json.loads(base64.b64decode(response["patch"]))
    return patch


async def test_every_webhook_path_is_routed(client: Any) -> None:
    c, _, _ = client
    for spec in WEBHOOKS:
        response = await post(c, spec.path, review(spec.kind.value, None, operation="DELETE"))
        assert response["allowed"] is True
    assert webhook_for(kind="LibvirtMachine", mutating=True) is not None
    assert webhook_for(kind="LibvirtMachineTemplate", mutating=True) is None


async def test_cluster_defaulting_patch(client: Any) -> None:
    c, _, _ = client
    raw = cluster_obj()
    raw["spec"]["futureField"] = {"keep": "me"}  # unknown to the models: must survive
    response = await post(c, MUTATE_CLUSTER, review("LibvirtCluster", raw))
    assert response["allowed"] is True
    patch = decoded_patch(response)
    patched = apply_patch(raw, patch)
    assert patched["spec"]["futureField"] == {"keep": "me"}
    assert patched["spec"]["network"]["name"] == "capl-ns.c"
    assert patched["spec"]["network"]["dnsDomain"] == "c.ns.capl.internal"
    assert patched["spec"]["network"]["dhcp"] == {
        "start": "192.168.150.2",
        "end": "192.168.150.254",
    }
    assert patched["spec"]["storagePool"] == {
        "name": "capl-ns.c",
        "path": "/var/lib/libvirt/images/capl-ns.c",
    }
    assert {op["op"] for op in patch} == {"add"}
    # Already defaulted: no patch at all.
    again = await post(
        c, MUTATE_CLUSTER, review("LibvirtCluster", patched, old=patched, operation="UPDATE")
    )
    assert again["allowed"] is True
    assert "patch" not in again


async def test_machine_defaulting_patch_keeps_unknown_fields_in_list_items(client: Any) -> None:
    c, _, _ = client
    raw = machine_obj(networkInterfaces=[{"mac": "52:54:00:AA:BB:CC", "vendorKnob": 1}, {}])
    response = await post(c, MUTATE_MACHINE, review("LibvirtMachine", raw))
    patch = decoded_patch(response)
    assert patch == [
        {"op": "add", "path": "/spec/networkInterfaces/0/mac", "value": "52:54:00:aa:bb:cc"}
    ]
    patched = apply_patch(raw, patch)
    assert patched["spec"]["networkInterfaces"][0] == {"mac": "52:54:00:aa:bb:cc", "vendorKnob": 1}


async def test_mutating_allows_what_it_cannot_parse(client: Any) -> None:
    c, _, _ = client
    raw = machine_obj(cpus="two")
    response = await post(c, MUTATE_MACHINE, review("LibvirtMachine", raw))
    assert response == {"uid": response["uid"], "allowed": True}


async def test_validating_cluster_overlap(client: Any) -> None:
    c, clusters, _ = client
    response = await post(c, VALIDATE_CLUSTER, review("LibvirtCluster", cluster_obj()))
    assert response["allowed"] is False
    assert response["status"]["code"] == 422
    assert response["status"]["reason"] == "Invalid"
    assert response["status"]["message"].startswith(
        "spec.network.cidr: 192.168.150.0/24 overlaps 192.168.150.0/25 of LibvirtCluster ns/other"
    )
    # the causes, as Kubernetes' own Invalid errors carry them (Cluster API's topology
    # controller shows only these in the Cluster's TopologyReconciled condition)
    details = response["status"]["details"]
    assert (details["group"], details["kind"], details["name"]) == (
        "infrastructure.cluster.x-k8s.io",
        "LibvirtCluster",
        "c",
    )
    assert details["causes"][0]["reason"] == "FieldValueInvalid"
    assert details["causes"][0]["field"] == "spec.network.cidr"
    assert details["causes"][0]["message"].startswith("192.168.150.0/24 overlaps 192.168.150.0/25")
    assert clusters.calls == 1
    ok = await post(c, VALIDATE_CLUSTER, review("LibvirtCluster", cluster_obj(cidr="10.0.0.0/24")))
    assert ok["allowed"] is True


async def test_validating_machine_uses_image_size(client: Any) -> None:
    c, _, images = client
    response = await post(
        c, VALIDATE_MACHINE, review("LibvirtMachine", machine_obj(rootVolume={"sizeGiB": 2}))
    )
    assert response["allowed"] is False
    assert response["status"]["message"].startswith("spec.rootVolume.sizeGiB: 2 GiB is smaller")
    assert images.seen == [("ns", "https://example.invalid/i.qcow2")]


async def test_validating_template_update_and_dry_run(client: Any) -> None:
    c, _, _ = client

    def template(cpus: int, annotations: dict[str, str] | None = None) -> dict[str, Any]:
        return {
            "apiVersion": api.API_VERSION,
            "kind": "LibvirtMachineTemplate",
            "metadata": {"name": "t", "namespace": "ns", "annotations": annotations or {}},
            "spec": {"template": {"spec": machine_obj(cpus=cpus)["spec"]}},
        }

    update = review("LibvirtMachineTemplate", template(4), old=template(2), operation="UPDATE")
    denied = await post(c, VALIDATE_MT, update)
    assert denied["allowed"] is False
    assert denied["status"]["message"].startswith(
        "spec.template.spec: LibvirtMachineTemplate spec is immutable"
    )
    dry = review(
        "LibvirtMachineTemplate",
        template(4, {api.TOPOLOGY_DRY_RUN_ANNOTATION: ""}),
        old=template(2),
        operation="UPDATE",
        dry_run=True,
    )
    assert (await post(c, VALIDATE_MT, dry))["allowed"] is True


async def test_validating_denies_what_it_cannot_parse(client: Any) -> None:
    c, _, _ = client
    response = await post(c, VALIDATE_MACHINE, review("LibvirtMachine", machine_obj(cpus=0)))
    assert response["allowed"] is False
    assert "spec.cpus" in response["status"]["message"]


@pytest.mark.parametrize("region", ["-eu", "eu west", "x" * 64, "eu/west", ""])
async def test_validating_cluster_region_must_be_a_label_value(client: Any, region: str) -> None:
    c, _, _ = client
    obj = cluster_obj(cidr="10.0.1.0/24", region=region)
    response = await post(c, VALIDATE_CLUSTER, review("LibvirtCluster", obj))
    assert response["allowed"] is False
    assert response["status"]["message"].startswith("spec.region: ")


async def test_validating_cluster_region_label_value_accepted(client: Any) -> None:
    c, _, _ = client
    obj = cluster_obj(cidr="10.0.1.0/24", region="eu-west_1.a")
    response = await post(c, VALIDATE_CLUSTER, review("LibvirtCluster", obj))
    assert response["allowed"] is True, response


async def test_objects_being_deleted_are_not_validated(client: Any) -> None:
    c, _, _ = client
    old = cluster_obj(cidr="10.0.0.0/24")
    new = cluster_obj(cidr="10.0.0.0/24")
    new["spec"]["network"]["dhcp"] = {"start": "10.9.0.1", "end": "10.9.0.2"}  # a new problem
    denied = await post(
        c, VALIDATE_CLUSTER, review("LibvirtCluster", new, old=old, operation="UPDATE")
    )
    assert denied["allowed"] is False
    new["metadata"]["deletionTimestamp"] = "2026-01-02T03:04:05Z"
    new["metadata"]["finalizers"] = []
    response = await post(
        c, VALIDATE_CLUSTER, review("LibvirtCluster", new, old=old, operation="UPDATE")
    )
    assert response["allowed"] is True


async def test_wrong_kind_for_path(client: Any) -> None:
    c, _, _ = client
    response = await post(c, VALIDATE_MACHINE, review("LibvirtCluster", cluster_obj()))
    assert response["allowed"] is False
    assert response["status"]["code"] == 400


async def test_bad_requests(client: Any) -> None:
    c, _, _ = client
    resp = await c.post(
        VALIDATE_MACHINE, data=b"{not json", headers={"Content-Type": "application/json"}
    )
    assert resp.status == 400
    resp = await c.post(VALIDATE_MACHINE, data=b"x", headers={"Content-Type": "text/plain"})
    assert resp.status == 415
    resp = await c.post(VALIDATE_MACHINE, json={"kind": "AdmissionReview"})
    assert resp.status == 400
    assert "AdmissionReview" in await resp.text()
    resp = await c.get(VALIDATE_MACHINE)
    assert resp.status == 405
    resp = await c.post("/validate-something-else", json={})
    assert resp.status == 404


async def test_without_lookups_cross_object_checks_are_skipped() -> None:
    async with TestClient(TestServer(create_app())) as c:
        response = await post(c, VALIDATE_CLUSTER, review("LibvirtCluster", cluster_obj()))
        assert response["allowed"] is True
        response = await post(
            c, VALIDATE_MACHINE, review("LibvirtMachine", machine_obj(rootVolume={"sizeGiB": 1}))
        )
        assert response["allowed"] is True


# --- JSON patch ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "before", "after", "expected"),
    [
        ({"a": 1}, {"a": 1}, {"a": 1}, []),
        ({"a": 1}, {"a": 1}, {"a": 2}, [{"op": "add", "path": "/a", "value": 2}]),
        ({}, {"d": 5}, {"d": 6}, [{"op": "add", "path": "/d", "value": 6}]),
        (
            {"a/b": {"x": 1}},
            {"a/b": {"x": 1}},
            {"a/b": {"x": 1, "y": 2}},
            [{"op": "add", "path": "/a~1b/y", "value": 2}],
        ),
        (
            {"l": [1, 2]},
            {"l": [1, 2]},
            {"l": [1, 3]},
            [{"op": "replace", "path": "/l/1", "value": 3}],
        ),
        ({"l": [1]}, {"l": [1]}, {"l": [1, 2]}, [{"op": "add", "path": "/l", "value": [1, 2]}]),
        ({"a": 1, "b": 2}, {"a": 1, "b": 2}, {"a": 1}, [{"op": "remove", "path": "/b"}]),
        ({"a": 1}, {"a": 1, "b": 2}, {"a": 1}, []),
        (
            {"m": {"t~x": 1}},
            {"m": {"t~x": 1}},
            {"m": {"t~x": 2}},
            [{"op": "add", "path": "/m/t~0x", "value": 2}],
        ),
    ],
)
def test_json_patch(raw: Any, before: Any, after: Any, expected: list[dict[str, Any]]) -> None:
    patch = json_patch(raw, before, after)
    assert patch == expected
    applied = apply_patch(raw, patch)
    for key, value in after.items():
        assert applied[key] == value


# --- TLS -------------------------------------------------------------------------------------


def write_pair(ca: CertificateAuthority, directory: Path) -> x509.Certificate:
    pair = ca.issue_serving(hosts=["127.0.0.1", "localhost"])
    pair.write(cert_path=directory / "tls.crt", key_path=directory / "tls.key")
    return pair.certificate


async def served_certificate(port: int, ca_file: Path) -> x509.Certificate:
    context = ssl.create_default_context(cafile=str(ca_file))
    _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
    try:
        ssl_object = writer.get_extra_info("ssl_object")
        der = ssl_object.getpeercert(binary_form=True)
        return x509.load_der_x509_certificate(der)
    finally:
        writer.close()
        await writer.wait_closed()


async def test_tls_server_serves_admission_and_reloads_certificates(tmp_path: Path) -> None:
    ca = CertificateAuthority()
    ca_file = tmp_path / "ca.crt"
    ca_file.write_bytes(ca.cert_pem)
    certs = tmp_path / "certs"
    first = write_pair(ca, certs)
    async with WebhookServer(app=create_app(), cert_dir=certs, host="127.0.0.1", port=0) as server:
        assert (await served_certificate(server.port, ca_file)).serial_number == first.serial_number
        context = ssl.create_default_context(cafile=str(ca_file))
        async with (
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as session,
            session.post(
                f"https://127.0.0.1:{server.port}{VALIDATE_MACHINE}",
                json=review("LibvirtMachine", machine_obj()),
            ) as resp,
        ):
            assert resp.status == 200
            assert (await resp.json())["response"]["allowed"] is True
        # cert-manager renews: the next handshake gets the new certificate, no restart.
        second = write_pair(ca, certs)
        assert second.serial_number != first.serial_number
        assert (
            await served_certificate(server.port, ca_file)
        ).serial_number == second.serial_number
        # A half-written pair keeps the previous certificate in service.
        (certs / "tls.key").write_text("garbage")
        assert (
            await served_certificate(server.port, ca_file)
        ).serial_number == second.serial_number


async def test_server_needs_its_certificates(tmp_path: Path) -> None:
    server = WebhookServer(app=create_app(), cert_dir=tmp_path, host="127.0.0.1", port=0)
    with pytest.raises(FileNotFoundError):
        await server.start()
    with pytest.raises(RuntimeError, match="not running"):
        _ = server.port
    await server.stop()
