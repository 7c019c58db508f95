"""The API objects of the demo cluster, in creation order, and their REST resources.

VM-only (``vm_objects``): one control-plane Machine + LibvirtMachine bootstrapped with
Ignition (a minimal Ignition v3 config that sets the hostname) and a MachineDeployment of
N-1 workers bootstrapped with cloud-config, of the test guest (no kubelet), with its
bootstrap data Secrets, the isolated LibvirtCluster and the Cluster. The base image is the
demo's loopback image server's URL with its sha256 (``capl.commands.demo.image_server``).

Real nodes: ``capl.commands.demo.node_objects``. ``demo_objects`` picks by the plan's mode;
``layout_names`` is the network and pool capl derives for the LibvirtCluster (what the
clean-up checks on the host); ``write_crds`` writes capl's CRDs, generated from the models
(so a pip-installed capl needs no repository checkout).
"""

from __future__ import annotations

import base64
import functools
import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from capl.commands.demo.node_objects import extra_resources, node_objects
from capl.commands.demo.plan import (
    CAPI_GROUP,
    CLUSTER_NAME_LABEL,
    CONTROL_PLANE_LABEL,
    DEPLOYMENT_NAME_LABEL,
    HOST_NAME,
    INFRA_GROUP,
    DemoPlan,
)

if TYPE_CHECKING:
    from capl.runtime.resources import Resource


__all__ = [
    "demo_objects",
    "ignition_config",
    "layout_names",
    "machine_deployment",
    "resource_of",
    "vm_objects",
    "write_crds",
]


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def ignition_config(hostname: str) -> str:
    """A minimal Ignition v3 config: the hostname, written as /etc/hostname."""
    config = {
        "ignition": {"version": "3.4.0"},
        "storage": {
            "files": [
                {
                    "path": "/etc/hostname",
                    "mode": 420,
                    "overwrite": True,
                    "contents": {"source": f"data:,{hostname}"},
                }
            ]
        },
    }
    return json.dumps(config, separators=(",", ":"))


CLOUD_CONFIG: Final = (
    "#cloud-config\n"
    "# capl demo worker: the hostname comes from the NoCloud meta-data capl writes.\n"
    "write_files:\n"
    "  - path: /etc/motd\n"
    "    content: capl demo worker\n"
)


def demo_objects(plan: DemoPlan) -> list[dict[str, Any]]:
    """Every API object of the demo cluster, in creation order."""
    return node_objects(plan) if plan.real_nodes else vm_objects(plan)


def vm_objects(plan: DemoPlan) -> list[dict[str, Any]]:
    """The VM-only cluster: bootstrap Secrets, the clusters, the control-plane machine, the
    workers' template and MachineDeployment."""
    cp = plan.control_plane_machine
    return [
        _secret(plan, f"{cp}-bootstrap", ignition_config(cp), "ignition"),
        _secret(plan, f"{plan.deployment}-bootstrap", CLOUD_CONFIG, "cloud-config"),
        {
            "apiVersion": _INFRA_API,
            "kind": "LibvirtCluster",
            "metadata": _meta(plan, plan.name, _cluster_labels(plan)),
            "spec": {
                "hosts": [{"name": HOST_NAME, "uri": plan.uri}],
                "network": {"cidr": plan.cidr, "mode": "isolated"},
                "storagePool": {"path": plan.pool_path},
            },
        },
        {
            "apiVersion": _CAPI_API,
            "kind": "Cluster",
            "metadata": _meta(plan, plan.name, {}),
            "spec": {"infrastructureRef": _infra_ref("LibvirtCluster", plan.name)},
        },
        *_control_plane_machine(plan),
        *_workers(plan),
    ]


_INFRA_API: Final = f"{INFRA_GROUP}/v1alpha1"
_CAPI_API: Final = f"{CAPI_GROUP}/v1beta2"


def _cluster_labels(plan: DemoPlan) -> dict[str, str]:
    return {CLUSTER_NAME_LABEL: plan.name}


def _meta(plan: DemoPlan, name: str, labels: Mapping[str, str]) -> dict[str, Any]:
    return {"name": name, "namespace": plan.namespace, "labels": dict(labels)}


def _infra_ref(kind: str, name: str) -> dict[str, str]:
    return {"apiGroup": INFRA_GROUP, "kind": kind, "name": name}


