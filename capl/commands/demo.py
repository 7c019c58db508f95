"""`capl demo`: capl's main job on this machine, in one command, and nothing left afterwards.

What it runs, all owned by this one process:

1. a **control plane** (``capl.testbed.ControlPlane``: etcd + kube-apiserver on loopback) in a
   fresh work directory ``$TMPDIR/capl-demo-XXXX``, with capl's CRDs (generated from the
   models, so a pip-installed capl needs no repository checkout);
2. the **Cluster API core manager** (``capl.testbed.capi.CapiCore``, the real Go binary that
   ``make capi`` builds) with its CRDs and webhooks on loopback. The demo uses real Cluster
   API objects, so what it shows is what a management cluster does: the Cluster controller
   adopts the LibvirtCluster, the MachineDeployment's MachineSet clones LibvirtMachines from
   a template, ``kubectl scale`` works;
3. **capl's manager in this process** (``capl.manager.build`` as an asyncio task, webhooks
   off, metrics on a free loopback port, logs to ``<workdir>/logs/capl-manager.log``). In
   process because ``test:///default`` is per-process state: the demo, its checks and the
   manager must share one libvirt test driver;
4. a **demo cluster** on one host (``--libvirt-uri``) with an isolated network on a /24 that
   overlaps no libvirt network and no local route and a directory pool in the work
   directory, in one of two modes:

   - **real nodes** (the default; ``capl.commands.demo_nodes`` has the details): Cluster
     API's kubeadm bootstrap provider runs beside the core manager, the workload cluster's
     control plane runs on this machine on the network's host address (``demo_nodes.
     RealNodes``), and N workers of the node image (``--node-image``, imported by capl from
     its path) join it: a MachineDeployment bootstrapped with Ignition and one with
     cloud-config — the objects of templates/cluster-template-offline.yaml;
   - **VM-only** (``--vm-only``; implied by the test driver, which boots no guests): one
     control-plane Machine + LibvirtMachine bootstrapped with Ignition and a
     MachineDeployment of N-1 workers bootstrapped with cloud-config, of the test guest (no
     kubelet). The base image is served to capl's image import from a loopback HTTP server
     (the guest image given with ``--image``; on the test driver a synthetic qcow2 header
     does), with its sha256, so the import is the same verified download production uses,
     and the demo can show its progress.

Then a **live view** (``rich.Live`` on a terminal; a line per change otherwise) of the
machines with host, domain state, address, Ready, with real nodes the Node (name, Ready or
NotReady, read with the workload kubeconfig), elapsed time and what each one waits for,
built with ``capl.commands.status_report.collect`` (the same join ``capl status`` shows). When all
N are done it prints exactly one line (scripts wait for it): ``N/N machines Ready``, with
real nodes ``N/N Nodes Ready`` (every Machine has a Ready Node) and the kubectl line for
``<workdir>/workload.kubeconfig``; then the commands to try, and keeps running, printing
changes (e.g. after scaling), until SIGINT or SIGTERM.

**Clean-up** removes everything the demo created, in this order: delete the Cluster,
MachineDeployment(s) and Machines through the API and wait (``--cleanup-timeout``) until capl
has shut the domains down and removed domains, volumes, DHCP/DNS entries, network and pool;
stop capl's manager; look at the host through the libvirt port and force-remove whatever of
*this* demo cluster is still there (only objects carrying capl's ownership tags for it:
domain metadata, network tag, pool marker) and say so; stop the kubeadm bootstrap provider
and the workload control plane (after the deletion: Cluster API drains and deletes Nodes
through it), the Cluster API manager and the control plane; remove the work directory
(``--keep`` keeps it, with every log). A second Ctrl-C during clean-up skips the wait and
goes straight to the forced removal; nothing is abandoned.

A demo that was killed (SIGKILL, OOM) cannot clean up: its child processes die with it
(PR_SET_PDEATHSIG), and the next ``capl demo`` finds its work directory (``demo.json``
records owner pid and start time, URI and names), removes its libvirt objects by the same
ownership-checked path and deletes the directory.

Exit codes: 0 stopped by the user after the machines were Ready (real nodes: had Ready Nodes;
or with ``--exit-when-ready``),
1 a step failed or a machine did not become Ready in time (after clean-up), 2 bad usage,
4 the libvirt host cannot be reached, 130 interrupted before the machines were Ready.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import functools
import hashlib
import ipaddress
import json
import os
import re
import shutil
import signal
import struct
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol

from capl.commands import demo_nodes
from capl.commands.shared import formatter
from capl.errors import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    CliError,
)

if TYPE_CHECKING:
    from aiohttp import web
    from rich.console import Console
    from rich.table import Table

    from capl.commands.status_report import StatusReport
    from capl.kube.client import KubeClient
    from capl.manager import Built
    from capl.runtime.manager import Manager
    from capl.runtime.resources import Resource
    from capl.testbed import ControlPlane
    from capl.testbed.capi import CapiCore
    from capl.virt import LibvirtHost, LibvirtHosts

__all__ = [
    "DemoPlan",
    "MachineRow",
    "Tracker",
    "demo_objects",
    "local_routes",
    "next_steps",
    "pick_cidr",
    "ready_line",
    "register",
    "row_line",
    "synthetic_qcow2",
]

DEFAULT_NAME: Final = "demo"
DEFAULT_NAMESPACE: Final = "default"
HOST_NAME: Final = "local"
WORKDIR_PREFIX: Final = "capl-demo-"
STATE_FILE: Final = "demo.json"
IMAGE_FILE: Final = "capl-demo-base.qcow2"
CAPI_GROUP: Final = "cluster.x-k8s.io"
INFRA_GROUP: Final = "infrastructure.cluster.x-k8s.io"
CONTROL_PLANE_LABEL: Final = "cluster.x-k8s.io/control-plane"
CLUSTER_NAME_LABEL: Final = "cluster.x-k8s.io/cluster-name"
DEPLOYMENT_NAME_LABEL: Final = "cluster.x-k8s.io/deployment-name"
CIDR_SEARCH: Final = (ipaddress.IPv4Network("10.213.0.0/16"), ipaddress.IPv4Network("10.0.0.0/8"))
"""Where the demo looks for a free /24, in order."""
_POLL = 1.0


# --- the plan: pure functions the unit tests pin -------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class DemoPlan:
    """What the demo creates; everything derives from it (names, objects, clean-up)."""

    name: str = DEFAULT_NAME
    namespace: str = DEFAULT_NAMESPACE
    uri: str
    machines: int = 3
    """VM-only: all machines (one control plane, the rest workers); real nodes: workers."""
    image_url: str = ""
    image_sha256: str | None = None
    cidr: str
    pool_path: str
    domain_type: str = "qemu"
    cpus: int = 1
    memory_mib: int = 256
    real_nodes: bool = False
    """Real Kubernetes nodes (capl.commands.demo_nodes) instead of VMs of the test guest."""
    image_path: str | None = None
    """Real nodes: the node image, a file on the host."""
    kubernetes_version: str = demo_nodes.KUBERNETES_VERSION

    @property
    def control_plane_machine(self) -> str:
        return f"{self.name}-control-plane-0"

    @property
    def control_plane(self) -> str:
        """Real nodes: the Cluster's TestbedControlPlane (the control plane on this host)."""
        return f"{self.name}-control-plane"

    @property
    def deployment(self) -> str:
        """The MachineDeployment `kubectl scale` is suggested for."""
        return self.md_cloud_config if self.real_nodes else f"{self.name}-workers"

    @property
    def deployments(self) -> tuple[str, ...]:
        if self.real_nodes:
            return (self.md_ignition, self.md_cloud_config)
        return (self.deployment,)

    @property
    def md_ignition(self) -> str:
        return f"{self.name}-md-ignition"

    @property
    def md_cloud_config(self) -> str:
        return f"{self.name}-md-cloud-config"

    @property
    def workers(self) -> int:
        """Replicas of `deployment`."""
        if self.real_nodes:
            return demo_nodes.split_workers(self.machines)[1]
        return self.machines - 1

    @property
    def test_driver(self) -> bool:
        return is_test_driver(self.uri)


