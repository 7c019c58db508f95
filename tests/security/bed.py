"""What the security tests share (not a test module): objects in, evidence out.

The security tests run the product's entry point, `capl manager` as a process
(tests/fixtures/capl.py), against a real kube-apiserver and real libvirt hosts, and then look
at what the run left behind. This module holds the pieces they share:

- Objects: `SecurityBed` creates a Cluster + LibvirtCluster and lets the manager's own
  LibvirtCluster controller create the network and pool on every host; once the LibvirtCluster
  reports `initialization.provisioned` it sets the Cluster's
  `status.initialization.infrastructureProvisioned`, standing in for the Cluster API core
  controllers that do not run here. `create_machine` makes a bootstrap Secret + Machine (the
  owner) + LibvirtMachine. Waits poll the API server with a deadline.
- Webhooks: `webhook_configurations(...)` turns the generated config/webhook/manifests.yaml
  into configurations that call one manager process on loopback, optionally limited to one
  namespace by a namespaceSelector (so a shared control plane's other tests never reach a
  webhook that goes away with the test).
- Secrets: `Needles` are the byte strings whose presence proves a leak: a token itself, and
  its base64 encodings at the three possible alignments (a token inside a longer value that
  was base64-encoded as a whole, e.g. a Secret's `data` field copied somewhere, still shows
  as one of them). `find_leaks(...)` reports where any of them occurs.
- libvirt, asked directly (the libvirt binding, never capl): `libvirt_documents(uri)` returns
  the XML of every domain (live and inactive, with VIR_DOMAIN_XML_SECURE), network, storage
  pool and volume on a host; `sweep(...)` removes whatever a failed test left of a namespace.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ipaddress
import json
import secrets
import subprocess
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from xml.etree import ElementTree

import libvirt
import yaml

from capl.kube import KubeClient
from capl.runtime.errors import NotFound
from capl.runtime.objects import Obj, ObjectKey
from capl.runtime.resources import (
    CLUSTER,
    EVENT,
    LIBVIRT_CLUSTER,
    LIBVIRT_MACHINE,
    MACHINE,
    SECRET,
    Resource,
)
from capl.testbed import ControlPlane
from tests.controllers.conftest import (
    BASE_VOLUME,
    bootstrap_secret_obj,
    cluster_obj,
    condition,
    is_ready,
    libvirt_cluster_obj,
    libvirt_machine_obj,
    machine_obj,
)

T = TypeVar("T")

REPO = Path(__file__).resolve().parents[2]
WEBHOOK_MANIFESTS = REPO / "config" / "webhook" / "manifests.yaml"
CAPL_XMLNS = "https://capl.dev/xmlns/v1alpha1"
BASE_CAPACITY = 1024**3


def _quiet(_ctx: object, _err: object) -> None:
    """libvirt prints every error to stderr by default; the exceptions say enough."""


libvirt.registerErrorHandler(_quiet, None)


# --- waiting -------------------------------------------------------------------------------


async def eventually(
    check: Callable[[], Awaitable[T | None]], *, within: float, what: str, interval: float = 0.2
) -> T:
    """Await `check()` until it returns something truthy; fail with `what` at the deadline."""
    deadline = time.monotonic() + within
    last: object = None
    while True:
        try:
            result = await check()
        except AssertionError as exc:  # a check may explain what it still misses
            result, last = None, exc
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"not {what} within {within:.0f} s (last: {last})")
        await asyncio.sleep(interval)


# --- secrets and where they must not show up -----------------------------------------------


def token(label: str) -> str:
    """A random marker, unique enough that finding it anywhere is proof it was copied there."""
    return f"capl-{label}-{secrets.token_hex(16)}"


def base64_forms(secret: bytes) -> list[bytes]:
    """The parts of base64(anything + secret + anything) that depend only on `secret`, for
    the three alignments of `secret` within the encoded value (standard and URL-safe)."""
    forms: list[bytes] = []
    for shift in range(3):
        encoded = base64.b64encode(b"\0" * shift + secret + b"\0\0")
        first = -(-8 * shift // 6)  # the first character made of secret bits only
        last = 8 * (shift + len(secret)) // 6
        core = encoded[first:last]
        forms += [core, core.replace(b"+", b"-").replace(b"/", b"_")]
    return sorted(set(forms))


@dataclass
class Needles:
    """Named secrets and every form of them that counts as a leak."""

    secrets_: dict[str, list[bytes]] = field(default_factory=dict)

    def add(self, name: str, secret: bytes | str) -> None:
        raw = secret.encode() if isinstance(secret, str) else secret
        if len(raw) < 16:
            raise ValueError(f"{name}: too short to be a reliable needle")
        self.secrets_[name] = [raw, *base64_forms(raw)]

    def add_pem_key(self, name: str, pem: bytes) -> None:
        """Every base64 body line of a PEM private key (one line found is enough to leak)."""
        body = [
            line.strip()
            for line in pem.splitlines()
            if line.strip() and not line.startswith(b"-----") and b":" not in line
        ]
        for index, line in enumerate(body):
            if len(line) >= 16:
                self.add(f"{name} (PEM line {index + 1})", line)

    def names(self) -> list[str]:
        return sorted(self.secrets_)


def find_leaks(where: str, blob: bytes | str, needles: Needles) -> list[str]:
    """One line per needle found in `blob`, with a little context around the first hit."""
    data = blob.encode(errors="replace") if isinstance(blob, str) else blob
    found = []
    for name, forms in needles.secrets_.items():
        for form in forms:
            at = data.find(form)
            if at >= 0:
                context = data[max(0, at - 80) : at + len(form) + 40].decode(errors="replace")
                found.append(f"{where}: {name} found as {form[:12]!r}...: ...{context}...")
                break
    return found


# --- webhooks --------------------------------------------------------------------------------


def webhook_configurations(
    *, base_url: str, ca_pem: bytes, namespace: str | None = None, suffix: str = ""
) -> list[dict[str, Any]]:
    """The generated webhook configurations, calling `base_url` (loopback) and trusting
    `ca_pem`; with `namespace`, only objects in that namespace are sent to the webhooks, and
    the configurations are renamed with `suffix` so they never collide with other tests'."""
    bundle = base64.b64encode(ca_pem).decode()
    docs = [d for d in yaml.safe_load_all(WEBHOOK_MANIFESTS.read_text()) if d]
    for doc in docs:
        if suffix:
            doc["metadata"]["name"] = f"{doc['metadata']['name']}-{suffix}"
        for hook in doc.get("webhooks") or ():
            path = (hook.get("clientConfig") or {}).get("service", {}).get("path", "/")
            hook["clientConfig"] = {"url": f"{base_url.rstrip('/')}{path}", "caBundle": bundle}
            if namespace is not None:
                hook["namespaceSelector"] = {
                    "matchLabels": {"kubernetes.io/metadata.name": namespace}
                }
    return docs


