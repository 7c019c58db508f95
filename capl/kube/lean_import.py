"""Import kubernetes_asyncio without its ~850 generated API and model modules, until asked.

capl uses kubernetes_asyncio for its configuration loaders (kubeconfig, exec and OIDC
credentials, in-cluster) and its TLS-configured aiohttp connector: `Configuration`,
`ApiClient`, `config.*`. The package's `__init__` files import every generated API class
and model on the way (`kubernetes_asyncio/__init__.py` imports `client`, whose `__init__`
imports about 850 modules): measured 36 MB of RSS in the manager process, of the 3 MB the
modules capl uses take (issue 16: the manager's RSS at 10,000 machines).

`install()` puts placeholder package modules for `kubernetes_asyncio`,
`kubernetes_asyncio.client` and `kubernetes_asyncio.client.models` into `sys.modules`
before the first import: same `__path__`, so every submodule imports as usual, but their
`__init__` has not run. The first attribute a placeholder does not have (a generated API
such as `client.CoreV1Api`, a model, or anything else the real `__init__` defines) runs the
real `__init__` into it, once: code that wants the whole package gets it, only later.
Nothing changes when kubernetes_asyncio was imported before `install()` (the real modules
are in `sys.modules` already).
"""

from __future__ import annotations

import importlib.util
import sys
import threading
import types
from pathlib import Path
from typing import Any

_PACKAGES = (
    "kubernetes_asyncio",
    "kubernetes_asyncio.client",
    "kubernetes_asyncio.client.models",
)
_SUBMODULES = (
    "kubernetes_asyncio.client.exceptions",
    "kubernetes_asyncio.client.configuration",
    "kubernetes_asyncio.client.rest",
    "kubernetes_asyncio.client.api_client",
)
_lock = threading.RLock()


class _LeanPackage(types.ModuleType):
    """A package whose real `__init__` runs on the first attribute it lacks."""

    _capl_init: Path
    _capl_complete: bool

    def __getattr__(self, name: str) -> Any:
        if self.__dict__.get("_capl_complete", True):
            raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")
        complete(self)
        try:
            return self.__dict__[name]
        except KeyError:
            raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}") from None


def complete(module: types.ModuleType) -> None:
    """Run the real `__init__` of a placeholder package (once; a no-op for a real module)."""
    with _lock:
        if not isinstance(module, _LeanPackage) or module.__dict__.get("_capl_complete", True):
            return
        module._capl_complete = True
        source = module._capl_init.read_text(encoding="utf-8")
        exec(compile(source, str(module._capl_init), "exec"), module.__dict__)


def install() -> bool:
    """Install the placeholders; False when kubernetes_asyncio is imported already."""
    with _lock:
        if "kubernetes_asyncio" in sys.modules:
            return False
        spec = importlib.util.find_spec("kubernetes_asyncio")
        if spec is None or spec.origin is None:
            return False
        root = Path(spec.origin).parent
        parent: types.ModuleType | None = None
        for name in _PACKAGES:
            directory = root.joinpath(*name.split(".")[1:])
            module = _LeanPackage(name)
            module.__file__ = str(directory / "__init__.py")
            module.__path__ = [str(directory)]
            module.__package__ = name
            module._capl_init = directory / "__init__.py"
            module._capl_complete = False
            module.__spec__ = importlib.util.spec_from_file_location(
                name, module.__file__, submodule_search_locations=module.__path__
            )
            sys.modules[name] = module
            if parent is not None:
                setattr(parent, name.rsplit(".", 1)[1], module)
            parent = module
        # the modules capl uses, in an order in which none asks a placeholder for a name it
        # lacks (`from kubernetes_asyncio.client import rest` in api_client finds rest set)
        for name in _SUBMODULES:
            importlib.import_module(name)
        client = sys.modules["kubernetes_asyncio.client"]
        setattr(client, "Configuration", sys.modules[_SUBMODULES[1]].Configuration)  # noqa: B010
        setattr(client, "ApiClient", sys.modules[_SUBMODULES[3]].ApiClient)  # noqa: B010
        return True
