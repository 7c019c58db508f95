"""The generated CRDs on a real kube-apiserver: round trips, samples, rejections, immutability.

Every rejection case asserts HTTP 422 and that the API server's message names the field at
fault, so the schema (bounds, patterns, enums, map-lists, CEL rules, transition rules) is
proven where users meet it, not only in the generator's unit tests.
"""

from __future__ import annotations

import copy
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from capl import api
from capl.api.kinds import KINDS, KINDS_BY_NAME, KindInfo
from capl.testbed import ControlPlane

pytestmark = pytest.mark.apiserver

REPO = Path(__file__).resolve().parents[2]
SAMPLES = REPO / "config" / "samples"
UUID = "6f1c8c52-1d7a-4c2e-9d4e-0a1b2c3d4e5f"
UUID2 = "0b7e3d1a-2c4f-4a6b-8c9d-1e2f3a4b5c6d"
T = "2026-01-02T03:04:05Z"


@pytest.fixture
async def objects(api_client: client.ApiClient) -> AsyncIterator[client.CustomObjectsApi]:
    return client.CustomObjectsApi(api_client)


def plural(kind: str) -> str:
    return KINDS_BY_NAME[kind].plural.value


async def create(
    objs: client.CustomObjectsApi, namespace: str, body: dict[str, Any]
) -> dict[str, Any]:
    result: dict[str, Any] = await objs.create_namespaced_custom_object(
        api.GROUP, api.VERSION, namespace, plural(body["kind"]), body
    )
    return result


async def get(
    objs: client.CustomObjectsApi, namespace: str, kind: str, name: str
) -> dict[str, Any]:
    result: dict[str, Any] = await objs.get_namespaced_custom_object(
        api.GROUP, api.VERSION, namespace, plural(kind), name
    )
    return result


async def merge_patch(
    objs: client.CustomObjectsApi,
    namespace: str,
    kind: str,
    name: str,
    patch: dict[str, Any],
    *,
    status: bool = False,
) -> dict[str, Any]:
    call = (
        objs.patch_namespaced_custom_object_status
        if status
        else objs.patch_namespaced_custom_object
    )
    result: dict[str, Any] = await call(
        api.GROUP,
        api.VERSION,
        namespace,
        plural(kind),
        name,
        patch,
        _content_type="application/merge-patch+json",
    )
    return result


def message_of(exc: ApiException) -> str:
    body = json.loads(exc.body)
    text: str = body["message"]
    return text


# --- valid objects ---------------------------------------------------------------------------


def full_machine(name: str = "full") -> dict[str, Any]:
    return {
        "apiVersion": api.API_VERSION,
        "kind": "LibvirtMachine",
        "metadata": {"name": name, "labels": {api.CLUSTER_NAME_LABEL: "demo"}},
        "spec": {
            "providerID": f"libvirt:///{UUID}",
            "domainUUID": UUID,
            "hostName": "h0",
            "cpus": 4,
            "memoryMiB": 8192,
            "image": {
                "url": "https://images.example.invalid/base.qcow2",
                "checksum": "sha256:" + "ab" * 32,
                "format": "qcow2",
            },
            "rootVolume": {"sizeGiB": 30},
            "extraDisks": [{"name": "etcd", "sizeGiB": 10}, {"name": "data", "sizeGiB": 100}],
            "networkInterfaces": [
                {"mac": "52:54:00:12:34:56", "ip": "192.168.150.10"},
                {"bridge": "br0"},
                {"network": "storage-net"},
            ],
            "firmware": "uefi",
            "domainType": "qemu",
            "evictionStrategy": "LiveMigrate",
            "migrationTarget": "h1",
        },
    }