async def install_webhooks(plane: ControlPlane, docs: Sequence[Mapping[str, Any]]) -> list[str]:
    """Create the configurations; returns their `kind/name` for `remove_webhooks`."""
    body = json.dumps({"apiVersion": "v1", "kind": "List", "items": list(docs)}).encode()
    out = await plane.kubectl("create", "-f", "-", "-o", "name", stdin=body)
    return [line.strip() for line in out.splitlines() if line.strip()]


async def remove_webhooks(plane: ControlPlane, names: Iterable[str]) -> None:
    names = list(names)
    if names:
        await plane.kubectl("delete", "--ignore-not-found", "--wait=false", *names)


# --- networks --------------------------------------------------------------------------------


def used_networks() -> list[ipaddress.IPv4Network]:
    out = subprocess.run(
        ["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True, check=False
    ).stdout
    nets = []
    for line in out.splitlines():
        parts = line.split()
        if "inet" in parts:
            with contextlib.suppress(ValueError):
                nets.append(ipaddress.IPv4Interface(parts[parts.index("inet") + 1]).network)
    return nets


def free_cidr(prefix: int = 24) -> str:
    """A random 10.x.y.0/`prefix` overlapping nothing configured on this machine."""
    used = used_networks()
    for _ in range(200):
        net = ipaddress.IPv4Network(
            f"10.{secrets.randbelow(100) + 150}.{secrets.randbelow(256)}.0/{prefix}", strict=False
        )
        if not any(net.overlaps(u) for u in used):
            return str(net)
    raise RuntimeError("no free 10.x.y.0/24 network on this machine")


# --- objects ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Host:
    """A host of a test cluster: the URI the manager uses, and how the test opens it itself."""

    name: str
    uri: str
    direct_uri: str = ""
    credentials_secret: str | None = None

    @property
    def open_uri(self) -> str:
        return self.direct_uri or self.uri

    def entry(self) -> dict[str, Any]:
        entry: dict[str, Any] = {"name": self.name, "uri": self.uri}
        if self.credentials_secret:
            entry["credentialsRef"] = {"name": self.credentials_secret}
        return entry


@dataclass
class BedCluster:
    name: str
    hosts: list[Host]
    cluster: Obj
    libvirt_cluster: Obj

    @property
    def network(self) -> str:
        return str(self.libvirt_cluster["spec"]["network"]["name"])

    @property
    def pool(self) -> str:
        return str(self.libvirt_cluster["spec"]["storagePool"]["name"])

    @property
    def pool_path(self) -> Path:
        return Path(self.libvirt_cluster["spec"]["storagePool"]["path"])


@dataclass
class SecurityBed:
    """One test's objects in one namespace (see the module docstring)."""

    plane: ControlPlane
    api: KubeClient
    namespace: str
    clusters: list[BedCluster] = field(default_factory=list)

    def key(self, name: str) -> ObjectKey:
        return ObjectKey(self.namespace, name)

    async def create(self, resource: Resource, obj: Obj) -> Obj:
        obj.setdefault("metadata", {})["namespace"] = self.namespace
        return await self.api.resource(resource).create(obj)

    async def get(self, resource: Resource, name: str) -> Obj | None:
        try:
            return await self.api.resource(resource).get(self.key(name))
        except NotFound:
            return None

    async def delete(self, resource: Resource, name: str) -> None:
        with contextlib.suppress(NotFound):
            await self.api.resource(resource).delete(self.key(name))

    async def list(self, resource: Resource) -> list[Obj]:
        return (await self.api.resource(resource).list(namespace=self.namespace)).items

    async def secret(self, name: str, data: Mapping[str, bytes]) -> Obj:
        return await self.create(
            SECRET,
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": name},
                "data": {k: base64.b64encode(v).decode() for k, v in data.items()},
            },
        )

    async def create_cluster(
        self,
        name: str,
        *,
        hosts: Sequence[Host],
        cidr: str,
        base_volume_on: Sequence[str] = (),
        within: float = 120.0,
    ) -> BedCluster:
        """Cluster + LibvirtCluster; returns once the manager provisioned the cluster's
        network and pool on every host (and `base_volume_on` hosts got BASE_VOLUME)."""
        cluster = await self.create(
            CLUSTER, cluster_obj(name, self.namespace, libvirt_cluster=name)
        )
        lc = await self.create(
            LIBVIRT_CLUSTER,
            libvirt_cluster_obj(
                name,
                self.namespace,
                cluster=cluster,
                hosts=[h.entry() for h in hosts],
                cidr=cidr,
                mode="isolated",
            ),
        )
        test_cluster = BedCluster(name=name, hosts=list(hosts), cluster=cluster, libvirt_cluster=lc)
        self.clusters.append(test_cluster)

        async def provisioned() -> Obj | None:
            obj = await self.get(LIBVIRT_CLUSTER, name)
            init = ((obj or {}).get("status") or {}).get("initialization") or {}
            if not init.get("provisioned"):
                raise AssertionError(json.dumps((obj or {}).get("status"))[:1500])
            return obj

        test_cluster.libvirt_cluster = await eventually(
            provisioned, within=within, what=f"LibvirtCluster {name} provisioned"
        )
        for host in hosts:
            if host.name in base_volume_on:
                await asyncio.to_thread(
                    put_base_volume, host.open_uri, test_cluster.pool, BASE_VOLUME
                )
        await self.api.resource(CLUSTER).patch_status(
            self.key(name), {"status": {"initialization": {"infrastructureProvisioned": True}}}
        )
        return test_cluster

    async def create_machine(
        self,
        cluster: BedCluster,
        name: str,
        *,
        spec: Mapping[str, Any],
        bootstrap: bytes,
        format: str | None = None,
        failure_domain: str | None = None,
    ) -> Obj:
        """Bootstrap Secret `<name>-bootstrap` + Machine + LibvirtMachine owned by it."""
        secret = f"{name}-bootstrap"
        await self.create(
            SECRET,
            bootstrap_secret_obj(
                secret, self.namespace, data=bootstrap, format=format, cluster=cluster.name
            ),
        )
        machine = await self.create(
            MACHINE,
            machine_obj(
                name,
                self.namespace,
                cluster=cluster.name,
                infra_name=name,
                bootstrap_secret=secret,
                failure_domain=failure_domain,
            ),
        )
        return await self.create(
            LIBVIRT_MACHINE,
            libvirt_machine_obj(
                name, self.namespace, cluster=cluster.name, machine=machine, spec=spec
            ),
        )

    async def wait_ready(self, name: str, *, within: float) -> Obj:
        async def ready() -> Obj | None:
            obj = await self.get(LIBVIRT_MACHINE, name)
            if obj is None or not is_ready(obj):
                raise AssertionError(json.dumps((obj or {}).get("status"))[:1500])
            return obj

        return await eventually(ready, within=within, what=f"LibvirtMachine {name} Ready")

    async def wait_condition(
        self, name: str, type_: str, *, reason: str, within: float
    ) -> dict[str, Any]:
        """The condition `type_` of LibvirtMachine `name` once it has `reason`."""

        async def check() -> dict[str, Any] | None:
            obj = await self.get(LIBVIRT_MACHINE, name)
            if obj is None or condition(obj, type_, "reason") != reason:
                raise AssertionError(json.dumps((obj or {}).get("status"))[:1500])
            for cond in obj["status"]["conditions"]:
                if cond["type"] == type_:
                    return dict(cond)
            return None

        return await eventually(check, within=within, what=f"{name}: {type_} reason {reason}")

    async def delete_machine(self, name: str) -> None:
        await self.delete(LIBVIRT_MACHINE, name)
        await self.delete(MACHINE, name)
        await self.delete(SECRET, f"{name}-bootstrap")

    async def wait_gone(self, resource: Resource, name: str, *, within: float) -> None:
        async def gone() -> bool:
            return await self.get(resource, name) is None

        await eventually(gone, within=within, what=f"{resource.kind} {name} gone")

    async def delete_all(self, *, within: float = 180.0) -> None:
        """Every LibvirtMachine, then every LibvirtCluster, through the manager; waits until
        the API server has none left (their finalizers removed by the manager)."""
        for lm in await self.list(LIBVIRT_MACHINE):
            await self.delete_machine(lm["metadata"]["name"])
        for lm in await self.list(LIBVIRT_MACHINE):
            await self.wait_gone(LIBVIRT_MACHINE, lm["metadata"]["name"], within=within)
        for lc in await self.list(LIBVIRT_CLUSTER):
            await self.delete(LIBVIRT_CLUSTER, lc["metadata"]["name"])
            await self.delete(CLUSTER, lc["metadata"]["name"])
        for lc in await self.list(LIBVIRT_CLUSTER):
            await self.wait_gone(LIBVIRT_CLUSTER, lc["metadata"]["name"], within=within)

    async def api_documents(self) -> dict[str, str]:
        """Every object of the namespace a user or controller reads, as JSON (Secrets are
        left out: they are where the secrets belong)."""
        documents: dict[str, str] = {}
        for resource in (CLUSTER, MACHINE, LIBVIRT_CLUSTER, LIBVIRT_MACHINE, EVENT):
            for obj in await self.list(resource):
                documents[f"{resource.kind} {obj['metadata']['name']}"] = json.dumps(obj)
        return documents

    async def sweep(self) -> list[str]:
        """Remove what is left of this namespace on every host, directly through libvirt."""
        removed: list[str] = []
        for cluster in self.clusters:
            for host in cluster.hosts:
                with contextlib.suppress(libvirt.libvirtError):
                    removed += await asyncio.to_thread(
                        sweep,
                        host.open_uri,
                        namespace=self.namespace,
                        network=cluster.network,
                        pool=cluster.pool,
                    )
        return removed


