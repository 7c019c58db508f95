"""The local test bed: a real Kubernetes control plane (etcd + kube-apiserver) on loopback.

Used by the test suite (tests/fixtures/controlplane.py) and by `capl demo`, which is why it
lives in the package rather than under tests/. It drives its processes only through
subprocesses, files and plain HTTP(S) — never through kubernetes_asyncio or libvirt — so it
depends on no other capl layer and any layer above the adapters may use it.

Public face:
- `ControlPlane`: start/stop etcd and kube-apiserver, restart either one alone, force an etcd
  compaction, install CRDs, mint kubeconfigs for extra users, read the audit log.
- `find_assets` / `Assets`: locate the binaries (KUBEBUILDER_ASSETS layout).
- `capl.testbed.certs`: the small certificate authority and kubeconfig writer behind it.
- `capl.testbed.process`: child processes that never outlive the parent, and the waits
  (readiness with a deadline, a retry when a port was lost) every test-bed process shares.
- `capl.testbed.localmanager`: a controller manager as a local process serving webhooks,
  health and metrics on loopback (the base of `capl.testbed.capi.CapiCore` and of the
  tests' `capl manager` process).
- `capl.testbed.capi`: the real Cluster API core manager (`ProviderManager`, the base the
  kubeadm managers of `capl.testbed.kubeadm_providers` share); `capl.testbed.capibuild` the
  build it runs (`make capi`), `capl.testbed.manifests` the provider manifests re-pointed at
  loopback webhooks, `capl.testbed.clusterctl` clusterctl with local repositories.
- `capl.testbed.hostedcp`: a workload control plane as host processes (kubeadm's phases).
- `capl.testbed.process.own_resolver`: a child process with a resolv.conf of its own.
"""

from capl.testbed.controlplane import (
    Assets,
    AssetsMissing,
    ControlPlane,
    ControlPlaneError,
    find_assets,
    free_port,
    read_audit_events,
)
from capl.testbed.process import ManagedProcess, ProcessFailed

__all__ = [
    "Assets",
    "AssetsMissing",
    "ControlPlane",
    "ControlPlaneError",
    "ManagedProcess",
    "ProcessFailed",
    "find_assets",
    "free_port",
    "read_audit_events",
]
