"""The API objects of the real-node demo: the offline flavor, built in Python.

templates/cluster-template-offline.yaml with the demo's values: a Cluster with its
TestbedControlPlane (the test bed's stand-in kind, whose CRD and aggregated ClusterRole
``testbed_manifests`` are installed with capl's CRDs), an isolated LibvirtCluster, one
LibvirtMachineTemplate of the node image (``make node-image``, imported by capl from its path
on the host), the KubeadmConfigTemplates ``<name>-md-ignition`` (format ignition) and
``<name>-md-cloud-config`` (format cloud-config), and one MachineDeployment for each, so the
worker pool mixes Ignition and cloud-config nodes.

They are created in two steps (``capl.commands.demo.real_nodes.RealNodes.create``):
``cluster_objects`` (the Cluster, paused, its TestbedControlPlane and LibvirtCluster) first;
``worker_objects`` (the templates and MachineDeployments) once the control plane runs and the
Cluster is resumed.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from capl.commands.demo.plan import (
    API_PORT,
    CAPI_GROUP,
    DEPLOYMENT_NAME_LABEL,
    INFRA_GROUP,
    POD_CIDR,
    SERVICE_CIDR,
    DemoPlan,
    gateway,
    split_workers,
)

if TYPE_CHECKING:
    from capl.runtime.resources import Resource

__all__ = [
    "cluster_objects",
    "extra_resources",
    "node_objects",
    "testbed_manifests",
    "worker_objects",
    "write_testbed_manifests",
]

_BOOTSTRAP_GROUP: Final = "bootstrap.cluster.x-k8s.io"
_TESTBED_CP_GROUP: Final = "controlplane.testbed.capl.dev"
_CRI_SOCKET: Final = "unix:///var/run/containerd/containerd.sock"


def node_objects(plan: DemoPlan) -> list[dict[str, Any]]:
    """Every API object of the real-node cluster, in creation order.

    Keep in step with templates/cluster-template-offline.yaml (the same objects, specs and
    names). The demo differs only where it must: the host is called `local`, the pool is a
    directory in the work directory, objects carry the cluster-name label, and the values
    are the demo's (CIDR, endpoint, image path, worker counts and size).
    """
    ignition_workers, cloud_config_workers = split_workers(plan.machines)
    return [
        _testbed_control_plane(plan),
        _libvirt_cluster(plan),
        _cluster(plan),
        _worker_template(plan),
        _kubeadm_config_template(plan, plan.md_ignition, "ignition"),
        _kubeadm_config_template(plan, plan.md_cloud_config, "cloud-config"),
        _machine_deployment(plan, plan.md_ignition, ignition_workers),
        _machine_deployment(plan, plan.md_cloud_config, cloud_config_workers),
    ]


def _meta(plan: DemoPlan, name: str) -> dict[str, Any]:
    labels = {"cluster.x-k8s.io/cluster-name": plan.name}
    return {"name": name, "namespace": plan.namespace, "labels": labels}


def _ref(group: str, kind: str, name: str) -> dict[str, str]:
    return {"apiGroup": group, "kind": kind, "name": name}


def _endpoint(plan: DemoPlan) -> dict[str, Any]:
    return {"host": gateway(plan.cidr), "port": API_PORT}


def _worker_template_name(plan: DemoPlan) -> str:
    return f"{plan.name}-worker"


def _testbed_control_plane(plan: DemoPlan) -> dict[str, Any]:
    return {
        "apiVersion": f"{_TESTBED_CP_GROUP}/v1alpha1",
        "kind": "TestbedControlPlane",
        "metadata": _meta(plan, plan.control_plane),
        "spec": {"version": plan.kubernetes_version, "controlPlaneEndpoint": _endpoint(plan)},
    }


def _libvirt_cluster(plan: DemoPlan) -> dict[str, Any]:
    return {
        "apiVersion": f"{INFRA_GROUP}/v1alpha1",
        "kind": "LibvirtCluster",
        "metadata": _meta(plan, plan.name),
        "spec": {
            "hosts": [{"name": "local", "uri": plan.uri}],
            "network": {"cidr": plan.cidr, "mode": "isolated"},
            "controlPlaneEndpoint": _endpoint(plan),
            "storagePool": {"path": plan.pool_path},
        },
    }


def _cluster(plan: DemoPlan) -> dict[str, Any]:
    return {
        "apiVersion": f"{CAPI_GROUP}/v1beta2",
        "kind": "Cluster",
        "metadata": _meta(plan, plan.name),
        "spec": {
            "clusterNetwork": {
                "pods": {"cidrBlocks": [POD_CIDR]},
                "services": {"cidrBlocks": [SERVICE_CIDR]},
            },
            "controlPlaneEndpoint": _endpoint(plan),
            "controlPlaneRef": _ref(_TESTBED_CP_GROUP, "TestbedControlPlane", plan.control_plane),
            "infrastructureRef": _ref(INFRA_GROUP, "LibvirtCluster", plan.name),
        },
    }


def _worker_template(plan: DemoPlan) -> dict[str, Any]:
    return {
        "apiVersion": f"{INFRA_GROUP}/v1alpha1",
        "kind": "LibvirtMachineTemplate",
        "metadata": _meta(plan, _worker_template_name(plan)),
        "spec": {
            "template": {
                "spec": {
                    "cpus": plan.cpus,
                    "memoryMiB": plan.memory_mib,
                    "image": {"path": plan.image_path, "format": "qcow2"},
                    "domainType": plan.domain_type,
                }
            }
        },
    }


def _kubeadm_config_template(plan: DemoPlan, name: str, fmt: str) -> dict[str, Any]:
    join = {
        "nodeRegistration": {"criSocket": _CRI_SOCKET, "imagePullPolicy": "Never"},
        "timeouts": {"tlsBootstrapSeconds": 600, "kubeletHealthCheckSeconds": 600},
    }
    return {
        "apiVersion": f"{_BOOTSTRAP_GROUP}/v1beta2",
        "kind": "KubeadmConfigTemplate",
        "metadata": _meta(plan, name),
        "spec": {"template": {"spec": {"format": fmt, "joinConfiguration": join}}},
    }


def _machine_deployment(plan: DemoPlan, name: str, replicas: int) -> dict[str, Any]:
    selector = {DEPLOYMENT_NAME_LABEL: name}
    return {
        "apiVersion": f"{CAPI_GROUP}/v1beta2",
        "kind": "MachineDeployment",
        "metadata": _meta(plan, name),
        "spec": {
            "clusterName": plan.name,
            "replicas": replicas,
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {"labels": dict(selector)},
                "spec": {
                    "clusterName": plan.name,
                    "version": plan.kubernetes_version,
                    "bootstrap": {
                        "configRef": _ref(_BOOTSTRAP_GROUP, "KubeadmConfigTemplate", name)
                    },
                    "infrastructureRef": _ref(
                        INFRA_GROUP, "LibvirtMachineTemplate", _worker_template_name(plan)
                    ),
                },
            },
        },
    }


def testbed_manifests() -> list[dict[str, Any]]:
    """The TestbedControlPlane CRD and the aggregated ClusterRole Cluster API needs on it."""
    from capl.testbed import hostedcp

    return [hostedcp.control_plane_crd(), hostedcp.control_plane_rbac()]


def write_testbed_manifests(directory: Path) -> None:
    """Into the directory of capl's CRDs (installed together); JSON is YAML."""
    directory.mkdir(parents=True, exist_ok=True)
    for obj in testbed_manifests():
        (directory / f"testbed-{obj['kind'].lower()}.yaml").write_text(json.dumps(obj, indent=1))