def machine_status() -> dict[str, Any]:
    return {
        "initialization": {"provisioned": True},
        "addresses": [
            {"type": "Hostname", "address": "full"},
            {"type": "InternalIP", "address": "192.168.150.10"},
            {"type": "InternalDNS", "address": "full.demo.ns.capl.internal"},
        ],
        "failureDomain": "h0",
        "host": "h0",
        "domainState": "Running",
        "observedGeneration": 1,
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "Ready",
                "message": "",
                "lastTransitionTime": T,
                "observedGeneration": 1,
            },
            {
                "type": "Paused",
                "status": "False",
                "reason": "NotPaused",
                "message": "",
                "lastTransitionTime": T,
            },
        ],
    }


def full_cluster(name: str = "full") -> dict[str, Any]:
    return {
        "apiVersion": api.API_VERSION,
        "kind": "LibvirtCluster",
        "metadata": {"name": name},
        "spec": {
            "controlPlaneEndpoint": {"host": "192.168.150.5", "port": 6443},
            # one host: a created network (cidr) on several hosts is refused
            "hosts": [
                {
                    "name": "h0",
                    "uri": "qemu+ssh://root@kvm1.example.invalid/system",
                    "credentialsRef": {"name": "kvm1-ssh"},
                    "controlPlane": True,
                    "maintenance": {"reason": "kernel update"},
                },
            ],
            "network": {
                "name": "capl-demo",
                "cidr": "192.168.150.0/24",
                "mode": "isolated",
                "bridge": "virbr-demo",
                "dnsDomain": "demo.example.invalid",
                "dhcp": {"start": "192.168.150.100", "end": "192.168.150.200"},
            },
            "storagePool": {"name": "capl-demo", "path": "/var/lib/libvirt/images/capl-demo"},
        },
    }


def cluster_status() -> dict[str, Any]:
    return {
        "initialization": {"provisioned": True},
        "failureDomains": [
            {"name": "h0", "controlPlane": True, "attributes": {"cpus": "8", "memoryMiB": "32768"}},
            {"name": "h1", "controlPlane": False},
        ],
        "hosts": [
            {
                "name": "h0",
                "reachable": True,
                "libvirtVersion": "9.0.0",
                "network": "capl-demo",
                "networkCreated": True,
                "bridge": "virbr-demo",
                "storagePool": "capl-demo",
                "storagePoolCreated": True,
                "maintenance": {"phase": "Blocked", "machines": 1, "message": "m0: None"},
            },
            {"name": "h1", "reachable": False, "message": "connection refused"},
        ],
        "observedGeneration": 1,
        "conditions": [
            {
                "type": "HostsReachable",
                "status": "False",
                "reason": "Unreachable",
                "message": "h1: connection refused",
                "lastTransitionTime": T,
            }
        ],
    }


def full_migration() -> dict[str, Any]:
    return {
        "apiVersion": api.API_VERSION,
        "kind": "LibvirtMachineMigration",
        "metadata": {"name": "full"},
        "spec": {
            "machineName": "full",
            "targetHost": "h1",
            "bandwidthMiBPerSecond": 100,
            "completionTimeoutPerGiB": 60,
            "progressTimeoutSeconds": 30,
            "allowAutoConverge": True,
            "allowPostCopy": False,
        },
    }


def machine_template_status() -> dict[str, Any]:
    return {
        "capacity": {"cpu": "2", "memory": "4096Mi", "nvidia.com/gpu": "1"},
        "nodeInfo": {"architecture": "amd64", "operatingSystem": "linux"},
    }


def migration_status() -> dict[str, Any]:
    return {
        "phase": "Running",
        "sourceHost": "h0",
        "targetHost": "h1",
        "copyStorage": True,
        "startTime": "2026-12-02T01:00:00Z",
        "abortRequested": False,
        "state": {"dataTotalBytes": 1 << 30, "dataRemainingBytes": 1 << 20, "downtimeMs": 80},
        "message": "moving",
        "observedGeneration": 1,
        "conditions": [
            {
                "type": "Succeeded",
                "status": "False",
                "reason": "MigrationRunning",
                "message": "moving",
                "lastTransitionTime": "2026-12-02T01:00:00Z",
            }
        ],
    }


