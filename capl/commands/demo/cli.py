"""The `capl demo` command: its flags, the defaults that depend on the mode, the exit code.

Exit codes: 0 stopped by the user after the machines were Ready (real nodes: had Ready Nodes;
or with ``--exit-when-ready``), 1 a step failed or a machine did not become Ready in time
(after clean-up), 2 bad usage, 4 the libvirt host cannot be reached, 130 interrupted before
the machines were Ready.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import os
import re
import signal
import sys
from typing import Any

from capl.commands.demo.lifecycle import Demo, Interrupted
from capl.commands.demo.plan import DEFAULT_NAME, WORKER_MEMORY_MIB, DemoOptions, is_test_driver
from capl.commands.demo.ui import Ui
from capl.commands.shared import formatter
from capl.errors import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    CliError,
)

__all__ = ["options_from_args", "register", "run", "run_demo"]


def _machines(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number {text!r}") from None
    if not 1 <= value <= 50:
        raise argparse.ArgumentTypeError(f"must be between 1 and 50, got {value}")
    return value


def _cidr(text: str) -> str:
    try:
        network = ipaddress.IPv4Network(text, strict=False)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an IPv4 network: {text!r}") from None
    if not 8 <= network.prefixlen <= 28:
        raise argparse.ArgumentTypeError("the prefix length must be between 8 and 28")
    return str(network)


_DURATION = re.compile(r"^(?:(\d+)h)?(?:(\d+)m)?(?:(\d+(?:\.\d+)?)s)?$")


def _seconds(text: str) -> float:
    """Seconds from "90", "90s", "10m", "1h30m"."""
    text = text.strip()
    with contextlib.suppress(ValueError):
        return float(text)
    match = _DURATION.match(text)
    if not text or match is None:
        raise argparse.ArgumentTypeError(f"invalid duration {text!r} (examples: 90s, 10m, 1h)")
    hours, minutes, seconds = match.groups()
    return int(hours or 0) * 3600 + int(minutes or 0) * 60 + float(seconds or 0)


def _dns_label(text: str) -> str:
    if not re.fullmatch(r"[a-z]([a-z0-9-]{0,30}[a-z0-9])?", text):
        raise argparse.ArgumentTypeError(
            f"{text!r}: lower-case letters, digits and '-', at most 32 characters"
        )
    return text


_DESCRIPTION = (
    "Start a local control plane, the Cluster API core manager, its kubeadm bootstrap\n"
    "provider and capl's manager; create a cluster whose workers are VMs of capl's node\n"
    "image (a MachineDeployment bootstrapped with Ignition, one with cloud-config, both\n"
    "by the kubeadm bootstrap provider) that join a workload control plane running on\n"
    "this machine; show them in a live view (with each machine's Node) until every\n"
    "Node is Ready, then print `N/N Nodes Ready`, the workload kubeconfig\n"
    "(<work directory>/workload.kubeconfig) and what to try.\n"
    "--vm-only: the fast demo of capl alone, N VMs of the test guest (one control-plane\n"
    "Machine with Ignition, workers with cloud-config, no kubelet) until `N/N machines\n"
    "Ready`; the libvirt test driver (test:///default) implies it.\n"
    "Ctrl-C (or SIGTERM) deletes the cluster through the API, checks that capl\n"
    "removed every domain, volume, DHCP/DNS entry, network and pool (anything left\n"
    "that carries the demo's ownership tags is removed directly), stops every\n"
    "process and removes the work directory.\n"
    "\n"
    "Needs the control-plane binaries (`make envtest`, $KUBEBUILDER_ASSETS), the\n"
    "Cluster API build (`make capi`, $CAPL_CAPI_DIR) and for real nodes the node\n"
    "binaries (`make node-bin`, $CAPL_NODE_BIN) and image (`make node-image`,\n"
    "$CAPL_NODE_IMAGE); all are also found in $CAPL_CACHE. `make demo` builds\n"
    "everything and runs this."
)
_EPILOG = (
    "examples:\n"
    "  capl demo --node-image $(hack/node-image.sh | tail -n1)   2 real nodes (TCG)\n"
    "  capl demo --machines 4 --domain-type kvm                  4 real nodes (KVM)\n"
    "  capl demo --vm-only --image $(hack/guest-image.sh | tail -n1)   3 VMs, no kubelet\n"
    "  capl demo --libvirt-uri test:///default                   VM-only in seconds\n"
    "  capl demo --vm-only --libvirt-uri qemu+ssh://root@kvm1/system --image https://host/os.qcow2\n"
    "\n"
    "exit codes: 0 stopped after every machine was Ready (real nodes: had a Ready\n"
    "Node), 1 failed (after clean-up), 2 bad usage, 4 libvirt host unreachable,\n"
    "130 interrupted before Ready"
)


def register(sub: Any) -> None:
    p = sub.add_parser(
        "demo",
        help="a demo cluster of real Kubernetes nodes on this machine, removed on Ctrl-C",
        formatter_class=formatter,
        description=_DESCRIPTION,
        epilog=_EPILOG,
    )
    _add_mode_flags(p)
    _add_cluster_flags(p)
    _add_run_flags(p)
    p.set_defaults(run=run)


def _add_mode_flags(p: argparse.ArgumentParser) -> None:
    """The host, the mode (real nodes or --vm-only), how many machines of which image, and
    whether the work directory stays."""
    p.add_argument(
        "--libvirt-uri",
        default="qemu:///system",
        metavar="URI",
        help="the libvirt host (default qemu:///system; real nodes need this machine; "
        "test:///default: no real VMs, implies --vm-only)",
    )
    p.add_argument(
        "--vm-only",
        action="store_true",
        help="VMs of the test guest instead of real nodes: capl's part alone, fast (~1 min)",
    )
    p.add_argument(
        "--machines",
        type=_machines,
        default=None,
        metavar="N",
        help="worker machines (2: one Ignition, one cloud-config); --vm-only: machines in "
        "total (3)",
    )
    p.add_argument(
        "--node-image",
        default=None,
        metavar="PATH",
        help="the node image (default: $CAPL_NODE_IMAGE, else the one `make node-image` built)",
    )
    p.add_argument(
        "--image",
        default=None,
        metavar="PATH|URL",
        help="--vm-only: base qcow2 image (default: $CAPL_GUEST_IMAGE, else the test guest "
        "`make guest-image` built; not needed on the test driver)",
    )
    p.add_argument(
        "--keep", action="store_true", help="keep the work directory (all logs) after the demo"
    )


def _add_cluster_flags(p: argparse.ArgumentParser) -> None:
    """The demo cluster: its name, network and machine shape."""
    p.add_argument("--name", type=_dns_label, default=DEFAULT_NAME, help="cluster name (demo)")
    p.add_argument(
        "--network-cidr",
        type=_cidr,
        default=None,
        metavar="CIDR",
        help="the demo network (default: a free /24 in 10.213.0.0/16)",
    )
    p.add_argument(
        "--domain-type",
        choices=("qemu", "kvm", "auto"),
        default="qemu",
        help="qemu = TCG emulation, works everywhere (default); kvm is faster on bare metal",
    )
    p.add_argument(
        "--memory-mib",
        type=int,
        default=None,
        help=f"memory per machine ({WORKER_MEMORY_MIB}; --vm-only: 256)",
    )


def _add_run_flags(p: argparse.ArgumentParser) -> None:
    """How long to wait, when to stop, how much the manager logs."""
    p.add_argument(
        "--ready-timeout",
        type=_seconds,
        default=None,
        metavar="DURATION",
        help="give up when not every machine is Ready (real nodes: has a Ready Node) after "
        "this long (20m; --vm-only: 10m)",
    )
    p.add_argument(
        "--cleanup-timeout",
        type=_seconds,
        default=180.0,
        metavar="DURATION",
        help="wait this long for capl's own clean-up before removing leftovers directly (3m)",
    )
    p.add_argument(
        "--exit-when-ready",
        action="store_true",
        help="clean up and exit once all machines are Ready, real nodes: every Machine has a "
        "Ready Node (for scripts and benchmarks)",
    )
    p.add_argument("--log-level", default="info", help="capl manager log level (info)")


def options_from_args(args: argparse.Namespace) -> DemoOptions:
    """The options; the defaults that depend on the mode (real nodes or --vm-only) resolved."""
    real = not args.vm_only and not is_test_driver(args.libvirt_uri)

    def pick(value: Any, real_default: Any, vm_default: Any) -> Any:
        if value is not None:
            return value
        return real_default if real else vm_default

    return DemoOptions(
        uri=args.libvirt_uri,
        machines=pick(args.machines, 2, 3),
        image=args.image,
        keep=args.keep,
        name=args.name,
        network_cidr=args.network_cidr,
        domain_type=args.domain_type,
        memory_mib=pick(args.memory_mib, WORKER_MEMORY_MIB, 256),
        ready_timeout=pick(args.ready_timeout, 1200.0, 600.0),
        cleanup_timeout=args.cleanup_timeout,
        exit_when_ready=args.exit_when_ready,
        log_level=args.log_level,
        vm_only=args.vm_only,
        node_image=args.node_image,
    )


def run(args: argparse.Namespace) -> int:
    options = options_from_args(args)
    ui = Ui(tty=sys.stdout.isatty() and os.environ.get("TERM") != "dumb")
    return asyncio.run(run_demo(options, ui))


async def run_demo(options: DemoOptions, ui: Ui) -> int:
    """The whole demo: up, wait, down. Returns the exit code (raises CliError for
    failures that happen before anything was created)."""
    demo = Demo(options, ui)
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, demo.signalled, signum)
    error: CliError | None = None
    interrupted = False
    try:
        try:
            await demo.up()
        except Interrupted:
            interrupted = not demo.ready
        except CliError as exc:
            error = exc
        except Exception as exc:
            first = str(exc).splitlines()[0] if str(exc) else ""
            error = CliError(f"{type(exc).__name__}: {first}")
            if os.environ.get("CAPL_DEBUG") == "1":
                raise
        if error is not None and demo.workdir is not None:
            ui.warn("a step failed (the error follows); cleaning up")
        clean = await demo.down()
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
    if error is not None:
        raise error
    if not clean:
        return EXIT_FAILED
    if interrupted:
        return EXIT_INTERRUPTED
    return EXIT_OK
