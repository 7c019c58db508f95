"""Fixtures of the adapter tests on libvirt's test driver (``test:///default``, one fake
hypervisor per process).

- `host`: the test driver's host in the `hosts` registry (tests/fixtures/virt.py).
"""

from __future__ import annotations

import pytest

from capl.virt import LibvirtHost, LibvirtHosts

URI = "test:///default"


@pytest.fixture
async def host(hosts: LibvirtHosts) -> LibvirtHost:
    return hosts.get(uri=URI)
