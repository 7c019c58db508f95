"""Names, constants and small readers shared by the e2e harness and its tests, and the run's
report: `report(line)` collects measurements that tests/e2e/conftest.py prints in the
terminal summary (`REPORT`).
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

from capl.runtime.resources import (
    CAPI_GROUP,
    Resource,
)
from capl.testing.objects import condition_of

MACHINE_DEPLOYMENT = Resource(CAPI_GROUP, "v1beta2", "MachineDeployment", "machinedeployments")
MACHINE_SET = Resource(CAPI_GROUP, "v1beta2", "MachineSet", "machinesets")
MACHINE_HEALTH_CHECK = Resource(CAPI_GROUP, "v1beta2", "MachineHealthCheck", "machinehealthchecks")

KUBERNETES_VERSION = "v1.35.4"
FLAVOR = "testbed"
CONTROL_PLANE_LABEL = "cluster.x-k8s.io/control-plane"
CLUSTER_NAME_LABEL = "cluster.x-k8s.io/cluster-name"
DEPLOYMENT_NAME_LABEL = "cluster.x-k8s.io/deployment-name"
CLONED_FROM_ANNOTATION = "cluster.x-k8s.io/cloned-from-name"
GUEST_MEMORY_MIB = 256
#: capl flags for e2e: a quick graceful shutdown (the test guest powers off in a second or
#: two), the rest as shipped.
CAPL_E2E_ARGS = ("--machine-shutdown-timeout=30s",)


# --- the run's report ------------------------------------------------------------------------

REPORT: list[str] = []
"""Measurements printed in the terminal summary (tests/e2e/conftest.py)."""


def report(line: str) -> None:
    REPORT.append(line)


def is_true(obj: Mapping[str, Any], type_: str) -> bool:
    return condition_of(obj, type_).get("status") == "True"


def internal_ip(obj: Mapping[str, Any]) -> str | None:
    """The InternalIP in status.addresses (Machine, LibvirtMachine, Node)."""
    for address in (obj.get("status") or {}).get("addresses") or ():
        if address.get("type") == "InternalIP":
            return str(address.get("address"))
    return None


def name_of(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()
