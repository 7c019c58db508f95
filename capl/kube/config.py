"""Find the cluster to talk to, the way client-go does.

Order: an explicit path (`--kubeconfig`), the KUBECONFIG environment variable (a list of files
merged, separated by ':'), the in-cluster service account (KUBERNETES_SERVICE_HOST + token file),
then ~/.kube/config. If none works, `KubeconfigError` explains in one line what was tried.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from dataclasses import dataclass

from kubernetes_asyncio.client import Configuration
from kubernetes_asyncio.config import ConfigException
from kubernetes_asyncio.config.incluster_config import (
    SERVICE_HOST_ENV_NAME,
    SERVICE_TOKEN_FILENAME,
    load_incluster_config,
)
from kubernetes_asyncio.config.kube_config import load_kube_config


class KubeconfigError(RuntimeError):
    """No usable cluster configuration was found."""


_temp_dir: str | None = None


def private_temp_dir() -> str:
    """One 0700 directory per process for the certificate and key files kubernetes_asyncio
    writes out of embedded kubeconfig data (its default is 0600 files straight in $TMPDIR).
    The loader caches those files process-wide by content, so the directory lives until exit."""
    global _temp_dir
    if _temp_dir is None:
        _temp_dir = tempfile.mkdtemp(prefix="capl-kubeconfig-")
        atexit.register(shutil.rmtree, _temp_dir, True)
    return _temp_dir


@dataclass(frozen=True, slots=True)
class Source:
    """Where the configuration comes from: a kubeconfig path (list) or the in-cluster account."""

    description: str
    path: str | None  # None: in-cluster


def find_source(kubeconfig: str | None = None, *, environ: dict[str, str] | None = None) -> Source:
    """Pick the source as client-go does (no I/O beyond file existence checks)."""
    env = os.environ if environ is None else environ
    if kubeconfig:
        path = os.path.expanduser(kubeconfig)
        if not os.path.isfile(path):
            raise KubeconfigError(f"--kubeconfig {kubeconfig}: no such file")
        return Source(f"--kubeconfig {kubeconfig}", path)
    listed = env.get("KUBECONFIG", "")
    if listed.strip(":"):
        files = [os.path.expanduser(p) for p in listed.split(":") if p]
        existing = [p for p in files if os.path.isfile(p)]
        if not existing:
            raise KubeconfigError(f"KUBECONFIG={listed}: no such file")
        return Source(f"KUBECONFIG={listed}", ":".join(existing))
    if env.get(SERVICE_HOST_ENV_NAME) and os.path.isfile(SERVICE_TOKEN_FILENAME):
        return Source("in-cluster service account", None)
    home = os.path.expanduser("~/.kube/config")
    if os.path.isfile(home):
        return Source(home, home)
    raise KubeconfigError(
        "no kubeconfig found: pass --kubeconfig, set KUBECONFIG, run in a pod with a service "
        "account, or create ~/.kube/config"
    )


async def load_configuration(
    kubeconfig: str | None = None, *, context: str | None = None
) -> tuple[Configuration, str]:
    """The client configuration and a description of where it came from."""
    source = find_source(kubeconfig)
    configuration = Configuration()
    try:
        if source.path is None:
            load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        else:
            await load_kube_config(
                config_file=source.path,
                context=context,
                client_configuration=configuration,
                persist_config=False,
                temp_file_path=private_temp_dir(),
            )
    except (ConfigException, OSError, ValueError, KeyError) as exc:
        raise KubeconfigError(f"{source.description}: {exc}") from exc
    return configuration, source.description