# --- libvirt, directly -------------------------------------------------------------------


def _open(uri: str) -> libvirt.virConnect:
    conn = libvirt.open(uri)
    if conn is None:  # pragma: no cover - old bindings
        raise libvirt.libvirtError(f"cannot open {uri}")
    return conn


def put_base_volume(uri: str, pool: str, name: str = BASE_VOLUME) -> None:
    conn = _open(uri)
    try:
        handle = conn.storagePoolLookupByName(pool)
        with contextlib.suppress(libvirt.libvirtError):
            handle.storageVolLookupByName(name)
            return
        handle.createXML(
            f"<volume><name>{name}</name><capacity>{BASE_CAPACITY}</capacity>"
            "<target><format type='qcow2'/></target></volume>",
            0,
        )
    finally:
        conn.close()


_GONE = {
    libvirt.VIR_ERR_NO_DOMAIN,
    libvirt.VIR_ERR_NO_NETWORK,
    libvirt.VIR_ERR_NO_STORAGE_POOL,
    libvirt.VIR_ERR_NO_STORAGE_VOL,
    libvirt.VIR_ERR_OPERATION_INVALID,
}


def _xml(what: str, call: Callable[[], str], into: dict[str, str]) -> None:
    """Record one XML document; objects that vanish meanwhile (other tests) are skipped."""
    try:
        into[what] = call()
    except libvirt.libvirtError as exc:
        if exc.get_error_code() not in _GONE:
            raise


