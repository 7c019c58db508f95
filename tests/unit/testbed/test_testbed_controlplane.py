"""ControlPlane's preparation, command lines and failure reporting, with stand-in binaries.

The stand-ins are shell scripts named like the real binaries: they let these tests check
what the launcher writes and how it reacts to a process that dies or never gets ready,
without kube-apiserver or etcd (tests/kube covers the real ones).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
from pathlib import Path

import pytest
import yaml

from capl.testbed import (
    AssetsMissing,
    ControlPlane,
    ControlPlaneError,
    ProcessFailed,
    find_assets,
    read_audit_events,
)
from capl.testbed.controlplane import ASSETS_ENV


def fake_assets(directory: Path, *, etcd: str = "exec sleep 300") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name, body in (("kube-apiserver", "exec sleep 300"), ("etcd", etcd), ("kubectl", "")):
        path = directory / name
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return directory


def flags(argv: list[str]) -> dict[str, str]:
    return dict(a[2:].split("=", 1) for a in argv[1:] if a.startswith("--") and "=" in a)


def test_find_assets_without_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ASSETS_ENV, raising=False)
    with pytest.raises(AssetsMissing, match=r"KUBEBUILDER_ASSETS is not set.*make envtest"):
        find_assets()


def test_find_assets_names_the_missing_binary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_assets(tmp_path)
    (tmp_path / "etcd").unlink()
    monkeypatch.setenv(ASSETS_ENV, str(tmp_path))
    with pytest.raises(AssetsMissing, match=r"^etcd not found .*make envtest"):
        find_assets()


def test_find_assets(tmp_path: Path) -> None:
    assets = find_assets(fake_assets(tmp_path))
    assert assets.kube_apiserver == tmp_path / "kube-apiserver"
    assert assets.etcd == tmp_path / "etcd"
    assert assets.kubectl == tmp_path / "kubectl"


def test_prepare_writes_pki_and_kubeconfig(tmp_path: Path) -> None:
    plane = ControlPlane(
        assets=find_assets(fake_assets(tmp_path / "bin")),
        workdir=tmp_path / "work",
        audit_log=tmp_path / "audit" / "audit.log",
    )
    plane.prepare()
    try:
        pki = plane.pki_dir
        for name in ("ca.crt", "apiserver.crt", "apiserver.key", "sa.key", "sa.pub"):
            assert (pki / name).is_file(), name
        for secret in ("apiserver.key", "sa.key", "admin.key"):
            assert stat.S_IMODE((pki / secret).stat().st_mode) == 0o600, secret

        config = yaml.safe_load(plane.kubeconfig.read_text())
        assert config["clusters"][0]["cluster"]["server"] == plane.url
        assert plane.url == f"https://127.0.0.1:{plane.apiserver_port}"
        ports = {plane.apiserver_port, plane.etcd_client_port, plane.etcd_peer_port}
        assert len(ports) == 3

        policy = yaml.safe_load((plane.workdir / "audit-policy.yaml").read_text())
        assert policy["kind"] == "Policy"
        assert (tmp_path / "audit").is_dir()
    finally:
        plane.close()
    assert (tmp_path / "work").is_dir(), "a given workdir is kept"


def test_apiserver_command_line(tmp_path: Path) -> None:
    plane = ControlPlane(
        assets=find_assets(fake_assets(tmp_path / "bin")),
        workdir=tmp_path / "work",
        watch_cache=False,
        audit_log=tmp_path / "audit.log",
        extra_apiserver_args=["--v=2"],
    )
    plane.prepare()
    argv = plane.apiserver_argv()
    f = flags(argv)
    assert argv[0] == str(tmp_path / "bin" / "kube-apiserver")
    assert f["authorization-mode"] == "RBAC"
    assert f["bind-address"] == "127.0.0.1"
    assert f["secure-port"] == str(plane.apiserver_port)
    assert f["etcd-servers"] == f"http://127.0.0.1:{plane.etcd_client_port}"
    assert f["client-ca-file"] == str(plane.ca_file)
    assert f["disable-admission-plugins"] == "ServiceAccount"
    assert f["service-account-issuer"].startswith("https://")
    assert Path(f["service-account-key-file"]).is_file()
    assert Path(f["service-account-signing-key-file"]).is_file()
    assert f["watch-cache"] == "false"
    assert f["audit-log-path"] == str(tmp_path / "audit.log")
    assert Path(f["audit-policy-file"]).is_file()
    assert argv[-1] == "--v=2"


def test_no_audit_flags_by_default(tmp_path: Path) -> None:
    plane = ControlPlane(assets=find_assets(fake_assets(tmp_path / "bin")), workdir=tmp_path / "w")
    plane.prepare()
    assert not any(a.startswith("--audit") for a in plane.apiserver_argv())
    assert flags(plane.apiserver_argv())["watch-cache"] == "true"
    with pytest.raises(ControlPlaneError, match="audit log is off"):
        plane.audit_events()


def test_etcd_command_line(tmp_path: Path) -> None:
    plane = ControlPlane(assets=find_assets(fake_assets(tmp_path / "bin")), workdir=tmp_path / "w")
    plane.prepare()
    f = flags(plane.etcd_argv())
    client = f"http://127.0.0.1:{plane.etcd_client_port}"
    peer = f"http://127.0.0.1:{plane.etcd_peer_port}"
    assert f["listen-client-urls"] == f["advertise-client-urls"] == client
    assert f["listen-peer-urls"] == f["initial-advertise-peer-urls"] == peer
    assert f["initial-cluster"] == f"capl-testbed={peer}"
    assert f["data-dir"] == str(plane.workdir / "etcd")


def test_add_user_writes_a_kubeconfig(tmp_path: Path) -> None:
    plane = ControlPlane(assets=find_assets(fake_assets(tmp_path / "bin")), workdir=tmp_path / "w")
    plane.prepare()
    path = plane.add_user("nobody", groups=["viewers"])
    assert path == plane.workdir / "users" / "nobody.kubeconfig"
    config = yaml.safe_load(path.read_text())
    assert config["users"][0]["name"] == "nobody"
    assert config["clusters"][0]["cluster"]["server"] == plane.url
    with pytest.raises(ValueError, match="unsupported user name"):
        plane.add_user("../escape")


def test_temporary_workdir_is_removed(tmp_path: Path) -> None:
    plane = ControlPlane(assets=find_assets(fake_assets(tmp_path / "bin")))
    plane.prepare()
    workdir = plane.workdir
    assert workdir.is_dir()
    plane.close()
    assert not workdir.exists()


async def test_a_process_that_dies_reports_its_log(tmp_path: Path) -> None:
    etcd = "echo 'etcd: something broke' >&2; exit 3"
    plane = ControlPlane(assets=find_assets(fake_assets(tmp_path / "bin", etcd=etcd)))
    with pytest.raises(ProcessFailed, match=r"(?s)etcd exited with status 3.*something broke"):
        await plane.start()
    assert plane.etcd_process is not None
    assert not plane.etcd_process.running


async def test_lost_port_race_is_retried_then_reported(tmp_path: Path) -> None:
    etcd = "echo 'listen tcp 127.0.0.1:1: bind: address already in use' >&2; exit 1"
    plane = ControlPlane(
        assets=find_assets(fake_assets(tmp_path / "bin", etcd=etcd)), workdir=tmp_path / "w"
    )
    with pytest.raises(ProcessFailed, match="address already in use"):
        await plane.start()
    assert (tmp_path / "w" / "logs" / "etcd.log").read_text().count("starting etcd") == 3


async def test_a_process_that_never_gets_ready_is_stopped(tmp_path: Path) -> None:
    plane = ControlPlane(
        assets=find_assets(fake_assets(tmp_path / "bin")),  # etcd stand-in just sleeps
        ready_timeout=0.5,
    )
    with pytest.raises(ControlPlaneError, match=r"etcd did not become ready within 0\.5 s"):
        await plane.start()
    proc = plane.etcd_process
    assert proc is not None
    assert not proc.running
    assert proc.returncode is not None  # stopped and reaped, not left behind


def test_read_audit_events_leaves_a_partial_line(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    first = json.dumps({"verb": "get"}) + "\n"
    path.write_text(first + '{"verb": "cre')
    events, offset = read_audit_events(path)
    assert events == [{"verb": "get"}]
    assert offset == len(first)
    with path.open("a") as f:
        f.write('ate"}\n')
    events, offset = read_audit_events(path, offset=offset)
    assert events == [{"verb": "create"}]
    assert offset == os.path.getsize(path)
    assert read_audit_events(tmp_path / "absent.log", offset=7) == ([], 7)


def test_stale_temporary_workdirs_are_swept(tmp_path: Path) -> None:
    tmp = Path(tempfile.gettempdir())
    dead = Path(tempfile.mkdtemp(prefix="capl-controlplane-", dir=tmp))
    (dead / "owner").write_text("999999999 1")  # no such process
    reused = Path(tempfile.mkdtemp(prefix="capl-controlplane-", dir=tmp))
    (reused / "owner").write_text(f"{os.getpid()} 1")  # our pid, another start time
    foreign = Path(tempfile.mkdtemp(prefix="capl-controlplane-", dir=tmp))  # no owner file
    plane = ControlPlane(assets=find_assets(fake_assets(tmp_path / "bin")))
    try:
        plane.prepare()
        assert not dead.exists()
        assert not reused.exists()
        assert foreign.exists()
        assert (plane.workdir / "owner").read_text().startswith(f"{os.getpid()} ")
        second = ControlPlane(assets=find_assets(fake_assets(tmp_path / "bin")))
        second.prepare()  # a live owner's directory is left alone
        assert plane.workdir.exists()
        second.close()
    finally:
        plane.close()
        shutil.rmtree(foreign, ignore_errors=True)