def full_object(kind: str) -> dict[str, Any]:
    if kind == "LibvirtMachineMigration":
        return full_migration()
    if kind == "LibvirtMachine":
        return full_machine()
    if kind == "LibvirtCluster":
        return full_cluster()
    if kind == "LibvirtMachineTemplate":
        spec = full_machine()["spec"]
        for key in ("providerID", "domainUUID", "migrationTarget"):
            del spec[key]
        spec["networkInterfaces"] = [{}, {"bridge": "br0"}]
        template: dict[str, Any] = {"metadata": {"labels": {"role": "worker"}}, "spec": spec}
    else:
        template = {"metadata": {"annotations": {"a": "b"}}, "spec": full_cluster()["spec"]}
    return {
        "apiVersion": api.API_VERSION,
        "kind": kind,
        "metadata": {"name": "full"},
        "spec": {"template": template},
    }


@pytest.mark.parametrize("info", KINDS, ids=lambda i: i.kind.value)
async def test_every_kind_round_trips(
    objects: client.CustomObjectsApi, namespace: str, info: KindInfo
) -> None:
    body = full_object(info.kind.value)
    sent = info.model.model_validate(body)
    created = await create(objects, namespace, sent.wire())
    back = info.model.model_validate(created)
    assert back.spec == sent.spec
    assert back.metadata.uid
    assert back.metadata.creation_timestamp is not None
    if info.status_subresource:
        status = {
            "LibvirtMachine": machine_status,
            "LibvirtCluster": cluster_status,
            "LibvirtMachineMigration": migration_status,
            "LibvirtMachineTemplate": machine_template_status,
        }[info.kind.value]()
        patched = await merge_patch(
            objects, namespace, info.kind.value, "full", {"status": status}, status=True
        )
        parsed = info.model.model_validate(patched)
        assert (
            parsed.wire()["status"]
            == info.model.model_validate({**body, "status": status}).wire()["status"]
        )
        again = info.model.model_validate(await get(objects, namespace, info.kind.value, "full"))
        assert again == parsed


async def test_server_defaults_match_the_model_defaults(
    objects: client.CustomObjectsApi, namespace: str
) -> None:
    minimal = {
        "apiVersion": api.API_VERSION,
        "kind": "LibvirtMachine",
        "metadata": {"name": "minimal"},
        "spec": {"image": {"path": "/var/lib/libvirt/images/base.qcow2"}},
    }
    created = await create(objects, namespace, minimal)
    model = api.LibvirtMachine.model_validate(minimal)
    assert created["spec"] == model.wire()["spec"]
    minimal_cluster = {
        "apiVersion": api.API_VERSION,
        "kind": "LibvirtCluster",
        "metadata": {"name": "minimal"},
        "spec": {
            "hosts": [{"name": "h0", "uri": "test:///default"}],
            "network": {"name": "default"},
        },
    }
    created = await create(objects, namespace, minimal_cluster)
    assert created["spec"] == api.LibvirtCluster.model_validate(minimal_cluster).wire()["spec"]


async def test_samples_are_accepted(control_plane: ControlPlane, namespace: str) -> None:
    out = await control_plane.kubectl(
        "apply", "--server-side", "-n", namespace, "-k", str(SAMPLES), "-o", "name"
    )
    assert len(out.split()) == len(KINDS)
    listing = await control_plane.kubectl(
        "get", "-n", namespace, "lvc,lvct,lvm,lvmt,lvmm", "-o", "json"
    )
    items = json.loads(listing)["items"]
    assert sorted(i["kind"] for i in items) == sorted(k.kind.value for k in KINDS)
    for item in items:
        KINDS_BY_NAME[item["kind"]].model.model_validate(item)


