"""Bootstrap data helpers (pure, in process): Ignition validation and NoCloud ISO images.

- Ignition (``format: ignition``) is delivered as a file through QEMU fw_cfg; before
  uploading it we check it is a JSON object with ``ignition.version``, so a malformed secret
  becomes a clear condition instead of a guest that never finishes booting.
- cloud-config (the default) is delivered as a NoCloud seed: an ISO 9660 image labelled
  ``cidata`` with ``user-data``, ``meta-data`` and optionally ``network-config``, built here
  with pycdlib (hosts need no mkisofs). Joliet and Rock Ridge names carry the lower-case
  file names cloud-init looks for. Where pycdlib puts each file depends only on the
  files' sizes, not on their bytes: the image is laid out once per size triple (the zero-filled
  layout is kept, a few at most) and each seed is that layout with its files' bytes written at
  the places pycdlib gave them — the same image pycdlib would write, but for the timestamps,
  which are those of the layout's making (cloud-init reads none of them). Laying out an image
  costs about 1.5 ms of CPU, the copy a few microseconds (issue 16: the manager's own CPU per
  machine).

The data is secret: error messages name the problem and the position, never the content.
"""

from __future__ import annotations

import functools
import io
import json
import re
from typing import Any

import pycdlib
import yaml

from capl.ports.errors import BootstrapDataError

__all__ = [
    "NOCLOUD_LABEL",
    "build_nocloud_iso",
    "nocloud_meta_data",
    "validate_ignition",
]

NOCLOUD_LABEL = "cidata"
_VERSION = re.compile(r"[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.]+)?")


def _refuse_constant(name: str) -> Any:
    raise BootstrapDataError(f"Ignition config is not valid JSON: {name} is not a JSON value")


def validate_ignition(data: bytes) -> dict[str, Any]:
    """Parse and minimally validate an Ignition config; returns the parsed object."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BootstrapDataError(f"Ignition config is not valid UTF-8 (byte {exc.start})") from None
    if not text.strip():
        raise BootstrapDataError("Ignition config is empty")
    try:
        parsed = json.loads(text, parse_constant=_refuse_constant)
    except json.JSONDecodeError as exc:
        raise BootstrapDataError(
            f"Ignition config is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    except RecursionError:
        raise BootstrapDataError("Ignition config is nested too deeply to parse") from None
    except ValueError as exc:  # e.g. an integer beyond Python's digit limit
        raise BootstrapDataError(f"Ignition config is not usable JSON: {exc}") from None
    if not isinstance(parsed, dict):
        raise BootstrapDataError(
            f"Ignition config must be a JSON object, got {type(parsed).__name__}"
        )
    section = parsed.get("ignition")
    if not isinstance(section, dict):
        raise BootstrapDataError('Ignition config has no "ignition" object')
    version = section.get("version")
    if not isinstance(version, str) or not _VERSION.fullmatch(version):
        raise BootstrapDataError(
            'Ignition config has no valid "ignition.version" (expected e.g. "3.4.0")'
        )
    return parsed


_PLAIN_ASCII = re.compile(r"[ -~]*")


def nocloud_meta_data(*, instance_id: str, hostname: str) -> bytes:
    """The NoCloud ``meta-data`` document (YAML). Printable ASCII values (UIDs and host
    names, i.e. always in practice) as double-quoted scalars, whose JSON escapes YAML reads
    alike, without the YAML emitter's cost; anything else through the emitter."""
    if _PLAIN_ASCII.fullmatch(instance_id) and _PLAIN_ASCII.fullmatch(hostname):
        return (
            f"instance-id: {json.dumps(instance_id)}\nlocal-hostname: {json.dumps(hostname)}\n"
        ).encode()
    doc = {"instance-id": instance_id, "local-hostname": hostname}
    return yaml.safe_dump(doc, default_flow_style=False, sort_keys=True).encode()


def build_nocloud_iso(
    *,
    user_data: bytes,
    instance_id: str,
    hostname: str,
    network_config: bytes | None = None,
) -> bytes:
    """A NoCloud seed ISO (label ``cidata``) as bytes."""
    contents = [user_data, nocloud_meta_data(instance_id=instance_id, hostname=hostname)]
    if network_config is not None:
        contents.append(network_config)
    layout, offsets = _layout(tuple(len(content) for content in contents))
    image = bytearray(layout)
    for offset, content in zip(offsets, contents, strict=True):
        image[offset : offset + len(content)] = content
    return bytes(image)


_FILES = (
    ("USERDATA.;1", "user-data"),
    ("METADATA.;1", "meta-data"),
    ("NETWORKC.;1", "network-config"),
)
"""(ISO 9660 name, Rock Ridge and Joliet name) of each file, in the order of their sizes."""


@functools.lru_cache(maxsize=8)
def _layout(sizes: tuple[int, ...]) -> tuple[bytes, tuple[int, ...]]:
    """The seed image with zero-filled files of these sizes (user-data, meta-data and, when
    given, network-config), and the byte offset of each file in it (see the module
    docstring)."""
    iso = pycdlib.PyCdlib()
    iso.new(interchange_level=3, vol_ident=NOCLOUD_LABEL, joliet=3, rock_ridge="1.09")
    try:
        for (iso_name, long_name), size in zip(_FILES, sizes, strict=False):
            iso.add_fp(
                io.BytesIO(bytes(size)),
                size,
                f"/{iso_name}",
                rr_name=long_name,
                joliet_path=f"/{long_name}",
            )
        out = io.BytesIO()
        iso.write_fp(out)
        block = iso.pvd.log_block_size
        offsets = tuple(
            iso.get_record(iso_path=f"/{iso_name}").extent_location() * block
            for iso_name, _ in _FILES[: len(sizes)]
        )
    finally:
        iso.close()
    image = out.getvalue()
    if any(offset + size > len(image) for offset, size in zip(offsets, sizes, strict=True)):
        raise AssertionError("pycdlib placed a file beyond the image's end")  # pragma: no cover
    return image, offsets
