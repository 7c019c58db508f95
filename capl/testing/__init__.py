"""Test support shipped with capl: what the test suite (tests/) and the benchmarks (bench/)
both drive the controllers with, in the spirit of `kopf.testing` and controller-runtime's
envtest helpers.

Nothing in capl itself imports this package (an import-linter contract says so); it sits on
top of every other layer and may use any of them. The pytest fixtures stay in tests/ and are
thin wrappers around it.

- `capl.testing.objects`: Cluster API and capl objects as plain dicts (Cluster,
  LibvirtCluster, bootstrap Secret, Machine, LibvirtMachine), creating them through any
  `create(resource, obj)`, reading their conditions back, polling for an object, random test
  networks and MACs.
- `capl.testing.crds`: the project's CRD directory and the Cluster API Cluster/Machine CRDs
  reduced to their storage version (no Cluster API manager runs beside them).
- `capl.testing.harness`: `ControllerHarness`, the real controllers in a `capl.runtime`
  Manager against a kube-apiserver and libvirt hosts, with object creators and waits.
- `capl.testing.toy`: a hand-written Toy CRD and reconciler for exercising the runtime
  against a real API server without capl's own controllers.

The submodules are imported one by one (this package re-exports nothing), so that taking the
toy does not load the libvirt adapter.
"""
