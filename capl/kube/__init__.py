"""capl.kube: the only package that imports kubernetes_asyncio.

`KubeClient.connect(kubeconfig)` returns the capl.runtime `Client` for a real API server.
"""

from capl.kube.client import KubeClient, KubeResourceClient
from capl.kube.config import KubeconfigError, load_configuration

__all__ = ["KubeClient", "KubeResourceClient", "KubeconfigError", "load_configuration"]
