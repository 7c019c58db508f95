"""CRDs for a test API server, for the tests (tests/) and the benchmarks (bench/).

- `CRD_DIR`: the project's own CRDs, config/crd/bases of the source tree (`make lint` keeps
  it in sync with the models; capl is installed editable from that tree by hack/venv.sh).
- The Cluster API `Cluster` and `Machine` CRDs from the Cluster API build
  (`$CAPL_CAPI_DIR/config/crd/bases`, `make capi`; `capi_crd_dir` finds it, else the newest
  build in the cache), reduced to their v1beta2 storage version with no conversion webhook
  (`reduced_crd`, `write_reduced_crds`): no Cluster API manager runs beside the controllers
  in tests/controllers and bench/.
- `install_capi_crds(plane, workdir)`: install the reduced CRDs on a control plane, unless a
  real Cluster API installed them already (with its conversion webhook; then they are left
  as they are).

A missing build raises `capl.testbed.capibuild.CapiMissing` with the hint to give the user
(tests/ turn it into a skip or a failure, bench/ into an exit).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from capl.kube import KubeClient
from capl.runtime.errors import NotFound
from capl.runtime.objects import ObjectKey
from capl.runtime.resources import CUSTOM_RESOURCE_DEFINITION
from capl.testbed import ControlPlane
from capl.testbed.capibuild import CAPI_DIR_ENV, CapiMissing

CRD_DIR = Path(__file__).resolve().parents[2] / "config" / "crd" / "bases"
CAPI_CRD_FILES = ("cluster.x-k8s.io_clusters.yaml", "cluster.x-k8s.io_machines.yaml")
IPAM_CRD_FILES = (
    "ipam.cluster.x-k8s.io_ipaddressclaims.yaml",
    "ipam.cluster.x-k8s.io_ipaddresses.yaml",
)

__all__ = [
    "CAPI_CRD_FILES",
    "CAPI_DIR_ENV",
    "CRD_DIR",
    "IPAM_CRD_FILES",
    "CapiMissing",
    "capi_crd_dir",
    "install_capi_crds",
    "install_ipam_crds",
    "reduced_crd",
    "write_reduced_crds",
]


def capi_crd_dir() -> Path:
    """config/crd/bases of the Cluster API build: $CAPL_CAPI_DIR's, else the newest one in
    the cache ($CAPL_CACHE/capi/<version>). CapiMissing when there is none."""
    value = os.environ.get(CAPI_DIR_ENV) or ""
    candidates = [Path(value)] if value else []
    cache = Path(os.environ.get("CAPL_CACHE", Path.home() / ".cache" / "capl")) / "capi"
    if not value and cache.is_dir():
        candidates += sorted((p for p in cache.iterdir() if p.is_dir()), reverse=True)
    for root in candidates:
        bases = root / "config" / "crd" / "bases"
        if all((bases / f).is_file() for f in CAPI_CRD_FILES):
            return bases
    where = f"{CAPI_DIR_ENV}={value}" if value else f"{CAPI_DIR_ENV} unset, none in {cache}"
    raise CapiMissing(
        f"no Cluster API build with config/crd/bases/{{{','.join(CAPI_CRD_FILES)}}} ({where}): "
        f"run `make capi` and export {CAPI_DIR_ENV}=<the directory it prints>"
    )


def reduced_crd(document: Mapping[str, Any]) -> dict[str, Any]:
    """The CRD with only its storage version (v1beta2) and no conversion webhook."""
    crd = dict(document)
    spec = dict(crd["spec"])
    spec["versions"] = [v for v in spec["versions"] if v.get("storage")]
    spec["conversion"] = {"strategy": "None"}
    crd["spec"] = spec
    metadata = dict(crd.get("metadata") or {})
    metadata.pop("annotations", None)
    crd["metadata"] = metadata
    return crd


def write_reduced_crds(bases: Path, workdir: Path, files: tuple[str, ...] = CAPI_CRD_FILES) -> None:
    """The reduced CRDs of `bases` (default: Cluster and Machine) as YAML files in `workdir`."""
    workdir.mkdir(parents=True, exist_ok=True)
    for filename in files:
        document = yaml.safe_load((bases / filename).read_text())
        (workdir / filename).write_text(yaml.safe_dump(reduced_crd(document)))


async def install_capi_crds(
    plane: ControlPlane, workdir: Path, files: tuple[str, ...] = CAPI_CRD_FILES
) -> list[str]:
    """Install the reduced Cluster/Machine CRDs (or `files`) unless a real Cluster API
    installed them; returns the CRD names."""
    async with await KubeClient.connect(str(plane.kubeconfig)) as client:
        crds = client.resource(CUSTOM_RESOURCE_DEFINITION)
        present = []
        for filename in files:
            group, plural = filename.removesuffix(".yaml").split("_", 1)
            name = f"{plural}.{group}"
            with contextlib.suppress(NotFound):
                crd = await crds.get(ObjectKey("", name))
                if (crd["spec"].get("conversion") or {}).get("strategy") == "Webhook":
                    present.append(name)
        if len(present) == len(files):
            return present
    write_reduced_crds(capi_crd_dir(), workdir, files)
    return await plane.install_crds(workdir)


async def install_ipam_crds(plane: ControlPlane, workdir: Path) -> list[str]:
    """The Cluster API IPAddressClaim and IPAddress CRDs, reduced like Cluster/Machine (only
    v1beta2, the version capl and the in-cluster IPAM provider v1.1 use)."""
    return await install_capi_crds(plane, workdir, IPAM_CRD_FILES)
