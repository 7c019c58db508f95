"""What one demo run has started: the state that set-up fills in and clean-up takes apart.

``DemoState`` holds every part (work directory, control plane, Cluster API manager, image
server, API clients, capl's manager and its task, libvirt hosts, real nodes) as None until
it is started, the signals' events (``stop``, ``hurry``) and what happened (``created``,
``ready``, ``failures``, ``leftovers``). ``capl.commands.demo.lifecycle.Demo`` starts the
parts; ``capl.commands.demo.cleanup.Cleanup`` stops and removes them, whichever were started.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from capl.commands.demo.image_server import ImageServer
    from capl.commands.demo.plan import DemoOptions, DemoPlan
    from capl.commands.demo.real_nodes import RealNodes
    from capl.commands.demo.ui import Ui
    from capl.kube.client import KubeClient
    from capl.manager import Built
    from capl.runtime.manager import Manager
    from capl.testbed import ControlPlane
    from capl.testbed.capi import CapiCore
    from capl.virt import LibvirtHosts

__all__ = ["POLL", "DemoState"]

POLL = 1.0
"""Seconds between two looks at the API server while the demo waits."""


class DemoState:
    """The parts of one demo run (see the module docstring)."""

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
        self.nodes: RealNodes | None = None
        """Real nodes: the kubeadm bootstrap provider and the workload control plane."""
        self.created = False
        self.ready = False
        self.failures: list[str] = []
        self.leftovers = False
        """Objects of the demo cluster could not be removed from the host."""
        self.log_file: TextIO | None = None
        """capl manager's log (logs/capl-manager.log), while the demo runs."""

    @property
    def kubeconfig(self) -> Path:
        """The admin kubeconfig of the demo's control plane (a copy at a short path)."""
        assert self.workdir is not None
        return self.workdir / "kubeconfig"

    def processes(self) -> list[str]:
        """Every process started, as "<name> pid <pid>"."""
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
