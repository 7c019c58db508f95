"""What the operator commands share: their argparse look, the API flags and API access.

- ``formatter`` and ``add_api_flags``: every command's help keeps its line breaks, and every
  command that talks to the API server has ``--kubeconfig`` and ``--context``;
  ``parse_duration`` / ``positive_duration``: Go-style durations ("90s", "10m", "1h30m");
- ``connect``: a ``capl.kube.KubeClient`` from the kubeconfig, resolved as client-go does it
  (``$KUBECONFIG``, in-cluster, then ``~/.kube/config``); no usable configuration is exit 4;
- ``default_namespace``: the namespace of the kubeconfig context in use (kubectl's default);
- ``api_failure``: a failed API request as a one-line ``CliError`` with the exit code that
  says what happened (unreachable 4, not found 3, forbidden or anything else 1);
- ``list_kind``: every object of a kind, or None when its CRD is not installed;
- ``add_scope_flags`` / ``scope_namespace``: ``-n NS | -A`` and the namespace they mean;
- ``align_columns`` and ``dash``: the plain (kubectl-style) tables of every command.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from capl.errors import EXIT_FAILED, EXIT_NOT_FOUND, EXIT_UNREACHABLE, CliError

if TYPE_CHECKING:
    from capl.kube.client import KubeClient
    from capl.runtime.errors import ApiError
    from capl.runtime.resources import Resource

__all__ = [
    "add_api_flags",
    "add_scope_flags",
    "align_columns",
    "api_failure",
    "connect",
    "dash",
    "default_namespace",
    "formatter",
    "list_kind",
    "parse_duration",
    "positive_duration",
    "scope_namespace",
]

_IN_CLUSTER_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


# --- argparse ------------------------------------------------------------------------------------


def formatter(prog: str) -> argparse.HelpFormatter:
    return argparse.RawDescriptionHelpFormatter(prog, max_help_position=36)


def add_api_flags(p: argparse.ArgumentParser) -> None:
    """--kubeconfig and --context, as every command that talks to the API server has them."""
    p.add_argument(
        "--kubeconfig",
        default=None,
        help="kubeconfig file (default: $KUBECONFIG, in-cluster, then ~/.kube/config)",
    )
    p.add_argument("--context", default=None, help="kubeconfig context (default: the current)")


def add_scope_flags(p: argparse.ArgumentParser, *, all_help: str = "every namespace") -> None:
    """``-n NS`` or ``-A`` (mutually exclusive), read back by ``scope_namespace``."""
    scope = p.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", default=None, help="namespace (default: context's)")
    scope.add_argument("-A", "--all-namespaces", action="store_true", help=all_help)


def scope_namespace(args: argparse.Namespace) -> str | None:
    """The namespace ``-n``/``-A`` mean (None: all), else the kubeconfig context's."""
    if getattr(args, "all_namespaces", False):
        return None
    namespace: str = args.namespace or default_namespace(args.kubeconfig, context=args.context)
    return namespace


# --- plain tables --------------------------------------------------------------------------------


def dash(value: object) -> str:
    """A table cell: "-" for None and ""."""
    return "-" if value is None or value == "" else str(value)


def align_columns(header: list[str], rows: Iterable[list[str]]) -> list[str]:
    """Lines of left-aligned columns three spaces apart, trailing blanks stripped."""
    table = [header, *rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    return [
        "   ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in table
    ]


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")


def parse_duration(text: str) -> float:
    """Seconds from a Go-style duration ("90s", "10m", "1h30m", "250ms") or plain seconds."""
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        pass
    pos, total = 0, 0.0
    scale = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
    for match in _DURATION.finditer(text):
        if match.start() != pos:
            break
        total += float(match.group(1)) * scale[match.group(2)]
        pos = match.end()
    if pos != len(text) or not text:
        raise argparse.ArgumentTypeError(f"invalid duration {text!r} (examples: 30s, 10m, 1h30m)")
    return total


def positive_duration(text: str) -> float:
    """An argparse type: a duration above zero."""
    value = parse_duration(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(
            f"must be a positive duration (e.g. 30s, 10m), got {text!r}"
        )
    return value


# --- API access ----------------------------------------------------------------------------------


async def connect(kubeconfig: str | None, *, context: str | None = None) -> KubeClient:
    """A client for the configured API server; no usable configuration -> exit 4."""
    from capl.kube.client import KubeClient
    from capl.kube.config import KubeconfigError

    try:
        return await KubeClient.connect(
            kubeconfig, context=context, user_agent="capl-cli", request_timeout=30.0
        )
    except KubeconfigError as exc:
        raise CliError(
            f"cannot load the cluster configuration: {exc}", code=EXIT_UNREACHABLE
        ) from exc


def default_namespace(kubeconfig: str | None, *, context: str | None = None) -> str:
    """The namespace of the kubeconfig context in use (kubectl's default), else "default"."""
    import yaml

    from capl.kube.config import KubeconfigError, find_source

    try:
        source = find_source(kubeconfig)
    except KubeconfigError:
        return "default"
    if source.path is None:
        try:
            with open(_IN_CLUSTER_NAMESPACE, encoding="utf-8") as handle:
                return handle.read().strip() or "default"
        except OSError:
            return "default"
    documents: list[Mapping[str, Any]] = []
    for path in source.path.split(":"):
        try:
            with open(path, encoding="utf-8") as handle:
                loaded = yaml.safe_load(handle)
        except (OSError, yaml.YAMLError):
            continue
        if isinstance(loaded, Mapping):
            documents.append(loaded)
    current = context or next(
        (str(d["current-context"]) for d in documents if d.get("current-context")), ""
    )
    for document in documents:
        for entry in document.get("contexts") or ():
            if isinstance(entry, Mapping) and entry.get("name") == current:
                namespace = (entry.get("context") or {}).get("namespace")
                return str(namespace) if namespace else "default"
    return "default"


def api_failure(exc: ApiError, *, server: str, what: str) -> CliError:
    """A one-line CliError with the right exit code for a failed API request."""
    from capl.runtime.errors import Forbidden, NotFound, TransportError

    if isinstance(exc, TransportError):
        cause = exc.__cause__
        detail = (str(cause) or type(cause).__name__) if cause is not None else exc.message
        if isinstance(cause, TimeoutError):
            detail = "timed out"
        return CliError(f"cannot reach the API server {server}: {detail}", code=EXIT_UNREACHABLE)
    if exc.code == 401:
        return CliError(
            f"the API server {server} rejected the credentials (401 Unauthorized)",
            code=EXIT_UNREACHABLE,
        )
    if isinstance(exc, Forbidden):
        return CliError(f"{what}: forbidden: {exc.message or exc}", code=EXIT_FAILED)
    if isinstance(exc, NotFound):
        return CliError(f"{what}: not found", code=EXIT_NOT_FOUND)
    return CliError(f"{what}: {exc}", code=EXIT_FAILED)


async def list_kind(
    client: KubeClient, resource: Resource, *, namespace: str | None
) -> list[dict[str, Any]] | None:
    """Every object of a kind (None when its CRD is not installed)."""
    from capl.runtime.errors import ApiError, NotFound

    try:
        listed = await client.resource(resource).list(namespace=namespace)
    except NotFound:
        return None
    except ApiError as exc:
        raise api_failure(exc, server=_server(client), what=f"list {resource.plural}") from exc
    return list(listed.items)


def _server(client: KubeClient) -> str:
    return str(client.configuration.host)
