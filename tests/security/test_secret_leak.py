"""Secrets never leak: bootstrap data and host credentials stay where they belong.

One run of the real `capl manager` process (debug logging, webhooks on) provisions a
cluster with two hosts:

- `kvm`: the real libvirtd (`qemu:///system`) — one TCG guest booting with an Ignition
  bootstrap Secret that carries a random token;
- `tls`: the libvirt test driver inside a private libvirtd reached over `test+tls://`, with
  a host credentials Secret (TLS client certificate and key; the key file carries a random
  marker line before its PEM block, which TLS libraries ignore and capl must copy into its
  credential files unchanged) — a machine with a cloud-config bootstrap Secret holding a
  second token, and two machines whose Ignition is malformed and contains further tokens
  (invalid JSON; an invalid `ignition.version` that *is* the token): the failure path, which
  must end in a condition and an event naming the problem, not the data;
- a `<cluster>-kubeconfig` Secret (a workload cluster's admin kubeconfig with an embedded
  client key), which the manager reads to give the workload Node its providerID.

Then everything the run produced is searched for every secret, in every form (raw, and base64
at all three alignments, see `tests.security.bed.Needles`):
the manager's log (all of it, debug level, including the deletion afterwards), every Event in
the namespace, every Cluster / Machine / LibvirtCluster / LibvirtMachine (spec, metadata,
status with its conditions), the XML of every domain (live and inactive, VIR_DOMAIN_XML_SECURE),
network, storage pool and volume on both hosts, QEMU's log of the guest's domain
(/var/log/libvirt/qemu/<domain>.log: the command line), and every file in the cluster's pool
directory on the real host.

Excluded, on purpose and exactly: the Ignition volume's content (the guest must read the token
from it through fw_cfg) and the guest's own serial log (the test guest prints the Ignition it
received) — both are asserted to contain the token, which proves the token went where it
belongs and that the search would have found it. Secrets themselves are not searched (that is
where the data lives), nor the manager's credential files (tests/security/
test_credentials_on_disk.py checks their permissions and removal).
"""

from __future__ import annotations

import asyncio
import base64
import json
import secrets
from pathlib import Path
from typing import Any

import pytest
import yaml

from capl.api import constants as c
from capl.ports.naming import machine_names
from capl.testbed import ControlPlane
from capl.testing.objects import libvirt_machine_spec
from tests.fixtures.bed import Host
from tests.fixtures.capl import CaplManagerFactory
from tests.fixtures.common import eventually
from tests.fixtures.guest import ignition_config
from tests.fixtures.transports import TlsLibvirtd
from tests.security.bed import (
    Needles,
    SecurityBed,
    find_leaks,
    install_webhooks,
    libvirt_documents,
    remove_webhooks,
    token,
    webhook_configurations,
)

pytestmark = [pytest.mark.apiserver, pytest.mark.libvirtd, pytest.mark.guest]

BOOT_TIMEOUT = 240.0
QEMU_LOG_DIR = Path("/var/log/libvirt/qemu")


def guest_spec(image: Path) -> dict[str, Any]:
    return {
        "image": {"path": str(image), "format": "qcow2"},
        "cpus": 1,
        "memoryMiB": 256,
        "domainType": "qemu",
    }


def workload_kubeconfig(plane: ControlPlane, user: str) -> bytes:
    """An admin-style kubeconfig with an embedded client key (of a user without rights)."""
    return plane.add_user(user).read_bytes()


def kubeconfig_key(kubeconfig: bytes) -> bytes:
    config = yaml.safe_load(kubeconfig)
    return base64.b64decode(config["users"][0]["user"]["client-key-data"])


