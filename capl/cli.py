"""The `capl` command: the controller manager and the tools an operator uses beside it.

Every subcommand parses its own flags (argparse), prints errors as one line (`capl: error:
...`) unless `--debug` is given, and exits with a meaningful code:

  0  success
  1  the operation failed (the message says why)
  2  bad usage (unknown flag, malformed value)
  3  the named object does not exist
  4  the API server or libvirt host cannot be reached
  130 interrupted (Ctrl-C)

Subcommands import their heavy dependencies lazily so `capl --help` and `capl version` stay
fast and work even where libvirt or the API server is absent.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from capl import __version__
from capl.commands.shared import parse_duration, positive_duration
from capl.errors import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    CliError,
)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid integer {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


class _Parser(argparse.ArgumentParser):
    """argparse with our exit code for usage errors and one-line messages."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _formatter(prog: str) -> argparse.HelpFormatter:
    return argparse.RawDescriptionHelpFormatter(prog, max_help_position=36)


def _add_kubeconfig(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--kubeconfig",
        default=None,
        help="kubeconfig file (default: $KUBECONFIG, in-cluster, then ~/.kube/config)",
    )


def _add_manager(sub: argparse._SubParsersAction[_Parser]) -> None:
    p = sub.add_parser(
        "manager",
        help="run the controller manager",
        formatter_class=_formatter,
        description="Run capl's controllers (LibvirtCluster, LibvirtMachine) and webhooks.",
        epilog=(
            "examples:\n"
            "  capl manager --kubeconfig ~/.kube/config --leader-elect\n"
            "  capl manager --namespace team-a --watch-filter team-a --concurrency 20\n"
            "  capl manager --metrics-bind-address 127.0.0.1:8080 --webhook-port 0"
        ),
    )
    _add_kubeconfig(p)
    _add_leader_election(p)
    _add_scope_and_serving(p)
    _add_timeouts(p)
    _add_libvirt_calls(p)
    p.add_argument("--log-level", default="info", help="debug, info, warning, error")
    p.add_argument("--log-format", choices=("auto", "json", "console"), default="auto")
    p.set_defaults(run=_run_manager)


def _add_leader_election(p: argparse.ArgumentParser) -> None:
    le = p.add_argument_group("leader election")
    le.add_argument("--leader-elect", action="store_true", help="run only while holding a Lease")
    le.add_argument("--leader-election-id", default="controller-leader-election-capl")
    le.add_argument("--leader-election-namespace", default=None)
    le.add_argument("--leader-elect-lease-duration", type=parse_duration, default=15.0)
    le.add_argument("--leader-elect-renew-deadline", type=parse_duration, default=10.0)
    le.add_argument("--leader-elect-retry-period", type=parse_duration, default=2.0)


def _add_scope_and_serving(p: argparse.ArgumentParser) -> None:
    """What the manager watches, how many workers reconcile, what it serves."""
    p.add_argument(
        "--metrics-bind-address",
        default=":8080",
        help="Prometheus metrics address, 0 disables (default :8080)",
    )
    p.add_argument(
        "--health-probe-bind-address",
        default=":9440",
        help="/healthz and /readyz address, 0 disables (default :9440)",
    )
    p.add_argument("--namespace", default=None, help="watch only this namespace")
    p.add_argument(
        "--watch-filter",
        default=None,
        help="reconcile only objects labelled cluster.x-k8s.io/watch-filter=<value>",
    )
    p.add_argument(
        "--concurrency", type=_positive_int, default=10, help="workers per controller (10)"
    )
    p.add_argument(
        "--sync-period",
        type=parse_duration,
        default=None,
        help="re-reconcile every cached object this often (default: never)",
    )
    p.add_argument("--webhook-port", type=int, default=9443, help="0 disables the webhooks")
    p.add_argument("--webhook-host", default="0.0.0.0")
    p.add_argument("--webhook-cert-dir", default="/tmp/k8s-webhook-server/serving-certs")


