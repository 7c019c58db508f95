"""The e2e harness: management clusters, workload clusters of real guests, a stand-in kubelet,
and direct looks at libvirt.

Management cluster (`Management`, `start_management`)
    One empty control plane (`control_plane_factory`), `clusterctl init --infrastructure
    libvirt` from the local repositories (core + capl's release), the Cluster API core
    manager as a local process with its webhooks re-pointed at loopback (`CapiCore`), and
    `capl manager` as a process (`capl.testbed.caplmanager.CaplManager`) with capl's webhook
    configurations pointed at it. Exactly what a user gets from `clusterctl init`, except that
    the managers run as processes instead of Deployments (there is no kubelet); capl's runs
    as the ServiceAccount clusterctl installed (a token in a kubeconfig), under the shipped
    ClusterRole and Role.

Workload cluster (`WorkloadCluster`, `create_workload_cluster`)
    `clusterctl generate cluster --flavor testbed` (templates/cluster-template-testbed.yaml:
    Cluster without controlPlaneRef, LibvirtCluster on qemu:///system with an isolated
    network, one stand-alone control-plane Machine, MachineDeployments `md-ignition` and
    `md-cloud-config`), applied server-side, plus the bootstrap Secrets the flavor names
    (owned by the Cluster, so `clusterctl move` carries them): an Ignition config with a
    hostname for the control plane, an Ignition config shared by the md-ignition workers, a
    #cloud-config shared by the md-cloud-config workers. Guests are the test guest image
    (CAPL_GUEST_IMAGE), TCG, 1 vCPU, 256 MiB.

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

libvirt (`LibvirtView`)
    Reads libvirt directly (libvirt-python, not capl's adapter): domains with owner metadata,
    volumes of a pool, DHCP hosts and DNS records from the network XML, leases;
    `resolve_a` asks the network's dnsmasq itself. Its own connection, reopened when the
    shared libvirtd restarts under it. `force_cleanup` removes what a failed test left.

Names: libvirt is shared by every test session on the machine (other stages and other
people's runs may be live at the same time), so every e2e namespace carries a random suffix
and every libvirt name capl derives from it (domains `capl-<namespace>-...`, network and pool
`capl-<namespace>.<cluster>`) is unique to the run; cleanup only ever touches those names.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import ipaddress
import os
import secrets
import socket
import statistics
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from xml.etree import ElementTree

import libvirt

from capl.api.defaults import derived_name
from capl.kube import KubeClient
from capl.ports.naming import machine_names
from capl.runtime.errors import AlreadyExists, NotFound
from capl.runtime.objects import Obj, ObjectKey
from capl.runtime.resources import (
    CAPI_GROUP,
    CLUSTER,
    LIBVIRT_CLUSTER,
    LIBVIRT_MACHINE,
    MACHINE,
    NODE,
    SECRET,
    Resource,
)
from capl.testbed import ControlPlane
from capl.testbed.capi import CapiAssets, CapiCore
from capl.testbed.caplmanager import CaplManager
from capl.testbed.clusterctl import Clusterctl, LocalProvider
from capl.testbed.identities import manager_identity
from capl.testing.objects import condition_of
from tests.fixtures.capi import new_clusterctl, record_timing
from tests.fixtures.capl import CaplManagerFactory
from tests.fixtures.common import eventually
from tests.fixtures.libvirt import GuestMarker, ignition_config, parse_markers
from tests.fixtures.libvirt_direct import (
    NetworkFacts,
    free_cidr,
    owner_tag,
    parse_network_xml,
    sweep,
)

T = TypeVar("T")

MACHINE_DEPLOYMENT = Resource(CAPI_GROUP, "v1beta2", "MachineDeployment", "machinedeployments")
MACHINE_SET = Resource(CAPI_GROUP, "v1beta2", "MachineSet", "machinesets")
MACHINE_HEALTH_CHECK = Resource(CAPI_GROUP, "v1beta2", "MachineHealthCheck", "machinehealthchecks")

KUBERNETES_VERSION = "v1.35.4"
FLAVOR = "testbed"
CONTROL_PLANE_LABEL = "cluster.x-k8s.io/control-plane"
CLUSTER_NAME_LABEL = "cluster.x-k8s.io/cluster-name"
DEPLOYMENT_NAME_LABEL = "cluster.x-k8s.io/deployment-name"
CLONED_FROM_ANNOTATION = "cluster.x-k8s.io/cloned-from-name"
GUEST_MEMORY_MIB = 256
#: capl flags for e2e: a quick graceful shutdown (the test guest powers off in a second or
#: two), the rest as shipped.
CAPL_E2E_ARGS = ("--machine-shutdown-timeout=30s",)


# --- the run's report ------------------------------------------------------------------------

REPORT: list[str] = []
"""Measurements printed in the terminal summary (tests/e2e/conftest.py)."""


def report(line: str) -> None:
    REPORT.append(line)


def is_true(obj: Mapping[str, Any], type_: str) -> bool:
    return condition_of(obj, type_).get("status") == "True"


def internal_ip(obj: Mapping[str, Any]) -> str | None:
    """The InternalIP in status.addresses (Machine, LibvirtMachine, Node)."""
    for address in (obj.get("status") or {}).get("addresses") or ():
        if address.get("type") == "InternalIP":
            return str(address.get("address"))
    return None


def name_of(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


# --- libvirt, read directly ------------------------------------------------------------------


@dataclass(frozen=True)
class DomainFacts:
    name: str
    uuid: str
    id: int
    """The runtime id of a running domain (-1 when off): a restart changes it."""
    state: int
    memory_kib: int
    vcpus: int
    domain_type: str
    owner: dict[str, str]
    """capl's ownership metadata (cluster, namespace, name, uid, kind); empty when absent."""

    @property
    def running(self) -> bool:
        return bool(self.state == libvirt.VIR_DOMAIN_RUNNING)


