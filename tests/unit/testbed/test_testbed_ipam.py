"""capl.testbed.ipam: finding the in-cluster IPAM provider build, and the manager's flags."""

from __future__ import annotations

from pathlib import Path

import pytest

from capl.testbed.ipam import IPAM_DIR_ENV, IpamMissing, find_ipam


def test_find_ipam_says_how_to_build_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(IPAM_DIR_ENV, raising=False)
    with pytest.raises(IpamMissing, match="make ipam"):
        find_ipam()
    with pytest.raises(IpamMissing, match=r"ipam-in-cluster-manager.*not found"):
        find_ipam(tmp_path)


def test_find_ipam_finds_a_complete_build(tmp_path: Path) -> None:
    manager = tmp_path / "bin" / "ipam-in-cluster-manager"
    manager.parent.mkdir()
    manager.write_text("#!/bin/sh\n")
    manager.chmod(0o755)
    default = tmp_path / "config" / "default"
    default.mkdir(parents=True)
    (default / "kustomization.yaml").write_text("resources: []\n")
    assets = find_ipam(tmp_path)
    assert (assets.manager, assets.config) == (manager, tmp_path / "config")
