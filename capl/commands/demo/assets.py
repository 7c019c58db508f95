"""Finding what the demo runs, before anything starts: binaries, builds and the node image.

Each is taken from its environment variable when set, else the newest build in the cache
(``$CAPL_CACHE``, default ``~/.cache/capl``) that the make target of the same name leaves:
the control-plane binaries (``make envtest``, ``$KUBEBUILDER_ASSETS``), the Cluster API build
(``make capi``, ``$CAPL_CAPI_DIR``) and for real nodes the node binaries (``make node-bin``,
``$CAPL_NODE_BIN``: kubeadm, kube-controller-manager, kube-scheduler for the hosted control
plane) and the node image (``make node-image``, ``$CAPL_NODE_IMAGE``, ``--node-image``).
What is missing is a CliError that names the make target; ``NodeParts`` is everything real
nodes need, found in one go.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from capl.commands.demo.plan import KUBERNETES_VERSION, WORKER_CPUS, runs_here
from capl.errors import (
    EXIT_USAGE,
    CliError,
)

if TYPE_CHECKING:
    from capl.testbed import Assets
    from capl.testbed.capibuild import CapiAssets

__all__ = [
    "NodeParts",
    "cache_dir",
    "find_capi_assets",
    "find_control_plane_assets",
    "find_node_bin",
    "find_node_image",
    "kubeadm_version",
    "node_image_for",
]

NODE_IMAGE_ENV: Final = "CAPL_NODE_IMAGE"
NODE_BIN_ENV: Final = "CAPL_NODE_BIN"


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(os.environ.get("CAPL_CACHE") or Path(base) / "capl")


def _version_key(path: Path) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", path.name))


def _cached_versions(kind: str) -> list[Path]:
    root = cache_dir() / kind
    if not root.is_dir():
        return []
    return sorted((p for p in root.iterdir() if p.is_dir()), key=_version_key, reverse=True)


def find_control_plane_assets() -> Assets:
    """$KUBEBUILDER_ASSETS, else the newest `make envtest` build in the cache."""
    from capl.testbed import AssetsMissing, find_assets

    if os.environ.get("KUBEBUILDER_ASSETS"):
        try:
            return find_assets()
        except AssetsMissing as exc:
            raise CliError(str(exc)) from None
    for candidate in _cached_versions("envtest"):
        with contextlib.suppress(AssetsMissing):
            return find_assets(candidate)
    raise CliError(
        "kube-apiserver, etcd and kubectl not found: run `make envtest` (or `make demo`, which "
        "builds everything) and set KUBEBUILDER_ASSETS to the directory it prints"
    )


def find_capi_assets() -> CapiAssets:
    """$CAPL_CAPI_DIR, else the newest `make capi` build in the cache."""
    from capl.testbed.capibuild import CAPI_DIR_ENV, CapiMissing, find_capi

    if os.environ.get(CAPI_DIR_ENV):
        try:
            return find_capi()
        except CapiMissing as exc:
            raise CliError(str(exc)) from None
    for candidate in _cached_versions("capi"):
        with contextlib.suppress(CapiMissing):
            return find_capi(candidate)
    raise CliError(
        "the Cluster API core manager was not found: run `make capi` (or `make demo`, which "
        f"builds everything) and set {CAPI_DIR_ENV} to the directory it prints"
    )


def _newest(candidates: Iterable[Path]) -> Path | None:
    found = sorted(candidates, key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def node_image_for(uri: str, *, image: str | None, node_image: str | None, cache: Path) -> Path:
    """The node image for a demo of real nodes on ``uri``; usage errors for what cannot work
    (a remote host, --image without --vm-only, no node image)."""
    if not runs_here(uri):
        raise CliError(
            f"real nodes need {uri} to be this machine (their control plane runs here, on the "
            "cluster network's host address): pass --vm-only",
            code=EXIT_USAGE,
        )
    if image is not None:
        raise CliError(
            "--image is the base image of the VM-only mode: add --vm-only (real nodes boot the "
            "node image, --node-image)",
            code=EXIT_USAGE,
        )
    return find_node_image(node_image, cache=cache)


def find_node_image(explicit: str | None, *, cache: Path) -> Path:
    """--node-image, else $CAPL_NODE_IMAGE, else the newest `make node-image` in the cache."""
    given = explicit or os.environ.get(NODE_IMAGE_ENV) or None
    path = Path(given) if given else _newest(cache.glob("node-image/*/capl-node.qcow2"))
    if path is None:
        raise CliError(
            "no node image: run `make node-image` (it prints the path; `make demo` builds it and "
            "passes it for you) and pass --node-image PATH, or run with --vm-only",
            code=EXIT_USAGE,
        )
    if re.match(r"^https?://", str(given or "")):
        raise CliError("--node-image takes a file on this machine, not a URL", code=EXIT_USAGE)
    path = path.expanduser().resolve()
    if not path.is_file():
        raise CliError(f"--node-image {path}: no such file", code=EXIT_USAGE)
    return path


def find_node_bin(*, cache: Path) -> Path:
    """$CAPL_NODE_BIN, else the newest `make node-bin` build in the cache (kubeadm,
    kube-controller-manager, kube-scheduler for the hosted control plane)."""
    given = os.environ.get(NODE_BIN_ENV)
    if given:
        return Path(given)
    found = _newest(p.parent.parent for p in cache.glob("node-bin/*/bin/kubeadm"))
    if found is None:
        raise CliError(
            "kubeadm, kube-controller-manager and kube-scheduler not found: run `make node-bin` "
            f"(or `make demo`, which builds everything) and set {NODE_BIN_ENV} to the directory "
            "it prints, or run with --vm-only"
        )
    return found


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeParts:
    """What real nodes need on this machine, found before anything starts."""

    image: Path
    node_bin: Path
    envtest: Path
    capi: CapiAssets

    @classmethod
    def find(cls, *, image: Path, envtest: Path, capi: CapiAssets, cache: Path) -> NodeParts:
        """The parts; CliError when a binary is missing (the node binaries, the kubeadm
        bootstrap provider's build)."""
        from capl.testbed.capibuild import CapiMissing
        from capl.testbed.hostedcp import HostedControlPlaneError, find_node_assets
        from capl.testbed.kubeadm_providers import require_kubeadm_providers

        node_bin = find_node_bin(cache=cache)
        try:
            find_node_assets(node_bin, envtest)
            require_kubeadm_providers(capi)
        except (HostedControlPlaneError, CapiMissing) as exc:
            raise CliError(f"{exc} (`make demo` builds everything), or use --vm-only") from None
        return cls(image=image, node_bin=node_bin, envtest=envtest, capi=capi)

    async def plan_values(self) -> dict[str, Any]:
        """The DemoPlan fields of real nodes."""
        return {
            "real_nodes": True,
            "image_path": str(self.image),
            "cpus": WORKER_CPUS,
            "kubernetes_version": await kubeadm_version(self.node_bin / "bin" / "kubeadm"),
        }


async def kubeadm_version(kubeadm: Path) -> str:
    """`kubeadm version -o short` (the Kubernetes version of the nodes and control plane)."""
    from capl.testbed.process import run_captured

    with contextlib.suppress(Exception):
        status, out, _ = await run_captured(
            [str(kubeadm), "version", "-o", "short"], env=dict(os.environ), within=30.0
        )
        if status == 0 and re.fullmatch(r"v\d+\.\d+\.\d+", out.strip()):
            return out.strip()
    return KUBERNETES_VERSION