_CONNECTION_ERRORS = frozenset(
    {
        libvirt.VIR_ERR_INTERNAL_ERROR,  # "client socket is closed"
        libvirt.VIR_ERR_SYSTEM_ERROR,  # "Cannot write data: Broken pipe"
        libvirt.VIR_ERR_RPC,
        libvirt.VIR_ERR_NO_CONNECT,
        libvirt.VIR_ERR_INVALID_CONN,
    }
)
R = TypeVar("R")


def _reconnecting(method: Callable[..., R]) -> Callable[..., R]:
    """Run a LibvirtView method again on a fresh connection when the daemon went away
    under the old one (another test stage may restart the shared libvirtd)."""

    @functools.wraps(method)
    def wrapper(self: LibvirtView, *args: Any, **kwargs: Any) -> R:
        try:
            return method(self, *args, **kwargs)
        except libvirt.libvirtError as exc:
            if exc.get_error_code() not in _CONNECTION_ERRORS or self._alive():
                raise
            self._drop()
            return method(self, *args, **kwargs)

    return wrapper


class LibvirtView:
    """Direct, read-mostly access to one libvirt daemon (blocking calls, all fast); its own
    connection, opened again when the daemon restarted."""

    def __init__(self, uri: str, *, reconnect_within: float = 60.0) -> None:
        self.uri = uri
        self.reconnect_within = reconnect_within
        self._conn: libvirt.virConnect | None = None

    @property
    def conn(self) -> libvirt.virConnect:
        if self._conn is not None and self._alive():
            return self._conn
        self._drop()
        deadline = time.monotonic() + self.reconnect_within
        while True:
            try:
                self._conn = libvirt.open(self.uri)
                return self._conn
            except libvirt.libvirtError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.5)  # libvirtd is restarting; nothing else to wait on here

    def _alive(self) -> bool:
        try:
            return self._conn is not None and bool(self._conn.isAlive())
        except libvirt.libvirtError:
            return False

    def _drop(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(libvirt.libvirtError):
                self._conn.close()
        self._conn = None

    def close(self) -> None:
        self._drop()

    @_reconnecting
    def domains(self, prefix: str) -> dict[str, DomainFacts]:
        """Every domain whose name starts with `prefix`, by name."""
        out: dict[str, DomainFacts] = {}
        for dom in self.conn.listAllDomains(0):
            try:
                name = dom.name()
                if not name.startswith(prefix):
                    continue
                out[name] = self._facts(dom)
            except libvirt.libvirtError as exc:
                if exc.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
                    continue  # undefined while we looked
                raise
        return out

    def _facts(self, dom: libvirt.virDomain) -> DomainFacts:
        state, _reason = dom.state()
        root = ElementTree.fromstring(dom.XMLDesc(0))
        return DomainFacts(
            name=dom.name(),
            uuid=dom.UUIDString().lower(),
            id=int(dom.ID()) if dom.isActive() else -1,
            state=int(state),
            memory_kib=int(root.findtext("memory") or 0),
            vcpus=int(root.findtext("vcpu") or 0),
            domain_type=str(root.get("type")),
            owner=owner_tag(root),
        )

    @_reconnecting
    def domain(self, name: str) -> DomainFacts | None:
        try:
            return self._facts(self.conn.lookupByName(name))
        except libvirt.libvirtError as exc:
            if exc.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
                return None
            raise

    @_reconnecting
    def destroy(self, name: str) -> None:
        """Stop a domain out of band (`virsh destroy`)."""
        self.conn.lookupByName(name).destroy()

    @_reconnecting
    def volumes(self, pool: str) -> set[str] | None:
        """Volume names of the pool (refreshed), None when the pool does not exist."""
        try:
            handle = self.conn.storagePoolLookupByName(pool)
        except libvirt.libvirtError as exc:
            if exc.get_error_code() == libvirt.VIR_ERR_NO_STORAGE_POOL:
                return None
            raise
        if handle.isActive():
            with contextlib.suppress(libvirt.libvirtError):
                handle.refresh(0)
            return {v.name() for v in handle.listAllVolumes(0)}
        return set()

    def pool_exists(self, pool: str) -> bool:
        return self.volumes(pool) is not None

    @_reconnecting
    def network(self, name: str) -> NetworkFacts | None:
        try:
            net = self.conn.networkLookupByName(name)
        except libvirt.libvirtError as exc:
            if exc.get_error_code() == libvirt.VIR_ERR_NO_NETWORK:
                return None
            raise
        return parse_network_xml(net.XMLDesc(0), active=bool(net.isActive()))

    @_reconnecting
    def leases(self, network: str) -> list[dict[str, Any]]:
        try:
            return list(self.conn.networkLookupByName(network).DHCPLeases())
        except libvirt.libvirtError:
            return []

    @_reconnecting
    def free_cidr(self) -> str:
        """A random /24 in 10.0.0.0/8 that no libvirt network, address or route uses."""
        return free_cidr(conn=self.conn)

    @_reconnecting
    def force_cleanup(
        self, *, domain_prefix: str, network: str | None, pool: str | None
    ) -> list[str]:
        """Remove what a test left: domains named `domain_prefix...`, the pool (volumes,
        directory) and the network. Returns what it removed (empty when all was clean)."""
        return sweep(self.conn, domain_prefix=domain_prefix, network=network, pool=pool)


def resolve_a(server: str, name: str, *, timeout: float = 2.0) -> set[str]:
    """The A records `server` (a dnsmasq on a test network's bridge) answers for `name`:
    one plain UDP query, no recursion wanted (stdlib only)."""
    query_id = secrets.randbelow(1 << 16)
    header = query_id.to_bytes(2, "big") + b"\x00\x00" + b"\x00\x01" + b"\x00" * 6
    question = b"".join(len(p).to_bytes(1, "big") + p.encode() for p in name.split("."))
    packet = header + question + b"\x00" + b"\x00\x01\x00\x01"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(timeout)
        sock.sendto(packet, (server, 53))
        reply, _ = sock.recvfrom(4096)
    if reply[:2] != query_id.to_bytes(2, "big"):
        raise RuntimeError(f"DNS reply for {name} from {server} has a foreign id")
    answers = int.from_bytes(reply[6:8], "big")
    pos = len(packet)
    found: set[str] = set()
    for _ in range(answers):
        if reply[pos] & 0xC0 == 0xC0:  # a compressed name: a pointer
            pos += 2
        else:
            while reply[pos]:
                pos += reply[pos] + 1
            pos += 1
        rtype = int.from_bytes(reply[pos : pos + 2], "big")
        length = int.from_bytes(reply[pos + 8 : pos + 10], "big")
        data = reply[pos + 10 : pos + 10 + length]
        pos += 10 + length
        if rtype == 1 and length == 4:
            found.add(str(ipaddress.IPv4Address(data)))
    return found


# --- the management cluster ------------------------------------------------------------------


CAPL_SERVICE_ACCOUNT = ("capl-system", "capl-controller-manager")
"""What `clusterctl init` installs for capl's manager (config/default's namePrefix capl-)."""


@dataclass
class Management:
    """A management cluster: control plane, clusterctl, Cluster API core, capl manager."""

    name: str
    plane: ControlPlane
    clusterctl: Clusterctl
    core: CapiCore
    capl: CaplManager
    api: KubeClient
    workdir: Path
    timings: dict[str, float] = field(default_factory=dict)

    async def close(self) -> None:
        await self.api.close()
        await self.capl.stop()
        await self.core.stop()


async def start_management(
    *,
    name: str,
    plane_factory: Callable[[], Awaitable[ControlPlane]],
    capi: CapiAssets,
    provider: LocalProvider,
    capl_factory: CaplManagerFactory,
    workdir: Path,
    capl_args: Sequence[str] = CAPL_E2E_ARGS,
    resolv_conf: Path | None = None,
    core_feature_gates: Mapping[str, bool] | None = None,
) -> Management:
    """Control plane + `clusterctl init --infrastructure libvirt` + the Cluster API core
    manager + `capl manager` with its webhooks, all ready. Wall times in `.timings` and in
    the terminal summary. resolv_conf: the resolver of the core manager and of capl's (both
    connect to workload clusters by their endpoint's name). core_feature_gates: merged over the
    core manager's defaults (e.g. RuntimeSDK and InPlaceUpdates)."""
    timings: dict[str, float] = {}
    t0 = time.monotonic()
    plane = await plane_factory()  # stopped by the factory
    t1 = time.monotonic()
    clusterctl = new_clusterctl(
        capi=capi, plane=plane, workdir=workdir / "clusterctl", providers=[provider]
    )
    await clusterctl.init(plane)
    t2 = time.monotonic()
    core = CapiCore(
        plane=plane, capi=capi, workdir=workdir / "capi-core", feature_gates=core_feature_gates
    )
    core.resolv_conf = resolv_conf
    try:
        await core.start()
        t3 = time.monotonic()
        capl = await capl_factory(plane, name=f"capl-{name}", extra_args=list(capl_args))
        capl.resolv_conf = resolv_conf  # it sets the workload Nodes' providerIDs
        await capl.install_webhooks()
        await capl.start()  # stopped by its factory
        # as deployed: the ServiceAccount `clusterctl init` installed, bound by its bindings
        identity = await manager_identity(plane)
        assert identity.service_account == CAPL_SERVICE_ACCOUNT, identity
        t4 = time.monotonic()
        api = await KubeClient.connect(str(plane.kubeconfig))
    except BaseException:
        await core.stop()
        raise
    timings.update(
        {
            "control plane": t1 - t0,
            "clusterctl init": t2 - t1,
            "CAPI core": t3 - t2,
            "capl manager": t4 - t3,
        }
    )
    for stage, seconds in timings.items():
        record_timing(f"management {name}: {stage}", seconds)
    return Management(
        name=name,
        plane=plane,
        clusterctl=clusterctl,
        core=core,
        capl=capl,
        api=api,
        workdir=workdir,
        timings=timings,
    )


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
