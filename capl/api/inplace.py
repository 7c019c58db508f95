"""Which LibvirtMachine spec changes capl makes in place (pure, on camelCase JSON specs).

Shared by the machine controller's day-2 step (`capl.controllers.machine.day2`), which
applies them, and the Cluster API in-place update extension (`capl.webhooks.inplace`), which
tells Cluster API which changes of a MachineDeployment's template it may leave to capl
instead of replacing the machines.

In place (`in_place_patch` covers the field when every check passes):

- `cpus` up to the vCPUs the domain can hot-plug (`maxCPUs`, else the current `cpus`);
- `memoryMiB` up to the memory the domain has (`maxMemoryMiB`, else the current
  `memoryMiB`);
- `rootVolume.sizeGiB` and `extraDisks[].sizeGiB` growing (never shrinking: the API server
  refuses that on a LibvirtMachine);
- `extraDisks` added or removed (matched by name);
- `networkInterfaces` added or removed at the end of the list (the NICs before stay exactly
  as they are; no `addressesFromPools` on an added NIC: its address is configured by the
  bootstrap data, only at creation).

Everything else (image, firmware, maxima, a changed NIC, a raise above the maxima, which
would need a power cycle) is left uncovered, so Cluster API replaces the machine.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["IN_PLACE_FIELDS", "in_place_patch"]

IN_PLACE_FIELDS = ("cpus", "memoryMiB", "rootVolume", "extraDisks", "networkInterfaces")

_DEFAULT_CPUS = 2
_DEFAULT_MEMORY_MIB = 4096


def _limit(spec: Mapping[str, Any], key: str, max_key: str, default: int) -> int:
    value = int(spec.get(key, default))
    return max(value, int(spec.get(max_key) or 0))


def _size(disk: Mapping[str, Any] | None) -> int:
    return int((disk or {}).get("sizeGiB", 0))


def _cpus_memory(current: Mapping[str, Any], desired: Mapping[str, Any], key: str) -> str | None:
    max_key, default = (
        ("maxCPUs", _DEFAULT_CPUS) if key == "cpus" else ("maxMemoryMiB", _DEFAULT_MEMORY_MIB)
    )
    wanted = int(desired.get(key, default))
    limit = _limit(current, key, max_key, default)
    if wanted > limit:
        return f"{key} {wanted} is above the {limit} the running domain can take ({max_key})"
    return None


def _root(current: Mapping[str, Any], desired: Mapping[str, Any]) -> str | None:
    old, new = current.get("rootVolume"), desired.get("rootVolume")
    if old is not None and new is None:
        return "rootVolume removed"
    if old is not None and _size(new) < _size(old):
        return "rootVolume.sizeGiB shrinks"
    return None


def _extra_disks(current: Mapping[str, Any], desired: Mapping[str, Any]) -> str | None:
    old = {d.get("name"): d for d in current.get("extraDisks") or ()}
    for disk in desired.get("extraDisks") or ():
        before = old.get(disk.get("name"))
        if before is not None and _size(disk) < _size(before):
            return f"extraDisks[{disk.get('name')}].sizeGiB shrinks"
    return None


def _nics(spec: Mapping[str, Any]) -> Sequence[Mapping[str, Any]]:
    return spec.get("networkInterfaces") or [{}]


def _network_interfaces(current: Mapping[str, Any], desired: Mapping[str, Any]) -> str | None:
    old, new = _nics(current), _nics(desired)
    for index, (a, b) in enumerate(zip(old, new, strict=False)):
        if dict(a) != dict(b):
            return f"networkInterfaces[{index}] changed (only added or removed at the end)"
    for index, nic in enumerate(new[len(old) :], start=len(old)):
        if nic.get("addressesFromPools"):
            return f"networkInterfaces[{index}].addressesFromPools on an added NIC"
    return None


def in_place_patch(
    current: Mapping[str, Any], desired: Mapping[str, Any]
) -> tuple[dict[str, Any], list[str]]:
    """(the in-place fields of `desired` that differ from `current` and capl can change in
    place, as a JSON merge patch of the spec; why the others cannot)."""
    patch: dict[str, Any] = {}
    refused: list[str] = []
    checks = {
        "cpus": lambda: _cpus_memory(current, desired, "cpus"),
        "memoryMiB": lambda: _cpus_memory(current, desired, "memoryMiB"),
        "rootVolume": lambda: _root(current, desired),
        "extraDisks": lambda: _extra_disks(current, desired),
        "networkInterfaces": lambda: _network_interfaces(current, desired),
    }
    for key in IN_PLACE_FIELDS:
        if current.get(key) == desired.get(key):
            continue
        problem = checks[key]()
        if problem is not None:
            refused.append(problem)
        else:
            patch[key] = desired.get(key)  # None removes it (merge patch)
    return patch, refused
