"""The e2e workload clusters.

Workload cluster (`WorkloadCluster`, `create_workload_cluster`)
    `clusterctl generate cluster --flavor testbed` (templates/cluster-template-testbed.yaml:
    Cluster without controlPlaneRef, LibvirtCluster on qemu:///system with an isolated
    network, one stand-alone control-plane Machine, MachineDeployments `md-ignition` and
    `md-cloud-config`), applied server-side, plus the bootstrap Secrets the flavor names
    (owned by the Cluster, so `clusterctl move` carries them): an Ignition config with a
    hostname for the control plane, an Ignition config shared by the md-ignition workers, a
    #cloud-config shared by the md-cloud-config workers. Guests are the test guest image
    (CAPL_GUEST_IMAGE), TCG, 1 vCPU, 256 MiB.

    `workload_cluster` is the test module's form: made on entry, deleted through Cluster API
    on exit and checked for leftovers (`teardown_cluster`).

Names: libvirt is shared by every test session on the machine (other stages and other
people's runs may be live at the same time), so every e2e namespace carries a random suffix
and every libvirt name capl derives from it (domains `capl-<namespace>-...`, network and pool
`capl-<namespace>.<cluster>`) is unique to the run; cleanup only ever touches those names.
"""

from __future__ import annotations

import contextlib
import secrets
import statistics
import time
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from capl.api.defaults import derived_name
from capl.kube import KubeClient
from capl.ports.naming import machine_names
from capl.runtime.errors import NotFound
from capl.runtime.objects import Obj, ObjectKey
from capl.runtime.resources import (
    CAPI_GROUP,
    CLUSTER,
    LIBVIRT_CLUSTER,
    LIBVIRT_MACHINE,
    MACHINE,
    SECRET,
    Resource,
)
from capl.testbed import ControlPlane
from capl.testing.objects import condition_of
from tests.e2e.harness.common import (
    CLUSTER_NAME_LABEL,
    DEPLOYMENT_NAME_LABEL,
    FLAVOR,
    GUEST_MEMORY_MIB,
    KUBERNETES_VERSION,
    MACHINE_DEPLOYMENT,
    b64,
    name_of,
)
from tests.e2e.harness.kubelet import GuestRecord, KubeletStandIn
from tests.e2e.harness.libvirt_view import DomainFacts, LibvirtView
from tests.e2e.harness.management import Management
from tests.fixtures.common import eventually
from tests.fixtures.guest import ignition_config
from tests.fixtures.libvirt_direct import (
    NetworkFacts,
)

# --- the workload cluster --------------------------------------------------------------------


