"""etcd of a test-bed control plane through its gRPC gateway (JSON over HTTP): health, the
current revision, and compaction — etcdctl is not part of the assets.

`compact` drives etcd's own compaction. kube-apiserver's watch cache keeps serving events
from memory after an etcd compaction; start the control plane with `watch_cache=False` when
watches from old resourceVersions must see 410 Gone deterministically (the test fixture does).
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Mapping
from typing import Any

import aiohttp

from capl.testbed.assets import ControlPlaneError

log = logging.getLogger(__name__)


async def health(url: str) -> tuple[bool, str]:
    """etcd's `/health`: (healthy?, what it answered)."""
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as session,
        session.get(f"{url}/health") as resp,
    ):
        body = await resp.text()
        if resp.status != 200:
            return False, f"HTTP {resp.status}: {body.strip()}"
        return json.loads(body).get("health") == "true", body.strip()


async def call(url: str, path: str, payload: Mapping[str, Any]) -> dict[str, Any]:
    """One gateway call; an error answer raises ControlPlaneError."""
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session,
        session.post(f"{url}{path}", json=payload) as resp,
    ):
        body: dict[str, Any] = await resp.json(content_type=None)
        if resp.status != 200 or "error" in body or "code" in body:
            raise ControlPlaneError(f"etcd {path} failed: HTTP {resp.status} {body}")
        return body


async def current_revision(url: str) -> int:
    """etcd's current revision (the newest resourceVersion kube-apiserver handed out)."""
    key = base64.b64encode(b"/capl-testbed/revision-probe").decode()
    body = await call(url, "/v3/kv/range", {"key": key, "count_only": True})
    return int(body["header"]["revision"])


async def compact(url: str) -> int:
    """Compact etcd's history up to its current revision; returns that revision.

    Afterwards, a watch (or a paginated list continuation) from any older resourceVersion
    that reaches etcd fails with 410 Gone. Compacting twice with no write in between is a
    no-op.
    """
    revision = await current_revision(url)
    try:
        await call(url, "/v3/kv/compaction", {"revision": str(revision), "physical": True})
    except ControlPlaneError as e:
        if "required revision has been compacted" not in str(e):
            raise
    log.info("etcd compacted to revision %d", revision)
    return revision