def is_test_driver(uri: str) -> bool:
    return uri.split(":", 1)[0].split("+", 1)[0] == "test"


def is_local_uri(uri: str) -> bool:
    """A URI whose hypervisor runs on this machine (local routes matter for its networks)."""
    scheme, _, rest = uri.partition("://")
    return "+" not in scheme and not rest.split("/", 1)[0]


def local_routes(proc_net_route: str) -> list[ipaddress.IPv4Network]:
    """The destinations of /proc/net/route (little-endian hex), default route excluded."""
    networks = []
    for line in proc_net_route.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 8:
            continue
        try:
            dest = ipaddress.IPv4Address(struct.pack("<I", int(fields[1], 16)))
            mask = ipaddress.IPv4Address(struct.pack("<I", int(fields[7], 16)))
        except ValueError:
            continue
        if int(mask) == 0:
            continue
        with contextlib.suppress(ValueError):
            networks.append(ipaddress.IPv4Network(f"{dest}/{mask}", strict=False))
    return networks


def pick_cidr(
    taken: Iterable[ipaddress.IPv4Network], *, search: Sequence[ipaddress.IPv4Network] = CIDR_SEARCH
) -> str:
    """The first /24 in ``search`` that overlaps none of ``taken``."""
    busy = list(taken)
    for space in search:
        for candidate in space.subnets(new_prefix=24):
            if not any(candidate.overlaps(other) for other in busy):
                return str(candidate)
    raise CliError("no free /24 for the demo network in 10.0.0.0/8: pass --network-cidr")


def synthetic_qcow2(virtual_size: int = 1 << 30) -> bytes:
    """A qcow2 header (magic, version 3, 64 KiB clusters, ``virtual_size``), for the test
    driver, which keeps volume metadata only: enough for capl's format sniffing."""
    header = b"QFI\xfb" + struct.pack(">IQIIQ", 3, 0, 0, 16, virtual_size)
    return header.ljust(512, b"\0")


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def ignition_config(hostname: str) -> str:
    """A minimal Ignition v3 config: the hostname, written as /etc/hostname."""
    config = {
        "ignition": {"version": "3.4.0"},
        "storage": {
            "files": [
                {
                    "path": "/etc/hostname",
                    "mode": 420,
                    "overwrite": True,
                    "contents": {"source": f"data:,{hostname}"},
                }
            ]
        },
    }
    return json.dumps(config, separators=(",", ":"))


CLOUD_CONFIG: Final = (
    "#cloud-config\n"
    "# capl demo worker: the hostname comes from the NoCloud meta-data capl writes.\n"
    "write_files:\n"
    "  - path: /etc/motd\n"
    "    content: capl demo worker\n"
)


def demo_objects(plan: DemoPlan) -> list[dict[str, Any]]:
    """Every API object of the demo cluster, in creation order."""
    if plan.real_nodes:
        return demo_nodes.node_objects(plan)
    ns, name = plan.namespace, plan.name
    cluster_labels = {CLUSTER_NAME_LABEL: name}
    cp_labels = {**cluster_labels, CONTROL_PLANE_LABEL: ""}
    md_labels = {**cluster_labels, DEPLOYMENT_NAME_LABEL: plan.deployment}
    infra_api = f"{INFRA_GROUP}/v1alpha1"
    capi_api = f"{CAPI_GROUP}/v1beta2"
    image: dict[str, Any] = {"url": plan.image_url, "format": "qcow2"}
    if plan.image_sha256:
        image["checksum"] = f"sha256:{plan.image_sha256}"
    machine_spec = {
        "cpus": plan.cpus,
        "memoryMiB": plan.memory_mib,
        "image": image,
        "domainType": plan.domain_type,
    }

    def meta(object_name: str, labels: Mapping[str, str]) -> dict[str, Any]:
        return {"name": object_name, "namespace": ns, "labels": dict(labels)}

    def secret(object_name: str, value: str, fmt: str) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": meta(object_name, cluster_labels),
            "type": "cluster.x-k8s.io/secret",
            "data": {"value": _b64(value), "format": _b64(fmt)},
        }

    def infra_ref(kind: str, object_name: str) -> dict[str, str]:
        return {"apiGroup": INFRA_GROUP, "kind": kind, "name": object_name}

    cp = plan.control_plane_machine
    return [
        secret(f"{cp}-bootstrap", ignition_config(cp), "ignition"),
        secret(f"{plan.deployment}-bootstrap", CLOUD_CONFIG, "cloud-config"),
        {
            "apiVersion": infra_api,
            "kind": "LibvirtCluster",
            "metadata": meta(name, cluster_labels),
            "spec": {
                "hosts": [{"name": HOST_NAME, "uri": plan.uri}],
                "network": {"cidr": plan.cidr, "mode": "isolated"},
                "storagePool": {"path": plan.pool_path},
            },
        },
        {
            "apiVersion": capi_api,
            "kind": "Cluster",
            "metadata": meta(name, {}),
            "spec": {"infrastructureRef": infra_ref("LibvirtCluster", name)},
        },
        {
            "apiVersion": infra_api,
            "kind": "LibvirtMachine",
            "metadata": meta(cp, cp_labels),
            "spec": machine_spec,
        },
        {
            "apiVersion": capi_api,
            "kind": "Machine",
            "metadata": meta(cp, cp_labels),
            "spec": {
                "clusterName": name,
                "bootstrap": {"dataSecretName": f"{cp}-bootstrap"},
                "infrastructureRef": infra_ref("LibvirtMachine", cp),
            },
        },
        {
            "apiVersion": infra_api,
            "kind": "LibvirtMachineTemplate",
            "metadata": meta(plan.deployment, cluster_labels),
            "spec": {"template": {"spec": machine_spec}},
        },
        {
            "apiVersion": capi_api,
            "kind": "MachineDeployment",
            "metadata": meta(plan.deployment, cluster_labels),
            "spec": {
                "clusterName": name,
                "replicas": plan.workers,
                "selector": {"matchLabels": md_labels},
                "template": {
                    "metadata": {"labels": md_labels},
                    "spec": {
                        "clusterName": name,
                        "bootstrap": {"dataSecretName": f"{plan.deployment}-bootstrap"},
                        "infrastructureRef": infra_ref("LibvirtMachineTemplate", plan.deployment),
                    },
                },
            },
        },
    ]


def resource_of(obj: Mapping[str, Any]) -> Resource:
    """The REST resource of a demo object."""
    from capl.runtime.resources import lookup

    if obj["kind"] == "MachineDeployment":
        return machine_deployment()
    if obj["kind"] in demo_nodes.extra_resources():
        return demo_nodes.extra_resources()[obj["kind"]]
    if obj["kind"] == "Secret":
        return lookup("Secret", group="")
    group = str(obj["apiVersion"]).split("/", 1)[0]
    found: Resource = lookup(str(obj["kind"]), group=group)
    return found


@functools.cache
def machine_deployment() -> Resource:
    """Cluster API's MachineDeployment (not one of the kinds capl's runtime knows)."""
    from capl.runtime.resources import Resource

    return Resource(CAPI_GROUP, "v1beta2", "MachineDeployment", "machinedeployments")


