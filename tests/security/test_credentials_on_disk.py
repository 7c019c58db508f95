"""No credentials on disk beyond 0600 files that are removed.

libvirt reads TLS certificates and ssh keys from files, and kubernetes_asyncio reads client
certificates from files: the manager has to write the credentials it gets from Secrets. Here
the real `capl manager` process runs with its own TMPDIR (0755, like a shared /tmp: a file
that is private only because the directory happens to be private does not pass) and a
cluster with two hosts that need credentials — the test driver behind `test+tls://` (the
private TLS libvirtd: client certificate and key) and behind `test+ssh://` (the private sshd:
private key and known_hosts) — plus a `<cluster>-kubeconfig` Secret with an embedded client
key, which the manager loads once a machine is Ready (to give the workload Node its
providerID).

Proven, by listing the manager's TMPDIR while it runs:
- every file the manager wrote is mode 0600 and lies in a directory of mode 0700 below
  TMPDIR, except the ssh wrapper script capl generates (0700: it must be executable), which
  holds no secret;
- the directories hold what was expected (TLS: cacert/clientcert/clientkey; ssh: the key and
  known_hosts; the workload kubeconfig's certificate files), so the check is not vacuous;
- after SIGTERM, nothing the manager wrote is left in TMPDIR;
- after the LibvirtCluster is deleted (the manager keeps running), its hosts' credential
  files are gone.
"""

from __future__ import annotations

import base64
import stat
from pathlib import Path

import pytest
import yaml

from capl.runtime.resources import LIBVIRT_CLUSTER
from capl.testbed import ControlPlane
from capl.testbed.caplmanager import CaplManager
from tests.fixtures.bed import Host
from tests.fixtures.capl import CaplManagerFactory
from tests.fixtures.common import eventually
from tests.fixtures.transports import SshServer, TlsLibvirtd, ssh_server
from tests.security.bed import FileEntry, SecurityBed, tree

__all__ = ["ssh_server"]  # the session fixture, registered by this import

pytestmark = [pytest.mark.apiserver, pytest.mark.libvirtd]

SSH_WRAPPER = "ssh"


async def run_manager(
    factory: CaplManagerFactory, plane: ControlPlane, *, namespace: str, tmp: Path
) -> CaplManager:
    manager = await factory(
        plane,
        name=f"capl-disk-{namespace[-6:]}",
        namespace=namespace,
        webhooks=False,
        log_level="info",
        env={"TMPDIR": str(tmp)},
    )
    await manager.start()
    return manager


@pytest.fixture
async def manager_with_credentials(
    bed: SecurityBed,
    control_plane: ControlPlane,
    capl_manager_factory: CaplManagerFactory,
    tls_libvirtd: TlsLibvirtd,
    tls_pki: Path,
    ssh_server: SshServer,
    shared_test_driver: str,
    private_tmp: Path,
) -> CaplManager:
    """The manager (TMPDIR `private_tmp`) running a cluster whose hosts need credentials
    (TLS and ssh), plus a `<cluster>-kubeconfig` Secret; one machine Ready."""
    manager = await run_manager(
        capl_manager_factory, control_plane, namespace=bed.namespace, tmp=private_tmp
    )
    await bed.secret("tls-credentials", tls_libvirtd.credentials)
    await bed.secret("ssh-credentials", ssh_server.credentials())
    tls = Host(
        "tls",
        tls_libvirtd.uri(),
        direct_uri=f"{tls_libvirtd.uri()}?pkipath={tls_pki}",
        credentials_secret="tls-credentials",
    )
    ssh = Host(
        "ssh",
        ssh_server.uri(driver="test", path="/default"),
        direct_uri=shared_test_driver,
        credentials_secret="ssh-credentials",
    )
    cluster = await bed.create_cluster(
        "disk", hosts=[tls, ssh], base_volume_on=["tls"], adopt_network=True
    )
    await bed.secret(
        "disk-kubeconfig", {"value": control_plane.add_user(f"{bed.namespace}-wl").read_bytes()}
    )
    await bed.create_machine(cluster, "m0", host="tls")
    await bed.wait_ready("m0", within=90)
    return manager


