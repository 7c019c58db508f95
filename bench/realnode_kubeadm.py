"""The baseline of bench/realnode.py: the same node image joined by hand with `kubeadm join`.

What someone without Cluster API does to add a worker to a kubeadm cluster, on the network
and in the pool capl's worker uses, timed from the first step until the Node is Ready:

1. a **bootstrap token** in the workload cluster, as `kubeadm token create` makes it: a
   Secret `bootstrap-token-<id>` of type `bootstrap.kubernetes.io/token` in kube-system,
   usable for authentication and signing, in the group
   `system:bootstrappers:kubeadm:default-node-token` (which the hosted control plane's
   `kubeadm init phase bootstrap-token` lets join and get its CSRs approved), expiring after
   the run's deadline; and the discovery hash of the cluster CA (`sha256:` of its
   SubjectPublicKeyInfo, what `kubeadm token create --print-join-command` prints);
2. the **Ignition config** (spec 2.3.0, the format the kubeadm bootstrap provider renders for
   capl's worker, in the provider's layout): `/etc/kubeadm.yml`, a JoinConfiguration with the
   token discovery and the same `nodeRegistration` and timeouts as the benchmark's
   KubeadmConfigTemplate; `/etc/kubeadm.sh`, which runs `kubeadm join --config
   /etc/kubeadm.yml`; the `kubeadm.service` unit that runs it once — the provider's own
   files minus Cluster API's success marker;
3. with libvirt-python: an **overlay** of the same base volume in the same pool, the Ignition
   file **uploaded** as a volume beside it, a **DHCP reservation** for the guest's MAC with its
   host name (the node image takes its host name, so the Node's name, from DHCP), and a
   transient **domain** of the same hardware, built by capl's own domain builders (the
   LibvirtMachineTemplate's spec: 2 vCPUs, 1,536 MiB, TCG, Ignition through QEMU fw_cfg),
   started with `createXML`;
4. then the workload cluster is asked for the Node every `POLL` seconds, as for capl's side.

Everything made is recorded as soon as it exists (`KubeadmNode`) and removed on every path,
failures included (`remove`): the domain, the volumes, the DHCP reservation, the token
Secret, the Node and the node's certificate signing requests. The domain's owner tag names a
namespace no manager watches, so no capl sweep touches it. The token is never printed.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import ipaddress
import json
import secrets
import string
import time
import urllib.parse
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import libvirt
import yaml
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from bench.machines_realvm import upload_raw_volume
from bench.realnode_common import POLL, Timeline, new_ready_node, node_gone, node_names
from capl.api.machine import LibvirtMachineSpec
from capl.controllers.machine.plan import NicPlan, build_domain_spec
from capl.kube import KubeClient
from capl.ports.naming import MachineNames
from capl.ports.virt import DomainOwner
from capl.runtime.errors import NotFound
from capl.runtime.objects import ObjectKey
from capl.runtime.resources import NODE, SECRET, Resource
from capl.testing.objects import random_mac
from capl.virt.domainxml import build_domain_xml

OWNER_NAMESPACE: Final = "bench-realnode-kubeadm"
"""The owner tag's namespace: watched by no manager (capl's side runs in another)."""
NODE_GROUP: Final = "system:bootstrappers:kubeadm:default-node-token"
CRI_SOCKET: Final = "unix:///var/run/containerd/containerd.sock"
CSR: Final = Resource(
    "certificates.k8s.io", "v1", "CertificateSigningRequest", "certificatesigningrequests",
    namespaced=False,
)  # fmt: skip
_TOKEN_CHARS: Final = string.ascii_lowercase + string.digits
_UNIT: Final = """[Unit]
Description=kubeadm
# Run only once. After a successful run, this file is moved to /tmp/.
ConditionPathExists=/etc/kubeadm.yml
After=network.target
[Service]
Type=oneshot
ExecStart=/etc/kubeadm.sh
[Install]
WantedBy=multi-user.target
"""
_SCRIPT: Final = """#!/bin/bash
set -e
kubeadm join --config /etc/kubeadm.yml
mv /etc/kubeadm.yml /tmp/
"""


def _token_part(length: int) -> str:
    return "".join(secrets.choice(_TOKEN_CHARS) for _ in range(length))


def ca_cert_hash(ca_pem: bytes) -> str:
    """kubeadm's discovery hash of a CA: sha256 of its DER SubjectPublicKeyInfo."""
    key = x509.load_pem_x509_certificate(ca_pem).public_key()
    spki = key.public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo)
    return "sha256:" + hashlib.sha256(spki).hexdigest()


