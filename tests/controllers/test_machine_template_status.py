"""The LibvirtMachineTemplate controller against the real API server: `status.capacity` and
`status.nodeInfo` (what the Cluster API autoscaler reads to scale a MachineDeployment up from
zero) follow the template's spec, with one status patch per change and none when in sync.

No webhook runs here, so the spec of a template can be changed (as the topology controller's
dry runs and users without capl's webhooks can): the status must follow it.
"""

from __future__ import annotations

from typing import Any

import pytest

from capl.api import constants as c
from capl.controllers import machine_template
from capl.runtime.objects import Obj, ObjectKey
from capl.runtime.resources import CLUSTER, LIBVIRT_MACHINE_TEMPLATE
from capl.testing.harness import ControllerHarness
from capl.testing.objects import cluster_obj

pytestmark = [pytest.mark.apiserver]

NAME = machine_template.CONTROLLER_NAME


def template(name: str, namespace: str, *, cpus: int, memory_mib: int) -> dict[str, Any]:
    return {
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1",
        "kind": "LibvirtMachineTemplate",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "template": {
                "spec": {
                    "cpus": cpus,
                    "memoryMiB": memory_mib,
                    "image": {"path": "/var/lib/libvirt/images/base.qcow2"},
                }
            }
        },
    }


def status_is(cpu: str, memory: str) -> Any:
    def check(obj: Obj) -> bool:
        return (obj.get("status") or {}) == {
            "capacity": {"cpu": cpu, "memory": memory},
            "nodeInfo": {"architecture": "amd64", "operatingSystem": "linux"},
        }

    return check


async def test_status_follows_the_spec(harness: ControllerHarness) -> None:
    await harness.start(machine_template.setup)
    templates = harness.api.resource(LIBVIRT_MACHINE_TEMPLATE)
    await harness.reconciled_after(
        NAME, templates.create(template("workers", harness.namespace, cpus=2, memory_mib=1536))
    )
    await harness.wait_for(
        LIBVIRT_MACHINE_TEMPLATE, "workers", status_is("2", "1536Mi"), what="status from spec"
    )
    await harness.settle(NAME)
    assert harness.writes(LIBVIRT_MACHINE_TEMPLATE, "workers") == {"PATCH/status": 1}

    # cpus and memory change: the status follows, in one more status patch
    key = ObjectKey(harness.namespace, "workers")
    await templates.patch(key, {"spec": {"template": {"spec": {"cpus": 4, "memoryMiB": 8192}}}})
    await harness.wait_for(LIBVIRT_MACHINE_TEMPLATE, "workers", status_is("4", "8192Mi"))
    await harness.settle(NAME)
    assert harness.writes(LIBVIRT_MACHINE_TEMPLATE, "workers") == {"PATCH/status": 2}

    # a change that leaves cpus and memory alone (a label) writes nothing
    await harness.reconciled_after(
        NAME, templates.patch(key, {"metadata": {"labels": {"pool": "blue"}}})
    )
    await harness.settle(NAME)
    assert harness.writes(LIBVIRT_MACHINE_TEMPLATE, "workers") == {"PATCH/status": 2}

    # someone else's status write is put right
    await templates.patch_status(key, {"status": {"capacity": {"cpu": "99", "gpu": "1"}}})
    await harness.wait_for(LIBVIRT_MACHINE_TEMPLATE, "workers", status_is("4", "8192Mi"))


async def test_paused_template_is_not_written(harness: ControllerHarness) -> None:
    await harness.start(machine_template.setup)
    templates = harness.api.resource(LIBVIRT_MACHINE_TEMPLATE)
    paused = template("paused", harness.namespace, cpus=1, memory_mib=512)
    paused["metadata"]["annotations"] = {c.PAUSED_ANNOTATION: ""}
    await harness.reconciled_after(NAME, templates.create(paused))
    await harness.settle(NAME)
    assert harness.writes(LIBVIRT_MACHINE_TEMPLATE, "paused") == {}
    obj = await harness.get(LIBVIRT_MACHINE_TEMPLATE, "paused")
    assert obj is not None
    assert "status" not in obj

    # unpaused: the status is written
    unpause = {"metadata": {"annotations": {c.PAUSED_ANNOTATION: None}}}
    await templates.patch(ObjectKey(harness.namespace, "paused"), unpause)
    await harness.wait_for(LIBVIRT_MACHINE_TEMPLATE, "paused", status_is("1", "512Mi"))


async def test_template_of_a_paused_cluster_is_not_written(harness: ControllerHarness) -> None:
    """Pause means no writes: a template labelled with a Cluster that has spec.paused (as the
    topology controller labels its templates; clusterctl move pauses the Cluster) keeps its
    status until the Cluster is unpaused."""
    await harness.start(machine_template.setup)
    ns = harness.namespace
    await harness.api.resource(CLUSTER).create(
        cluster_obj("moving", ns, libvirt_cluster="moving", paused=True)
    )
    labelled = template("moving-md-0", ns, cpus=2, memory_mib=1024)
    labelled["metadata"]["labels"] = {c.CLUSTER_NAME_LABEL: "moving"}
    await harness.reconciled_after(
        NAME, harness.api.resource(LIBVIRT_MACHINE_TEMPLATE).create(labelled)
    )
    await harness.settle(NAME)
    assert harness.writes(LIBVIRT_MACHINE_TEMPLATE, "moving-md-0") == {}

    # the Cluster resumes: its templates are brought up to date without a change of their own
    await harness.api.resource(CLUSTER).patch(ObjectKey(ns, "moving"), {"spec": {"paused": False}})
    await harness.wait_for(LIBVIRT_MACHINE_TEMPLATE, "moving-md-0", status_is("2", "1024Mi"))
    await harness.settle(NAME)
    assert harness.writes(LIBVIRT_MACHINE_TEMPLATE, "moving-md-0") == {"PATCH/status": 1}
