"""Clean-up: removes everything a demo created, whichever parts of it were started.

In this order: delete the Cluster, MachineDeployment(s) and Machines through the API and
wait (``--cleanup-timeout``) until capl has shut the domains down and removed domains,
volumes, DHCP/DNS entries, network and pool (objects Cluster API had not adopted yet are
deleted directly); stop capl's manager; check in the control plane's audit log that none of
its requests was refused by its role (it runs as deployed, under config/rbac's roles); look
at the host through the libvirt port and
force-remove whatever of *this* demo cluster is still there (``capl.commands.demo.leftovers``)
and say so; stop the kubeadm bootstrap provider and the workload control plane (after the
deletion: Cluster API drains and deletes Nodes through it), the Cluster API manager and the
control plane; remove the work directory (``--keep`` keeps it, with every log; leftovers on
the host keep it too, so the next demo retries). A second Ctrl-C during clean-up skips the
wait and goes straight to the forced removal; nothing is abandoned.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

from capl.commands.demo.leftovers import find_leftovers, force_clean
from capl.commands.demo.objects import layout_names, machine_deployment
from capl.commands.demo.plan import CLUSTER_NAME_LABEL
from capl.commands.demo.state import POLL, DemoState
from capl.commands.demo.workdirs import STATE_FILE, pid_alive

__all__ = ["Cleanup"]


class Cleanup:
    """Takes apart what ``demo`` started; ``run`` once, after set-up ended in any way."""

    def __init__(self, demo: DemoState) -> None:
        self.demo = demo

    def _manager_requests_granted(self) -> bool:
        """The manager ran as deployed (config/rbac's roles): none of its requests may have
        been refused (the control plane's audit log)."""
        from capl.testbed.identities import refused_requests

        refused = refused_requests()
        if refused:
            self.demo.failures.append(
                "requests of capl's manager refused by its role:\n  " + "\n  ".join(refused)
            )
        return not refused

    async def run(self) -> bool:
        """Remove everything; True when nothing is left. Never raises (reports instead)."""
        if self.demo.workdir is None:  # failed before anything was started
            return True
        ok = True
        if self.demo.created:
            ok &= await self._step_quietly("deleting the demo cluster", self._delete_through_api)
        ok &= await self._step_quietly("stopping capl's manager", self._stop_manager)
        ok &= self._manager_requests_granted()
        if not await self._step_quietly("checking the libvirt host", self._verify_host):
            ok = False
            self.demo.leftovers = self.demo.leftovers or self.demo.created
        if self.demo.built is not None:
            with contextlib.suppress(Exception):
                await self.demo.built.workload.close()
        if self.demo.hosts is not None:
            with contextlib.suppress(Exception):
                await self.demo.hosts.close()
        for client in (self.demo.client, self.demo.manager_client):
            if client is not None:
                with contextlib.suppress(Exception):
                    await client.close()
        # side by side; the real nodes' parts only after the API-driven deletion (Cluster API
        # drains and deletes the Nodes through the workload control plane)
        ok &= all(await asyncio.gather(self._stop_nodes(), self._stop_capi()))
        if self.demo.plane is not None:
            ok &= await self._step_quietly("stopping the control plane", self.demo.plane.stop)
        if self.demo.image_server is not None:
            await self.demo.image_server.stop()
        still = [p for p in self.demo.processes() if pid_alive(int(p.rsplit(" ", 1)[1]))]
        if still:
            ok = False
            self.demo.failures.append(f"processes still running: {', '.join(still)}")
        if self.demo.log_file is not None:
            _restore_logging()
            self.demo.log_file.close()
        if self.demo.workdir is not None:
            if self.demo.leftovers:
                # demo.json stays: the next `capl demo` tries again to remove them.
                self.demo.ui.say(
                    f"kept {self.demo.workdir}: the next `capl demo` retries the clean-up"
                )
            elif self.demo.options.keep:
                (self.demo.workdir / STATE_FILE).unlink(missing_ok=True)
                self.demo.ui.say(f"kept the work directory with every log: {self.demo.workdir}")
            else:
                shutil.rmtree(self.demo.workdir, ignore_errors=True)
                if self.demo.workdir.exists():
                    ok = False
                    self.demo.failures.append(f"could not remove {self.demo.workdir}")
        if ok:
            what = "processes stopped"
            if self.demo.plan is not None:
                what = (
                    f"nothing of cluster {self.demo.plan.name} is left on {self.demo.plan.uri}; "
                    + what
                )
            if self.demo.workdir is not None and not self.demo.options.keep:
                what += f"; {self.demo.workdir} removed"
            self.demo.ui.say(f"cleaned up: {what}")
        else:
            self.demo.ui.warn("clean-up incomplete: " + "; ".join(self.demo.failures))
        return ok

    async def _stop_nodes(self) -> bool:
        if self.demo.nodes is None:
            return True
        failed = await self.demo.nodes.stop()
        self.demo.failures += failed
        return not failed

    async def _stop_capi(self) -> bool:
        if self.demo.capi is None:
            return True
        return await self._step_quietly("stopping the Cluster API manager", self.demo.capi.stop)

    async def _step_quietly(self, what: str, work: Callable[[], Any]) -> bool:
        try:
            result = await work()
        except Exception as exc:
            self.demo.failures.append(f"{what}: {exc}")
            return False
        return result is not False

    async def _delete_through_api(self) -> bool:
        from capl.runtime.errors import NotFound
        from capl.runtime.objects import ObjectKey
        from capl.runtime.resources import CLUSTER, LIBVIRT_CLUSTER, LIBVIRT_MACHINE, MACHINE

        assert self.demo.client is not None
        assert self.demo.plan is not None
        plan = self.demo.plan
        client = self.demo.client
        key = ObjectKey(plan.namespace, plan.name)
        self.demo.ui.say(
            "Deleting the demo cluster through the API: capl shuts the machines down, removes "
            "their domains, volumes and DHCP/DNS entries, then the network and the pool."
        )
        with self.demo.ui.step("Deleting the demo cluster") as progress:
            if self.demo.nodes is not None:  # a paused Cluster is not deleted
                with contextlib.suppress(NotFound):
                    await self.demo.nodes.resume(client)
            targets = [(machine_deployment(), name) for name in plan.deployments]
            if not plan.real_nodes:
                targets.append((MACHINE, plan.control_plane_machine))
            for resource, name in [*targets, (CLUSTER, plan.name)]:
                with contextlib.suppress(NotFound):
                    await client.resource(resource).delete(ObjectKey(plan.namespace, name))
            deadline = time.monotonic() + self.demo.options.cleanup_timeout
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
                if self.demo.hurry.is_set():
                    self.demo.failures.append(
                        "the API-driven clean-up was cut short (second Ctrl-C)"
                    )
                    return True  # the forced clean-up below still runs
                if time.monotonic() > deadline:
                    self.demo.ui.warn(
                        f"capl did not finish within {self.demo.options.cleanup_timeout:.0f} s "
                        f"(--cleanup-timeout): still {', '.join(remaining)}"
                    )
                    return True
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.demo.hurry.wait(), timeout=POLL)

    async def _stop_manager(self) -> None:
        if self.demo.manager is None or self.demo.manager_task is None:
            return
        self.demo.manager.stop()
        try:
            await asyncio.wait_for(asyncio.shield(self.demo.manager_task), timeout=30)
        except TimeoutError:
            self.demo.manager_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.demo.manager_task
        except Exception:  # a crashed manager was reported already
            pass

    async def _verify_host(self) -> bool:
        """Nothing of the demo cluster may be left; force-remove (and say so) what is."""
        if self.demo.plan is None or not self.demo.created:
            return True
        from capl.virt import LibvirtHosts

        plan = self.demo.plan
        network, pool = layout_names(plan)
        hosts = self.demo.hosts or LibvirtHosts()
        self.demo.hosts = hosts
        host = hosts.get(uri=plan.uri)
        names = {"namespace": plan.namespace, "cluster": plan.name, "network": network}
        left = await find_leftovers(host, **names, pool=pool)
        if left.empty:
            return True
        self.demo.ui.warn(
            f"capl did not remove everything; removing it directly: {left.describe()}"
        )
        left = await force_clean(host, **names, pool=pool)
        if not left.empty:
            self.demo.leftovers = True
            self.demo.failures.append(f"left on {plan.uri}: {left.describe()}")
            return False
        self.demo.ui.say(f"force-removed what capl left of cluster {plan.name} on {plan.uri}")
        return True


def _orphan(obj: Mapping[str, Any]) -> bool:
    """An object with no owner that nobody is deleting yet."""
    meta = obj.get("metadata") or {}
    return not meta.get("ownerReferences") and not meta.get("deletionTimestamp")


def _restore_logging() -> None:
    from capl.runtime.logging import configure_logging

    with contextlib.suppress(Exception):
        configure_logging(level="warning", format="console", stream=sys.stderr)