@dataclass
class KubeadmNode:
    """One hand-made node and what it got so far (see the module docstring)."""

    name: str
    """Domain, DHCP host name and so Node name."""
    ip: str
    mac: str = field(default_factory=random_mac)
    token_id: str = field(default_factory=lambda: _token_part(6))
    token_secret: str = field(default_factory=lambda: _token_part(16), repr=False)
    domain_uuid: str = field(default_factory=lambda: str(uuid.uuid4()))
    token_created: bool = False
    volumes: list[str] = field(default_factory=list)
    reserved: bool = False
    domain_created: bool = False
    node_name: str | None = None
    """The Node it registered (its DHCP host name, `name`, unless it joined before it had
    one: see bench/realnode_common.py)."""

    @property
    def node_names(self) -> list[str]:
        return sorted({self.name, self.node_name or self.name})

    @property
    def token(self) -> str:
        return f"{self.token_id}.{self.token_secret}"

    def redact(self, text: str) -> str:
        return text.replace(self.token_secret, "<token>")


@dataclass
class KubeadmSide:
    """Where the hand-made nodes go: capl's cluster network and pool, its base volume."""

    uri: str
    network: str
    cidr: str
    pool: str
    base_path: str
    capacity_bytes: int
    """The base image's virtual size: capl's root overlay has the same."""
    spec: LibvirtMachineSpec
    workload: KubeClient
    endpoint: str
    """host:port of the workload API server."""
    ca_pem: bytes
    workdir: Path

    def new_node(self, tag: str) -> KubeadmNode:
        """A node with a fresh name and token, its reservation at the top of the range
        (capl hands out addresses from the bottom)."""
        ip = ipaddress.IPv4Network(self.cidr, strict=False).broadcast_address - 1
        return KubeadmNode(name=f"rn-kubeadm-{tag}", ip=str(ip))

    # -- the bootstrap data ----------------------------------------------------------------

    def join_configuration(self, node: KubeadmNode) -> str:
        config = {
            "apiVersion": "kubeadm.k8s.io/v1beta4",
            "kind": "JoinConfiguration",
            "discovery": {
                "bootstrapToken": {
                    "apiServerEndpoint": self.endpoint,
                    "token": node.token,
                    "caCertHashes": [ca_cert_hash(self.ca_pem)],
                },
            },
            "nodeRegistration": {"criSocket": CRI_SOCKET, "imagePullPolicy": "Never"},
            "timeouts": {"tlsBootstrap": "10m0s", "kubeletHealthCheck": "10m0s"},
        }
        return "---\n" + yaml.safe_dump(config, sort_keys=False)

    def ignition(self, node: KubeadmNode) -> bytes:
        def file(path: str, mode: int, text: str) -> dict[str, Any]:
            source = "data:," + urllib.parse.quote(text)
            return {
                "filesystem": "root",
                "path": path,
                "mode": mode,
                "contents": {"source": source},
            }

        config = {
            "ignition": {"version": "2.3.0"},
            "storage": {
                "files": [
                    file("/etc/kubeadm.sh", 0o700, _SCRIPT),
                    file("/etc/kubeadm.yml", 0o600, self.join_configuration(node)),
                ]
            },
            "systemd": {"units": [{"name": "kubeadm.service", "enabled": True, "contents": _UNIT}]},
        }
        return json.dumps(config).encode()

    def token_object(self, node: KubeadmNode, *, ttl_s: float) -> dict[str, Any]:
        expires = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + ttl_s))
        return {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": f"bootstrap-token-{node.token_id}", "namespace": "kube-system"},
            "type": "bootstrap.kubernetes.io/token",
            "stringData": {
                "token-id": node.token_id,
                "token-secret": node.token_secret,
                "expiration": expires,
                "usage-bootstrap-authentication": "true",
                "usage-bootstrap-signing": "true",
                "auth-extra-groups": NODE_GROUP,
                "description": "bench/realnode.py: the kubeadm baseline",
            },
        }

    # -- the guest ----------------------------------------------------------------------------

    def domain_xml(self, node: KubeadmNode, *, root: str, ignition: str) -> str:
        names = MachineNames(
            prefix=node.name,
            domain=node.name,
            root_volume=f"{node.name}-root.qcow2",
            ignition_volume=f"{node.name}-ignition.ign",
            cidata_volume=f"{node.name}-cidata.iso",
            console_log=f"{node.name}-console.log",
        )
        owner = DomainOwner(
            cluster="kubeadm", namespace=OWNER_NAMESPACE, name=node.name, uid=node.domain_uuid
        )
        nic = NicPlan(
            index=0, network=self.network, bridge=None, cluster_network=True, mac=None, ip=None
        )
        return build_domain_xml(
            build_domain_spec(
                names=names,
                uuid=node.domain_uuid,
                owner=owner,
                spec=self.spec,
                domain_type=self.spec.domain_type,
                arch="x86_64",
                root_path=root,
                extra_paths=(),
                ignition_path=ignition,
                cidata_path=None,
                nics=((nic, node.mac),),
                console_log=str(self.console_log(node)),
            )
        )

    def console_log(self, node: KubeadmNode) -> Path:
        return self.workdir / f"{node.name}-console.log"

    def _dhcp_host(self, node: KubeadmNode) -> str:
        return f"<host mac='{node.mac}' name='{node.name}' ip='{node.ip}'/>"

    def _make_guest(self, node: KubeadmNode, ignition: bytes, timeline: Timeline) -> None:
        """Overlay, Ignition volume, DHCP reservation, domain (libvirt-python, one
        connection); each object recorded in `node` before it is made."""
        conn = libvirt.open(self.uri)
        try:
            pool = conn.storagePoolLookupByName(self.pool)
            root_name = f"{node.name}-root.qcow2"
            node.volumes.append(root_name)
            root = pool.createXML(
                f"<volume><name>{root_name}</name>"
                f"<capacity unit='bytes'>{self.capacity_bytes}</capacity>"
                "<target><format type='qcow2'/></target><backingStore>"
                f"<path>{self.base_path}</path><format type='qcow2'/></backingStore></volume>",
                0,
            )
            ign_name = f"{node.name}-ignition.ign"
            node.volumes.append(ign_name)
            ign_path = upload_raw_volume(pool, conn, ign_name, ignition)
            node.reserved = True
            conn.networkLookupByName(self.network).update(
                libvirt.VIR_NETWORK_UPDATE_COMMAND_ADD_LAST,
                libvirt.VIR_NETWORK_SECTION_IP_DHCP_HOST,
                -1,
                self._dhcp_host(node),
                libvirt.VIR_NETWORK_UPDATE_AFFECT_LIVE | libvirt.VIR_NETWORK_UPDATE_AFFECT_CONFIG,
            )
            timeline.mark("volumes and DHCP reservation")
            xml = self.domain_xml(node, root=str(root.path()), ignition=ign_path)
            node.domain_created = True
            conn.createXML(xml, 0)
            timeline.mark("domain started")
        finally:
            conn.close()

    # -- one join, one removal -------------------------------------------------------------

    async def join(self, node: KubeadmNode, *, within: float) -> Timeline:
        """Steps 1-4 of the module docstring, timed from the token to the Ready Node;
        TimeoutError (with the console's tail) after `within` seconds."""
        before = await node_names(self.workload)
        timeline = Timeline()
        node.token_created = True  # from the request on: the removal tolerates NotFound
        await self.workload.resource(SECRET).create(self.token_object(node, ttl_s=within + 600))
        timeline.mark("token")
        await asyncio.to_thread(self._make_guest, node, self.ignition(node), timeline)
        while (name := await new_ready_node(self.workload, before, timeline)) is None:
            if timeline.elapsed() > within:
                raise TimeoutError(
                    f"{node.name}: no Ready Node within {within:.0f} s; the console's tail:\n"
                    + self.console_tail(node)
                )
            await asyncio.sleep(POLL)
        node.node_name = name
        return timeline

    def console_tail(self, node: KubeadmNode, limit: int = 3000) -> str:
        try:
            text = self.console_log(node).read_bytes()[-limit:].decode(errors="replace")
        except OSError as exc:
            return f"(no console log: {exc})"
        return node.redact(text)

    async def remove(self, node: KubeadmNode, *, within: float) -> list[str]:
        """Everything `node` got, whatever state it is in; what is still there afterwards."""
        await asyncio.to_thread(self._remove_guest, node)
        api = self.workload
        with contextlib.suppress(NotFound):
            if node.token_created:
                name = f"bootstrap-token-{node.token_id}"
                await api.resource(SECRET).delete(ObjectKey("kube-system", name))
        # the guest is gone, so no kubelet can register the Node again
        for name in node.node_names:
            with contextlib.suppress(NotFound):
                await api.resource(NODE).delete(ObjectKey("", name))
        users = {f"system:bootstrap:{node.token_id}"} | {
            f"system:node:{n}" for n in node.node_names
        }
        for csr in (await api.resource(CSR).list()).items:
            if (csr.get("spec") or {}).get("username") in users:
                with contextlib.suppress(NotFound):
                    await api.resource(CSR).delete(ObjectKey("", csr["metadata"]["name"]))
        started = time.monotonic()
        while not all([await node_gone(api, n) for n in node.node_names]):
            if time.monotonic() - started > within:
                break
            await asyncio.sleep(POLL)
        self.console_log(node).unlink(missing_ok=True)
        return await asyncio.to_thread(self._left, node) + await self._left_in_cluster(node)

    def _remove_guest(self, node: KubeadmNode) -> None:
        conn = libvirt.open(self.uri)
        try:
            if node.domain_created:
                with contextlib.suppress(libvirt.libvirtError):
                    conn.lookupByUUIDString(node.domain_uuid).destroy()  # transient: gone
            if node.reserved:
                with contextlib.suppress(libvirt.libvirtError):
                    conn.networkLookupByName(self.network).update(
                        libvirt.VIR_NETWORK_UPDATE_COMMAND_DELETE,
                        libvirt.VIR_NETWORK_SECTION_IP_DHCP_HOST,
                        -1,
                        self._dhcp_host(node),
                        libvirt.VIR_NETWORK_UPDATE_AFFECT_LIVE
                        | libvirt.VIR_NETWORK_UPDATE_AFFECT_CONFIG,
                    )
            with contextlib.suppress(libvirt.libvirtError):
                pool = conn.storagePoolLookupByName(self.pool)
                for volume in node.volumes:
                    with contextlib.suppress(libvirt.libvirtError):
                        pool.storageVolLookupByName(volume).delete(0)
        finally:
            conn.close()

    def _left(self, node: KubeadmNode) -> list[str]:
        """What of the guest is still in libvirt."""
        left = []
        conn = libvirt.open(self.uri)
        try:
            with contextlib.suppress(libvirt.libvirtError):
                conn.lookupByUUIDString(node.domain_uuid)
                left.append(f"domain {node.name}")
            with contextlib.suppress(libvirt.libvirtError):
                if node.mac in conn.networkLookupByName(self.network).XMLDesc(0):
                    left.append(f"DHCP reservation of {node.name}")
            with contextlib.suppress(libvirt.libvirtError):
                pool = conn.storagePoolLookupByName(self.pool)
                pool.refresh(0)
                names = set(pool.listVolumes())
                left += [f"volume {v}" for v in node.volumes if v in names]
        finally:
            conn.close()
        return left

    async def _left_in_cluster(self, node: KubeadmNode) -> list[str]:
        left = []
        with contextlib.suppress(NotFound):
            await self.workload.resource(SECRET).get(
                ObjectKey("kube-system", f"bootstrap-token-{node.token_id}")
            )
            left.append(f"token {node.token_id}")
        left += [f"Node {n}" for n in node.node_names if not await node_gone(self.workload, n)]
        return left
