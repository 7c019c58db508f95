"""capl.runtime: a small controller runtime (informers, work queue, controllers, leader
election, manager) over raw JSON objects and the client Protocols in `capl.runtime.client`.

It imports no Kubernetes client library: capl.kube implements the Protocols. Controllers use:

- `ObjectKey`, `Obj`, `copy_obj`, `get_path` (objects), `Resource` + well-known kinds (resources)
- `Reconciler`, `Result`, `Watch` (controller); mappers/predicates (handlers)
- `Cache` reads (informer), `apply_patch` / `Patcher` (patch), conditions helpers (conditions)
- `Recorder` for events (events); typed errors (errors)

The manager wiring uses `Manager`, `ManagerOptions` (manager) and `configure_logging` (logging).
"""

from capl.runtime.client import Client, ObjectList, ResourceClient, WatchEvent
from capl.runtime.controller import Controller, Reconciler, Result, Watch
from capl.runtime.errors import (
    AlreadyExists,
    ApiError,
    Conflict,
    Forbidden,
    Gone,
    Invalid,
    NotFound,
    StaleIncarnation,
    TransportError,
    WatchStalled,
)
from capl.runtime.events import EventRecorder, NullRecorder, Recorder
from capl.runtime.informer import Cache, Informer, InformerOptions
from capl.runtime.manager import LeadershipLost, Manager, ManagerOptions
from capl.runtime.objects import Obj, ObjectKey, copy_obj, get_path, key_of
from capl.runtime.patch import Patcher, apply_patch, merge_patch
from capl.runtime.resources import Resource

__all__ = [
    "AlreadyExists",
    "ApiError",
    "Cache",
    "Client",
    "Conflict",
    "Controller",
    "EventRecorder",
    "Forbidden",
    "Gone",
    "Informer",
    "InformerOptions",
    "Invalid",
    "LeadershipLost",
    "Manager",
    "ManagerOptions",
    "NotFound",
    "NullRecorder",
    "Obj",
    "ObjectKey",
    "ObjectList",
    "Patcher",
    "Reconciler",
    "Recorder",
    "Resource",
    "ResourceClient",
    "Result",
    "StaleIncarnation",
    "TransportError",
    "Watch",
    "WatchEvent",
    "WatchStalled",
    "apply_patch",
    "copy_obj",
    "get_path",
    "key_of",
    "merge_patch",
]