async def test_several_hosts_share_a_bridge_mode_network_or_an_adopted_one(
    objects: client.CustomObjectsApi, namespace: str
) -> None:
    """The multi-host refusal is about networks capl creates per host in nat/isolated mode
    only: bridge mode (a LAN all hosts share) and an adopted network stay allowed."""
    bridged = at(
        at(C, "spec.hosts", TWO_HOSTS), "spec.network", {"mode": "bridge", "bridge": "br0"}
    )
    adopted = at(at(C, "spec.hosts", TWO_HOSTS), "spec.network", {"name": "lan"})
    for name, body in (("bridged", bridged), ("adopted", adopted)):
        created = await create(objects, namespace, at(body, "metadata.name", name))
        assert len(created["spec"]["hosts"]) == 2


async def test_printer_columns_and_short_names(
    control_plane: ControlPlane, objects: client.CustomObjectsApi, namespace: str
) -> None:
    await create(objects, namespace, full_machine("shown"))
    await merge_patch(
        objects, namespace, "LibvirtMachine", "shown", {"status": machine_status()}, status=True
    )
    table = await control_plane.kubectl("get", "lvm", "-n", namespace)
    header, row = table.splitlines()[:2]
    assert header.split() == [
        "NAME",
        "CLUSTER",
        "HOST",
        "STATE",
        "READY",
        "PROVIDERID",
        "ADDRESS",
        "AGE",
    ]
    assert row.split()[:7] == [
        "shown",
        "demo",
        "h0",
        "Running",
        "True",
        f"libvirt:///{UUID}",
        "192.168.150.10",
    ]
    categories = await control_plane.kubectl("get", "cluster-api", "-n", namespace, "-o", "name")
    assert "libvirtmachine.infrastructure.cluster.x-k8s.io/shown" in categories.split()


async def test_server_side_apply_merges_hosts_by_name(
    control_plane: ControlPlane, namespace: str
) -> None:
    base = full_cluster("ssa")
    base["spec"]["hosts"] = [{"name": "h0", "uri": "qemu:///system"}]
    base["spec"]["network"] = {"mode": "bridge", "bridge": "br0"}  # room for a second host
    await control_plane.kubectl(
        "apply", "--server-side", "--field-manager=alice", "-n", namespace, "-f", "-",
        stdin=yaml.safe_dump(base).encode(),
    )  # fmt: skip
    extra = {
        "apiVersion": api.API_VERSION,
        "kind": "LibvirtCluster",
        "metadata": {"name": "ssa"},
        "spec": {"hosts": [{"name": "h9", "uri": "qemu+ssh://kvm9/system", "controlPlane": False}]},
    }
    await control_plane.kubectl(
        "apply", "--server-side", "--field-manager=bob", "-n", namespace, "-f", "-",
        stdin=yaml.safe_dump(extra).encode(),
    )  # fmt: skip
    obj = json.loads(
        await control_plane.kubectl("get", "lvc", "ssa", "-n", namespace, "-o", "json")
    )
    assert [h["name"] for h in obj["spec"]["hosts"]] == ["h0", "h9"]


# --- rejected objects ------------------------------------------------------------------------


