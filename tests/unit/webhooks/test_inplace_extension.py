"""The in-place update extension's routes (capl.webhooks.inplace) on the webhook app: the
Runtime SDK paths, the request and response shapes of Cluster API v1.13's hooks
(api/runtime/hooks/v1alpha1/inplaceupdate_types.go, discovery_types.go), the patch as
base64 (Go []byte), and UpdateMachine's answers from the LibvirtMachine's status."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from capl.api import constants as c
from capl.webhooks import create_app
from capl.webhooks.inplace import PATH_PREFIX, mount_in_place_extension

SPEC: dict[str, Any] = {
    "image": {"path": "/img.qcow2"},
    "cpus": 2,
    "memoryMiB": 1024,
    "rootVolume": {"sizeGiB": 10},
}


class Machines:
    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}

    def libvirt_machine(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        return self.objects.get((namespace, name))


@pytest.fixture
async def client() -> AsyncIterator[tuple[TestClient[Any, Any], Machines]]:
    machines = Machines()
    app = create_app()
    mount_in_place_extension(app, machines=machines)
    async with TestClient(TestServer(app)) as test_client:
        yield test_client, machines


def _template(spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1",
        "kind": "LibvirtMachineTemplate",
        "metadata": {"name": "t", "namespace": "ns"},
        "spec": {"template": {"spec": spec}},
    }


async def _post(client: TestClient[Any, Any], hook: str, body: dict[str, Any]) -> Any:
    response = await client.post(f"{PATH_PREFIX}/{hook}", json=body)
    assert response.status == 200, await response.text()
    return await response.json()


async def test_discovery_lists_the_three_hooks(client: Any) -> None:
    test_client, _ = client
    answer = await _post(test_client, "discovery", {"kind": "DiscoveryRequest"})
    assert answer["status"] == "Success"
    hooks = {h["requestHook"]["hook"]: h["name"] for h in answer["handlers"]}
    assert hooks == {
        "CanUpdateMachine": "can-update-machine",
        "CanUpdateMachineSet": "can-update-machineset",
        "UpdateMachine": "update-machine",
    }
    for handler in answer["handlers"]:
        assert handler["requestHook"]["apiVersion"] == "hooks.runtime.cluster.x-k8s.io/v1alpha1"


async def test_can_update_machine_set_patches_a_grown_disk_only(client: Any) -> None:
    test_client, _ = client
    grown = {**SPEC, "rootVolume": {"sizeGiB": 20}}
    answer = await _post(
        test_client,
        "canupdatemachineset/can-update-machineset",
        {
            "kind": "CanUpdateMachineSetRequest",
            "current": {"infrastructureMachineTemplate": _template(SPEC)},
            "desired": {"infrastructureMachineTemplate": _template(grown)},
        },
    )
    assert answer["status"] == "Success"
    patch = answer["infrastructureMachineTemplatePatch"]
    assert patch["patchType"] == "JSONMergePatch"
    assert json.loads(base64.b64decode(patch["patch"])) == {
        "spec": {"template": {"spec": {"rootVolume": {"sizeGiB": 20}}}}
    }
    # another image: no patch at all (Cluster API replaces the machines)
    other = {**SPEC, "image": {"path": "/other.qcow2"}}
    answer = await _post(
        test_client,
        "canupdatemachineset/can-update-machineset",
        {
            "current": {"infrastructureMachineTemplate": _template(SPEC)},
            "desired": {"infrastructureMachineTemplate": _template(other)},
        },
    )
    assert answer["status"] == "Success"
    assert "infrastructureMachineTemplatePatch" not in answer
    # another provider's template: none of capl's business
    foreign = {**_template(grown), "kind": "DockerMachineTemplate"}
    answer = await _post(
        test_client,
        "canupdatemachineset/can-update-machineset",
        {
            "current": {"infrastructureMachineTemplate": {**_template(SPEC), "kind": "X"}},
            "desired": {"infrastructureMachineTemplate": foreign},
        },
    )
    assert "infrastructureMachineTemplatePatch" not in answer


async def test_can_update_machine_covers_machine_specs(client: Any) -> None:
    test_client, _ = client
    current = {"kind": "LibvirtMachine", "spec": {**SPEC, "maxCPUs": 4}}
    desired = {"kind": "LibvirtMachine", "spec": {**SPEC, "maxCPUs": 4, "cpus": 4}}
    answer = await _post(
        test_client,
        "canupdatemachine/can-update-machine",
        {
            "current": {"infrastructureMachine": current},
            "desired": {"infrastructureMachine": desired},
        },
    )
    patch = answer["infrastructureMachinePatch"]
    assert json.loads(base64.b64decode(patch["patch"])) == {"spec": {"cpus": 4}}


def _machine(spec: dict[str, Any], generation: int, observed: int, *conds: dict[str, Any]) -> Any:
    return {
        "kind": "LibvirtMachine",
        "metadata": {"name": "m", "namespace": "ns", "generation": generation},
        "spec": spec,
        "status": {"observedGeneration": observed, "conditions": list(conds)},
    }


def _hardware(status: str, reason: str, message: str = "") -> dict[str, Any]:
    return {
        "type": c.ConditionType.HARDWARE_UPDATED,
        "status": status,
        "reason": reason,
        "message": message,
    }


async def test_update_machine_follows_the_machine_controller(client: Any) -> None:
    test_client, machines = client
    grown = {**SPEC, "rootVolume": {"sizeGiB": 20}}
    request = {
        "kind": "UpdateMachineRequest",
        "desired": {
            "machine": {"metadata": {"name": "m", "namespace": "ns"}},
            "infrastructureMachine": {
                "kind": "LibvirtMachine",
                "metadata": {"name": "m", "namespace": "ns"},
                "spec": grown,
            },
        },
    }
    path = "updatemachine/update-machine"

    async def answer() -> Any:
        return await _post(test_client, path, request)

    first = await answer()  # not in the cache yet
    assert (first["status"], first["retryAfterSeconds"]) == ("Success", 5)
    machines.objects["ns", "m"] = _machine(SPEC, 1, 1)
    assert (await answer())["retryAfterSeconds"] == 5  # the cache has the old spec
    machines.objects["ns", "m"] = _machine(grown, 2, 1)
    assert (await answer())["retryAfterSeconds"] == 5  # not observed yet
    failed = _hardware("False", c.Reason.HARDWARE_UPDATE_FAILED, "libvirt said no")
    machines.objects["ns", "m"] = _machine(grown, 2, 2, failed)
    assert (await answer())["retryAfterSeconds"] == 5
    assert (await answer())["message"] == "libvirt said no"
    machines.objects["ns", "m"] = _machine(grown, 2, 2, _hardware("True", "HardwareApplied"))
    done = await answer()
    assert (done["status"], done["retryAfterSeconds"]) == ("Success", 0)
    waiting = _hardware("False", c.Reason.RESTART_REQUIRED, "cpus=4 at the next power cycle")
    machines.objects["ns", "m"] = _machine(grown, 2, 2, waiting)
    done = await answer()
    assert (done["status"], done["retryAfterSeconds"], done["message"]) == (
        "Success",
        0,
        "cpus=4 at the next power cycle",
    )
    refused = _hardware("False", c.Reason.NOT_IN_PLACE, "networkInterfaces[0] changed")
    machines.objects["ns", "m"] = _machine(grown, 2, 2, refused)
    assert (await answer())["status"] == "Failure"
    reverted = _hardware("False", c.Reason.HARDWARE_REVERTED, "the change failed (...)")
    machines.objects["ns", "m"] = _machine(grown, 2, 2, reverted)
    assert (await answer())["status"] == "Failure"