async def test_secrets_never_leak(
    bed: SecurityBed,
    control_plane: ControlPlane,
    capl_manager_factory: CaplManagerFactory,
    tls_libvirtd: TlsLibvirtd,
    tls_pki: Path,
    libvirtd_uri: str,
    guest_image: Path,
    private_tmp: Path,
) -> None:
    ns = bed.namespace
    needles = Needles()

    # -- the secrets ---------------------------------------------------------------------
    ignition_token = token("ignition")
    cloud_config_token = token("cloudconfig")
    bad_json_token = token("badjson")
    bad_version_token = token("badversion")
    credentials_marker = token("credentials")
    key_with_marker = (
        f"capl test marker {credentials_marker}\n".encode() + tls_libvirtd.credentials["tls.key"]
    )
    kubeconfig = workload_kubeconfig(control_plane, f"capl-leak-{secrets.token_hex(4)}")
    for name, value in (
        ("Ignition token", ignition_token),
        ("cloud-config token", cloud_config_token),
        ("malformed-Ignition token", bad_json_token),
        ("bad-version token", bad_version_token),
        ("credentials marker", credentials_marker),
    ):
        needles.add(name, value)
    needles.add_pem_key("TLS client key", tls_libvirtd.credentials["tls.key"])
    needles.add_pem_key("workload kubeconfig key", kubeconfig_key(kubeconfig))

    # -- the manager -----------------------------------------------------------------------
    manager = await capl_manager_factory(
        control_plane,
        name="capl-leak",
        namespace=ns,
        log_level="debug",
        extra_args=["--machine-shutdown-timeout=10s", "--concurrency=4"],
        env={"TMPDIR": str(private_tmp)},
    )
    await manager.start()
    hooks = await install_webhooks(
        control_plane,
        webhook_configurations(
            base_url=manager.webhook_url, ca_pem=manager.ca_pem, namespace=ns, suffix=ns
        ),
    )
    try:
        # -- the cluster -------------------------------------------------------------------
        await bed.secret(
            "tls-credentials",
            {
                "ca.crt": tls_libvirtd.credentials["ca.crt"],
                "tls.crt": tls_libvirtd.credentials["tls.crt"],
                "tls.key": key_with_marker,
            },
        )
        kvm = Host("kvm", libvirtd_uri)
        tls = Host(
            "tls",
            tls_libvirtd.uri(),
            direct_uri=f"{tls_libvirtd.uri()}?pkipath={tls_pki}",
            credentials_secret="tls-credentials",
        )
        cluster = await bed.create_cluster(
            "leak", hosts=[kvm, tls], base_volume_on=["tls"], within=180, adopt_network=True
        )
        await bed.secret("leak-kubeconfig", {"value": kubeconfig})

        # -- the machines ------------------------------------------------------------------
        ignition = ignition_config(hostname="guest", files={"/etc/capl-token": ignition_token})
        cloud_config = (
            "#cloud-config\nwrite_files:\n- path: /etc/capl-token\n"
            f"  content: {cloud_config_token}\n"
        ).encode()
        bad_json = (
            '{"ignition": {"version": "3.4.0"}, "storage": {"files": [{"path": "/etc/t", '
            f'"contents": {{"source": "data:,{bad_json_token}'
        ).encode()
        bad_version = json.dumps({"ignition": {"version": bad_version_token}}).encode()
        td = libvirt_machine_spec()
        await bed.create_machine(
            cluster,
            "guest",
            spec=guest_spec(guest_image),
            bootstrap=ignition,
            format="ignition",
            host="kvm",
        )
        await bed.create_machine(cluster, "cc", spec=td, bootstrap=cloud_config, host="tls")
        await bed.create_machine(
            cluster, "bad-json", spec=td, bootstrap=bad_json, format="ignition",
            host="tls",
        )  # fmt: skip
        await bed.create_machine(
            cluster, "bad-version", spec=td, bootstrap=bad_version, format="ignition",
            host="tls",
        )  # fmt: skip

        await bed.wait_ready("cc", within=90)
        for name in ("bad-json", "bad-version"):
            cond = await bed.wait_condition(
                name,
                c.ConditionType.BOOTSTRAP_DATA_DELIVERED,
                reason=c.Reason.BOOTSTRAP_DATA_INVALID,
                within=90,
            )
            assert "Ignition" in cond["message"], cond  # names the problem ...
        await bed.wait_ready("guest", within=BOOT_TIMEOUT)

        # -- where the secrets must be (so the search below would find them) ---------------
        names = machine_names(namespace=ns, name="guest")
        ignition_file = cluster.pool_path / names.ignition_volume
        serial_log = cluster.pool_path / names.console_log
        assert ignition_token.encode() in ignition_file.read_bytes()

        async def guest_printed_it() -> bool:  # the guest echoes its Ignition in base64
            log = serial_log.read_bytes() if serial_log.exists() else b""
            return any(form in log for form in needles.secrets_["Ignition token"])

        await eventually(guest_printed_it, within=60, what="the guest's serial log")

        # -- evidence while everything exists ------------------------------------------------
        leaks: list[str] = []
        for where, text in (await bed.api_documents()).items():
            leaks += find_leaks(where, text, needles)
        for host, machine in ((kvm, "guest"), (tls, "cc")):
            documents = await asyncio.to_thread(libvirt_documents, host.open_uri)
            domain = machine_names(namespace=ns, name=machine).domain
            assert any(key.endswith(f" domain {domain}") for key in documents), documents.keys()
            for where, text in documents.items():
                leaks += find_leaks(where, text, needles)
        excluded = {ignition_file, serial_log}
        scanned = 0
        for path in sorted(cluster.pool_path.iterdir()):
            if path.is_file() and path not in excluded:
                leaks += find_leaks(f"file {path}", path.read_bytes(), needles)
                scanned += 1
        assert scanned >= 2, "the root overlay and base image were not found"
        qemu_log = QEMU_LOG_DIR / f"{names.domain}.log"
        if qemu_log.exists():
            leaks += find_leaks(f"file {qemu_log}", qemu_log.read_bytes(), needles)

        # -- deletion, then the rest ---------------------------------------------------------
        await bed.delete_all(within=180)
        for where, text in (await bed.api_documents()).items():
            leaks += find_leaks(where, text, needles)
        await manager.stop()
        log = manager.log_text()
        levels = {record.get("level") for record in manager.log_records()}
        assert "debug" in levels, levels  # the search covered the most verbose level
        leaks += find_leaks(f"manager log {manager.log_path}", log, needles)
        assert not leaks, "secrets leaked:\n" + "\n".join(leaks)
    finally:
        await remove_webhooks(control_plane, hooks)