def libvirt_documents(uri: str) -> dict[str, str]:
    """The XML of everything on the host: every domain (live and inactive definition, with
    VIR_DOMAIN_XML_SECURE, which includes what libvirt would otherwise hide), network (live
    and inactive), storage pool and volume."""
    secure = libvirt.VIR_DOMAIN_XML_SECURE
    inactive = libvirt.VIR_DOMAIN_XML_INACTIVE
    docs: dict[str, str] = {}
    conn = _open(uri)
    try:
        for dom in conn.listAllDomains(0):
            with contextlib.suppress(libvirt.libvirtError):
                name = dom.name()
                _xml(f"{uri} domain {name}", lambda d=dom: d.XMLDesc(secure), docs)
                _xml(
                    f"{uri} domain {name} (inactive)",
                    lambda d=dom: d.XMLDesc(secure | inactive),
                    docs,
                )
        for net in conn.listAllNetworks(0):
            with contextlib.suppress(libvirt.libvirtError):
                name = net.name()
                _xml(f"{uri} network {name}", lambda n=net: n.XMLDesc(0), docs)
                _xml(
                    f"{uri} network {name} (inactive)",
                    lambda n=net: n.XMLDesc(libvirt.VIR_NETWORK_XML_INACTIVE),
                    docs,
                )
        for pool in conn.listAllStoragePools(0):
            with contextlib.suppress(libvirt.libvirtError):
                name = pool.name()
                _xml(f"{uri} pool {name}", lambda p=pool: p.XMLDesc(0), docs)
                if not pool.isActive():
                    continue
                for vol in pool.listAllVolumes(0):
                    with contextlib.suppress(libvirt.libvirtError):
                        _xml(f"{uri} volume {name}/{vol.name()}", lambda v=vol: v.XMLDesc(0), docs)
    finally:
        conn.close()
    return docs


