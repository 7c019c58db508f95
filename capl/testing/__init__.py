"""Test support shipped with capl: what the test suite (tests/) and the benchmarks (bench/)
both drive capl with, in the spirit of `kopf.testing` and controller-runtime's envtest
helpers.

Nothing in capl itself imports this package (an import-linter contract says so); it sits on
top of every other layer and may use any of them. The pytest fixtures stay in tests/ and are
thin wrappers around it.

- `capl.testing.toy`: a hand-written Toy CRD and reconciler for exercising the runtime
  against a real API server without capl's own controllers.

The submodules are imported one by one (this package re-exports nothing).
"""
