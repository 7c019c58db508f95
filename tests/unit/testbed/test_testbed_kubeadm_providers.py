"""Pure parts of capl.testbed.kubeadm_providers and of the Cluster API release layout it shares
with capl.testbed.capi: what each manager is run with, where the build keeps it, what the
clusterctl local repository carries. No binaries run here (tests/e2e/test_kubeadm_providers.py
runs them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from capl.testbed import Assets, ControlPlane
from capl.testbed.capi import (
    CORE_COMPONENTS,
    KUBEADM_BOOTSTRAP_COMPONENTS,
    KUBEADM_CONTROL_PLANE_COMPONENTS,
    CapiAssets,
    CapiCore,
    CapiMissing,
    ProviderManager,
)
from capl.testbed.capibuild import CAPI_COMPONENTS
from capl.testbed.clusterctl import Clusterctl
from capl.testbed.kubeadm_providers import (
    IGNITION_GATE,
    KubeadmBootstrap,
    KubeadmControlPlane,
    KubeadmProviders,
    require_kubeadm_providers,
)

VERSION = "v1.13.6"


def build(root: Path, *, kubeadm: bool = True) -> CapiAssets:
    """A `make capi` output layout with empty stand-ins for the binaries."""
    root.mkdir(parents=True, exist_ok=True)
    components = CAPI_COMPONENTS if kubeadm else (CORE_COMPONENTS,)
    for c in components:
        binary = root / "bin" / c.manager
        binary.parent.mkdir(parents=True, exist_ok=True)
        binary.write_text("#!/bin/sh\n")
        binary.chmod(0o755)
        (root / c.config).mkdir(parents=True, exist_ok=True)
        (root / c.config / "kustomization.yaml").write_text("resources: []\n")
    clusterctl = root / "bin" / "clusterctl"
    clusterctl.write_text("#!/bin/sh\n")
    clusterctl.chmod(0o755)
    return CapiAssets(
        directory=root,
        manager=root / "bin" / CORE_COMPONENTS.manager,
        clusterctl=clusterctl,
        config=root / "config",
        version=VERSION,
    )


def plane(tmp_path: Path) -> ControlPlane:
    bins = tmp_path / "assets"
    assets = Assets(
        directory=bins,
        kube_apiserver=bins / "kube-apiserver",
        etcd=bins / "etcd",
        kubectl=bins / "kubectl",
    )
    made = ControlPlane(assets=assets, workdir=tmp_path / "plane")
    made.prepare()
    return made


def flags(manager: ProviderManager) -> dict[str, str]:
    manager.prepare()
    return dict(a.removeprefix("--").partition("=")[::2] for a in manager.argv()[1:])


@pytest.mark.parametrize("kind", [KubeadmBootstrap, KubeadmControlPlane])
def test_kubeadm_managers_run_like_the_core_with_ignition_on(
    tmp_path: Path, kind: type[ProviderManager]
) -> None:
    capi = build(tmp_path / VERSION)
    manager = kind(plane=plane(tmp_path), capi=capi)
    argv = manager.argv()
    assert argv[0] == str(tmp_path / VERSION / "bin" / kind.components.manager)
    got = flags(manager)
    assert got["leader-elect"] == "false"
    assert got["health-addr"] == f"127.0.0.1:{manager.health_port}"
    assert got["diagnostics-address"] == f"127.0.0.1:{manager.metrics_port}"
    assert got["webhook-port"] == str(manager.webhook_port)
    assert got["webhook-cert-dir"] == str(manager.cert_dir)
    assert "insecure-diagnostics" in got
    gates = dict(g.split("=") for g in got["feature-gates"].split(","))
    assert gates[IGNITION_GATE] == "true"
    assert gates["MachinePool"] == "true"
    assert manager.workdir == manager.plane.workdir / kind.workdir_name
    assert manager.provider == kind.components.provider_id
    # The core manager is the same program shape, with its own gates and no Ignition gate.
    core = flags(CapiCore(plane=manager.plane, capi=capi))
    assert set(core) == set(got)
    assert IGNITION_GATE not in core["feature-gates"]


def test_gates_can_be_overridden(tmp_path: Path) -> None:
    capi = build(tmp_path / VERSION)
    manager = KubeadmBootstrap(
        plane=plane(tmp_path), capi=capi, feature_gates={IGNITION_GATE: False}
    )
    assert f"{IGNITION_GATE}=false" in flags(manager)["feature-gates"]


def test_the_pair_gets_separate_workdirs_and_processes(tmp_path: Path) -> None:
    pair = KubeadmProviders.for_plane(
        plane=plane(tmp_path), capi=build(tmp_path / VERSION), workdir=tmp_path / "kubeadm"
    )
    dirs = {m.workdir for m in pair.managers}
    assert dirs == {tmp_path / "kubeadm" / "capi-kubeadm-bootstrap",
                    tmp_path / "kubeadm" / "capi-kubeadm-control-plane"}  # fmt: skip
    assert {m.name for m in pair.managers} == {
        "kubeadm-bootstrap-manager",
        "kubeadm-control-plane-manager",
    }


def test_a_build_without_the_kubeadm_managers_is_reported(tmp_path: Path) -> None:
    capi = build(tmp_path / VERSION, kubeadm=False)
    with pytest.raises(CapiMissing, match=r"kubeadm-bootstrap-manager.*run `make capi`"):
        require_kubeadm_providers(capi)
    with pytest.raises(CapiMissing):
        KubeadmProviders.for_plane(plane=plane(tmp_path), capi=capi)


def test_local_repository_layout_follows_clusterctl(tmp_path: Path) -> None:
    capi = build(tmp_path / VERSION)
    clusterctl = Clusterctl(capi=capi, kubectl=tmp_path / "kubectl", workdir=tmp_path / "cc")
    assert clusterctl.release_components == list(CAPI_COMPONENTS)
    repo = tmp_path / "cc" / "repository"
    assert clusterctl.components_path(CORE_COMPONENTS) == (
        repo / "cluster-api" / VERSION / "core-components.yaml"
    )
    assert clusterctl.components_path(KUBEADM_BOOTSTRAP_COMPONENTS) == (
        repo / "bootstrap-kubeadm" / VERSION / "bootstrap-components.yaml"
    )
    assert clusterctl.components_path(KUBEADM_CONTROL_PLANE_COMPONENTS) == (
        repo / "control-plane-kubeadm" / VERSION / "control-plane-components.yaml"
    )
    # clusterctl's names for them: `--bootstrap kubeadm --control-plane kubeadm`.
    assert (KUBEADM_BOOTSTRAP_COMPONENTS.name, KUBEADM_BOOTSTRAP_COMPONENTS.type) == (
        "kubeadm", "BootstrapProvider",
    )  # fmt: skip
    assert (KUBEADM_CONTROL_PLANE_COMPONENTS.name, KUBEADM_CONTROL_PLANE_COMPONENTS.type) == (
        "kubeadm", "ControlPlaneProvider",
    )  # fmt: skip
    # An older build without the kubeadm trees: the core only.
    core_only = Clusterctl(
        capi=build(tmp_path / "old" / VERSION, kubeadm=False),
        kubectl=tmp_path / "kubectl",
        workdir=tmp_path / "cc-old",
    )
    assert core_only.release_components == [CORE_COMPONENTS]
