"""Cluster API's in-place update extension (Runtime SDK, hooks.runtime.cluster.x-k8s.io/v1alpha1),
served by the manager on the webhook server's HTTPS port (`mount_in_place_extension`).

Cluster API v1.12+ with the feature gates `RuntimeSDK` and `InPlaceUpdates` asks the
extensions an ExtensionConfig registers (its `clientConfig` pointing at this server) before
it rolls out a MachineDeployment whose templates changed:

- `Discovery` (POST .../discovery): the handlers below;
- `CanUpdateMachineSet` (MachineDeployment rollouts) and `CanUpdateMachine` (the control
  plane's): the request carries the current and desired LibvirtMachineTemplate (or
  LibvirtMachine); the answer is a JSON merge patch of the changes capl makes in place
  (`capl.api.inplace.in_place_patch`). Cluster API applies it to the current object and
  compares: only when nothing else differs are the machines updated in place, otherwise they
  are replaced as before;
- `UpdateMachine`: Cluster API has written the new spec to the LibvirtMachine (server-side
  apply) and asks until the answer says done. The machine controller applies the change
  (`capl.controllers.machine.day2`); this reads the LibvirtMachine from the manager's cache:
  done when the controller observed the generation and HardwareUpdated is not False (or is
  False/RestartRequired: the condition says what waits for the next power cycle); in
  progress (retryAfterSeconds) while the cache or the controller is behind; Failure for
  NotInPlace and HardwareReverted (the change failed, was reverted and is not retried).

Objects of other kinds (another provider's templates) get an empty patch. `Patch.patch` is Go
`[]byte`, which JSON carries as base64.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from aiohttp import web

from capl.api import constants as c
from capl.api.constants import Kind
from capl.api.inplace import in_place_patch

__all__ = [
    "HANDLERS",
    "HOOKS_API_VERSION",
    "PATH_PREFIX",
    "MachineLookup",
    "mount_in_place_extension",
]

log = logging.getLogger(__name__)

HOOKS_API_VERSION = "hooks.runtime.cluster.x-k8s.io/v1alpha1"
PATH_PREFIX = "/hooks.runtime.cluster.x-k8s.io/v1alpha1"
HANDLERS = {
    "CanUpdateMachine": "can-update-machine",
    "CanUpdateMachineSet": "can-update-machineset",
    "UpdateMachine": "update-machine",
}
"""Hook -> handler name; Cluster API calls `<PATH_PREFIX>/<hook in lower case>/<name>`."""

RETRY_SECONDS = 5
TIMEOUT_SECONDS = 10


class MachineLookup(Protocol):
    """A LibvirtMachine as the manager's cache has it (camelCase JSON), None if unknown."""

    def libvirt_machine(self, namespace: str, name: str) -> Mapping[str, Any] | None: ...


def discovery() -> dict[str, Any]:
    return {
        "apiVersion": HOOKS_API_VERSION,
        "kind": "DiscoveryResponse",
        "status": "Success",
        "handlers": [
            {
                "name": name,
                "requestHook": {"apiVersion": HOOKS_API_VERSION, "hook": hook},
                "timeoutSeconds": TIMEOUT_SECONDS,
                "failurePolicy": "Fail",
            }
            for hook, name in HANDLERS.items()
        ],
    }


def _merge_patch(patch: Mapping[str, Any]) -> dict[str, str]:
    raw = json.dumps(patch, separators=(",", ":"), sort_keys=True).encode()
    return {"patchType": "JSONMergePatch", "patch": base64.b64encode(raw).decode()}


def _pair(
    request: Mapping[str, Any], key: str, kind: str
) -> tuple[Mapping[str, Any], Mapping[str, Any]] | None:
    """(current, desired) object `key` of a CanUpdate request when both are of `kind`."""
    current = (request.get("current") or {}).get(key) or {}
    desired = (request.get("desired") or {}).get(key) or {}
    if current.get("kind") != kind or desired.get("kind") != kind:
        return None
    return current, desired


def can_update_machine_set(request: Mapping[str, Any]) -> dict[str, Any]:
    """The LibvirtMachineTemplate changes capl makes in place (spec.template.spec)."""
    pair = _pair(request, "infrastructureMachineTemplate", Kind.LIBVIRT_MACHINE_TEMPLATE)
    response: dict[str, Any] = {
        "apiVersion": HOOKS_API_VERSION,
        "kind": "CanUpdateMachineSetResponse",
        "status": "Success",
    }
    if pair is None:
        return response
    current, desired = pair
    old = ((current.get("spec") or {}).get("template") or {}).get("spec") or {}
    new = ((desired.get("spec") or {}).get("template") or {}).get("spec") or {}
    patch, refused = in_place_patch(old, new)
    if patch:
        response["infrastructureMachineTemplatePatch"] = _merge_patch(
            {"spec": {"template": {"spec": patch}}}
        )
    if refused:
        response["message"] = "not in place: " + "; ".join(refused)
    return response


