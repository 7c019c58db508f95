"""The API client reads the proxy environment once (capl.kube.client), not per request."""

from __future__ import annotations

import pytest

from capl.kube.client import _env_proxy

HOST = "https://127.0.0.1:6443"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)


def test_no_proxy_configured() -> None:
    assert _env_proxy(HOST) is None


def test_https_proxy_applies_to_the_api_server(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    assert _env_proxy(HOST) == "http://proxy.example:3128"
    assert _env_proxy("http://127.0.0.1:8080") is None  # only the scheme's own variable


def test_no_proxy_bypasses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    monkeypatch.setenv("NO_PROXY", "localhost,127.0.0.1")
    assert _env_proxy(HOST) is None
    assert _env_proxy("https://api.example:6443") == "http://proxy.example:3128"
