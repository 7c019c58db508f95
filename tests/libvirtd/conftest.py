"""Fixtures of the tests on the real libvirtd (TCG guests, real storage and networks).

- `host`: the system daemon's host (``qemu:///system``) in the `hosts` registry
  (tests/fixtures/virt.py).
"""

from __future__ import annotations

import pytest

from capl.virt import LibvirtHost, LibvirtHosts


@pytest.fixture
async def host(hosts: LibvirtHosts, libvirtd_uri: str) -> LibvirtHost:
    return hosts.get(uri=libvirtd_uri)