def can_update_machine(request: Mapping[str, Any]) -> dict[str, Any]:
    """The LibvirtMachine changes capl makes in place (spec)."""
    pair = _pair(request, "infrastructureMachine", Kind.LIBVIRT_MACHINE)
    response: dict[str, Any] = {
        "apiVersion": HOOKS_API_VERSION,
        "kind": "CanUpdateMachineResponse",
        "status": "Success",
    }
    if pair is None:
        return response
    current, desired = pair
    patch, refused = in_place_patch(current.get("spec") or {}, desired.get("spec") or {})
    if patch:
        response["infrastructureMachinePatch"] = _merge_patch({"spec": patch})
    if refused:
        response["message"] = "not in place: " + "; ".join(refused)
    return response


def _update_response(status: str, message: str, retry: int = 0) -> dict[str, Any]:
    return {
        "apiVersion": HOOKS_API_VERSION,
        "kind": "UpdateMachineResponse",
        "status": status,
        "message": message,
        "retryAfterSeconds": retry,
    }


def update_machine(request: Mapping[str, Any], machines: MachineLookup) -> dict[str, Any]:
    """Done once the machine controller applied the desired spec (see the module docstring)."""
    desired = (request.get("desired") or {}).get("infrastructureMachine") or {}
    if desired.get("kind") != Kind.LIBVIRT_MACHINE:
        return _update_response("Success", "")
    meta = desired.get("metadata") or {}
    namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    found = machines.libvirt_machine(namespace, name)
    if found is None:
        return _update_response(
            "Success", f"LibvirtMachine {namespace}/{name} not seen yet", RETRY_SECONDS
        )
    spec, wanted = found.get("spec") or {}, desired.get("spec") or {}
    patch, _refused = in_place_patch(spec, wanted)
    if patch:
        return _update_response(
            "Success", "waiting for the new spec to reach the manager", RETRY_SECONDS
        )
    status = found.get("status") or {}
    generation = (found.get("metadata") or {}).get("generation")
    if status.get("observedGeneration") != generation:
        return _update_response(
            "Success", "the machine controller has not observed the new spec yet", RETRY_SECONDS
        )
    condition = next(
        (
            x
            for x in status.get("conditions") or ()
            if x.get("type") == c.ConditionType.HARDWARE_UPDATED
        ),
        None,
    )
    if condition is None or condition.get("status") == "True":
        return _update_response("Success", "applied in place")
    reason, message = condition.get("reason"), str(condition.get("message") or "")
    if reason == c.Reason.RESTART_REQUIRED:
        return _update_response("Success", message)
    if reason in (c.Reason.NOT_IN_PLACE, c.Reason.HARDWARE_REVERTED):
        return _update_response("Failure", message)
    return _update_response("Success", message, RETRY_SECONDS)


Handler = Callable[[Mapping[str, Any]], dict[str, Any]]


def mount_in_place_extension(app: web.Application, *, machines: MachineLookup) -> None:
    """Add the extension's routes (Discovery and the three hooks) to `app`."""

    def route(handler: Handler) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handle(request: web.Request) -> web.Response:
            try:
                body = await request.json()
            except ValueError as exc:
                raise web.HTTPBadRequest(text=f"invalid JSON: {exc}") from exc
            if not isinstance(body, dict):
                raise web.HTTPBadRequest(text="expected a JSON object")
            answer = handler(body)
            log.debug("runtime hook %s: %s", request.path, answer.get("message", ""))
            return web.json_response(answer)

        return handle

    app.router.add_post(f"{PATH_PREFIX}/discovery", route(lambda _body: discovery()))
    hooks: dict[str, Handler] = {
        "CanUpdateMachine": can_update_machine,
        "CanUpdateMachineSet": can_update_machine_set,
        "UpdateMachine": lambda body: update_machine(body, machines),
    }
    for hook, name in HANDLERS.items():
        app.router.add_post(f"{PATH_PREFIX}/{hook.lower()}/{name}", route(hooks[hook]))
