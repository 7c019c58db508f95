"""Root of the test suite: registers the test-bed fixtures (control plane, libvirt hosts,
Cluster API, the Cluster API CRDs for controller tests, the `capl manager` process, an HTTP
server for base images, capl's libvirt adapter), and the check that no request of a manager
identity was refused (tests/fixtures/rbac.py)."""

pytest_plugins = [
    "tests.fixtures.common",
    "tests.fixtures.controlplane",
    "tests.fixtures.libvirt",
    "tests.fixtures.capi",
    "tests.fixtures.ipam",
    "tests.fixtures.objects",
    "tests.fixtures.capl",
    "tests.fixtures.images",
    "tests.fixtures.virt",
    "tests.fixtures.rbac",
]
