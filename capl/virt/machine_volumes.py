"""The storage of a new domain in one worker-thread operation (``Host.create_machine_volumes``).

A machine's creation needs a name check and three or more volumes. Made one by one, each is
a hand-off to a worker thread and back (about 25 to 100 µs of CPU each, measured: the
hand-off, not the call) and each volume's description is read back (one ``XMLDesc`` call and
an XML parse) only to learn its path. Here they run back to back on the pool's serial thread,
under the pool's lock, and the paths come from the volume handles (``PoolDriver.volume_path``:
a directory pool's volume key *is* the path). Runs in a worker thread (blocking).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from capl.ports.virt import HostId, MachineVolumePaths, MachineVolumes, VolumeFormat
from capl.virt import storage
from capl.virt.domain import get_by_name
from capl.virt.pools import PoolDrivers
from capl.virt.pools.base import VolumeRequest

__all__ = ["create_machine_volumes"]


def create_machine_volumes(
    c: Any,
    host_id: HostId,
    request: MachineVolumes,
    *,
    drivers: PoolDrivers,
    on_step: Callable[[str], None] | None = None,
) -> MachineVolumePaths:
    """See ``Host.create_machine_volumes``; ``on_step`` after each kind of volume."""
    holder = get_by_name(c, host_id, request.domain_name)
    if holder is not None and holder.uuid.lower() != request.domain_uuid.lower():
        return MachineVolumePaths(holder=holder)
    step = on_step or _no_step
    pool_name = request.pool
    driver = drivers.of(storage.lookup_pool(c, pool_name))
    base = request.backing
    backing_format = base.volume.format if base.volume.format in ("qcow2", "raw") else None
    root = storage.create_volume_handle(
        c,
        pool_name,
        VolumeRequest(
            name=request.root,
            capacity_bytes=max(request.root_capacity_bytes, base.virtual_size_bytes),
            format=VolumeFormat.QCOW2,
            backing_path=base.volume.path,
            backing_format=backing_format,
        ),
        drivers=drivers,
    )
    step("root-volume")
    extras = tuple(
        driver.volume_path(
            storage.create_volume_handle(
                c,
                pool_name,
                VolumeRequest(name=name, capacity_bytes=size, format=VolumeFormat.QCOW2),
                drivers=drivers,
            )
        )
        for name, size in request.extras
    )
    step("extra-volumes")
    volume, info = storage.upload_handle(
        c, pool_name, request.bootstrap, request.bootstrap_data, drivers=drivers
    )
    step("bootstrap-volume")
    return MachineVolumePaths(
        holder=holder,
        root=driver.volume_path(root),
        extras=extras,
        bootstrap=info.path if info is not None else driver.volume_path(volume),
    )


def _no_step(_step: str) -> None:
    """No fault points (production)."""