# --- the live view -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class MachineRow:
    name: str
    host: str
    state: str
    address: str
    ready: str
    elapsed: float
    """Seconds since the machine was created; frozen once it became Ready."""
    detail: str
    """What the machine waits for (the first condition not in its good state), or ""."""
    node: str = ""
    """Real nodes: the Node's name and Ready/NotReady ("-": no Node yet); else ""."""
    node_ready: bool = False

    @property
    def is_ready(self) -> bool:
        return self.ready == "True"

    def key(self) -> tuple[str, ...]:
        """What a change line is printed for (not the ticking elapsed time)."""
        return (self.host, self.state, self.address, self.ready, self.node, self.detail)


def format_elapsed(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds}s" if seconds < 120 else f"{seconds // 60}m{seconds % 60:02d}s"


def _parse_time(text: str | None) -> float | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _condition_detail(report: StatusReport, kind: str, name: str) -> str:
    for condition in report.conditions:
        if condition.kind == kind and condition.name == name and condition.type != "Ready":
            text = f"{condition.type}: {condition.reason}" if condition.reason else condition.type
            if condition.message:
                text += f" ({condition.message})"
            return text
    for condition in report.conditions:
        if condition.kind == kind and condition.name == name:
            return condition.reason or condition.message
    return ""


class Tracker:
    """Turns status reports into rows; remembers when each machine was first seen Ready
    (with ``nodes``: when it was first seen with a Ready Node, which is what counts then)."""

    def __init__(self, *, cluster: str, expected: int, nodes: bool = False) -> None:
        self.cluster = cluster
        self.expected = expected
        self.nodes = nodes
        self._ready_at: dict[str, float] = {}
        self.rows: list[MachineRow] = []

    def update(
        self,
        report: StatusReport,
        *,
        now: float,
        nodes: demo_nodes.NodeIndex | None = None,
    ) -> list[MachineRow]:
        rows = []
        for view in report.machines:
            if view.cluster not in (None, self.cluster):
                continue
            created = _parse_time(view.created) or now
            if view.libvirt_machine is not None:
                detail = _condition_detail(report, "LibvirtMachine", view.libvirt_machine)
            else:
                detail = "waiting for its LibvirtMachine"
            node, node_ready = "", False
            if self.nodes:
                node, node_ready, detail = demo_nodes.row_node(
                    view, nodes or demo_nodes.NodeIndex(), machine_detail=detail
                )
            elif view.ready == "True":
                detail = ""
            done = node_ready if self.nodes else view.ready == "True"
            if done:
                ready_at = self._ready_at.setdefault(view.name, now)
            else:
                self._ready_at.pop(view.name, None)
                ready_at = now
            rows.append(
                MachineRow(
                    name=view.name,
                    host=view.host or "-",
                    state=view.state or "-",
                    address=",".join(view.addresses) or "-",
                    ready=view.ready or "-",
                    elapsed=max(0.0, ready_at - created),
                    detail=detail,
                    node=node,
                    node_ready=node_ready,
                )
            )
        self.rows = rows
        return rows

    @property
    def ready(self) -> int:
        """Machines Ready (with ``nodes``: machines whose Node is Ready)."""
        return sum(1 for row in self.rows if (row.node_ready if self.nodes else row.is_ready))

    @property
    def all_ready(self) -> bool:
        return len(self.rows) == self.expected and self.ready == self.expected


def ready_line(ready: int, total: int, *, nodes: bool = False) -> str:
    """The one line scripts wait for (real nodes: `N/N Nodes Ready`)."""
    return f"{ready}/{total} {'Nodes' if nodes else 'machines'} Ready"


def row_line(row: MachineRow, *, since_start: float) -> str:
    """A change of one machine, as a plain line (no terminal, or after the live view)."""
    text = (
        f"[{format_elapsed(since_start):>6}] {row.name}: host={row.host} state={row.state} "
        f"address={row.address} ready={row.ready}"
    )
    if row.node:
        text += f" node={row.node.replace(' ', '/')}"
    text += f" elapsed={format_elapsed(row.elapsed)}"
    return f"{text} - {row.detail}" if row.detail else text


_STYLE = {"True": "green", "False": "red", "Unknown": "yellow"}


def render_table(
    rows: Sequence[MachineRow], *, title: str, caption: str, nodes: bool = False
) -> Table:
    """The live table; ``nodes`` adds the NODE column (the Node's name, Ready/NotReady)."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title=title, title_justify="left", caption=caption, caption_justify="left")
    columns = ["MACHINE", "HOST", "STATE", "ADDRESS", "READY"]
    columns += ["NODE"] if nodes else []
    for column in (*columns, "ELAPSED", "WAITING FOR"):
        table.add_column(column, overflow="fold", no_wrap=column != "WAITING FOR")
    for row in rows:
        node = [Text(row.node, style="green" if row.node_ready else "")] if nodes else []
        table.add_row(
            row.name,
            row.host,
            row.state,
            row.address,
            Text(row.ready, style=_STYLE.get(row.ready, "")),
            *node,
            format_elapsed(row.elapsed),
            Text(row.detail, style="dim"),
        )
    return table


def next_steps(
    *,
    plan: DemoPlan,
    kubeconfig: str,
    kubectl: str,
    capl: str,
    metrics_url: str | None,
    workload_kubeconfig: str | None = None,
    console_machine: str | None = None,
) -> str:
    """What to try while the demo runs (exact commands with the demo's kubeconfig; with
    real nodes first the workload cluster's, with ``workload_kubeconfig``)."""
    kc = f"--kubeconfig {kubeconfig}"
    lines = ["Try it, in another terminal:"]
    if workload_kubeconfig is not None:
        lines += demo_nodes.workload_lines(kubectl=kubectl, kubeconfig=workload_kubeconfig)
    lines += [
        f"  {kubectl} {kc} get clusters,machinedeployments,machines",
        f"  {kubectl} {kc} get libvirtclusters,libvirtmachines -o wide",
        f"  {capl} status {kc}",
        f"  {kubectl} {kc} scale machinedeployment {plan.deployment} --replicas {plan.workers + 1}",
    ]
    if plan.test_driver:
        lines.append(
            "  (the libvirt test driver lives inside this process: `capl console` and virsh "
            "cannot see its domains; run with a real libvirtd, e.g. `make demo`, for that)"
        )
    else:
        lines += [
            f"  {capl} console {console_machine or plan.control_plane_machine} {kc}"
            "    (Ctrl-] leaves)",
            f"  virsh -c {plan.uri} list --all",
        ]
    if metrics_url:
        lines.append(
            f"  curl -s {metrics_url} | grep -E "
            "'^(controller_runtime_reconcile_total|rest_client_requests_total)'"
        )
    lines.append("Ctrl-C stops the demo and removes everything it created.")
    return "\n".join(lines)


# --- finding the binaries ------------------------------------------------------------------------


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(os.environ.get("CAPL_CACHE") or Path(base) / "capl")


def _version_key(path: Path) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", path.name))


def _cached_versions(kind: str) -> list[Path]:
    root = _cache_dir() / kind
    if not root.is_dir():
        return []
    return sorted((p for p in root.iterdir() if p.is_dir()), key=_version_key, reverse=True)


def find_control_plane_assets() -> Any:
    """$KUBEBUILDER_ASSETS, else the newest `make envtest` build in the cache."""
    from capl.testbed import AssetsMissing, find_assets

    if os.environ.get("KUBEBUILDER_ASSETS"):
        try:
            return find_assets()
        except AssetsMissing as exc:
            raise CliError(str(exc)) from None
    for candidate in _cached_versions("envtest"):
        with contextlib.suppress(AssetsMissing):
            return find_assets(candidate)
    raise CliError(
        "kube-apiserver, etcd and kubectl not found: run `make envtest` (or `make demo`, which "
        "builds everything) and set KUBEBUILDER_ASSETS to the directory it prints"
    )


def find_capi_assets() -> Any:
    """$CAPL_CAPI_DIR, else the newest `make capi` build in the cache."""
    from capl.testbed.capi import CAPI_DIR_ENV, CapiMissing, find_capi

    if os.environ.get(CAPI_DIR_ENV):
        try:
            return find_capi()
        except CapiMissing as exc:
            raise CliError(str(exc)) from None
    for candidate in _cached_versions("capi"):
        with contextlib.suppress(CapiMissing):
            return find_capi(candidate)
    raise CliError(
        "the Cluster API core manager was not found: run `make capi` (or `make demo`, which "
        f"builds everything) and set {CAPI_DIR_ENV} to the directory it prints"
    )


# --- output --------------------------------------------------------------------------------------


class View(Protocol):
    def show(self, rows: Sequence[MachineRow], caption: str) -> None: ...


class Ui:
    """Everything the demo prints. On a terminal: spinners and a live table (rich);
    otherwise plain lines, one per step and one per change, never redrawn."""

    def __init__(self, *, tty: bool) -> None:
        self.tty = tty
        self.started = time.monotonic()
        self._console: Console | None = None
        if tty:
            from rich.console import Console

            self._console = Console(highlight=False)

    def say(self, text: str = "") -> None:
        self._emit(text)

    def warn(self, text: str) -> None:
        if self._console is not None:
            self._emit(f"[yellow]![/yellow] {text}", markup=True)
        else:
            self._emit(f"warning: {text}")

    def _emit(self, text: str, *, markup: bool = False) -> None:
        """Print a line. A closed stdout (``capl demo | head``) must not stop the clean-up:
        the first failed write sends all further output to /dev/null."""
        try:
            if self._console is not None:
                self._console.print(text, markup=markup, soft_wrap=True)
            else:
                print(text, flush=True)
        except OSError:  # BrokenPipeError and friends
            with contextlib.suppress(OSError):
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, sys.stdout.fileno())
                os.close(devnull)

    @contextlib.contextmanager
    def step(self, text: str) -> Iterator[Callable[[str], None]]:
        """A long operation: a spinner (terminal) or a start line; its duration at the end.
        Yields a function that updates the text (progress)."""
        t0 = time.monotonic()
        if self._console is not None:
            with self._console.status(text) as status:
                yield lambda more: status.update(f"{text} {more}")
            self._emit(
                f"[green]✓[/green] {text} [dim]({time.monotonic() - t0:.1f} s)[/dim]", markup=True
            )
        else:
            self._emit(f"==> {text}")
            last = [""]

            def progress(more: str) -> None:
                if more != last[0]:
                    last[0] = more
                    self._emit(f"    {more}")

            yield progress
            self._emit(f"    done in {time.monotonic() - t0:.1f} s")

    @contextlib.contextmanager
    def live(self, title: str, *, nodes: bool = False) -> Iterator[View]:
        if self._console is not None:
            from rich.live import Live

            with Live(
                render_table([], title=title, caption="", nodes=nodes),
                console=self._console,
                refresh_per_second=4,
                redirect_stdout=False,
                redirect_stderr=False,
            ) as live:

                class _Live:
                    def show(self, rows: Sequence[MachineRow], caption: str) -> None:
                        live.update(render_table(rows, title=title, caption=caption, nodes=nodes))

                yield _Live()
        else:
            self._emit(f"==> {title}")
            yield _Lines(self)


class _Lines:
    """The non-terminal view: one line per machine change and per caption change."""

    def __init__(self, ui: Ui) -> None:
        self._ui = ui
        self._seen: dict[str, tuple[str, ...]] = {}
        self._caption = ""

    def prime(self, rows: Sequence[MachineRow]) -> None:
        """Remember ``rows`` as shown already (they were, in the live table)."""
        self._seen = {row.name: row.key() for row in rows}

    def show(self, rows: Sequence[MachineRow], caption: str) -> None:
        since = time.monotonic() - self._ui.started
        for row in rows:
            if self._seen.get(row.name) != row.key():
                self._seen[row.name] = row.key()
                self._ui.say(row_line(row, since_start=since))
        for gone in sorted(set(self._seen) - {row.name for row in rows}):
            del self._seen[gone]
            self._ui.say(f"[{format_elapsed(since):>6}] {gone}: deleted")
        if caption != self._caption:
            self._caption = caption
            self._ui.say(f"[{format_elapsed(since):>6}] {caption}")


# --- the image server ----------------------------------------------------------------------------


class ImageServer:
    """Serves one base image on 127.0.0.1 to capl's image import; counts the bytes sent."""

    def __init__(self, *, path: Path | None, data: bytes | None = None) -> None:
        self.path = path
        self.data = data
        self.size = path.stat().st_size if path is not None else len(data or b"")
        self.sent = 0
        self.requests = 0
        self.port = 0
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/{IMAGE_FILE}"

    async def start(self) -> None:
        from aiohttp import web

        app = web.Application()
        app.router.add_get(f"/{IMAGE_FILE}", self._get)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert server is not None
        self.port = int(server.sockets[0].getsockname()[1])  # type: ignore[attr-defined]

    async def _get(self, request: web.Request) -> web.StreamResponse:
        from aiohttp import web

        self.requests += 1
        response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        response.content_length = self.size
        await response.prepare(request)
        if request.method == "HEAD":
            return response
        if self.data is not None:
            await response.write(self.data)
            self.sent += len(self.data)
        else:
            assert self.path is not None
            with self.path.open("rb") as handle:
                while chunk := await asyncio.to_thread(handle.read, 1 << 20):
                    await response.write(chunk)
                    self.sent += len(chunk)
        await response.write_eof()
        return response

    def progress(self) -> str:
        if not self.requests:
            return "image: not requested yet"
        mib = 1024 * 1024
        done = min(self.sent, self.size * self.requests)
        return f"image: {done / mib:.1f}/{self.size * self.requests / mib:.1f} MiB served"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


# --- ownership of work directories (stale demos) -------------------------------------------------


def process_identity(pid: int) -> str | None:
    """``pid`` plus its start time, which tells a live process from a reused pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return f"{pid} {stat.rsplit(')', 1)[1].split()[19]}"


def _write_state(workdir: Path, state: Mapping[str, Any]) -> None:
    tmp = workdir / f".{STATE_FILE}.tmp"
    tmp.write_text(json.dumps(dict(state), indent=2))
    tmp.replace(workdir / STATE_FILE)


def _read_state(workdir: Path) -> dict[str, Any] | None:
    try:
        value = json.loads((workdir / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def other_demos() -> Iterator[tuple[Path, dict[str, Any], bool]]:
    """(work directory, state, owner alive) of every demo work directory on this machine."""
    for workdir in sorted(Path(tempfile.gettempdir()).glob(f"{WORKDIR_PREFIX}*")):
        state = _read_state(workdir)
        if state is None:
            continue
        owner = str(state.get("owner") or "")
        pid = owner.split(" ", 1)[0]
        alive = bool(owner) and pid.isdigit() and process_identity(int(pid)) == owner
        yield workdir, state, alive


# --- clean-up through the libvirt port -----------------------------------------------------------


@dataclass(slots=True)
class Leftovers:
    """What of a demo cluster is still on its host."""

    domains: list[str] = field(default_factory=list)
    volumes: list[str] = field(default_factory=list)
    network: str | None = None
    pool: str | None = None

    @property
    def empty(self) -> bool:
        return not (self.domains or self.volumes or self.network or self.pool)

    def describe(self) -> str:
        parts = [f"domain {d}" for d in self.domains]
        parts += [f"{len(self.volumes)} volume(s)"] if self.volumes else []
        parts += [f"network {self.network}"] if self.network else []
        parts += [f"pool {self.pool}"] if self.pool else []
        return ", ".join(parts) or "nothing"


async def find_leftovers(
    host: LibvirtHost, *, namespace: str, cluster: str, network: str, pool: str
) -> Leftovers:
    found = Leftovers()
    for domain in await host.list_domains(cluster=cluster):
        if domain.owner is not None and domain.owner.namespace == namespace:
            found.domains.append(domain.name)
    info = await host.get_network(network)
    if info is not None and info.owner is not None and info.owner.name == cluster:
        found.network = network
    pool_info = await host.get_pool(pool)
    if pool_info is not None:
        found.pool = pool
        found.volumes = [v.name for v in await host.list_volumes(pool=pool, refresh=True)]
    return found


async def force_clean(
    host: LibvirtHost, *, namespace: str, cluster: str, network: str, pool: str
) -> Leftovers:
    """Remove what of the demo cluster is left, through ownership-checked operations only;
    returns what could not be removed."""
    from capl.ports.virt import ClusterOwner

    owner = ClusterOwner(namespace=namespace, name=cluster)
    for domain in await host.list_domains(cluster=cluster):
        if domain.owner is not None and domain.owner.namespace == namespace:
            await host.undefine_domain(domain.uuid, owner=domain.owner)
    await host.delete_pool(name=pool, owner=owner)
    await host.delete_network(name=network, owner=owner)
    return await find_leftovers(
        host, namespace=namespace, cluster=cluster, network=network, pool=pool
    )


def layout_names(plan: DemoPlan) -> tuple[str, str]:
    """(network, pool) names capl derives for the demo cluster."""
    from capl.api.cluster import LibvirtCluster
    from capl.api.defaults import default_libvirt_cluster

    raw = next(o for o in demo_objects(plan) if o["kind"] == "LibvirtCluster")
    model = default_libvirt_cluster(LibvirtCluster.model_validate(raw))
    pool = model.spec.storage_pool
    assert model.spec.network.name is not None
    assert pool is not None
    assert pool.name is not None
    return model.spec.network.name, pool.name


async def sweep_stale(ui: Ui) -> None:
    """Remove what demos that were killed left behind (their work directory and, on a real
    libvirt host, their tagged domains, volumes, network and pool)."""
    from capl.virt import LibvirtHosts

    for workdir, state, alive in other_demos():
        if alive:
            continue
        uri = str(state.get("uri") or "")
        names = [state.get(k) for k in ("namespace", "cluster", "network", "pool")]
        if uri and not is_test_driver(uri) and all(isinstance(n, str) and n for n in names):
            namespace, cluster, network, pool = (str(n) for n in names)
            hosts = LibvirtHosts()
            try:
                left = await force_clean(
                    hosts.get(uri=uri),
                    namespace=namespace,
                    cluster=cluster,
                    network=network,
                    pool=pool,
                )
            except Exception as exc:
                ui.warn(
                    f"could not remove what an earlier, killed demo ({workdir}) left on {uri}: "
                    f"{exc} (the next `capl demo` tries again)"
                )
                continue
            finally:
                await hosts.close()
            if not left.empty:
                ui.warn(f"an earlier demo left on {uri}: {left.describe()} (not removable)")
                continue
            ui.say(f"removed what an earlier, killed demo left on {uri} (cluster {cluster})")
        shutil.rmtree(workdir, ignore_errors=True)


# --- the demo ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class DemoOptions:
    uri: str
    machines: int
    image: str | None
    keep: bool
    name: str
    network_cidr: str | None
    domain_type: str
    memory_mib: int
    ready_timeout: float
    cleanup_timeout: float
    exit_when_ready: bool
    log_level: str
    vm_only: bool = False
    """--vm-only as given (the test driver implies it: see `real_nodes`)."""
    node_image: str | None = None

    @property
    def real_nodes(self) -> bool:
        return not self.vm_only and not is_test_driver(self.uri)


class Interrupted(Exception):
    """SIGINT/SIGTERM arrived during a phase that waits."""


class Demo:
    """One demo run: `up()` (set-up, create, live view), then `down()` (always)."""

    def __init__(self, options: DemoOptions, ui: Ui) -> None:
        self.options = options
        self.ui = ui
        self.stop = asyncio.Event()
        """Set by the first SIGINT/SIGTERM."""
        self.hurry = asyncio.Event()
        """Set by a second one: skip waiting for the API-driven clean-up."""
        self.workdir: Path | None = None
        self.plane: ControlPlane | None = None
        self.capi: CapiCore | None = None
        self.image_server: ImageServer | None = None
        self.client: KubeClient | None = None
        self.manager_client: KubeClient | None = None
        self.manager: Manager | None = None
        self.manager_task: asyncio.Task[None] | None = None
        self.hosts: LibvirtHosts | None = None
        self.built: Built | None = None
        self.plan: DemoPlan | None = None
        self.nodes: demo_nodes.RealNodes | None = None
        """Real nodes: the kubeadm bootstrap provider and the workload control plane."""
        self.created = False
        self.ready = False
        self.failures: list[str] = []
        self.leftovers = False
        """Objects of the demo cluster could not be removed from the host."""
        self.log_file: Any = None

    @property
    def kubeconfig(self) -> Path:
        """The admin kubeconfig of the demo's control plane (a copy at a short path)."""
        assert self.workdir is not None
        return self.workdir / "kubeconfig"

    # -- signals ----------------------------------------------------------------------------

    def signalled(self, signum: int) -> None:
        name = signal.Signals(signum).name
        if not self.stop.is_set():
            self.ui.say(f"\n{name}: stopping the demo and removing everything it created")
            self.stop.set()
        else:
            self.ui.warn(
                f"{name} again: not waiting for capl any longer; removing what is left "
                "directly (domains, volumes, network, pool), then stopping the processes"
            )
            self.hurry.set()

    async def _sleep(self, seconds: float) -> None:
        """Sleep, but raise Interrupted as soon as the demo is asked to stop."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stop.wait(), timeout=seconds)
        if self.stop.is_set():
            raise Interrupted

    # -- set-up -----------------------------------------------------------------------------

    async def up(self) -> None:
        opts = self.options
        node_image = None
        if opts.real_nodes:
            node_image = demo_nodes.node_image_for(
                opts.uri, image=opts.image, node_image=opts.node_image, cache=_cache_dir()
            )
        image_path, image_url = (None, None) if opts.real_nodes else self._image_source()
        assets = find_control_plane_assets()
        capi_assets = find_capi_assets()
        parts = None
        if node_image is not None:
            parts = demo_nodes.NodeParts.find(
                image=node_image, envtest=assets.directory, capi=capi_assets, cache=_cache_dir()
            )
        elif is_test_driver(opts.uri) and not opts.vm_only:
            self.ui.say(
                "the libvirt test driver boots no guests, so no real nodes: VM-only mode "
                "(as with --vm-only)"
            )
        await sweep_stale(self.ui)
        self._check_no_other_demo()

        self.workdir = Path(tempfile.mkdtemp(prefix=WORKDIR_PREFIX))
        identity = process_identity(os.getpid()) or ""
        _write_state(self.workdir, {"owner": identity, "uri": opts.uri})
        (self.workdir / "logs").mkdir()
        self._configure_logging()
        logs = "logs/, control-plane/logs/, control-plane/capi-core/logs/"
        if opts.real_nodes:
            logs += ", control-plane/capi-kubeadm-bootstrap/logs/, workload/logs/"
        self.ui.say(f"work directory: {self.workdir} (logs: {logs})")

        network_cidr = opts.network_cidr or await self._pick_network()
        server: ImageServer | None = None
        sha256: str | None = None
        if image_url is None and not opts.real_nodes:
            if image_path is not None:
                with self.ui.step(f"Checksumming the base image {image_path}"):
                    sha256 = await asyncio.to_thread(_sha256, image_path)
                server = ImageServer(path=image_path)
            else:
                data = synthetic_qcow2()
                sha256 = hashlib.sha256(data).hexdigest()
                server = ImageServer(path=None, data=data)
            await server.start()
            self.image_server = server
            image_url = server.url
        self.plan = DemoPlan(
            name=opts.name,
            uri=opts.uri,
            machines=opts.machines,
            image_url=image_url or "",
            image_sha256=sha256,
            cidr=network_cidr,
            pool_path=str(self.workdir / "pool"),
            domain_type=opts.domain_type,
            memory_mib=opts.memory_mib,
            **(await parts.plan_values() if parts is not None else {}),
        )
        network, pool = layout_names(self.plan)
        _write_state(
            self.workdir,
            {
                "owner": identity,
                "uri": opts.uri,
                "namespace": self.plan.namespace,
                "cluster": self.plan.name,
                "network": network,
                "pool": pool,
            },
        )

        from capl.testbed import ControlPlane
        from capl.testbed.capi import CapiCore

        self.plane = ControlPlane(assets=assets, workdir=self.workdir / "control-plane")
        with self.ui.step("Starting a local control plane (etcd + kube-apiserver)"):
            await self._cancellable(self.plane.start())
        shutil.copyfile(self.plane.kubeconfig, self.kubeconfig)
        self.kubeconfig.chmod(0o600)
        crd_dir = self.workdir / "crds"
        _write_crds(crd_dir)
        crds = "capl's CRDs"
        if opts.real_nodes:
            demo_nodes.write_testbed_manifests(crd_dir)
            crds += " and the TestbedControlPlane CRD"
        with self.ui.step(f"Installing {crds}"):
            await self._cancellable(self.plane.install_crds(crd_dir))
        self.capi = CapiCore(plane=self.plane, capi=capi_assets)
        with self.ui.step(f"Starting the Cluster API core manager {capi_assets.version}"):
            await self._cancellable(self.capi.start())
        if parts is not None:
            self.nodes = demo_nodes.RealNodes(
                plan=self.plan, workdir=self.workdir, parts=parts, plane=self.plane
            )
            await self.nodes.start_bootstrap_provider(self.ui, run=self._cancellable)
        self.ui.say("processes: " + ", ".join(self._processes()))

        with self.ui.step("Starting capl's manager (in this process)"):
            await self._cancellable(self._start_manager())
        if self.nodes is not None:
            assert self.client is not None
            self.created = True  # from the first object on (the clean-up tolerates NotFound)
            await self.nodes.create(self.client, self.ui, run=self._cancellable)
        else:
            with self.ui.step(
                f"Creating the demo cluster {self.plan.name!r} on {opts.uri} "
                f"(isolated network {self.plan.cidr}, {self.plan.machines} machines)"
            ):
                await self._cancellable(self._create())
        await self._watch()

    def _image_source(self) -> tuple[Path | None, str | None]:
        """(local file, URL): exactly one, or neither on the test driver (synthetic)."""
        image = self.options.image or os.environ.get("CAPL_GUEST_IMAGE") or None
        if image is None and is_test_driver(self.options.uri):
            return None, None
        if image is None:
            cached = sorted(
                _cache_dir().glob("guest/*/capl-guest.qcow2"), key=lambda p: p.stat().st_mtime
            )
            image = str(cached[-1]) if cached else None
        if image is None:
            raise CliError(
                "no guest image: pass --image PATH|URL (`make guest-image` builds the test "
                "guest and prints its path; `make demo` passes it for you)",
                code=EXIT_USAGE,
            )
        if re.match(r"^https?://", image):
            return None, image
        path = Path(image).expanduser().resolve()
        if not path.is_file():
            raise CliError(f"--image {image}: no such file", code=EXIT_USAGE)
        return path, None

    def _check_no_other_demo(self) -> None:
        if is_test_driver(self.options.uri):
            return
        for workdir, state, alive in other_demos():
            if (
                alive
                and state.get("uri") == self.options.uri
                and state.get("cluster") == self.options.name
            ):
                pid = str(state.get("owner", "")).split(" ", 1)[0]
                raise CliError(
                    f"another capl demo (pid {pid}, {workdir}) runs cluster "
                    f"{self.options.name!r} on {self.options.uri}: stop it, or pass --name"
                )

    def _configure_logging(self) -> None:
        from capl.runtime.logging import configure_logging

        assert self.workdir is not None
        self.log_file = (self.workdir / "logs" / "capl-manager.log").open("a", buffering=1)
        configure_logging(level=self.options.log_level, format="json", stream=self.log_file)

    async def _cancellable(self, work: Any) -> Any:
        """Run ``work``; cancel it and raise Interrupted when the demo is asked to stop."""
        task = asyncio.ensure_future(work)
        stopper = asyncio.ensure_future(self.stop.wait())
        try:
            await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopper.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
            raise Interrupted
        return task.result()

    async def _pick_network(self) -> str:
        """A /24 that overlaps no libvirt network on the host (and no local route)."""
        from capl.ports.errors import VirtError
        from capl.virt import LibvirtHosts

        hosts = LibvirtHosts()
        try:
            host = hosts.get(uri=self.options.uri)
            try:
                info = await host.info()
                taken = await host.connection.run("list networks", _network_cidrs)
            except VirtError as exc:
                raise CliError(
                    f"cannot reach the libvirt host {self.options.uri}: {exc} (on this machine: "
                    "`make libvirt-host` starts libvirtd)",
                    code=EXIT_UNREACHABLE,
                ) from None
        finally:
            await hosts.close()
        offered = info.domain_types or (self.options.domain_type,)
        if (
            not is_test_driver(self.options.uri)
            and self.options.domain_type != "auto"
            and self.options.domain_type not in offered
        ):
            raise CliError(
                f"{self.options.uri} offers domain types {', '.join(info.domain_types)}, not "
                f"{self.options.domain_type} (--domain-type)",
                code=EXIT_USAGE,
            )
        if is_local_uri(self.options.uri) and not is_test_driver(self.options.uri):
            with contextlib.suppress(OSError):
                taken += local_routes(await asyncio.to_thread(Path("/proc/net/route").read_text))
        return pick_cidr(taken)

    def _processes(self) -> list[str]:
        found = []
        if self.plane is not None:
            for proc in (self.plane.etcd_process, self.plane.apiserver_process):
                if proc is not None and proc.pid is not None:
                    found.append(f"{proc.name} pid {proc.pid}")
        if self.capi is not None and self.capi.process is not None:
            found.append(f"{self.capi.process.name} pid {self.capi.process.pid}")
        if self.nodes is not None:
            found += self.nodes.processes()
        return found

    async def _start_manager(self) -> None:
        from capl.controllers.libvirtcluster import LibvirtClusterOptions
        from capl.controllers.libvirtmachine import MachineOptions
        from capl.kube.client import KubeClient
        from capl.manager import ProviderOptions, build
        from capl.runtime.manager import ManagerOptions

        assert self.plane is not None
        kubeconfig = str(self.plane.kubeconfig)
        options = ProviderOptions(
            manager=ManagerOptions(
                metrics_bind_address="127.0.0.1:0",
                health_probe_bind_address="0",
                namespace=DEFAULT_NAMESPACE,
                handle_signals=False,
                graceful_shutdown_timeout=5.0,
            ),
            kubeconfig=kubeconfig,
            webhook_port=0,
            log_level=self.options.log_level,
            log_format="json",
            machine=MachineOptions(
                shutdown_timeout=20.0, shutdown_poll=1.0, address_poll=1.0, node_poll=2.0
            ),
            cluster=LibvirtClusterOptions(health_interval=30.0, unreachable_retry=10.0),
        )
        self.client = await KubeClient.connect(kubeconfig, user_agent="capl-demo")
        self.manager_client = await KubeClient.connect(kubeconfig)
        built = build(options, self.manager_client)
        self.built = built
        manager, self.hosts = built.manager, built.hosts
        self.manager = manager
        self.manager_task = asyncio.create_task(manager.run(), name="capl-manager")
        deadline = time.monotonic() + 60
        while not manager.ready:
            if self.manager_task.done():
                self.manager_task.result()
                raise CliError("capl's manager stopped during start-up (see its log)")
            if time.monotonic() > deadline:
                raise CliError("capl's manager did not sync its caches within 60 s")
            await asyncio.sleep(0.1)

    async def _create(self) -> None:
        assert self.client is not None
        assert self.plan is not None
        for obj in demo_objects(self.plan):
            await self.client.resource(resource_of(obj)).create(obj)
            self.created = True

    # -- the live view --------------------------------------------------------------------

    def _metrics_url(self) -> str | None:
        port = getattr(self.manager, "metrics_port", None)
        return f"http://127.0.0.1:{port}/metrics" if port else None

    async def _report(self) -> StatusReport:
        from capl.commands.status_report import collect

        assert self.client is not None
        assert self.plan is not None
        return await collect(self.client, namespace=self.plan.namespace, cluster=self.plan.name)

    def _caption(self, tracker: Tracker, report: StatusReport) -> str:
        parts = [ready_line(tracker.ready, tracker.expected, nodes=tracker.nodes)]
        for cluster in report.clusters:
            if cluster.ready != "True":
                parts.append(f"LibvirtCluster Ready={cluster.ready or '-'}")
                detail = _condition_detail(report, "LibvirtCluster", cluster.libvirt_cluster or "")
                if detail:
                    parts.append(detail)
        if self.image_server is not None and self.image_server.sent < self.image_server.size:
            parts.append(self.image_server.progress())
        parts.append("Ctrl-C stops and cleans up")
        return " · ".join(parts)

    async def _watch(self) -> None:
        assert self.plan is not None
        assert self.plane is not None
        plan = self.plan
        tracker = Tracker(cluster=plan.name, expected=plan.machines, nodes=plan.real_nodes)
        deadline = time.monotonic() + self.options.ready_timeout
        title = f"capl demo: cluster {plan.name} on {plan.uri} ({plan.machines} machines)"
        if self.nodes is not None:
            title = (
                f"capl demo: cluster {plan.name} on {plan.uri} ({plan.machines} worker "
                f"machines; control plane on this machine, {self.nodes.endpoint})"
            )
        report: StatusReport | None = None
        with self.ui.live(title, nodes=plan.real_nodes) as view:
            while True:
                report = await self._update(tracker)
                view.show(tracker.rows, self._caption(tracker, report))
                if tracker.all_ready or time.monotonic() > deadline:
                    break
                await self._sleep(_POLL)
        if not tracker.all_ready:
            from capl.commands.status import render_plain

            self.ui.say(render_plain(report))
            done = "machines with a Ready Node" if plan.real_nodes else "machines Ready"
            raise CliError(
                f"{tracker.ready} of {plan.machines} {done} after "
                f"{self.options.ready_timeout:.0f} s (--ready-timeout); the conditions above "
                "say what they wait for"
            )
        self.ready = True
        self.ui.say(ready_line(tracker.ready, plan.machines, nodes=plan.real_nodes))
        self.ui.say("")
        kubectl = _command("kubectl", self.plane.assets.kubectl)
        workload_kubeconfig = None
        if self.nodes is not None:
            workload_kubeconfig = str(self.nodes.kubeconfig)
            self.ui.say(
                f"The workload cluster (its control plane runs on this machine, "
                f"{self.nodes.endpoint}):\n  {kubectl} --kubeconfig {workload_kubeconfig} "
                "get nodes\n"
            )
        self.ui.say(
            next_steps(
                plan=plan,
                kubeconfig=str(self.kubeconfig),
                kubectl=kubectl,
                capl=_command("capl", Path(sys.argv[0])),
                metrics_url=self._metrics_url(),
                workload_kubeconfig=workload_kubeconfig,
                console_machine=tracker.rows[0].name if plan.real_nodes else None,
            )
        )
        if self.options.exit_when_ready:
            return
        await self._follow(tracker)

    async def _update(self, tracker: Tracker) -> StatusReport:
        """One poll: the status report, with real nodes also the workload cluster's Nodes."""
        self._check_manager()
        report = await self._report()
        nodes = await self.nodes.nodes() if self.nodes is not None else None
        tracker.update(report, now=time.time(), nodes=nodes)
        return report

    async def _follow(self, tracker: Tracker) -> None:
        """After Ready: a line per change until the demo is stopped."""
        lines = _Lines(self.ui)
        lines.prime(tracker.rows)
        counts = (len(tracker.rows), tracker.ready)
        ready = "with a Ready Node" if tracker.nodes else "Ready"
        with contextlib.suppress(Interrupted):
            while True:
                await self._sleep(2.0)
                await self._update(tracker)
                lines.show(tracker.rows, "")
                now = (len(tracker.rows), tracker.ready)
                if now != counts:
                    counts = now
                    self.ui.say(f"now {now[0]} machines, {now[1]} of them {ready}")

    def _check_manager(self) -> None:
        if self.manager_task is not None and self.manager_task.done():
            exc = self.manager_task.exception() if not self.manager_task.cancelled() else None
            raise CliError(f"capl's manager stopped: {exc!r} (see logs/capl-manager.log)")
        if self.nodes is not None:
            self.nodes.check_running()

    # -- clean-up -----------------------------------------------------------------------------

    async def down(self) -> bool:
        """Remove everything; True when nothing is left. Never raises (reports instead)."""
        if self.workdir is None:  # failed before anything was started
            return True
        ok = True
        if self.created:
            ok &= await self._step_quietly("deleting the demo cluster", self._delete_through_api)
        ok &= await self._step_quietly("stopping capl's manager", self._stop_manager)
        if not await self._step_quietly("checking the libvirt host", self._verify_host):
            ok = False
            self.leftovers = self.leftovers or self.created
        if self.built is not None:
            with contextlib.suppress(Exception):
                await self.built.workload.close()
        if self.hosts is not None:
            with contextlib.suppress(Exception):
                await self.hosts.close()
        for client in (self.client, self.manager_client):
            if client is not None:
                with contextlib.suppress(Exception):
                    await client.close()
        # side by side; the real nodes' parts only after the API-driven deletion (Cluster API
        # drains and deletes the Nodes through the workload control plane)
        ok &= all(await asyncio.gather(self._stop_nodes(), self._stop_capi()))
        if self.plane is not None:
            ok &= await self._step_quietly("stopping the control plane", self.plane.stop)
        if self.image_server is not None:
            await self.image_server.stop()
        still = [p for p in self._processes() if _pid_alive(int(p.rsplit(" ", 1)[1]))]
        if still:
            ok = False
            self.failures.append(f"processes still running: {', '.join(still)}")
        if self.log_file is not None:
            _restore_logging()
            self.log_file.close()
        if self.workdir is not None:
            if self.leftovers:
                # demo.json stays: the next `capl demo` tries again to remove them.
                self.ui.say(f"kept {self.workdir}: the next `capl demo` retries the clean-up")
            elif self.options.keep:
                (self.workdir / STATE_FILE).unlink(missing_ok=True)
                self.ui.say(f"kept the work directory with every log: {self.workdir}")
            else:
                shutil.rmtree(self.workdir, ignore_errors=True)
                if self.workdir.exists():
                    ok = False
                    self.failures.append(f"could not remove {self.workdir}")
        if ok:
            what = "processes stopped"
            if self.plan is not None:
                what = f"nothing of cluster {self.plan.name} is left on {self.plan.uri}; " + what
            if self.workdir is not None and not self.options.keep:
                what += f"; {self.workdir} removed"
            self.ui.say(f"cleaned up: {what}")
        else:
            self.ui.warn("clean-up incomplete: " + "; ".join(self.failures))
        return ok

    async def _stop_nodes(self) -> bool:
        if self.nodes is None:
            return True
        failed = await self.nodes.stop()
        self.failures += failed
        return not failed

    async def _stop_capi(self) -> bool:
        if self.capi is None:
            return True
        return await self._step_quietly("stopping the Cluster API manager", self.capi.stop)

    async def _step_quietly(self, what: str, work: Callable[[], Any]) -> bool:
        try:
            result = await work()
        except Exception as exc:
            self.failures.append(f"{what}: {exc}")
            return False
        return result is not False

    async def _delete_through_api(self) -> bool:
        from capl.runtime.errors import NotFound
        from capl.runtime.objects import ObjectKey
        from capl.runtime.resources import CLUSTER, LIBVIRT_CLUSTER, LIBVIRT_MACHINE, MACHINE

        assert self.client is not None
        assert self.plan is not None
        plan = self.plan
        client = self.client
        key = ObjectKey(plan.namespace, plan.name)
        self.ui.say(
            "Deleting the demo cluster through the API: capl shuts the machines down, removes "
            "their domains, volumes and DHCP/DNS entries, then the network and the pool."
        )
        with self.ui.step("Deleting the demo cluster") as progress:
            if self.nodes is not None:  # a paused Cluster is not deleted
                with contextlib.suppress(NotFound):
                    await self.nodes.resume(client)
            targets = [(machine_deployment(), name) for name in plan.deployments]
            if not plan.real_nodes:
                targets.append((MACHINE, plan.control_plane_machine))
            for resource, name in [*targets, (CLUSTER, plan.name)]:
                with contextlib.suppress(NotFound):
                    await client.resource(resource).delete(ObjectKey(plan.namespace, name))
            deadline = time.monotonic() + self.options.cleanup_timeout
            while True:
                machines = await client.resource(LIBVIRT_MACHINE).list(
                    namespace=plan.namespace, label_selector=f"{CLUSTER_NAME_LABEL}={plan.name}"
                )
                remaining = [f"{len(machines.items)} machine(s)"] if machines.items else []
                orphans = [(LIBVIRT_MACHINE, m) for m in machines.items if _orphan(m)]
                for resource in (LIBVIRT_CLUSTER, CLUSTER):
                    with contextlib.suppress(NotFound):
                        obj = await client.resource(resource).get(key)
                        remaining.append(resource.kind)
                        if resource is LIBVIRT_CLUSTER and _orphan(obj):
                            orphans.append((resource, obj))
                # Objects Cluster API had not adopted yet (the demo was stopped right after
                # creating them) have no owner that would delete them: delete them directly.
                for resource, obj in orphans:
                    with contextlib.suppress(NotFound):
                        await client.resource(resource).delete(
                            ObjectKey(plan.namespace, obj["metadata"]["name"])
                        )
                if not remaining:
                    return True
                progress("waiting for " + ", ".join(remaining))
                if self.hurry.is_set():
                    self.failures.append("the API-driven clean-up was cut short (second Ctrl-C)")
                    return True  # the forced clean-up below still runs
                if time.monotonic() > deadline:
                    self.ui.warn(
                        f"capl did not finish within {self.options.cleanup_timeout:.0f} s "
                        f"(--cleanup-timeout): still {', '.join(remaining)}"
                    )
                    return True
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.hurry.wait(), timeout=_POLL)

    async def _stop_manager(self) -> None:
        if self.manager is None or self.manager_task is None:
            return
        self.manager.stop()
        try:
            await asyncio.wait_for(asyncio.shield(self.manager_task), timeout=30)
        except TimeoutError:
            self.manager_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.manager_task
        except Exception:  # a crashed manager was reported already
            pass

    async def _verify_host(self) -> bool:
        """Nothing of the demo cluster may be left; force-remove (and say so) what is."""
        if self.plan is None or not self.created:
            return True
        from capl.virt import LibvirtHosts

        plan = self.plan
        network, pool = layout_names(plan)
        hosts = self.hosts or LibvirtHosts()
        self.hosts = hosts
        host = hosts.get(uri=plan.uri)
        names = {"namespace": plan.namespace, "cluster": plan.name, "network": network}
        left = await find_leftovers(host, **names, pool=pool)
        if left.empty:
            return True
        self.ui.warn(f"capl did not remove everything; removing it directly: {left.describe()}")
        left = await force_clean(host, **names, pool=pool)
        if not left.empty:
            self.leftovers = True
            self.failures.append(f"left on {plan.uri}: {left.describe()}")
            return False
        self.ui.say(f"force-removed what capl left of cluster {plan.name} on {plan.uri}")
        return True