def at(obj: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    """A copy of obj with the dotted path set (numeric parts index lists); None deletes."""
    result = copy.deepcopy(obj)
    node: Any = result
    parts = dotted.split(".")
    for part in parts[:-1]:
        node = node[int(part)] if part.isdigit() else node.setdefault(part, {})
    last = parts[-1]
    if value is None:
        del node[last]
    elif last.isdigit():
        node[int(last)] = value
    else:
        node[last] = value
    return result


def machine(name: str = "bad") -> dict[str, Any]:
    return {
        "apiVersion": api.API_VERSION,
        "kind": "LibvirtMachine",
        "metadata": {"name": name},
        "spec": {"image": {"url": "https://images.example.invalid/base.qcow2"}},
    }


def cluster(name: str = "bad") -> dict[str, Any]:
    return {
        "apiVersion": api.API_VERSION,
        "kind": "LibvirtCluster",
        "metadata": {"name": name},
        "spec": {
            "hosts": [{"name": "h0", "uri": "qemu:///system"}],
            "network": {"cidr": "192.168.150.0/24"},
        },
    }


def machine_template() -> dict[str, Any]:
    return {
        "apiVersion": api.API_VERSION,
        "kind": "LibvirtMachineTemplate",
        "metadata": {"name": "bad"},
        "spec": {"template": {"spec": machine()["spec"]}},
    }


def cluster_template() -> dict[str, Any]:
    return {
        "apiVersion": api.API_VERSION,
        "kind": "LibvirtClusterTemplate",
        "metadata": {"name": "bad"},
        "spec": {"template": {"spec": cluster()["spec"]}},
    }


M, C = machine(), cluster()
TWO_HOSTS = [{"name": "h0", "uri": "qemu:///system"}, {"name": "h1", "uri": "qemu+tls://h1/system"}]
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


# --- immutability ----------------------------------------------------------------------------


IMMUTABLE: list[tuple[str, str, dict[str, Any], dict[str, Any], str]] = [
    # (case, kind, patch applied first (allowed), patch that must be refused, field)
    (
        "image",
        "LibvirtMachine",
        {},
        {"spec": {"image": {"url": "https://images.example.invalid/other.qcow2"}}},
        "spec.image",
    ),
    (
        "host-name",
        "LibvirtMachine",
        {"spec": {"hostName": "h0"}},
        {"spec": {"hostName": "h1"}},
        "spec.hostName",
    ),
    (
        "host-name-removed",
        "LibvirtMachine",
        {"spec": {"hostName": "h0"}},
        {"spec": {"hostName": None}},
        "spec.hostName",
    ),
    (
        "provider-id",
        "LibvirtMachine",
        {"spec": {"providerID": f"libvirt:///{UUID}", "domainUUID": UUID}},
        {"spec": {"providerID": f"libvirt:///{UUID2}", "domainUUID": UUID2}},
        "spec.providerID",
    ),
    (
        "domain-uuid-removed",
        "LibvirtMachine",
        {"spec": {"domainUUID": UUID}},
        {"spec": {"domainUUID": None}},
        "spec.domainUUID",
    ),
    (
        "cidr",
        "LibvirtCluster",
        {},
        {"spec": {"network": {"cidr": "192.168.151.0/24"}}},
        "spec.network.cidr",
    ),
    (
        "network-mode",
        "LibvirtCluster",
        {},
        {"spec": {"network": {"mode": "isolated"}}},
        "spec.network.mode",
    ),
    (
        "network-name",
        "LibvirtCluster",
        {"spec": {"network": {"name": "capl-x"}}},
        {"spec": {"network": {"name": "capl-y"}}},
        "spec.network.name",
    ),
    (
        "endpoint",
        "LibvirtCluster",
        {"spec": {"controlPlaneEndpoint": {"host": "api.x.example", "port": 6443}}},
        {"spec": {"controlPlaneEndpoint": {"host": "api.y.example"}}},
        "spec.controlPlaneEndpoint.host",
    ),
    (
        "pool-path",
        "LibvirtCluster",
        {"spec": {"storagePool": {"name": "p", "path": "/srv/p"}}},
        {"spec": {"storagePool": {"path": "/srv/q"}}},
        "spec.storagePool.path",
    ),
]


@pytest.mark.parametrize(
    ("case", "kind", "first", "second", "field"), IMMUTABLE, ids=[c[0] for c in IMMUTABLE]
)
async def test_immutable_fields(
    objects: client.CustomObjectsApi,
    namespace: str,
    case: str,
    kind: str,
    first: dict[str, Any],
    second: dict[str, Any],
    field: str,
) -> None:
    await create(objects, namespace, machine("imm") if kind == "LibvirtMachine" else cluster("imm"))
    if first:
        # Setting a write-once field the first time is allowed.
        await merge_patch(objects, namespace, kind, "imm", first)
    with pytest.raises(ApiException) as info:
        await merge_patch(objects, namespace, kind, "imm", second)
    assert info.value.status == 422
    message = message_of(info.value)
    assert field in message, f"{case}: {message}"
    assert "immutable" in message, f"{case}: {message}"


async def test_mutable_fields_stay_mutable(
    objects: client.CustomObjectsApi, namespace: str
) -> None:
    await create(objects, namespace, machine("mut"))
    patched = await merge_patch(
        objects,
        namespace,
        "LibvirtMachine",
        "mut",
        {
            "spec": {
                "cpus": 8,
                "hostName": "h0",
                "providerID": f"libvirt:///{UUID}",
                "domainUUID": UUID,
            }
        },
    )
    assert patched["spec"]["cpus"] == 8
    # Re-sending the same write-once values is not a change.
    await merge_patch(objects, namespace, "LibvirtMachine", "mut", {"spec": {"hostName": "h0"}})
    # bridge mode: hosts can be added (a created nat/isolated network allows one host)
    await create(
        objects, namespace, at(cluster("mut"), "spec.network", {"mode": "bridge", "bridge": "br0"})
    )
    await merge_patch(
        objects, namespace, "LibvirtCluster", "mut",
        {"spec": {"controlPlaneEndpoint": {"host": "api.mut.example", "port": 6443}}},
    )  # fmt: skip
    hosts = [
        {"name": "h0", "uri": "qemu:///system"},
        {"name": "h1", "uri": "qemu+ssh://kvm1/system"},
    ]
    await merge_patch(objects, namespace, "LibvirtCluster", "mut", {"spec": {"hosts": hosts}})


async def test_host_name_changes_only_along_a_migration(
    objects: client.CustomObjectsApi, namespace: str
) -> None:
    """spec.hostName is write-once except for the one step a migration takes: to the host
    recorded in migrationTarget, clearing it in the same write."""
    await create(objects, namespace, machine("mig"))
    await merge_patch(objects, namespace, "LibvirtMachine", "mig", {"spec": {"hostName": "h0"}})
    refused = [
        ({"hostName": "h1"}, "spec.hostName"),  # no migration recorded
        ({"migrationTarget": "h0"}, "spec.migrationTarget"),  # the host it is on
    ]
    for patch, field in refused:
        with pytest.raises(ApiException) as info:
            await merge_patch(objects, namespace, "LibvirtMachine", "mig", {"spec": patch})
        assert info.value.status == 422, patch
        assert field in message_of(info.value), patch
    await merge_patch(
        objects, namespace, "LibvirtMachine", "mig", {"spec": {"migrationTarget": "h1"}}
    )
    refused = [
        ({"hostName": "h2", "migrationTarget": None}, "spec.hostName"),  # not the target
        ({"hostName": "h1"}, "spec.hostName"),  # target not cleared in the same write
        ({"migrationTarget": "h2"}, "spec.migrationTarget"),  # retargeted mid-flight
    ]
    for patch, field in refused:
        with pytest.raises(ApiException) as info:
            await merge_patch(objects, namespace, "LibvirtMachine", "mig", {"spec": patch})
        assert info.value.status == 422, patch
        assert field in message_of(info.value), patch
    moved = await merge_patch(
        objects,
        namespace,
        "LibvirtMachine",
        "mig",
        {"spec": {"hostName": "h1", "migrationTarget": None}},
    )
    assert moved["spec"]["hostName"] == "h1"
    assert "migrationTarget" not in moved["spec"]
    # an aborted migration clears the target and leaves hostName alone
    await merge_patch(
        objects, namespace, "LibvirtMachine", "mig", {"spec": {"migrationTarget": "h0"}}
    )
    back = await merge_patch(
        objects, namespace, "LibvirtMachine", "mig", {"spec": {"migrationTarget": None}}
    )
    assert back["spec"]["hostName"] == "h1"


async def test_migration_spec_is_immutable(
    objects: client.CustomObjectsApi, namespace: str
) -> None:
    await create(objects, namespace, full_migration())
    with pytest.raises(ApiException) as info:
        await merge_patch(
            objects, namespace, "LibvirtMachineMigration", "full", {"spec": {"targetHost": "h2"}}
        )
    assert info.value.status == 422
    assert "spec is immutable" in message_of(info.value)
