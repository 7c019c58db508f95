"""A tiny manager process for the two-process leader-election test (not a test module).

    python -m tests.kube.runtime_manager_proc --kubeconfig K --namespace NS --identity ID \
        --intervals FILE [--lease-duration 10 --renew-deadline 7 --retry-period 1.5]

Runs a Manager with leader election and the Toy reconciler (status.by = identity) in one
namespace; every reconcile appends a JSON line {"id", "start", "end", "key"} to FILE.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from capl.kube import KubeClient
from capl.runtime.logging import configure_logging
from capl.runtime.manager import Manager, ManagerOptions
from capl.runtime.objects import ObjectKey
from capl.testing.toy import TOY, ToyReconciler


class LoggingToy(ToyReconciler):
    def __init__(self, *args: Any, path: Path, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.path = path

    async def reconcile(self, key: ObjectKey) -> Any:
        try:
            return await super().reconcile(key)
        finally:
            start, end = self.intervals[-1]
            with self.path.open("a") as f:
                line = {"id": self.identity, "start": start, "end": end, "key": str(key)}
                f.write(json.dumps(line) + "\n")


async def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--namespace", required=True)
    p.add_argument("--identity", required=True)
    p.add_argument("--intervals", required=True, type=Path)
    p.add_argument("--lease-duration", type=float, default=15.0)
    p.add_argument("--renew-deadline", type=float, default=10.0)
    p.add_argument("--retry-period", type=float, default=2.0)
    args = p.parse_args(argv)
    configure_logging(level="info", format="json")
    client = await KubeClient.connect(args.kubeconfig)
    try:
        manager = Manager(
            ManagerOptions(
                leader_elect=True,
                leader_election_id="toy-leader",
                leader_election_namespace=args.namespace,
                identity=args.identity,
                lease_duration=args.lease_duration,
                renew_deadline=args.renew_deadline,
                retry_period=args.retry_period,
                namespace=args.namespace,
                metrics_bind_address="0",
                health_probe_bind_address="0",
                graceful_shutdown_timeout=5,
            ),
            client,
        )
        reconciler = LoggingToy(manager.cache, client, identity=args.identity, path=args.intervals)
        manager.add_controller("toy", for_=TOY, reconciler=reconciler, concurrency=4)
        await manager.run()
    finally:
        await client.close()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