def _orphan(obj: Mapping[str, Any]) -> bool:
    """An object with no owner that nobody is deleting yet."""
    meta = obj.get("metadata") or {}
    return not meta.get("ownerReferences") and not meta.get("deletionTimestamp")


def _network_cidrs(conn: Any) -> list[ipaddress.IPv4Network]:
    """Runs in the libvirt worker thread: the CIDR of every network on the host."""
    from capl.virt.networkxml import parse_network_xml

    cidrs = []
    for network in conn.listAllNetworks(0):
        with contextlib.suppress(Exception):
            info = parse_network_xml(
                network.XMLDesc(0), active=False, persistent=True, autostart=False
            )
            if info.cidr:
                cidrs.append(ipaddress.IPv4Network(info.cidr, strict=False))
    return cidrs


def _write_crds(directory: Path) -> None:
    from capl.api.crdgen import crd, dump
    from capl.api.kinds import KINDS

    directory.mkdir(parents=True, exist_ok=True)
    for info in KINDS:
        (directory / f"{info.crd_name}.yaml").write_text(dump(crd(info)))


def _command(name: str, fallback: Path) -> str:
    """``name`` when it is on PATH (and the same program), else the full path."""
    found = shutil.which(name)
    if found and (fallback.name != name or Path(found).resolve() == fallback.resolve()):
        return name
    return str(fallback.resolve()) if fallback.exists() else name


def _pid_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _restore_logging() -> None:
    from capl.runtime.logging import configure_logging

    with contextlib.suppress(Exception):
        configure_logging(level="warning", format="console", stream=sys.stderr)


# --- the command ---------------------------------------------------------------------------------


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


def register(sub: Any) -> None:
    p = sub.add_parser(
        "demo",
        help="a demo cluster of real Kubernetes nodes on this machine, removed on Ctrl-C",
        formatter_class=formatter,
        description=(
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
        ),
        epilog=(
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
        ),
    )
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
        help=f"memory per machine ({demo_nodes.WORKER_MEMORY_MIB}; --vm-only: 256)",
    )
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
    p.set_defaults(run=run)


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
        memory_mib=pick(args.memory_mib, demo_nodes.WORKER_MEMORY_MIB, 256),
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
