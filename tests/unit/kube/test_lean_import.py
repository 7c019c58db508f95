"""capl.kube imports kubernetes_asyncio without its generated APIs and models, which load
on first use (capl/kube/lean_import.py). Each case runs in a fresh interpreter: the
placeholders exist only where nothing imported kubernetes_asyncio before capl.kube."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap


def _run(code: str) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    result: dict[str, object] = json.loads(out.strip().splitlines()[-1])
    return result


def test_capl_kube_loads_only_what_it_uses() -> None:
    result = _run(
        """
        import json, sys
        import capl.kube
        from capl.kube import KubeClient
        from kubernetes_asyncio.client import ApiClient, Configuration
        loaded = [m for m in sys.modules if m.startswith("kubernetes_asyncio")]
        print(json.dumps({
            "count": len(loaded),
            "models": [m for m in loaded if m.startswith("kubernetes_asyncio.client.models.")],
            "configuration": Configuration.__module__,
            "api_client": ApiClient.__module__,
        }))
        """
    )
    assert result["models"] == []
    count = result["count"]
    assert isinstance(count, int)
    assert count < 40, result
    assert result["configuration"] == "kubernetes_asyncio.client.configuration"
    assert result["api_client"] == "kubernetes_asyncio.client.api_client"


def test_the_whole_package_loads_on_first_use() -> None:
    result = _run(
        """
        import json, sys
        import capl.kube
        import kubernetes_asyncio
        version = kubernetes_asyncio.__version__  # a dunder of the real __init__ too
        from kubernetes_asyncio import client, watch
        from kubernetes_asyncio.client import ApiClient, Configuration
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}}
        # ApiClient's deserialisation looks models up on the models package by name
        model = ApiClient.__new__(ApiClient)._ApiClient__deserialize(pod, "V1Pod")
        print(json.dumps({
            "core": client.CoreV1Api.__name__,
            "model": type(model).__name__,
            "name": model.metadata.name,
            "watch": watch.Watch.__name__,
            "version": version,
            "same_configuration": client.Configuration is Configuration,
        }))
        """
    )
    assert result["core"] == "CoreV1Api"
    assert result["model"] == "V1Pod"
    assert result["name"] == "p"
    assert result["watch"] == "Watch"
    assert isinstance(result["version"], str)
    assert result["version"]
    assert result["same_configuration"] is True


def test_nothing_changes_when_kubernetes_asyncio_came_first() -> None:
    result = _run(
        """
        import json, sys
        import kubernetes_asyncio.client
        from capl.kube import lean_import
        print(json.dumps({
            "installed": lean_import.install(),
            "real": type(sys.modules["kubernetes_asyncio.client"]).__name__,
        }))
        """
    )
    assert result == {"installed": False, "real": "module"}
