"""capl.kube: the only package that imports kubernetes_asyncio.

`KubeClient.connect(kubeconfig)` returns the capl.runtime `Client` for a real API server.
"""

from capl.kube import lean_import

# before anything imports kubernetes_asyncio: its generated APIs and models load on first use
lean_import.install()

from capl.kube.client import KubeClient, KubeResourceClient  # noqa: E402
from capl.kube.config import KubeconfigError, load_configuration  # noqa: E402

__all__ = ["KubeClient", "KubeResourceClient", "KubeconfigError", "load_configuration"]
