"""The stand-in kubelet of the e2e workload clusters.

Stand-in kubelet (`KubeletStandIn`)
    Polls the serial console logs capl's domains write into the cluster's pool directory
    (`<machine prefix>-console.log`) and parses the test guest's `CAPL-GUEST:` markers. When
    a boot shows `providerID=` and `ip=`, it registers a Node in the workload API server:
    name = the hostname the guest applied (Ignition / cloud-init), or, for a guest left with
    `localhost`, the DHCP host name libvirt's network hands out for its MAC (what CoreOS's
    NetworkManager would take); spec.providerID = what the guest derived from its SMBIOS UUID;
    status Ready with the leased address. A providerID is registered once and never again:
    a Node deleted by a test stays gone even when capl restarts the domain (the guest boots
    again and prints its markers again). It records when it first saw the console log (the
    domain started) and each marker, for the boot-to-lease measurements.

    The Node carries the four conditions a kubelet reports (Ready True, Memory/Disk/PID
    pressure False): Cluster API's NodeHealthy, hence Machine Ready/Available and the
    MachineDeployment's availableReplicas (which a rolling update with maxUnavailable 0 waits
    for), reads all four.

How Cluster API v1.13 gets to Running without a control-plane provider (read in
cluster-api@v1.13.6, and what the harness does about it)
    - ClusterCache (controllers/clustercache) connects to a workload cluster as soon as
      `Cluster.status.initialization.infrastructureProvisioned` is true, with the kubeconfig
      in Secret `<cluster>-kubeconfig` (key `value`); a failed connection is retried every
      30 s (ConnectionCreationRetryInterval, no flag). Without a controlPlaneRef the Cluster
      controller would generate that Secret itself, but only from a `<cluster>-ca` Secret,
      which nothing here creates: it stays ours.
    - ControlPlaneInitialized (cluster_controller_status.go) is true, for a Cluster without
      controlPlaneRef, once a Machine labelled `cluster.x-k8s.io/control-plane` has
      `status.nodeRef`. Only the condition: `status.initialization.controlPlaneInitialized`
      is set from a control-plane object alone and stays unset here (MachineHealthCheck and
      `clusterctl move` look at the condition).
    - The Machine controller sets nodeRef when it finds a Node whose spec.providerID equals
      Machine.spec.providerID (copied from the InfraMachine once it is provisioned). It
      watches the workload Nodes only after ControlPlaneInitialized; before that, a Machine
      is looked at again only when something about it changes (its InfraMachine, the
      Cluster's initialization, the ClusterCache connect event) — a Node that appears after
      the last such reconcile is not noticed (no requeue, 10 min resync).
    So the first control-plane Machine can get stuck when the Node shows up *after* capl
    reported the machine provisioned (which it does when it sees the DHCP lease, about when
    the guest prints `ip=`). The harness models the real order instead: a workload API
    server is reachable only once its first control-plane node is up, so the stand-in
    kubelet creates `<cluster>-kubeconfig` right after it registered the first
    control-plane Node. ClusterCache then connects (on its next retry, <= 30 s) strictly
    after that Node exists, and the connect event (or the later provisioned update)
    reconciles the Machine with the Node present: nodeRef, ControlPlaneInitialized, and
    from then on Node events drive the workers. This costs up to 30 s once per cluster.

    `serving_kubelet` runs one stand-in for a test module (on the management cluster's API
    server, or on a separate workload API server it connects to).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from capl.kube import KubeClient
from capl.ports.naming import machine_names
from capl.runtime.errors import AlreadyExists
from capl.runtime.objects import ObjectKey
from capl.runtime.resources import (
    NODE,
    SECRET,
)
from capl.testbed import ControlPlane
from tests.e2e.harness.common import CLUSTER_NAME_LABEL, KUBERNETES_VERSION, b64
from tests.e2e.harness.libvirt_view import LibvirtView
from tests.fixtures.guest import GuestMarker, parse_markers

# --- guests and the stand-in kubelet ---------------------------------------------------------


@dataclass
class GuestRecord:
    """What the stand-in kubelet saw of one domain's serial console log."""

    cluster: str
    console_log: Path
    control_plane: bool
    first_seen: float
    """time.monotonic() when the log file was first seen (about when the domain started)."""
    marks: dict[str, float] = field(default_factory=dict)
    """Marker name -> time.monotonic() when it was first seen."""
    markers: list[GuestMarker] = field(default_factory=list)
    provider_id: str | None = None
    ip: str | None = None
    mac: str | None = None
    hostname: str | None = None
    node: str | None = None
    boots: int = 0

    def marker(self, name: str) -> GuestMarker | None:
        for marker in reversed(self.markers):
            if marker.name == name:
                return marker
        return None

    @property
    def start_to_lease(self) -> float | None:
        """Seconds from the domain's start (console log appears) to the DHCP lease."""
        if "ip" not in self.marks:
            return None
        return self.marks["ip"] - self.first_seen

    @property
    def init_to_lease(self) -> float | None:
        """Seconds from the guest's init (first marker) to the DHCP lease."""
        if "ip" not in self.marks or "boot" not in self.marks:
            return None
        return self.marks["ip"] - self.marks["boot"]