def domain_owner(xml: str) -> tuple[str | None, str | None]:
    """(namespace, name) of the capl ownership tag in a domain's metadata."""
    root = ElementTree.fromstring(xml)
    element = root.find(f"metadata/{{{CAPL_XMLNS}}}machine")
    if element is None:
        return None, None
    values = {child.tag.rsplit("}", 1)[-1]: (child.text or "").strip() for child in element}
    return values.get("namespace"), values.get("name")


def sweep(uri: str, *, namespace: str, network: str | None, pool: str | None) -> list[str]:
    """Remove the domains of `namespace` (name prefix or owner tag), the pool with its
    volumes and the network (after a failed test: the manager normally removes all)."""
    removed: list[str] = []
    conn = _open(uri)
    try:
        prefix = f"capl-{namespace}-"
        for dom in conn.listAllDomains(0):
            with contextlib.suppress(libvirt.libvirtError):
                name = dom.name()
                owner_ns, _ = domain_owner(dom.XMLDesc(0))
                if name.startswith(prefix) or owner_ns == namespace:
                    if dom.isActive():
                        dom.destroy()
                    with contextlib.suppress(libvirt.libvirtError):
                        dom.undefineFlags(libvirt.VIR_DOMAIN_UNDEFINE_NVRAM)
                    removed.append(f"domain {name}")
        if pool:
            with contextlib.suppress(libvirt.libvirtError):
                handle = conn.storagePoolLookupByName(pool)
                for vol in handle.listAllVolumes(0):
                    with contextlib.suppress(libvirt.libvirtError):
                        vol.delete(0)
                for step in (handle.destroy, lambda: handle.delete(0), handle.undefine):
                    with contextlib.suppress(libvirt.libvirtError):
                        step()
                removed.append(f"pool {pool}")
        if network:
            with contextlib.suppress(libvirt.libvirtError):
                net = conn.networkLookupByName(network)
                with contextlib.suppress(libvirt.libvirtError):
                    net.destroy()
                with contextlib.suppress(libvirt.libvirtError):
                    net.undefine()
                removed.append(f"network {network}")
    finally:
        conn.close()
    return removed


# --- files -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class FileEntry:
    path: Path
    mode: int
    is_dir: bool


def tree(root: Path) -> list[FileEntry]:
    """Every file and directory below `root` (not `root` itself) with its permission bits."""
    entries = []
    for path in sorted(root.rglob("*")):
        with contextlib.suppress(FileNotFoundError):
            st = path.lstat()
            entries.append(FileEntry(path=path, mode=st.st_mode & 0o7777, is_dir=path.is_dir()))
    return entries
