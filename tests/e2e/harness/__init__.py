"""The e2e harness: management clusters, workload clusters of real guests, a stand-in kubelet,
and direct looks at libvirt.

One module per part (each explains its part); the tests import the names from here:

- `management`: management clusters (`Management`, `start_management`, `ManagementParts`);
- `workload`: workload clusters of the testbed flavor (`WorkloadCluster`,
  `create_workload_cluster`, `workload_cluster`, `teardown_cluster`);
- `kubelet`: the stand-in kubelet that registers Nodes for booted guests (`KubeletStandIn`,
  `serving_kubelet`), and why Cluster API v1.13 needs it to create `<cluster>-kubeconfig`;
- `libvirt_view`: direct reads of libvirt (`LibvirtView`, `DomainFacts`, `resolve_a`);
- `common`: labels, resources, constants, object readers and the run's report (`REPORT`).

A test module's fixtures are three context managers (see tests/e2e/test_workload_cluster.py):
`management_parts.running(name)`, `serving_kubelet(api, view)` and `workload_cluster(...)`.
"""

from __future__ import annotations

from tests.e2e.harness.common import (
    CAPL_E2E_ARGS,
    CLONED_FROM_ANNOTATION,
    CLUSTER_NAME_LABEL,
    CONTROL_PLANE_LABEL,
    DEPLOYMENT_NAME_LABEL,
    FLAVOR,
    GUEST_MEMORY_MIB,
    KUBERNETES_VERSION,
    MACHINE_DEPLOYMENT,
    MACHINE_HEALTH_CHECK,
    MACHINE_SET,
    REPORT,
    b64,
    internal_ip,
    is_true,
    name_of,
    report,
)
from tests.e2e.harness.kubelet import (
    GuestRecord,
    KubeletStandIn,
    serving_kubelet,
)
from tests.e2e.harness.libvirt_view import (
    DomainFacts,
    LibvirtView,
    resolve_a,
)
from tests.e2e.harness.management import (
    CAPL_SERVICE_ACCOUNT,
    Management,
    ManagementParts,
    start_management,
)
from tests.e2e.harness.workload import (
    WorkloadCluster,
    bootstrap_secret,
    create_workload_cluster,
    delete_cluster,
    guest_summary,
    teardown_cluster,
    workload_cluster,
)

__all__ = [
    "CAPL_E2E_ARGS",
    "CAPL_SERVICE_ACCOUNT",
    "CLONED_FROM_ANNOTATION",
    "CLUSTER_NAME_LABEL",
    "CONTROL_PLANE_LABEL",
    "DEPLOYMENT_NAME_LABEL",
    "FLAVOR",
    "GUEST_MEMORY_MIB",
    "KUBERNETES_VERSION",
    "MACHINE_DEPLOYMENT",
    "MACHINE_HEALTH_CHECK",
    "MACHINE_SET",
    "REPORT",
    "DomainFacts",
    "GuestRecord",
    "KubeletStandIn",
    "LibvirtView",
    "Management",
    "ManagementParts",
    "WorkloadCluster",
    "b64",
    "bootstrap_secret",
    "create_workload_cluster",
    "delete_cluster",
    "guest_summary",
    "internal_ip",
    "is_true",
    "name_of",
    "report",
    "resolve_a",
    "serving_kubelet",
    "start_management",
    "teardown_cluster",
    "workload_cluster",
]