@dataclass
class _WatchedCluster:
    namespace: str
    name: str
    pool_path: Path
    network: str
    control_plane_logs: set[str]
    kubeconfig: bytes
    management: KubeClient
    kubeconfig_created: bool = False


class KubeletStandIn:
    """Registers Nodes for booted guests (see the module docstring)."""

    def __init__(self, *, workload: KubeClient, view: LibvirtView, interval: float = 0.25) -> None:
        self.workload = workload
        self.view = view
        self.interval = interval
        self.records: dict[Path, GuestRecord] = {}
        self.registered: dict[str, str] = {}
        """providerID -> Node name, for every Node this kubelet ever registered."""
        self.registrations: list[tuple[str, str, float]] = []
        """(providerID, Node name, time.monotonic()) in order."""
        self.errors: list[str] = []
        self._clusters: dict[tuple[str, str], _WatchedCluster] = {}
        self._task: asyncio.Task[None] | None = None

    def watch(
        self,
        *,
        namespace: str,
        name: str,
        pool_path: Path,
        network: str,
        control_plane_machines: Iterable[str],
        kubeconfig: bytes,
        management: KubeClient,
    ) -> None:
        """Serve a cluster: its pool directory, its control-plane machines (by name), the
        kubeconfig to put into `<name>-kubeconfig` in `management` once the first
        control-plane Node is up."""
        logs = {
            machine_names(namespace=namespace, name=m).console_log for m in control_plane_machines
        }
        self._clusters[(namespace, name)] = _WatchedCluster(
            namespace=namespace,
            name=name,
            pool_path=pool_path,
            network=network,
            control_plane_logs=logs,
            kubeconfig=kubeconfig,
            management=management,
        )

    def retarget(self, *, namespace: str, name: str, management: KubeClient) -> None:
        """The cluster moved to another management cluster (clusterctl move)."""
        self._clusters[(namespace, name)].management = management

    def forget(self, *, namespace: str, name: str) -> None:
        self._clusters.pop((namespace, name), None)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="kubelet-stand-in")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            for cluster in list(self._clusters.values()):
                try:
                    await self._scan(cluster)
                except Exception as exc:  # keep serving; the tests look at .errors
                    message = f"{cluster.namespace}/{cluster.name}: {type(exc).__name__}: {exc}"
                    if not self.errors or self.errors[-1] != message:
                        self.errors.append(message)
            await asyncio.sleep(self.interval)

    async def _scan(self, cluster: _WatchedCluster) -> None:
        now = time.monotonic()
        try:
            entries = [
                Path(e.path)
                for e in os.scandir(cluster.pool_path)
                if e.name.endswith("-console.log")
            ]
        except FileNotFoundError:
            return
        for path in entries:
            record = self.records.get(path)
            if record is None:
                record = self.records[path] = GuestRecord(
                    cluster=f"{cluster.namespace}/{cluster.name}",
                    console_log=path,
                    control_plane=path.name in cluster.control_plane_logs,
                    first_seen=now,
                )
            try:
                text = path.read_bytes().decode("utf-8", "replace")
            except FileNotFoundError:
                continue
            markers = parse_markers(text)
            record.markers = markers
            record.boots = sum(1 for m in markers if m.name == "boot")
            for marker in markers:
                record.marks.setdefault(marker.name, now)
            await self._maybe_register(cluster, record)

    async def _maybe_register(self, cluster: _WatchedCluster, record: GuestRecord) -> None:
        provider = record.marker("providerID")
        lease = record.marker("ip")
        if provider is None or lease is None or not provider.value:
            return
        record.provider_id = provider.value
        record.ip = lease.value
        record.mac = (lease.fields.get("mac") or "").lower()
        hostname = record.marker("hostname")
        record.hostname = hostname.value if hostname is not None else None
        if provider.value in self.registered:
            record.node = self.registered[provider.value]
            return  # registered once; a Node deleted since stays deleted
        node_name = self._node_name(cluster, record)
        if node_name is None:
            return
        await self._register(node_name, record)
        self.registered[provider.value] = node_name
        self.registrations.append((provider.value, node_name, time.monotonic()))
        record.node = node_name
        if record.control_plane and not cluster.kubeconfig_created:
            await self._create_kubeconfig(cluster)
            cluster.kubeconfig_created = True

    def _node_name(self, cluster: _WatchedCluster, record: GuestRecord) -> str | None:
        if record.hostname and record.hostname != "localhost":
            return record.hostname
        network = self.view.network(cluster.network)
        if network is None:
            return None
        for host in network.dhcp_hosts:
            if host.mac == record.mac and host.name:
                return host.name
        return None

    async def _register(self, node_name: str, record: GuestRecord) -> None:
        assert record.provider_id is not None
        assert record.ip is not None
        labels = {
            "kubernetes.io/hostname": node_name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
        }
        if record.control_plane:
            labels["node-role.kubernetes.io/control-plane"] = ""
        nodes = self.workload.resource(NODE)
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": node_name,
                "labels": labels,
                "annotations": {"e2e.capl.dev/kubelet": "stand-in"},
            },
            "spec": {"providerID": record.provider_id},
        }
        try:
            await nodes.create(body)
        except AlreadyExists:
            existing = await nodes.get(ObjectKey("", node_name))
            theirs = (existing.get("spec") or {}).get("providerID")
            if theirs != record.provider_id:
                raise AssertionError(
                    f"Node {node_name} exists with providerID {theirs}, guest says "
                    f"{record.provider_id}"
                ) from None
        uuid = record.provider_id.rsplit("/", 1)[-1]
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        # the conditions a kubelet reports (Cluster API's NodeHealthy reads all four)
        conditions = [
            ("Ready", "True", "KubeletReady", "the e2e stand-in kubelet saw the guest boot"),
            ("MemoryPressure", "False", "KubeletHasSufficientMemory", ""),
            ("DiskPressure", "False", "KubeletHasNoDiskPressure", ""),
            ("PIDPressure", "False", "KubeletHasSufficientPID", ""),
        ]
        status = {
            "conditions": [
                {
                    "type": type_,
                    "status": value,
                    "reason": reason,
                    "message": message,
                    "lastHeartbeatTime": stamp,
                    "lastTransitionTime": stamp,
                }
                for type_, value, reason, message in conditions
            ],
            "addresses": [
                {"type": "InternalIP", "address": record.ip},
                {"type": "Hostname", "address": node_name},
            ],
            "nodeInfo": {
                "machineID": uuid.replace("-", ""),
                "systemUUID": uuid,
                "bootID": secrets.token_hex(16),
                "kernelVersion": "6.1.0-cloud-amd64",
                "osImage": "capl test guest",
                "containerRuntimeVersion": "none://0",
                "kubeletVersion": KUBERNETES_VERSION,
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        }
        await nodes.patch_status(ObjectKey("", node_name), {"status": status})

    async def _create_kubeconfig(self, cluster: _WatchedCluster) -> None:
        secret = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": f"{cluster.name}-kubeconfig",
                "namespace": cluster.namespace,
                "labels": {CLUSTER_NAME_LABEL: cluster.name},
            },
            "type": "cluster.x-k8s.io/secret",
            "data": {"value": b64(cluster.kubeconfig)},
        }
        with contextlib.suppress(AlreadyExists):
            await cluster.management.resource(SECRET).create(secret)

    # -- measurements -----------------------------------------------------------------------

    def record_of(self, namespace: str, machine: str) -> GuestRecord | None:
        log = machine_names(namespace=namespace, name=machine).console_log
        for path, record in self.records.items():
            if path.name == log:
                return record
        return None


@contextlib.asynccontextmanager
async def serving_kubelet(
    workload: KubeClient | ControlPlane, view: LibvirtView
) -> AsyncIterator[KubeletStandIn]:
    """A running `KubeletStandIn` that registers Nodes in `workload`: a client of the API
    server the Nodes go to (e.g. the management cluster's own), or a separate workload
    control plane (a client of it is opened here and closed on exit)."""
    api = (
        await KubeClient.connect(str(workload.kubeconfig))
        if isinstance(workload, ControlPlane)
        else workload
    )
    stand_in = KubeletStandIn(workload=api, view=view)
    stand_in.start()
    try:
        yield stand_in
    finally:
        await stand_in.stop()
        if api is not workload:
            await api.close()
