"""A minimal controller-manager process for tests and benchmarks (not a test module).

    python -m tests.controllers.manager_proc --kubeconfig K --namespace NS \
        [--controllers libvirtmachine[,libvirtcluster]] [--machine-option name=value ...]

Runs a `capl.runtime.Manager` with the real adapters (KubeClient, LibvirtHosts,
KubeWorkloadClusters) and the named controllers' `setup` functions, in one namespace, until
SIGTERM. The crash-consistency test starts it with `CAPL_FAULT=<step>` (see
capl.controllers.machine_plan.FAULT_STEPS) and restarts it without. It stands in for
`capl manager` until that exists; it is deliberately small.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib
import sys

from capl.controllers import libvirtmachine
from capl.controllers.common import Deps
from capl.kube import KubeClient
from capl.kube.workload import KubeWorkloadClusters
from capl.runtime.logging import configure_logging
from capl.runtime.manager import Manager, ManagerOptions
from capl.virt import LibvirtHosts


def _machine_options(pairs: list[str]) -> libvirtmachine.MachineOptions:
    values: dict[str, float] = {}
    known = {f.name for f in dataclasses.fields(libvirtmachine.MachineOptions)}
    for pair in pairs:
        name, _, value = pair.partition("=")
        if name not in known:
            raise SystemExit(f"unknown machine option {name!r} (known: {', '.join(sorted(known))})")
        values[name] = float(value)
    return libvirtmachine.MachineOptions(**values)  # type: ignore[arg-type]


async def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--controllers", default="libvirtmachine")
    parser.add_argument("--machine-option", action="append", default=[])
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args(argv)
    configure_logging(level=args.log_level, format="json")
    client = await KubeClient.connect(args.kubeconfig)
    hosts = LibvirtHosts()
    workload = KubeWorkloadClusters()
    try:
        manager = Manager(
            ManagerOptions(
                namespace=args.namespace,
                metrics_bind_address="0",
                health_probe_bind_address="0",
                concurrency=args.concurrency,
                graceful_shutdown_timeout=5.0,
            ),
            client,
        )
        deps = Deps(
            cache=manager.cache,
            client=client,
            recorder=manager.recorder,
            hosts=hosts,
            workload=workload,
            clock=manager.clock,
        )
        for name in args.controllers.split(","):
            if name == "libvirtmachine":
                libvirtmachine.setup(manager, deps, options=_machine_options(args.machine_option))
            else:
                module = importlib.import_module(f"capl.controllers.{name}")
                module.setup(manager, deps)
        await manager.run()
    finally:
        await hosts.close()
        await workload.close()
        await client.close()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