def _secret(plan: DemoPlan, name: str, value: str, fmt: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _meta(plan, name, _cluster_labels(plan)),
        "type": "cluster.x-k8s.io/secret",
        "data": {"value": _b64(value), "format": _b64(fmt)},
    }


def _machine_spec(plan: DemoPlan) -> dict[str, Any]:
    image: dict[str, Any] = {"url": plan.image_url, "format": "qcow2"}
    if plan.image_sha256:
        image["checksum"] = f"sha256:{plan.image_sha256}"
    return {
        "cpus": plan.cpus,
        "memoryMiB": plan.memory_mib,
        "image": image,
        "domainType": plan.domain_type,
    }


def _control_plane_machine(plan: DemoPlan) -> list[dict[str, Any]]:
    """The LibvirtMachine and Machine of the control plane (bootstrapped with Ignition)."""
    cp = plan.control_plane_machine
    labels = {**_cluster_labels(plan), CONTROL_PLANE_LABEL: ""}
    return [
        {
            "apiVersion": _INFRA_API,
            "kind": "LibvirtMachine",
            "metadata": _meta(plan, cp, labels),
            "spec": _machine_spec(plan),
        },
        {
            "apiVersion": _CAPI_API,
            "kind": "Machine",
            "metadata": _meta(plan, cp, labels),
            "spec": {
                "clusterName": plan.name,
                "bootstrap": {"dataSecretName": f"{cp}-bootstrap"},
                "infrastructureRef": _infra_ref("LibvirtMachine", cp),
            },
        },
    ]


def _workers(plan: DemoPlan) -> list[dict[str, Any]]:
    """The workers' LibvirtMachineTemplate and MachineDeployment (bootstrapped with
    cloud-config)."""
    md_labels = {**_cluster_labels(plan), DEPLOYMENT_NAME_LABEL: plan.deployment}
    return [
        {
            "apiVersion": _INFRA_API,
            "kind": "LibvirtMachineTemplate",
            "metadata": _meta(plan, plan.deployment, _cluster_labels(plan)),
            "spec": {"template": {"spec": _machine_spec(plan)}},
        },
        {
            "apiVersion": _CAPI_API,
            "kind": "MachineDeployment",
            "metadata": _meta(plan, plan.deployment, _cluster_labels(plan)),
            "spec": {
                "clusterName": plan.name,
                "replicas": plan.workers,
                "selector": {"matchLabels": md_labels},
                "template": {
                    "metadata": {"labels": md_labels},
                    "spec": {
                        "clusterName": plan.name,
                        "bootstrap": {"dataSecretName": f"{plan.deployment}-bootstrap"},
                        "infrastructureRef": _infra_ref("LibvirtMachineTemplate", plan.deployment),
                    },
                },
            },
        },
    ]


def resource_of(obj: Mapping[str, Any]) -> Resource:
    """The REST resource of a demo object."""
    from capl.runtime.resources import lookup

    if obj["kind"] == "MachineDeployment":
        return machine_deployment()
    if obj["kind"] in extra_resources():
        return extra_resources()[obj["kind"]]
    if obj["kind"] == "Secret":
        return lookup("Secret", group="")
    group = str(obj["apiVersion"]).split("/", 1)[0]
    found: Resource = lookup(str(obj["kind"]), group=group)
    return found


@functools.cache
def machine_deployment() -> Resource:
    """Cluster API's MachineDeployment (not one of the kinds capl's runtime knows)."""
    from capl.runtime.resources import Resource

    return Resource(CAPI_GROUP, "v1beta2", "MachineDeployment", "machinedeployments")


def layout_names(plan: DemoPlan) -> tuple[str, str]:
    """(network, pool) names capl derives for the demo cluster."""
    from capl.api.cluster import LibvirtCluster
    from capl.api.defaults import default_libvirt_cluster

    raw = next(o for o in demo_objects(plan) if o["kind"] == "LibvirtCluster")
    model = default_libvirt_cluster(LibvirtCluster.model_validate(raw))
    pool = model.spec.storage_pool
    assert model.spec.network.name is not None
    assert pool is not None
    assert pool.name is not None
    return model.spec.network.name, pool.name


def write_crds(directory: Path) -> None:
    from capl.api.crdgen import crd, dump
    from capl.api.kinds import KINDS

    directory.mkdir(parents=True, exist_ok=True)
    for info in KINDS:
        (directory / f"{info.crd_name}.yaml").write_text(dump(crd(info)))
