"""What the security tests share (not a test module): objects in, evidence out.

The security tests run the product's entry point, `capl manager` as a process
(tests/fixtures/capl.py), against a real kube-apiserver and real libvirt hosts, and then look
at what the run left behind. This module holds the pieces they share:

- Objects: `SecurityBed` is tests/fixtures/bed.py `ManagerBed` (a Cluster + LibvirtCluster
  provisioned by the manager's own LibvirtCluster controller, machines as bootstrap Secret +
  Machine + LibvirtMachine, waits with a deadline, a direct libvirt sweep afterwards) plus
  `wait_condition` and `api_documents`.
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
  pool and volume on a host.
"""

from __future__ import annotations

import base64
import contextlib
import json
import secrets
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import libvirt
import yaml

from capl.runtime.resources import CLUSTER, EVENT, LIBVIRT_CLUSTER, LIBVIRT_MACHINE, MACHINE
from capl.testbed import ControlPlane
from capl.testing.objects import condition_of
from tests.fixtures.bed import ManagerBed
from tests.fixtures.libvirt_direct import open_libvirt

REPO = Path(__file__).resolve().parents[2]
WEBHOOK_MANIFESTS = REPO / "config" / "webhook" / "manifests.yaml"


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


# --- objects ---------------------------------------------------------------------------------


@dataclass
class SecurityBed(ManagerBed):
    """One test's objects in one namespace (see the module docstring)."""

    async def wait_condition(
        self, name: str, type_: str, *, reason: str, within: float
    ) -> dict[str, Any]:
        """The condition `type_` of LibvirtMachine `name` once it has `reason`."""
        cond = await self.wait_for(
            LIBVIRT_MACHINE,
            name,
            lambda obj: condition_of(obj, type_).get("reason") == reason,
            within=within,
            what=f"{type_} reason {reason}",
        )
        return condition_of(cond, type_)

    async def api_documents(self) -> dict[str, str]:
        """Every object of the namespace a user or controller reads, as JSON (Secrets are
        left out: they are where the secrets belong)."""
        documents: dict[str, str] = {}
        for resource in (CLUSTER, MACHINE, LIBVIRT_CLUSTER, LIBVIRT_MACHINE, EVENT):
            for obj in await self.list_objects(resource):
                documents[f"{resource.kind} {obj['metadata']['name']}"] = json.dumps(obj)
        return documents


# --- libvirt, directly -------------------------------------------------------------------


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
    conn = open_libvirt(uri)
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