@functools.cache
def extra_resources() -> dict[str, Resource]:
    """REST resources of the kinds of this mode capl's runtime does not know."""
    from capl.runtime.resources import Resource
    from capl.testbed import hostedcp

    return {
        "TestbedControlPlane": Resource(
            hostedcp.CP_GROUP, hostedcp.CP_VERSION, hostedcp.CP_KIND, hostedcp.CP_PLURAL
        ),
        "KubeadmConfigTemplate": Resource(
            _BOOTSTRAP_GROUP, "v1beta2", "KubeadmConfigTemplate", "kubeadmconfigtemplates"
        ),
        "MachineDeployment": Resource(
            CAPI_GROUP, "v1beta2", "MachineDeployment", "machinedeployments"
        ),
    }


CLUSTER_KINDS: Final = ("TestbedControlPlane", "Cluster", "LibvirtCluster")
"""Created first (see `RealNodes.create`); the templates and MachineDeployments follow."""


def cluster_objects(plan: DemoPlan) -> list[dict[str, Any]]:
    """The first step: the Cluster, its TestbedControlPlane and LibvirtCluster."""
    return [o for o in node_objects(plan) if o["kind"] in CLUSTER_KINDS]


def worker_objects(plan: DemoPlan) -> list[dict[str, Any]]:
    """The second step, once the control plane runs: the templates and MachineDeployments."""
    return [o for o in node_objects(plan) if o["kind"] not in CLUSTER_KINDS]