def problems(entries: list[FileEntry], tmp: Path, secrets: list[bytes]) -> list[str]:
    """Everything below `tmp` that is not a 0600 file in a 0700 directory."""
    found = []
    for entry in entries:
        where = entry.path.relative_to(tmp)
        parent_mode = stat.S_IMODE(entry.path.parent.stat().st_mode)
        if entry.is_dir:
            if entry.mode != 0o700:
                found.append(f"directory {where} has mode {entry.mode:04o}, not 0700")
            continue
        if entry.path.parent == tmp or parent_mode != 0o700:
            found.append(f"file {where} lies in a directory of mode {parent_mode:04o}")
        if entry.path.name == SSH_WRAPPER and entry.mode == 0o700:
            content = entry.path.read_bytes()
            if any(s in content for s in secrets):
                found.append(f"the ssh wrapper {where} contains secret material")
        elif entry.mode != 0o600:
            found.append(f"file {where} has mode {entry.mode:04o}, not 0600")
    return found


def names_below(entries: list[FileEntry], prefix: str) -> set[str]:
    return {
        e.path.name
        for e in entries
        if not e.is_dir and any(p.name.startswith(prefix) for p in e.path.parents)
    }


def own_kubeconfig_files(entries: list[FileEntry], kubeconfig: Path) -> set[Path]:
    """The files kubernetes_asyncio wrote for the manager's own --kubeconfig (its embedded CA,
    client certificate and key), recognised by their content."""
    config = yaml.safe_load(kubeconfig.read_text())
    blobs = {
        base64.b64decode(value)
        for section in ("clusters", "users")
        for item in config[section]
        for key, value in (item.get("cluster") or item.get("user") or {}).items()
        if key.endswith("-data")
    }
    return {e.path for e in entries if not e.is_dir and e.path.read_bytes() in blobs}


async def test_credential_files_are_private_and_gone_after_sigterm(
    manager_with_credentials: CaplManager,
    tls_libvirtd: TlsLibvirtd,
    ssh_server: SshServer,
    private_tmp: Path,
) -> None:
    manager = manager_with_credentials

    async def written() -> list[FileEntry] | None:
        entries = tree(private_tmp)
        files = {e.path.name for e in entries if not e.is_dir}
        wanted = {"cacert.pem", "clientcert.pem", "clientkey.pem", "id", "known_hosts"}
        # the manager's own kubeconfig files share the private directory with the workload
        # cluster's: more files there than its own means the workload client wrote its own
        kubeconfig_files = names_below(entries, "capl-kubeconfig-")
        own = own_kubeconfig_files(entries, manager.kubeconfig)
        if not wanted <= files or len(kubeconfig_files) <= len(own):
            raise AssertionError(sorted(str(e.path.relative_to(private_tmp)) for e in entries))
        return entries

    entries = await eventually(
        written, within=60, what="the TLS, ssh and workload kubeconfig credential files"
    )
    secrets = [tls_libvirtd.credentials["tls.key"], ssh_server.client_key]
    assert problems(entries, private_tmp, secrets) == []

    assert await manager.stop() == 0
    left = [str(e.path.relative_to(private_tmp)) for e in tree(private_tmp)]
    assert left == [], f"left behind after SIGTERM: {left}"


async def test_own_kubeconfig_files_are_private(
    control_plane: ControlPlane,
    capi_crds: list[str],
    capl_manager_factory: CaplManagerFactory,
    namespace: str,
    private_tmp: Path,
) -> None:
    """Minimal reproduction: `capl manager --kubeconfig <file with embedded certificates>`
    with TMPDIR set; nothing else is needed."""
    manager = await run_manager(
        capl_manager_factory, control_plane, namespace=namespace, tmp=private_tmp
    )
    entries = tree(private_tmp)
    own = own_kubeconfig_files(entries, manager.kubeconfig)
    assert own, "the manager wrote no files for its kubeconfig"
    assert problems([e for e in entries if e.path in own], private_tmp, []) == []


async def test_host_credential_files_go_with_the_cluster(
    bed: SecurityBed, manager_with_credentials: CaplManager, private_tmp: Path
) -> None:
    async def host_files() -> set[str] | None:
        return names_below(tree(private_tmp), "capl-host-")

    assert await eventually(host_files, within=30, what="host credential files")
    await bed.delete_all(within=120)
    assert await bed.get(LIBVIRT_CLUSTER, "disk") is None

    async def gone() -> bool:
        left = names_below(tree(private_tmp), "capl-host-")
        if left:
            raise AssertionError(f"still on disk: {sorted(left)}")
        return True

    await eventually(gone, within=30, what="the host credential files removed")
