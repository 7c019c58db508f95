"""Reading from a guest and from a volume's end on the test driver: it has neither a guest
agent nor volume downloads, so both answer "cannot" at once, without a libvirt call."""

from __future__ import annotations

import uuid

import pytest

from capl.ports.virt import GuestFileState
from capl.virt import LibvirtHost, LibvirtHosts


async def test_guest_file_on_the_test_driver_is_unsupported(
    hosts: LibvirtHosts, host: LibvirtHost
) -> None:
    await host.get_domain(str(uuid.uuid4()))  # connects
    before = hosts.calls.total(host.host_id)
    found = await host.read_guest_file(
        str(uuid.uuid4()), "/run/cluster-api/bootstrap-success.complete"
    )
    assert found.state is GuestFileState.UNSUPPORTED
    assert found.data == b""
    assert (
        await host.read_volume_tail(pool="default-pool", name="x-console.log", limit=4096) is None
    )
    assert hosts.calls.total(host.host_id) == before


async def test_guest_file_on_the_test_driver_takes_no_worker_thread(
    host: LibvirtHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The answer is known on the asyncio side: no call is handed to a worker thread."""

    async def no_call(*args: object, **kwargs: object) -> object:
        raise AssertionError("read_guest_file handed a call to a worker thread")

    monkeypatch.setattr(host.connection, "run", no_call)
    found = await host.read_guest_file(str(uuid.uuid4()), "/etc/hostname")
    assert found.state is GuestFileState.UNSUPPORTED
