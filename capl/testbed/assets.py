"""The binaries a test-bed control plane runs (the KUBEBUILDER_ASSETS layout `make envtest`
writes: kube-apiserver, etcd, kubectl), the control plane's errors, and free loopback ports."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Final

ASSETS_ENV: Final = "KUBEBUILDER_ASSETS"
ASSET_NAMES: Final = ("kube-apiserver", "etcd", "kubectl")


class ControlPlaneError(RuntimeError):
    """The control plane could not be started, stopped or used."""


class AssetsMissing(ControlPlaneError):
    """The kube-apiserver/etcd/kubectl binaries are not where KUBEBUILDER_ASSETS says."""


@dataclass(frozen=True, kw_only=True)
class Assets:
    """The three binaries, in the KUBEBUILDER_ASSETS layout."""

    directory: Path
    kube_apiserver: Path
    etcd: Path
    kubectl: Path


def find_assets(directory: str | os.PathLike[str] | None = None) -> Assets:
    """Locate the binaries in `directory`, else in $KUBEBUILDER_ASSETS."""
    where = os.fspath(directory) if directory is not None else os.environ.get(ASSETS_ENV, "")
    if not where:
        raise AssetsMissing(
            f"{ASSETS_ENV} is not set: run `make envtest` and set {ASSETS_ENV} to the "
            "directory it prints last"
        )
    root = Path(where)
    missing = [n for n in ASSET_NAMES if not os.access(root / n, os.X_OK)]
    if missing:
        raise AssetsMissing(
            f"{', '.join(missing)} not found (or not executable) in {root} "
            f"({ASSETS_ENV}): run `make envtest` to build "
            f"{'it' if len(missing) == 1 else 'them'}"
        )
    return Assets(
        directory=root,
        kube_apiserver=root / "kube-apiserver",
        etcd=root / "etcd",
        kubectl=root / "kubectl",
    )


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (another process may still take it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