@dataclass
class WorkloadCluster:
    """One workload cluster made from the testbed flavor (see the module docstring)."""

    namespace: str
    name: str
    management: Management
    view: LibvirtView
    kubelet: KubeletStandIn
    network: str
    pool: str
    pool_path: Path
    dns_domain: str
    cidr: str
    secrets: dict[str, bytes]
    """Bootstrap Secret name -> the bootstrap data in it."""
    tokens: list[str]
    """Random strings inside the bootstrap data (must never show up in logs)."""
    created_at: float = field(default_factory=time.monotonic)

    # -- names ------------------------------------------------------------------------------

    @property
    def api(self) -> KubeClient:
        return self.management.api

    @property
    def control_plane_machine(self) -> str:
        return f"{self.name}-control-plane-0"

    @property
    def md_ignition(self) -> str:
        return f"{self.name}-md-ignition"

    @property
    def md_cloud_config(self) -> str:
        return f"{self.name}-md-cloud-config"

    @property
    def domain_prefix(self) -> str:
        """Every domain of this cluster's machines starts with it (namespace is unique)."""
        return f"capl-{self.namespace}-"

    def domain_of(self, machine: str) -> str:
        return machine_names(namespace=self.namespace, name=machine).domain

    def volume_prefix(self, machine: str) -> str:
        return machine_names(namespace=self.namespace, name=machine).prefix + "-"

    # -- Cluster API objects ----------------------------------------------------------------

    async def get(self, resource: Resource, name: str) -> Obj | None:
        try:
            return await self.api.resource(resource).get(ObjectKey(self.namespace, name))
        except NotFound:
            return None

    async def objects(self, resource: Resource, selector: str | None = None) -> list[Obj]:
        listing = await self.api.resource(resource).list(
            namespace=self.namespace, label_selector=selector
        )
        return listing.items

    async def machines(self, deployment: str | None = None) -> dict[str, Obj]:
        """The Cluster's Machines (of one MachineDeployment), by name."""
        selector = f"{CLUSTER_NAME_LABEL}={self.name}"
        if deployment is not None:
            selector += f",{DEPLOYMENT_NAME_LABEL}={deployment}"
        return {name_of(m): m for m in await self.objects(MACHINE, selector)}

    async def scale(self, deployment: str, replicas: int) -> None:
        await self.api.resource(MACHINE_DEPLOYMENT).patch(
            ObjectKey(self.namespace, deployment), {"spec": {"replicas": replicas}}
        )

    async def wait_running(
        self, deployment: str | None, count: int, *, within: float = 300.0, interval: float = 0.5
    ) -> dict[str, Obj]:
        """Until exactly `count` Machines (of `deployment`; None: all of the Cluster) exist,
        none deleting, all in phase Running."""

        async def probe() -> dict[str, Obj] | None:
            machines = await self.machines(deployment)
            if len(machines) != count:
                return None
            for m in machines.values():
                if (m.get("metadata") or {}).get("deletionTimestamp"):
                    return None
                if (m.get("status") or {}).get("phase") != "Running":
                    return None
            return machines

        return await eventually(
            probe,
            within=within,
            what=f"{count} Machines of {deployment or self.name} Running",
            explain=self.explain,
            interval=interval,
        )

    async def wait_gone(self, deployment: str, *, within: float = 180.0) -> None:
        """Until the MachineDeployment has no Machines left."""

        async def probe() -> bool:
            return not await self.machines(deployment)

        await eventually(
            probe, within=within, what=f"no Machines of {deployment}", explain=self.explain
        )

    async def explain(self) -> str:
        """What the Machines, their LibvirtMachines, libvirt and the kubelet look like now."""
        lines = []
        with contextlib.suppress(Exception):
            for name, m in sorted((await self.machines()).items()):
                status = m.get("status") or {}
                lines.append(
                    f"Machine {name}: phase={status.get('phase')} "
                    f"providerID={(m.get('spec') or {}).get('providerID')} "
                    f"nodeRef={(status.get('nodeRef') or {}).get('name')} "
                    f"deleting={bool((m.get('metadata') or {}).get('deletionTimestamp'))}"
                )
            for lm in await self.objects(LIBVIRT_MACHINE):
                ready = condition_of(lm, "Ready")
                lines.append(
                    f"LibvirtMachine {name_of(lm)}: Ready={ready.get('status')} "
                    f"{ready.get('reason')} {str(ready.get('message'))[:200]}"
                )
        with contextlib.suppress(Exception):
            for name, facts in sorted(self.view.domains(self.domain_prefix).items()):
                lines.append(f"domain {name}: {facts.uuid} state={facts.state}")
        for record in self.kubelet.records.values():
            if record.cluster == f"{self.namespace}/{self.name}":
                lines.append(
                    f"guest {record.console_log.name}: marks={sorted(record.marks)} "
                    f"node={record.node}"
                )
        if self.kubelet.errors:
            lines.append(f"kubelet errors: {self.kubelet.errors[-3:]}")
        return "\n".join(lines)

    # -- libvirt ----------------------------------------------------------------------------

    def domains(self) -> dict[str, DomainFacts]:
        return self.view.domains(self.domain_prefix)

    def network_facts(self) -> NetworkFacts | None:
        return self.view.network(self.network)

    def leftovers_of(self, machines: Iterable[str]) -> list[str]:
        """What libvirt still holds of these machines: domains, volumes, DHCP hosts, DNS
        records (empty when nothing)."""
        found: list[str] = []
        names = list(machines)
        domains = self.domains()
        volumes = self.view.volumes(self.pool) or set()
        network = self.network_facts()
        for machine in names:
            domain = self.domain_of(machine)
            if domain in domains:
                found.append(f"domain {domain}")
            prefix = self.volume_prefix(machine)
            found += [f"volume {v}" for v in sorted(volumes) if v.startswith(prefix)]
            if network is not None:
                found += [
                    f"dhcp host {h.name} {h.mac} {h.ip}"
                    for h in network.dhcp_hosts
                    if h.name == machine
                ]
                fqdn = f"{machine}.{self.dns_domain}"
                found += [
                    f"dns {d.ip} {d.hostnames}"
                    for d in network.dns_hosts
                    if fqdn in d.hostnames or machine in d.hostnames
                ]
        return found

    # -- measurements -----------------------------------------------------------------------

    def guest(self, machine: str) -> GuestRecord | None:
        return self.kubelet.record_of(self.namespace, machine)


