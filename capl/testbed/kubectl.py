"""kubectl as the test bed drives it: one call, and "apply these manifests, wait for their CRDs".

The test bed never imports a Kubernetes client library (capl.testbed stands apart from the
adapter layers); whatever it writes to an API server goes through kubectl with an explicit
kubeconfig and a private discovery cache, so runs in parallel do not share one. Used by
`ControlPlane.kubectl`/`install_crds` and, through them, by the Cluster API, clusterctl and
manager helpers of this package.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from capl.testbed.assets import ControlPlaneError
from capl.testbed.process import child_env, run_captured

log = logging.getLogger(__name__)

_MANIFEST_SUFFIXES = frozenset({".yaml", ".yml", ".json"})
_CRD_PREFIX = "customresourcedefinition.apiextensions.k8s.io/"


@dataclass(frozen=True)
class Kubectl:
    """Which kubectl, against which cluster (kubeconfig), with which discovery cache."""

    binary: Path
    kubeconfig: Path
    cache_dir: Path


async def run_kubectl(
    ctx: Kubectl, *args: str, stdin: bytes | None = None, within: float = 120.0
) -> str:
    """Run kubectl with `args`; returns its stdout, raises ControlPlaneError on failure."""
    argv = [str(ctx.binary), f"--kubeconfig={ctx.kubeconfig}", f"--cache-dir={ctx.cache_dir}"]
    rc, out, err = await run_captured([*argv, *args], env=child_env(), stdin=stdin, within=within)
    if rc != 0:
        raise ControlPlaneError(f"kubectl {' '.join(args)} failed with status {rc}: {err.strip()}")
    return out


def manifest_files(directory: Path) -> list[Path]:
    """The manifests of `directory` (YAML or JSON files, sorted); none if it is missing."""
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if p.is_file() and p.suffix in _MANIFEST_SUFFIXES)


async def apply_and_wait_for_crds(
    ctx: Kubectl, directory: Path, *, within: float = 60.0
) -> list[str]:
    """Apply every manifest in `directory` (server-side) and wait for its CRDs.

    Returns the names of the CustomResourceDefinitions, once all are Established. A missing
    or empty directory installs nothing.
    """
    files = manifest_files(directory)
    if not files:
        return []
    file_args = [arg for f in files for arg in ("-f", str(f))]
    out = await run_kubectl(
        ctx, "apply", "--server-side", "--force-conflicts", "--field-manager=capl-testbed",
        "-o", "name", *file_args,
    )  # fmt: skip
    crds = [line.strip() for line in out.splitlines() if line.startswith(_CRD_PREFIX)]
    if crds:
        await wait_established(functools.partial(run_kubectl, ctx), crds, within=within)
    names = [c.split("/", 1)[1] for c in crds]
    log.info("installed %d CRD(s) from %s: %s", len(names), directory, ", ".join(names))
    return names


KubectlRun = Callable[..., Awaitable[str]]


async def wait_established(kubectl: KubectlRun, crds: Sequence[str], *, within: float) -> None:
    """`kubectl wait` until the CRDs (kubectl resource names) are Established.

    A CRD the API server has not yet given any condition makes kubectl fail at once
    (".status.conditions accessor error: <nil> is of the type <nil>") instead of waiting;
    that answer is asked again, every half second, until `within`. `kubectl` runs kubectl
    with its arguments and a `within=` keyword (run_kubectl bound to a context, or
    ControlPlane.kubectl).
    """
    deadline = time.monotonic() + within
    while True:
        left = max(1.0, deadline - time.monotonic())
        try:
            await kubectl(
                "wait", "--for=condition=Established", f"--timeout={left:.0f}s", *crds,
                within=left + 30,
            )  # fmt: skip
            return
        except ControlPlaneError as exc:
            if "accessor error" not in str(exc) or time.monotonic() >= deadline:
                raise
        await asyncio.sleep(0.5)
