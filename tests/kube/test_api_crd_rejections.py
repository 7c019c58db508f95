"""The generated CRDs on a real kube-apiserver: malformed objects and statuses are refused.

Every rejection case asserts HTTP 422 and that the API server's message names the field at
fault, so the schema (bounds, patterns, enums, map-lists, CEL rules) is proven where users
meet it, not only in the generator's unit tests. Helpers: tests/kube/crd_objects.py.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from tests.kube.crd_objects import (
    TWO_HOSTS,
    UUID,
    UUID2,
    T,
    at,
    cluster,
    cluster_template,
    create,
    machine,
    machine_template,
    merge_patch,
    message_of,
    objects,
)

__all__ = ["objects"]  # the fixture, registered by this import

pytestmark = pytest.mark.apiserver


M, C = machine(), cluster()
NICS = "spec.networkInterfaces"
# (case id, object, substring the API server's message must contain: the field's path)
MALFORMED: list[tuple[str, dict[str, Any], str]] = [
    ("cpus-zero", at(M, "spec.cpus", 0), "spec.cpus"),
    ("cpus-string", at(M, "spec.cpus", "two"), "spec.cpus"),
    ("cpus-too-many", at(M, "spec.cpus", 513), "spec.cpus"),
    ("memory-too-small", at(M, "spec.memoryMiB", 32), "spec.memoryMiB"),
    ("memory-float", at(M, "spec.memoryMiB", 1024.5), "spec.memoryMiB"),
    ("image-missing", at(M, "spec.image", None), "spec.image"),
    ("image-no-source", at(M, "spec.image", {"format": "raw"}), "spec.image"),
    ("image-two-sources", at(M, "spec.image.path", "/images/base.qcow2"), "spec.image"),
    ("image-url-scheme", at(M, "spec.image.url", "ftp://x.invalid/base"), "spec.image.url"),
    ("image-path-relative", at(M, "spec.image", {"path": "images/base.qcow2"}), "spec.image.path"),
    ("image-checksum", at(M, "spec.image.checksum", "sha256:abc"), "spec.image.checksum"),
    ("image-checksum-algo", at(M, "spec.image.checksum", "md5:" + "a" * 67), "spec.image.checksum"),
    ("image-format", at(M, "spec.image.format", "vmdk"), "spec.image.format"),
    ("root-size-zero", at(M, "spec.rootVolume", {"sizeGiB": 0}), "spec.rootVolume.sizeGiB"),
    ("root-size-missing", at(M, "spec.rootVolume", {}), "spec.rootVolume.sizeGiB"),
    (
        "disk-duplicate",
        at(M, "spec.extraDisks", [{"name": "d", "sizeGiB": 1}, {"name": "d", "sizeGiB": 2}]),
        "spec.extraDisks[1]",
    ),
    (
        "disk-name",
        at(M, "spec.extraDisks", [{"name": "Data_1", "sizeGiB": 1}]),
        "spec.extraDisks[0].name",
    ),
    (
        "disk-too-big",
        at(M, "spec.extraDisks", [{"name": "d", "sizeGiB": 70000}]),
        "spec.extraDisks[0].sizeGiB",
    ),
    ("mac-format", at(M, NICS, [{"mac": "52:54:00:zz:00:01"}]), f"{NICS}[0].mac"),
    ("mac-short", at(M, NICS, [{"mac": "52:54:00:00:01"}]), f"{NICS}[0].mac"),
    ("nic-network-and-bridge", at(M, NICS, [{"network": "a", "bridge": "br0"}]), f"{NICS}[0]"),
    ("nic-ip", at(M, NICS, [{"ip": "10.0.0.300"}]), f"{NICS}[0].ip"),
    ("nic-ip-on-bridge", at(M, NICS, [{"bridge": "br0", "ip": "10.0.0.5"}]), f"{NICS}[0].ip"),
    ("nic-bridge-name", at(M, NICS, [{"bridge": "a-very-long-bridge-name"}]), f"{NICS}[0].bridge"),
    ("nic-too-many", at(M, NICS, [{}] * 9), NICS),
    ("firmware", at(M, "spec.firmware", "coreboot"), "spec.firmware"),
    ("domain-type", at(M, "spec.domainType", "xen"), "spec.domainType"),
    ("provider-id", at(M, "spec.providerID", "aws:///i-0123"), "spec.providerID"),
    (
        "provider-id-mismatch",
        at(at(M, "spec.providerID", f"libvirt:///{UUID}"), "spec.domainUUID", UUID2),
        "spec.providerID",
    ),
    ("domain-uuid", at(M, "spec.domainUUID", "not-a-uuid"), "spec.domainUUID"),
    ("host-name", at(M, "spec.hostName", "Host_1"), "spec.hostName"),
    ("hosts-empty", at(C, "spec.hosts", []), "spec.hosts"),
    (
        "hosts-duplicate-name",
        at(
            C,
            "spec.hosts",
            [{"name": "h", "uri": "qemu:///system"}, {"name": "h", "uri": "test:///default"}],
        ),
        "spec.hosts[1]",
    ),
    (
        "hosts-duplicate-uri",
        at(
            C,
            "spec.hosts",
            [{"name": "a", "uri": "qemu:///system"}, {"name": "b", "uri": "qemu:///system"}],
        ),
        "spec.hosts",
    ),
    (
        "hosts-no-control-plane",
        at(C, "spec.hosts", [{"name": "a", "uri": "qemu:///system", "controlPlane": False}]),
        "spec.hosts",
    ),
    ("host-uri", at(C, "spec.hosts.0.uri", "not a uri"), "spec.hosts[0].uri"),
    ("host-name-case", at(C, "spec.hosts.0.name", "UPPER"), "spec.hosts[0].name"),
    (
        "host-credentials-ref",
        at(C, "spec.hosts.0.credentialsRef", {}),
        "spec.hosts[0].credentialsRef.name",
    ),
    (
        "host-control-plane-type",
        at(C, "spec.hosts.0.controlPlane", "yes"),
        "spec.hosts[0].controlPlane",
    ),
    ("cidr-prefix", at(C, "spec.network.cidr", "192.168.1.0/33"), "spec.network.cidr"),
    ("cidr-no-prefix", at(C, "spec.network.cidr", "192.168.1.0"), "spec.network.cidr"),
    ("cidr-octet", at(C, "spec.network.cidr", "192.168.256.0/24"), "spec.network.cidr"),
    ("network-empty", at(C, "spec.network", {}), "spec.network"),
    ("network-missing", at(C, "spec.network", None), "spec.network"),
    ("network-mode", at(C, "spec.network.mode", "routed"), "spec.network.mode"),
    ("bridge-mode-needs-bridge", at(C, "spec.network", {"mode": "bridge"}), "spec.network.bridge"),
    (
        "bridge-mode-no-cidr",
        at(C, "spec.network", {"mode": "bridge", "bridge": "br0", "cidr": "10.0.0.0/24"}),
        "spec.network.cidr",
    ),
    (
        "dhcp-needs-cidr",
        at(
            C, "spec.network", {"name": "default", "dhcp": {"start": "10.0.0.2", "end": "10.0.0.9"}}
        ),
        "spec.network.dhcp",
    ),
    (
        "dhcp-address",
        at(C, "spec.network.dhcp", {"start": "x", "end": "10.0.0.9"}),
        "spec.network.dhcp.start",
    ),
    ("dns-domain", at(C, "spec.network.dnsDomain", "Bad_Domain"), "spec.network.dnsDomain"),
    (
        "endpoint-port",
        at(C, "spec.controlPlaneEndpoint", {"host": "api", "port": 70000}),
        "spec.controlPlaneEndpoint.port",
    ),
    ("pool-path", at(C, "spec.storagePool", {"path": "relative/dir"}), "spec.storagePool.path"),
    (
        "template-cpus",
        at(machine_template(), "spec.template.spec.cpus", -1),
        "spec.template.spec.cpus",
    ),
    ("template-missing", at(machine_template(), "spec.template", None), "spec.template"),
    (
        "cluster-template-cidr",
        at(cluster_template(), "spec.template.spec.network.cidr", "10.0.0.0/2"),
        "spec.template.spec.network.cidr",
    ),
    # a created nat/isolated network on several hosts would be one island per host
    ("cluster-nat-two-hosts", at(C, "spec.hosts", TWO_HOSTS), "spec.network.mode"),
    (
        "cluster-isolated-two-hosts",
        at(at(C, "spec.hosts", TWO_HOSTS), "spec.network.mode", "isolated"),
        "spec.network.mode",
    ),
    (
        "cluster-template-nat-two-hosts",
        at(cluster_template(), "spec.template.spec.hosts", TWO_HOSTS),
        "spec.template.spec.network.mode",
    ),
]


def test_there_are_at_least_thirty_distinct_malformed_objects() -> None:
    assert len(MALFORMED) >= 30
    assert len({case for case, _, _ in MALFORMED}) == len(MALFORMED)
    assert len({json.dumps(obj, sort_keys=True) for _, obj, _ in MALFORMED}) == len(MALFORMED)


@pytest.mark.parametrize(("case", "body", "field"), MALFORMED, ids=[c for c, _, _ in MALFORMED])
async def test_malformed_object_is_rejected_naming_the_field(
    objects: client.CustomObjectsApi, namespace: str, case: str, body: dict[str, Any], field: str
) -> None:
    with pytest.raises(ApiException) as info:
        await create(objects, namespace, body)
    assert info.value.status == 422, info.value.body
    message = message_of(info.value)
    assert field in message, f"{case}: {message}"


STATUS_MALFORMED: list[tuple[str, str, dict[str, Any], str]] = [
    (
        "condition-status",
        "LibvirtMachine",
        {
            "conditions": [
                {"type": "Ready", "status": "Maybe", "reason": "X", "lastTransitionTime": T}
            ]
        },
        "status.conditions[0].status",
    ),
    (
        "condition-reason",
        "LibvirtMachine",
        {
            "conditions": [
                {"type": "Ready", "status": "True", "reason": "not ok", "lastTransitionTime": T}
            ]
        },
        "status.conditions[0].reason",
    ),
    (
        "address-type",
        "LibvirtMachine",
        {"addresses": [{"type": "PublicIP", "address": "1.2.3.4"}]},
        "status.addresses[0].type",
    ),
    (
        "failure-domain-duplicate",
        "LibvirtCluster",
        {"failureDomains": [{"name": "h0"}, {"name": "h0"}]},
        "status.failureDomains[1]",
    ),
]


@pytest.mark.parametrize(
    ("case", "kind", "status", "field"), STATUS_MALFORMED, ids=[c[0] for c in STATUS_MALFORMED]
)
async def test_malformed_status_is_rejected_naming_the_field(
    objects: client.CustomObjectsApi,
    namespace: str,
    case: str,
    kind: str,
    status: dict[str, Any],
    field: str,
) -> None:
    await create(objects, namespace, machine("s") if kind == "LibvirtMachine" else cluster("s"))
    with pytest.raises(ApiException) as info:
        await merge_patch(objects, namespace, kind, "s", {"status": status}, status=True)
    assert info.value.status == 422
    assert field in message_of(info.value), f"{case}: {message_of(info.value)}"