def guest_summary(records: Sequence[GuestRecord]) -> dict[str, float]:
    """max/mean of the boot-to-lease times of some guests."""
    start = [r.start_to_lease for r in records if r.start_to_lease is not None]
    init = [r.init_to_lease for r in records if r.init_to_lease is not None]
    return {
        "start_to_lease_max": max(start) if start else float("nan"),
        "start_to_lease_mean": statistics.fmean(start) if start else float("nan"),
        "init_to_lease_max": max(init) if init else float("nan"),
    }


def bootstrap_secret(
    *, namespace: str, name: str, cluster: Obj, data: bytes, fmt: str
) -> dict[str, Any]:
    """A bootstrap data Secret owned by the Cluster (so `clusterctl move` carries it)."""
    meta = cluster["metadata"]
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {CLUSTER_NAME_LABEL: meta["name"]},
            "ownerReferences": [
                {
                    "apiVersion": f"{CAPI_GROUP}/v1beta2",
                    "kind": "Cluster",
                    "name": meta["name"],
                    "uid": meta["uid"],
                }
            ],
        },
        "type": "cluster.x-k8s.io/secret",
        "data": {"value": b64(data), "format": b64(fmt.encode())},
    }


async def create_workload_cluster(
    management: Management,
    *,
    namespace: str,
    name: str,
    view: LibvirtView,
    kubelet: KubeletStandIn,
    workload_plane: ControlPlane,
    guest_image: Path,
    uri: str,
    ignition_workers: int = 0,
    cloud_config_workers: int = 0,
) -> WorkloadCluster:
    """Generate the testbed flavor, apply it, create the bootstrap Secrets; the kubelet
    serves the cluster from then on (it creates `<name>-kubeconfig` pointing at
    `workload_plane` when the control-plane Node is up)."""
    try:
        plane = management.plane
        cidr = view.free_cidr()
        await plane.kubectl("create", "namespace", namespace)
        manifest = await management.clusterctl.generate_cluster(
            name,
            kubeconfig=plane.kubeconfig,
            flavor=FLAVOR,
            target_namespace=namespace,
            kubernetes_version=KUBERNETES_VERSION,
            worker_machine_count=ignition_workers,
            variables={
                "LIBVIRT_URI": uri,
                "LIBVIRT_NETWORK_CIDR": cidr,
                "LIBVIRT_IMAGE_PATH": str(guest_image),
                "LIBVIRT_DOMAIN_TYPE": "qemu",
                "LIBVIRT_CPUS": "1",
                "LIBVIRT_MEMORY_MIB": str(GUEST_MEMORY_MIB),
                "LIBVIRT_CLOUD_CONFIG_WORKER_MACHINE_COUNT": str(cloud_config_workers),
            },
        )
        await plane.kubectl(
            "apply", "--server-side", "--field-manager=capl-e2e", "-f", "-",
            stdin=manifest.encode(),
        )  # fmt: skip
        api = management.api
        cluster = await api.resource(CLUSTER).get(ObjectKey(namespace, name))
        lcluster = await api.resource(LIBVIRT_CLUSTER).get(ObjectKey(namespace, name))
        spec = lcluster["spec"]
        # capl's mutating webhook filled in the derived names
        network, pool = spec["network"]["name"], spec["storagePool"]["name"]
        tokens = [secrets.token_hex(12) for _ in range(3)]
        bootstrap = {
            f"{name}-bootstrap-control-plane": (
                ignition_config(
                    hostname=f"{name}-control-plane-0",
                    files={"/etc/capl-e2e-token": tokens[0] + "\n"},
                ),
                "ignition",
            ),
            f"{name}-bootstrap-ignition": (
                ignition_config(files={"/etc/capl-e2e-token": tokens[1] + "\n"}),
                "ignition",
            ),
            f"{name}-bootstrap-cloud-config": (
                f"#cloud-config\nwrite_files:\n  - path: /etc/capl-e2e-token\n"
                f"    content: {tokens[2]}\n".encode(),
                "cloud-config",
            ),
        }
        for secret_name, (data, fmt) in bootstrap.items():
            await api.resource(SECRET).create(
                bootstrap_secret(
                    namespace=namespace, name=secret_name, cluster=cluster, data=data, fmt=fmt
                )
            )
        workload = WorkloadCluster(
            namespace=namespace,
            name=name,
            management=management,
            view=view,
            kubelet=kubelet,
            network=network,
            pool=pool,
            pool_path=Path(spec["storagePool"]["path"]),
            dns_domain=spec["network"]["dnsDomain"],
            cidr=cidr,
            secrets={k: v[0] for k, v in bootstrap.items()},
            tokens=tokens,
        )
        kubelet.watch(
            namespace=namespace,
            name=name,
            pool_path=workload.pool_path,
            network=network,
            control_plane_machines=[workload.control_plane_machine],
            kubeconfig=workload_plane.kubeconfig.read_bytes(),
            management=api,
        )
        return workload
    except BaseException:
        # the module cannot go on: stop capl (it would recreate what is removed under it)
        # and remove what it may have made, by the names the defaults derive
        kubelet.forget(namespace=namespace, name=name)
        await management.capl.stop()
        derived = derived_name(namespace=namespace, name=name)
        view.force_cleanup(domain_prefix=f"capl-{namespace}-", network=derived, pool=derived)
        raise