def _add_timeouts(p: argparse.ArgumentParser) -> None:
    """How long the manager and its machines wait, and how often clusters are re-checked."""
    p.add_argument("--graceful-shutdown-timeout", type=parse_duration, default=30.0)
    p.add_argument(
        "--machine-shutdown-timeout",
        type=parse_duration,
        default=60.0,
        help="graceful ACPI shutdown of a deleted machine before it is destroyed (60s)",
    )
    p.add_argument(
        "--bootstrap-timeout",
        type=positive_duration,
        default=1200.0,
        help="report BootstrapTimedOut (with the console tail) when a guest agent does not "
        "show the bootstrap success file this long after the domain started (20m)",
    )
    p.add_argument(
        "--orphan-sweep-interval",
        type=parse_duration,
        default=60.0,
        help="sweep the hosts for domains of LibvirtMachines that no longer exist this "
        "often, 0 disables (60s)",
    )
    p.add_argument(
        "--orphan-grace",
        type=parse_duration,
        default=30.0,
        help="remove an orphaned domain only once two consecutive sweeps reported it and it "
        "was first seen at least this long ago (30s)",
    )
    p.add_argument(
        "--cluster-health-interval",
        type=parse_duration,
        default=60.0,
        help="probe every host of the clusters this often (one call per host, spread over "
        "the interval); clusters whose reachability changed are reconciled; 0 disables (60s)",
    )
    p.add_argument(
        "--cluster-drift-interval",
        type=parse_duration,
        default=600.0,
        help="reconcile a healthy cluster in full again after about this long (a network or "
        "pool removed behind capl's back), 0 disables (10m)",
    )


def _add_libvirt_calls(p: argparse.ArgumentParser) -> None:
    lv = p.add_argument_group("libvirt calls (per host)")
    lv.add_argument(
        "--libvirt-call-timeout",
        type=positive_duration,
        default=30.0,
        help="time limit of one libvirt call (30s)",
    )
    lv.add_argument(
        "--libvirt-long-call-timeout",
        type=positive_duration,
        default=1800.0,
        help="time limit of an image import or upload (30m)",
    )
    lv.add_argument(
        "--libvirt-workers-per-host",
        type=_positive_int,
        default=8,
        help="threads running libvirt calls to one host (8)",
    )
    lv.add_argument(
        "--libvirt-max-inflight-per-host",
        type=_positive_int,
        default=None,
        help="unanswered calls to one host before new ones fail at once (4 x workers)",
    )


def _run_manager(args: argparse.Namespace) -> int:
    from capl.manager import run_from_args

    return run_from_args(args)


def _add_version(sub: argparse._SubParsersAction[_Parser]) -> None:
    p = sub.add_parser(
        "version",
        help="print the version",
        formatter_class=_formatter,
        epilog="examples:\n  capl version",
    )
    p.set_defaults(run=lambda _args: _print(f"capl {__version__}"))


def _print(text: str) -> int:
    print(text)
    return EXIT_OK


Registrar = Callable[["argparse._SubParsersAction[_Parser]"], None]


def _registrars() -> list[Registrar]:
    from capl import commands

    return [_add_manager, _add_version, *commands.REGISTRARS]


def build_parser() -> _Parser:
    parser = _Parser(
        prog="capl",
        formatter_class=_formatter,
        description="capl: the Cluster API infrastructure provider for libvirt/KVM.",
        epilog=(
            "examples:\n"
            "  capl demo                          3 real VMs on the local libvirtd\n"
            "  capl status                        clusters and machines at a glance\n"
            "  capl console worker-0 -n default   the serial console of a machine\n"
            "  capl manager --leader-elect        the controller manager"
        ),
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for register in _registrars():
        register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "run", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        code: int = args.run(args)
        return code
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except Exception as exc:
        if args.debug or os.environ.get("CAPL_DEBUG") == "1":
            raise
        code = exc.code if isinstance(exc, CliError) else _classify(exc)
        message = str(exc) or type(exc).__name__
        print(f"capl: error: {message.splitlines()[0]}", file=sys.stderr)
        return code


def _classify(exc: Exception) -> int:
    """Exit code for an unexpected exception, by what it says about the world."""
    name = type(exc).__name__
    if name in {"NotFound", "DomainNotFound"}:
        return EXIT_NOT_FOUND
    if name in {"KubeconfigError", "TransportError", "HostUnreachable", "ClientConnectorError"}:
        return EXIT_UNREACHABLE
    if isinstance(exc, ConnectionError | OSError) and not isinstance(exc, FileNotFoundError):
        return EXIT_UNREACHABLE
    return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
