"""Root of the test suite: registers the test-bed fixtures (control plane, libvirt hosts,
Cluster API)."""

pytest_plugins = [
    "tests.fixtures.common",
    "tests.fixtures.controlplane",
    "tests.fixtures.libvirt",
    "tests.fixtures.capi",
]