async def delete_cluster(workload: WorkloadCluster, *, within: float = 240.0) -> float:
    """Delete the Cluster and wait until it is gone; the seconds it took."""
    t0 = time.monotonic()
    with contextlib.suppress(NotFound):
        await workload.api.resource(CLUSTER).delete(ObjectKey(workload.namespace, workload.name))

    async def gone() -> bool:
        return await workload.get(CLUSTER, workload.name) is None

    await eventually(
        gone, within=within, what=f"Cluster {workload.name} deleted", explain=workload.explain
    )
    return time.monotonic() - t0


async def teardown_cluster(workload: WorkloadCluster, *, within: float = 180.0) -> list[str]:
    """After a test module: delete the Cluster through Cluster API if it is still there
    (bounded wait), then stop capl (it would recreate domains deleted under it) and remove
    whatever libvirt still holds of the cluster. Returns what had to be force-removed."""
    with contextlib.suppress(Exception):
        if (
            await workload.get(CLUSTER, workload.name) is not None
            and workload.management.capl.running
        ):
            await delete_cluster(workload, within=within)
    leftovers: list[str] = []
    if (
        workload.domains()
        or workload.view.pool_exists(workload.pool)
        or workload.network_facts() is not None
    ):
        await workload.management.capl.stop()
        leftovers = workload.view.force_cleanup(
            domain_prefix=workload.domain_prefix, network=workload.network, pool=workload.pool
        )
    workload.kubelet.forget(namespace=workload.namespace, name=workload.name)
    return leftovers


@contextlib.asynccontextmanager
async def workload_cluster(
    management: Management,
    *,
    namespace: str,
    name: str,
    kubelet: KubeletStandIn,
    guest_image: Path,
    uri: str,
    workload_plane: ControlPlane | None = None,
    ignition_workers: int = 0,
    cloud_config_workers: int = 0,
) -> AsyncIterator[WorkloadCluster]:
    """`create_workload_cluster` on entry (libvirt read through the kubelet's view; the
    workload API server is the management cluster's own unless `workload_plane` is given),
    `teardown_cluster` on exit, which must have found nothing to remove by hand."""
    workload = await create_workload_cluster(
        management,
        namespace=namespace,
        name=name,
        view=kubelet.view,
        kubelet=kubelet,
        workload_plane=workload_plane or management.plane,
        guest_image=guest_image,
        uri=uri,
        ignition_workers=ignition_workers,
        cloud_config_workers=cloud_config_workers,
    )
    try:
        yield workload
    finally:
        leftovers = await teardown_cluster(workload)
        assert not leftovers, f"had to remove by hand: {leftovers}"
