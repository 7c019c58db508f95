"""The admission webhooks called by a real kube-apiserver, over TLS on loopback.

The aiohttp application runs in this process (`WebhookServer` on 127.0.0.1, certificate from a
CA generated here); Validating- and MutatingWebhookConfigurations point the API server at it
with `clientConfig.url` and the CA bundle, scoped by namespaceSelector to the test's
namespace so no other test ever reaches this webhook. The configurations are removed after
each test.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from capl import api
from capl.api import LibvirtCluster
from capl.api.admission import WEBHOOKS
from capl.testbed.certs import CertificateAuthority
from capl.webhooks import WebhookServer, create_app

pytestmark = pytest.mark.apiserver

DEADLINE = 60.0  # a failure bound, never a synchronisation device


class NamespaceClusters:
    """LibvirtClusterLister over the API server, limited to one namespace."""

    def __init__(self, objects: client.CustomObjectsApi, namespace: str) -> None:
        self._objects = objects
        self._namespace = namespace

    async def list_libvirt_clusters(self) -> Sequence[LibvirtCluster]:
        listing = await self._objects.list_namespaced_custom_object(
            api.GROUP, api.VERSION, self._namespace, "libvirtclusters"
        )
        return [LibvirtCluster.model_validate(item) for item in listing["items"]]


def configurations(*, name: str, port: int, ca_pem: bytes, namespace: str) -> list[dict[str, Any]]:
    bundle = base64.b64encode(ca_pem).decode()
    docs = []
    for mutating, kind in (
        (True, "MutatingWebhookConfiguration"),
        (False, "ValidatingWebhookConfiguration"),
    ):
        hooks = [
            {
                "name": spec.name,
                "admissionReviewVersions": ["v1"],
                "clientConfig": {"url": f"https://127.0.0.1:{port}{spec.path}", "caBundle": bundle},
                "failurePolicy": "Fail",
                "sideEffects": "None",
                "timeoutSeconds": 10,
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                "rules": [
                    {
                        "apiGroups": [api.GROUP],
                        "apiVersions": [api.VERSION],
                        "operations": list(spec.operations),
                        "resources": [spec.plural.value],
                        "scope": "Namespaced",
                    }
                ],
            }
            for spec in WEBHOOKS
            if spec.mutating == mutating
        ]
        docs.append(
            {
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": kind,
                "metadata": {"name": name},
                "webhooks": hooks,
            }
        )
    return docs


async def eventually(probe: Callable[[], Awaitable[bool]]) -> None:
    async with asyncio.timeout(DEADLINE):
        while True:
            if await probe():
                return
            await asyncio.sleep(0.1)


def machine(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": api.API_VERSION,
        "kind": "LibvirtMachine",
        "metadata": {"name": name},
        "spec": {"image": {"url": "https://images.example.invalid/base.qcow2"}, **spec},
    }


def cluster(name: str, cidr: str, uri: str = "qemu:///system") -> dict[str, Any]:
    return {
        "apiVersion": api.API_VERSION,
        "kind": "LibvirtCluster",
        "metadata": {"name": name},
        "spec": {"hosts": [{"name": "h0", "uri": uri}], "network": {"cidr": cidr}},
    }


def machine_template(
    name: str, *, cpus: int, annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    return {
        "apiVersion": api.API_VERSION,
        "kind": "LibvirtMachineTemplate",
        "metadata": {"name": name, "annotations": annotations or {}},
        "spec": {"template": {"spec": machine("x", cpus=cpus)["spec"]}},
    }


def message_of(exc: ApiException) -> str:
    text: str = json.loads(exc.body)["message"]
    return text


class Webhooked:
    def __init__(self, objects: client.CustomObjectsApi, namespace: str) -> None:
        self.objects = objects
        self.namespace = namespace

    async def create(self, body: dict[str, Any], *, dry_run: bool = False) -> dict[str, Any]:
        kwargs = {"dry_run": "All"} if dry_run else {}
        result: dict[str, Any] = await self.objects.create_namespaced_custom_object(
            api.GROUP, api.VERSION, self.namespace, body["kind"].lower() + "s", body, **kwargs
        )
        return result

    async def apply(
        self, body: dict[str, Any], *, dry_run: bool = False, manager: str = "capl-test"
    ) -> dict[str, Any]:
        """Server-side apply, the way the topology controller sends its dry runs."""
        kwargs: dict[str, Any] = {"dry_run": "All"} if dry_run else {}
        result: dict[str, Any] = await self.objects.patch_namespaced_custom_object(
            api.GROUP,
            api.VERSION,
            self.namespace,
            body["kind"].lower() + "s",
            body["metadata"]["name"],
            body,
            field_manager=manager,
            force=True,
            _content_type="application/apply-patch+yaml",
            **kwargs,
        )
        return result


@pytest.fixture
async def webhooked(
    api_client: client.ApiClient, namespace: str, tmp_path: Path
) -> AsyncIterator[Webhooked]:
    ca = CertificateAuthority(common_name="capl-webhook-test-ca")
    pair = ca.issue_serving(hosts=["127.0.0.1"])
    pair.write(cert_path=tmp_path / "tls.crt", key_path=tmp_path / "tls.key")
    objects = client.CustomObjectsApi(api_client)
    admission = client.AdmissionregistrationV1Api(api_client)
    app = create_app(clusters=NamespaceClusters(objects, namespace))
    name = f"capl-test-{namespace}"
    async with WebhookServer(app=app, cert_dir=tmp_path, host="127.0.0.1", port=0) as server:
        mutating, validating = configurations(
            name=name, port=server.port, ca_pem=ca.cert_pem, namespace=namespace
        )
        await admission.create_mutating_webhook_configuration(mutating)
        await admission.create_validating_webhook_configuration(validating)
        try:
            target = Webhooked(objects, namespace)

            async def active() -> bool:
                # Both configurations are live once the mutating webhook defaults a name
                # and the validating one rejects what only it can (a duplicate MAC).
                created = await target.create(cluster("probe", "10.99.0.0/24"), dry_run=True)
                if "name" not in created["spec"]["network"]:
                    return False
                nics = [{"mac": "52:54:00:00:00:01"}, {"mac": "52:54:00:00:00:01", "bridge": "b"}]
                try:
                    await target.create(machine("probe", networkInterfaces=nics), dry_run=True)
                except ApiException as e:
                    return e.status == 422 and "duplicates" in message_of(e)
                return False

            await eventually(active)
            yield target
        finally:
            await admission.delete_mutating_webhook_configuration(name)
            await admission.delete_validating_webhook_configuration(name)


async def test_template_update_rejected_but_topology_dry_run_accepted(webhooked: Webhooked) -> None:
    await webhooked.apply(machine_template("workers", cpus=2))
    changed = machine_template("workers", cpus=4)
    with pytest.raises(ApiException) as info:
        await webhooked.apply(changed)
    assert info.value.status == 422
    message = message_of(info.value)
    assert (
        "denied the request: spec.template.spec: LibvirtMachineTemplate spec is immutable"
        in message
    )

    # The topology controller's dry run: same change, annotated, dryRun=All.
    annotated = machine_template(
        "workers", cpus=4, annotations={api.TOPOLOGY_DRY_RUN_ANNOTATION: ""}
    )
    result = await webhooked.apply(annotated, dry_run=True, manager="capi-topology")
    assert result["spec"]["template"]["spec"]["cpus"] == 4
    stored = await webhooked.objects.get_namespaced_custom_object(
        api.GROUP, api.VERSION, webhooked.namespace, "libvirtmachinetemplates", "workers"
    )
    assert stored["spec"]["template"]["spec"]["cpus"] == 2  # a dry run persists nothing

    # Each half of the exception alone is not enough.
    with pytest.raises(ApiException):
        await webhooked.apply(changed, dry_run=True)
    with pytest.raises(ApiException):
        await webhooked.apply(annotated)


async def test_overlapping_cidr_rejected(webhooked: Webhooked) -> None:
    await webhooked.create(cluster("first", "192.168.150.0/24"))
    with pytest.raises(ApiException) as info:
        await webhooked.create(
            cluster("second", "192.168.150.128/25", uri="qemu+ssh://root@localhost/system")
        )
    assert info.value.status == 422
    message = message_of(info.value)
    assert (
        "spec.network.cidr: 192.168.150.128/25 overlaps 192.168.150.0/24 of LibvirtCluster"
        f" {webhooked.namespace}/first" in message
    ), message
    # Another network, or the same one on another host, is fine.
    await webhooked.create(cluster("third", "192.168.151.0/24"))
    await webhooked.create(
        cluster("fourth", "192.168.150.0/24", uri="qemu+ssh://kvm2.example.invalid/system")
    )


async def test_defaults_are_stored(webhooked: Webhooked) -> None:
    created = await webhooked.create(cluster("defaulted", "10.20.0.0/24"))
    ns = webhooked.namespace
    assert created["spec"]["network"]["name"] == f"capl-{ns}.defaulted"
    assert created["spec"]["network"]["dnsDomain"] == f"defaulted.{ns}.capl.internal"
    assert created["spec"]["network"]["dhcp"] == {"start": "10.20.0.2", "end": "10.20.0.254"}
    assert created["spec"]["storagePool"]["path"] == f"/var/lib/libvirt/images/capl-{ns}.defaulted"
    m = await webhooked.create(machine("mac", networkInterfaces=[{"mac": "52:54:00:AB:CD:EF"}]))
    assert m["spec"]["networkInterfaces"] == [{"mac": "52:54:00:ab:cd:ef"}]


async def test_controller_write_backs_pass_the_webhooks(webhooked: Webhooked) -> None:
    """What the controllers will patch (endpoint, providerID, status) is not blocked."""
    await webhooked.create(cluster("wb", "10.30.0.0/24"))
    patched = await webhooked.objects.patch_namespaced_custom_object(
        api.GROUP, api.VERSION, webhooked.namespace, "libvirtclusters", "wb",
        {"spec": {"controlPlaneEndpoint": {"host": "api.wb.example", "port": 6443}}},
        _content_type="application/merge-patch+json",
    )  # fmt: skip
    assert patched["spec"]["controlPlaneEndpoint"]["port"] == 6443
    await webhooked.create(machine("wb"))
    uuid = "6f1c8c52-1d7a-4c2e-9d4e-0a1b2c3d4e5f"
    patched = await webhooked.objects.patch_namespaced_custom_object(
        api.GROUP, api.VERSION, webhooked.namespace, "libvirtmachines", "wb",
        {"spec": {"providerID": f"libvirt:///{uuid}", "domainUUID": uuid, "hostName": "h0"}},
        _content_type="application/merge-patch+json",
    )  # fmt: skip
    assert patched["spec"]["domainUUID"] == uuid


async def test_bad_hardware_refused_at_admission_naming_the_field(webhooked: Webhooked) -> None:
    """Machine hardware (issue 17): a topology that does not give cpus is refused by the
    CRD's own rule; pinning, NUMA cells and XML patches that touch capl's elements by the
    webhook; each message names the field. A consistent spec passes (dry run)."""
    bad: list[tuple[dict[str, Any], str]] = [
        (
            {"cpus": 4, "cpu": {"topology": {"sockets": 2, "cores": 1, "threads": 1}}},
            "spec.cpu.topology: Invalid value: cpu.topology: sockets x cores x"
            " threads must equal cpus",
        ),
        (
            {"xmlPatches": [{"op": "set", "path": "uuid", "value": "x"}]},
            "spec.xmlPatches[0].path: element 'uuid' is owned by capl and cannot be patched",
        ),
        (
            {"xmlPatches": [{"op": "add", "path": "devices", "xml": "<interface type='bridge'/>"}]},
            "spec.xmlPatches[0].xml: element 'interface' is owned by capl and cannot be added",
        ),
        (
            {"cpus": 2, "cpu": {"dedicatedCPUs": [3]}},
            "spec.cpu.dedicatedCPUs: 1 host CPUs for 2 vCPUs: give one per vCPU",
        ),
        (
            {"hostDevices": [{"name": "g", "pciAddress": "0000:65:00.0", "vendor": "0x10de"}]},
            "hostDevices: set pciAddress, or vendor and product",
        ),
    ]
    for spec, expected in bad:
        with pytest.raises(ApiException) as info:
            await webhooked.create(machine("hw", **spec), dry_run=True)
        assert info.value.status == 422, spec
        assert expected in message_of(info.value), message_of(info.value)
    good = {
        "cpus": 4,
        "memoryMiB": 2048,
        "cpu": {"mode": "host-model", "topology": {"sockets": 1, "cores": 2, "threads": 2}},
        "hostDevices": [{"name": "g", "vendor": "0x10de", "product": "0x2236"}],
        "tpm": {},
        "xmlPatches": [{"op": "add", "path": "devices", "xml": "<watchdog model='itco'/>"}],
    }
    created = await webhooked.create(machine("hw", **good), dry_run=True)
    assert created["spec"]["cpu"]["topology"] == {"sockets": 1, "cores": 2, "threads": 2}
    assert created["spec"]["tpm"] == {"version": "2.0"}
