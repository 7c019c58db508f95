"""Deterministic names and addresses derived from Kubernetes identities (pure functions).

Why deterministic: a crash between "create the thing" and "record it in the API object" must
not leak the thing. When the name (or MAC) follows from the machine's identity alone, the
next reconcile finds what the previous one created and carries on.

Scheme
------
- Every name capl gives a libvirt object starts with ``capl-``; volumes cannot carry
  metadata, so for them the name is the ownership tag.
- A machine's objects share ``capl-<namespace>-<name>-<h>`` where ``<h>`` is 8 hex digits of
  SHA-256 over ``namespace/name``: the hash keeps names unique when the readable part is
  ambiguous ("a-b"/"c" vs "a"/"b-c") or truncated. Its domain is named exactly that, its
  volumes append a role (``-root.qcow2``, ``-data<i>.qcow2``, ``-ignition.ign``,
  ``-cidata.iso``, ``-console.log``).
- A pool capl created holds the zero-byte marker volume ``.capl-owner.<namespace>.<name>``
  (namespaces have no dots, so the split is unambiguous; long names are shortened with a
  hash).
- MACs are ``52:54:00`` (the QEMU/KVM OUI) plus 3 bytes of SHA-256 over cluster, namespace,
  name and an ``attempt`` counter the caller bumps if the MAC is already reserved on the
  network by another machine (24 bits collide at scale; the controller records the MAC it
  settled on in the API object).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from capl.ports.errors import InvalidSpec

__all__ = [
    "CAPL_PREFIX",
    "POOL_OWNER_MARKER_PREFIX",
    "MachineNames",
    "base_image_volume_name",
    "is_capl_name",
    "machine_hostname",
    "machine_mac",
    "machine_names",
    "normalize_mac",
    "pool_owner_marker",
    "short_hash",
]

CAPL_PREFIX = "capl-"
POOL_OWNER_MARKER_PREFIX = ".capl-owner."

_READABLE_MAX = 80
_UNSAFE = re.compile(r"[^a-z0-9.-]+")


def short_hash(*parts: str, length: int = 8) -> str:
    """Hex digest prefix of SHA-256 over ``parts`` joined by NUL (unambiguous framing)."""
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:length]


def _readable(text: str, limit: int) -> str:
    cleaned = _UNSAFE.sub("-", text.lower()).strip("-.")
    return cleaned[:limit].rstrip("-.") or "x"


@dataclass(frozen=True, slots=True, kw_only=True)
class MachineNames:
    prefix: str
    """``capl-<namespace>-<name>-<hash>``: every volume of the machine starts with it."""
    domain: str
    root_volume: str
    ignition_volume: str
    cidata_volume: str
    console_log: str
    """File name (in the pool directory) the serial console is logged to."""

    def extra_volume(self, index: int) -> str:
        return f"{self.prefix}-data{index}.qcow2"

    def owns_volume(self, volume_name: str) -> bool:
        return volume_name.startswith(self.prefix + "-")


def machine_names(*, namespace: str, name: str) -> MachineNames:
    readable = _readable(f"{namespace}-{name}", _READABLE_MAX)
    prefix = f"{CAPL_PREFIX}{readable}-{short_hash(namespace, name)}"
    return MachineNames(
        prefix=prefix,
        domain=prefix,
        root_volume=f"{prefix}-root.qcow2",
        ignition_volume=f"{prefix}-ignition.ign",
        cidata_volume=f"{prefix}-cidata.iso",
        console_log=f"{prefix}-console.log",
    )


def machine_hostname(name: str) -> str:
    """A DNS label for the machine: its name when it is one, else shortened with a hash."""
    label = _UNSAFE.sub("-", name.lower()).replace(".", "-").strip("-")
    if label and len(label) <= 63 and label == name:
        return label
    return f"{label[:54].rstrip('-') or 'm'}-{short_hash(name, length=8)}"


def base_image_volume_name(*, image: str, digest: str | None = None, url: str | None = None) -> str:
    """``capl-base-<image>-<h>``; ``h`` from the sha256 digest when known, else the URL, so a
    changed image gets a new volume instead of silently reusing the old one."""
    basis = (digest or "").lower() or (url or image)
    return f"{CAPL_PREFIX}base-{_readable(image, _READABLE_MAX)}-{short_hash(basis, length=12)}"


def pool_owner_marker(*, namespace: str, name: str) -> str:
    readable = f"{namespace}.{name}"
    if len(readable) > 200 or _UNSAFE.search(readable):
        readable = (
            f"{_readable(namespace, 63)}.{_readable(name, 100)}~{short_hash(namespace, name)}"
        )
    return POOL_OWNER_MARKER_PREFIX + readable


def is_capl_name(name: str) -> bool:
    return name.startswith(CAPL_PREFIX) or name.startswith(POOL_OWNER_MARKER_PREFIX)


_MAC = re.compile(r"^[0-9a-f]{2}(:[0-9a-f]{2}){5}$")


def normalize_mac(mac: str) -> str:
    """Lower-case, colon-separated; raises InvalidSpec for anything else or multicast MACs."""
    value = mac.strip().lower().replace("-", ":")
    if not _MAC.match(value):
        raise InvalidSpec(f"{mac!r} is not a MAC address (expected 52:54:00:xx:xx:xx)")
    if int(value[:2], 16) & 1:
        raise InvalidSpec(f"{mac!r} is a multicast MAC address")
    return value


def machine_mac(*, cluster: str, namespace: str, name: str, attempt: int = 0) -> str:
    digest = hashlib.sha256(
        "\0".join(("capl-mac-v1", cluster, namespace, name, str(attempt))).encode()
    ).digest()
    return "52:54:00:" + ":".join(f"{b:02x}" for b in digest[:3])
