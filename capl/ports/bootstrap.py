"""Bootstrap data helpers (pure, in process): Ignition validation and NoCloud ISO images.

- Ignition (``format: ignition``) is delivered as a file through QEMU fw_cfg; before
  uploading it we check it is a JSON object with ``ignition.version``, so a malformed secret
  becomes a clear condition instead of a guest that never finishes booting.
- cloud-config (the default) is delivered as a NoCloud seed: an ISO 9660 image labelled
  ``cidata`` with ``user-data``, ``meta-data`` and optionally ``network-config``, built here
  with pycdlib (hosts need no mkisofs). Joliet and Rock Ridge names carry the lower-case
  file names cloud-init looks for.

The data is secret: error messages name the problem and the position, never the content.
"""

from __future__ import annotations

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


def nocloud_meta_data(*, instance_id: str, hostname: str) -> bytes:
    """The NoCloud ``meta-data`` document (YAML)."""
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
    files: list[tuple[str, str, bytes]] = [
        ("USERDATA.;1", "user-data", user_data),
        ("METADATA.;1", "meta-data", nocloud_meta_data(instance_id=instance_id, hostname=hostname)),
    ]
    if network_config is not None:
        files.append(("NETWORKC.;1", "network-config", network_config))
    iso = pycdlib.PyCdlib()
    iso.new(interchange_level=3, vol_ident=NOCLOUD_LABEL, joliet=3, rock_ridge="1.09")
    try:
        for iso_name, long_name, content in files:
            iso.add_fp(
                io.BytesIO(content),
                len(content),
                f"/{iso_name}",
                rr_name=long_name,
                joliet_path=f"/{long_name}",
            )
        out = io.BytesIO()
        iso.write_fp(out)
    finally:
        iso.close()
    return out.getvalue()
