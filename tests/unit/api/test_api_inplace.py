"""Which spec changes capl makes in place (capl.api.inplace): the merge patch and the refusals."""

from __future__ import annotations

from typing import Any

import pytest

from capl.api.inplace import in_place_patch

BASE: dict[str, Any] = {
    "image": {"path": "/img.qcow2"},
    "cpus": 2,
    "maxCPUs": 4,
    "memoryMiB": 1024,
    "rootVolume": {"sizeGiB": 10},
    "extraDisks": [{"name": "a", "sizeGiB": 1}],
}


def _with(**changes: Any) -> dict[str, Any]:
    spec = dict(BASE)
    for key, value in changes.items():
        if value is None:
            spec.pop(key, None)
        else:
            spec[key] = value
    return spec


def test_growth_and_additions_are_covered() -> None:
    desired = _with(
        cpus=4,
        rootVolume={"sizeGiB": 20},
        extraDisks=[{"name": "a", "sizeGiB": 2}, {"name": "b", "sizeGiB": 1}],
        networkInterfaces=[{}, {"network": "n2"}],
    )
    patch, refused = in_place_patch(BASE, desired)
    assert refused == []
    assert patch == {
        "cpus": 4,
        "rootVolume": {"sizeGiB": 20},
        "extraDisks": [{"name": "a", "sizeGiB": 2}, {"name": "b", "sizeGiB": 1}],
        "networkInterfaces": [{}, {"network": "n2"}],
    }


def test_a_removed_disk_is_a_merge_patch_null() -> None:
    patch, refused = in_place_patch(BASE, _with(extraDisks=None))
    assert (patch, refused) == ({"extraDisks": None}, [])


@pytest.mark.parametrize(
    ("desired", "why"),
    [
        (_with(cpus=5), "cpus 5 is above the 4"),
        (_with(memoryMiB=2048), "memoryMiB 2048 is above the 1024"),
        (_with(rootVolume={"sizeGiB": 5}), "rootVolume.sizeGiB shrinks"),
        (_with(rootVolume=None), "rootVolume removed"),
        (_with(extraDisks=[{"name": "a", "sizeGiB": 0}]), "extraDisks[a].sizeGiB shrinks"),
        (_with(networkInterfaces=[{"bridge": "br0"}]), "networkInterfaces[0] changed"),
        (
            _with(networkInterfaces=[{}, {"addressesFromPools": [{"name": "p"}]}]),
            "networkInterfaces[1].addressesFromPools",
        ),
    ],
)
def test_what_needs_a_replacement_is_left_out(desired: dict[str, Any], why: str) -> None:
    patch, refused = in_place_patch(BASE, desired)
    assert patch == {}
    assert len(refused) == 1
    assert why in refused[0]


def test_other_fields_are_never_covered() -> None:
    patch, refused = in_place_patch(BASE, _with(image={"path": "/other.qcow2"}, cpus=3))
    assert patch == {"cpus": 3}  # the image stays different: Cluster API replaces
    assert refused == []
