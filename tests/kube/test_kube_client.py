"""capl.kube.KubeClient against the real API server: verbs, typed errors, watch, 410, stats."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncGenerator
from pathlib import Path

import pytest

from capl.kube import KubeClient, KubeconfigError, load_configuration
from capl.kube.config import find_source
from capl.runtime.client import WatchEvent
from capl.runtime.errors import AlreadyExists, Conflict, Gone, Invalid, NotFound
from capl.runtime.objects import ObjectKey
from capl.runtime.resources import CONFIG_MAP, NAMESPACE
from capl.testbed import ControlPlane
from capl.testing.toy import TOY, toy

pytestmark = pytest.mark.apiserver


async def test_verbs_and_typed_errors(kube: KubeClient, namespace: str) -> None:
    toys = kube.resource(TOY)
    key = ObjectKey(namespace, "t1")
    created = await toys.create(toy("t1", namespace, 3, team="a"))
    assert created["metadata"]["generation"] == 1
    with pytest.raises(AlreadyExists):
        await toys.create(toy("t1", namespace))
    got = await toys.get(key)
    assert got["spec"] == {"value": 3}
    listed = await toys.list(namespace=namespace, label_selector="team=a", limit=1)
    assert [o["metadata"]["name"] for o in listed.items] == ["t1"]
    assert listed.items[0]["kind"] == "Toy"
    assert listed.resource_version
    patched = await toys.patch(key, {"spec": {"value": 4}, "status": {"ignored": True}})
    assert patched["metadata"]["generation"] == 2
    assert "status" not in patched  # the main resource ignores status
    status = await toys.patch_status(key, {"status": {"observed": 4}})
    assert status["status"] == {"observed": 4}
    assert status["metadata"]["generation"] == 2  # status writes do not bump generation
    with pytest.raises(Conflict):
        await toys.patch(
            key,
            {"metadata": {"finalizers": ["x"]}},
            resource_version=created["metadata"]["resourceVersion"],
        )
    await toys.patch(
        key,
        {"metadata": {"finalizers": ["x"]}},
        resource_version=status["metadata"]["resourceVersion"],
    )
    with pytest.raises(NotFound):
        await toys.get(ObjectKey(namespace, "missing"))
    with pytest.raises(Invalid):
        await kube.resource(CONFIG_MAP).create(
            {"metadata": {"name": "Not_Valid", "namespace": namespace}}
        )
    deleting = await toys.delete(key)
    assert deleting is not None
    assert deleting["metadata"]["deletionTimestamp"]
    await toys.patch(key, {"metadata": {"finalizers": None}})
    with pytest.raises(NotFound):
        await toys.get(key)
    with pytest.raises(NotFound):
        await toys.delete(key)
    # accounting: per object, by verb and subresource
    counts = {(r.method, r.subresource): n for r, n in kube.stats.object_counts(key=key).items()}
    assert counts[("PATCH", "status")] == 1
    assert counts[("POST", "")] == 2
    assert kube.stats.total(method="PATCH", code=409) == 1
    assert kube.stats.writes(resource=TOY, key=key) == sum(
        n for (m, _), n in counts.items() if m != "GET"
    )


async def test_watch_from_a_resource_version_and_gone_after_compaction(
    kube: KubeClient, namespace: str, control_plane: ControlPlane
) -> None:
    toys = kube.resource(TOY)
    start = await toys.list(namespace=namespace)
    await toys.create(toy("a", namespace))
    await toys.patch(ObjectKey(namespace, "a"), {"spec": {"value": 2}})
    await toys.delete(ObjectKey(namespace, "a"))
    seen = []
    stream = toys.watch(
        resource_version=start.resource_version, namespace=namespace, timeout_seconds=5
    )
    async with contextlib.aclosing(stream):
        async for event in stream:
            if event.type != "BOOKMARK":
                seen.append(event.type)
            if len(seen) == 3:
                break
    assert seen == ["ADDED", "MODIFIED", "DELETED"]
    await control_plane.compact()
    with pytest.raises(Gone):
        await drain(toys.watch(resource_version=start.resource_version, namespace=namespace))
    assert kube.stats.total(method="WATCH") == 2


async def drain(stream: AsyncGenerator[WatchEvent, None]) -> None:
    async with contextlib.aclosing(stream):
        async for _ in stream:
            pass


async def test_cluster_scoped_and_kubeconfig_discovery(
    control_plane: ControlPlane, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    await control_plane.ensure_running()
    monkeypatch.setenv("KUBECONFIG", str(control_plane.kubeconfig))
    client = await KubeClient.connect()
    try:
        names = {o["metadata"]["name"] for o in (await client.resource(NAMESPACE).list()).items}
        assert "default" in names
    finally:
        await client.close()
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "nope"))
    with pytest.raises(KubeconfigError, match=r"KUBECONFIG=.*no such file"):
        await load_configuration()
    with pytest.raises(KubeconfigError, match="--kubeconfig"):
        await load_configuration(str(tmp_path / "nope"))
    monkeypatch.delenv("KUBECONFIG")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(KubeconfigError, match="no kubeconfig found"):
        find_source()
    (tmp_path / ".kube").mkdir()
    (tmp_path / ".kube" / "config").write_text(control_plane.kubeconfig.read_text())
    assert find_source().path == os.path.join(tmp_path, ".kube", "config")
