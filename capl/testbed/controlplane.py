"""A real Kubernetes control plane on loopback: one etcd member and one kube-apiserver.

What a test or the demo gets is an unmodified kube-apiserver with RBAC, x509 client
authentication and its usual admission chain, backed by a throw-away etcd: the same
semantics (resourceVersions, 409 conflicts, watches that resume, 410 Gone after compaction,
CRD schema validation) as a production cluster. What it does *not* have is a
controller-manager or a scheduler: no garbage collection of owned objects, namespaces stay
Terminating after deletion, no service-account tokens are minted, no pods run.

Layout of the working directory (a fresh temporary directory unless one is given):

    pki/            CA, serving certificate, admin client certificate, service-account keys
    etcd/           etcd's data directory (survives etcd and kube-apiserver restarts)
    admin.kubeconfig
    users/<name>.kubeconfig   extra users minted by `add_user`
    logs/etcd.log, logs/kube-apiserver.log   process output, appended across restarts
    audit-policy.yaml         when an audit log is requested
    owner                     pid and start time of the creating process; a later start
                              removes temporary directories whose owner died without cleanup

Design choices:
- Ports are picked free on 127.0.0.1 and kept across restarts, so clients (and kubeconfigs)
  stay valid when a test restarts kube-apiserver or etcd alone. Losing the race for a port
  on first start (another process grabbed it) is retried with new ports.
- Readiness is decided by the processes themselves: etcd's `/health` and kube-apiserver's
  authenticated `/readyz`. Waits have deadlines; failures carry the process's log tail and,
  for kube-apiserver, the checks `/readyz?verbose` still reports as failing.
- `compact()`: etcd's own compaction through its gRPC gateway (`capl.testbed.etcd`). The
  binaries: `capl.testbed.assets`; the audit log: `capl.testbed.audit`; stale working
  directories of killed runs: `capl.testbed.workdirs`.
- Processes: see capl.testbed.process (own process group, PR_SET_PDEATHSIG, atexit).
- This module never imports kubernetes_asyncio: it drives kubectl for CRDs and speaks
  plain HTTP(S) for health checks, which keeps it usable outside the adapter layers.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import logging
import os
import re
import shutil
import ssl
import tempfile
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import aiohttp
import yaml

from capl.testbed import certs, etcd
from capl.testbed.assets import (
    ASSETS_ENV,
    Assets,
    AssetsMissing,
    ControlPlaneError,
    find_assets,
    free_port,
)
from capl.testbed.audit import DEFAULT_AUDIT_POLICY, read_audit_events
from capl.testbed.kubectl import Kubectl, apply_and_wait_for_crds, run_kubectl
from capl.testbed.process import (
    ManagedProcess,
    ReadyCheck,
    child_env,
    retry_lost_port,
    wait_until_ready,
)
from capl.testbed.workdirs import OWNER_FILE, WORKDIR_PREFIX, process_identity, sweep_stale_workdirs

log = logging.getLogger(__name__)

__all__ = [
    "ASSETS_ENV",
    "Assets",
    "AssetsMissing",
    "ControlPlane",
    "ControlPlaneError",
    "find_assets",
    "free_port",
    "read_audit_events",
]

SERVICE_ACCOUNT_ISSUER: Final = "https://kubernetes.default.svc.cluster.local"
ADMIN_USER: Final = "capl-testbed-admin"

_POLL_INTERVAL = 0.1


class ControlPlane:
    """etcd + kube-apiserver on loopback, started with `await start()` (or `async with`)."""

    _open: weakref.WeakSet[ControlPlane] = weakref.WeakSet()
    _open_lock = threading.Lock()

    def __init__(
        self,
        *,
        assets: Assets | None = None,
        workdir: Path | None = None,
        audit_log: Path | None = None,
        audit_policy: Mapping[str, Any] | None = None,
        watch_cache: bool = True,
        service_cluster_ip_range: str = "10.0.0.0/24",
        extra_apiserver_args: Sequence[str] = (),
        extra_etcd_args: Sequence[str] = (),
        admission_plugins: Sequence[str] = (),
        ready_timeout: float = 90.0,
        stop_grace: float = 10.0,
    ) -> None:
        """Configure (nothing starts until `start`).

        assets: the binaries; default `find_assets()` (KUBEBUILDER_ASSETS).
        workdir: where certificates, etcd data and logs go; default a temporary directory
            that `stop` removes (a given directory is kept).
        audit_log: write kube-apiserver's audit log (JSON lines) to this file; off if None.
        audit_policy: the audit policy; default Metadata level for every request.
        watch_cache: kube-apiserver's --watch-cache. False sends every watch to etcd, so a
            forced compaction makes watches from older resourceVersions fail with 410.
        admission_plugins: admission plugins to enable besides kube-apiserver's defaults
            (`--enable-admission-plugins`), e.g. OwnerReferencesPermissionEnforcement as
            OpenShift runs it.
        ready_timeout: deadline in seconds for each process to become ready.
        stop_grace: seconds between SIGTERM and SIGKILL when stopping.
        """
        self.assets = assets if assets is not None else find_assets()
        self._given_workdir = workdir
        self._workdir: Path | None = None
        self.audit_log = audit_log
        self._audit_policy = audit_policy if audit_policy is not None else DEFAULT_AUDIT_POLICY
        self.watch_cache = watch_cache
        self.service_cluster_ip_range = service_cluster_ip_range
        self._extra_apiserver_args = list(extra_apiserver_args)
        self._extra_etcd_args = list(extra_etcd_args)
        self.admission_plugins = list(admission_plugins)
        self.ready_timeout = ready_timeout
        self.stop_grace = stop_grace

        self._ca: certs.CertificateAuthority | None = None
        self._admin: certs.KeyPair | None = None
        self.etcd_client_port = 0
        self.etcd_peer_port = 0
        self.apiserver_port = 0
        self._etcd: ManagedProcess | None = None
        self._apiserver: ManagedProcess | None = None
        self.startup_seconds: float | None = None
        self.timings: dict[str, float] = {}
        self.apiserver_starts: list[tuple[float, float]] = []
        """(launched, ready) wall-clock times of each kube-apiserver start: until its
        authorizer's caches are loaded, it refuses (403) what RBAC would allow."""

    # ---------------------------------------------------------------- paths and addresses

    @property
    def workdir(self) -> Path:
        if self._workdir is None:
            raise ControlPlaneError("the control plane is not prepared (call start())")
        return self._workdir

    @property
    def pki_dir(self) -> Path:
        return self.workdir / "pki"

    @property
    def ca_file(self) -> Path:
        return self.pki_dir / "ca.crt"

    @property
    def kubeconfig(self) -> Path:
        """The admin kubeconfig (user in group system:masters)."""
        return self.workdir / "admin.kubeconfig"

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.apiserver_port}"

    @property
    def etcd_url(self) -> str:
        return f"http://127.0.0.1:{self.etcd_client_port}"

    @property
    def etcd_log(self) -> Path:
        return self.workdir / "logs" / "etcd.log"

    @property
    def apiserver_log(self) -> Path:
        return self.workdir / "logs" / "kube-apiserver.log"

    @property
    def etcd_process(self) -> ManagedProcess | None:
        return self._etcd

    @property
    def apiserver_process(self) -> ManagedProcess | None:
        return self._apiserver

    @property
    def running(self) -> bool:
        return bool(
            self._etcd and self._etcd.running and self._apiserver and self._apiserver.running
        )

    # ---------------------------------------------------------------- preparation

    def prepare(self) -> None:
        """Create the working directory, certificates, keys and admin kubeconfig; pick ports.

        `start` calls it; it is public so the generated files and command lines can be
        inspected without starting anything. Idempotent.
        """
        if self._workdir is not None:
            return
        if self._given_workdir is not None:
            self._given_workdir.mkdir(parents=True, exist_ok=True)
            self._workdir = self._given_workdir
        else:
            sweep_stale_workdirs()
            self._workdir = Path(tempfile.mkdtemp(prefix=WORKDIR_PREFIX))
            (self._workdir / OWNER_FILE).write_text(process_identity(os.getpid()) or "")
        with self._open_lock:
            self._open.add(self)
        (self.workdir / "logs").mkdir(exist_ok=True)
        (self.workdir / "etcd").mkdir(mode=0o700, exist_ok=True)

        ca = certs.CertificateAuthority()
        self._ca = ca
        pki = self.pki_dir
        certs.write_file(self.ca_file, ca.cert_pem, mode=0o644)
        ca.issue_serving().write(cert_path=pki / "apiserver.crt", key_path=pki / "apiserver.key")
        certs.ServiceAccountKeys.generate().write(
            private_path=pki / "sa.key", public_path=pki / "sa.pub"
        )
        self._admin = ca.issue_client(user=ADMIN_USER, groups=["system:masters"])
        self._admin.write(cert_path=pki / "admin.crt", key_path=pki / "admin.key")
        if self.audit_log is not None:
            policy = yaml.safe_dump(dict(self._audit_policy), sort_keys=False).encode()
            certs.write_file(self.workdir / "audit-policy.yaml", policy, mode=0o644)
            self.audit_log.parent.mkdir(parents=True, exist_ok=True)
        self._pick_etcd_ports()
        self._pick_apiserver_port()

    def _pick_etcd_ports(self) -> None:
        self.etcd_client_port = free_port()
        self.etcd_peer_port = free_port()
        while self.etcd_peer_port == self.etcd_client_port:  # pragma: no cover - unlikely
            self.etcd_peer_port = free_port()

    def _pick_apiserver_port(self) -> None:
        self.apiserver_port = free_port()
        self._write_admin_kubeconfig()

    def _write_admin_kubeconfig(self) -> None:
        assert self._ca is not None
        assert self._admin is not None
        config = certs.kubeconfig(
            server=self.url, ca_pem=self._ca.cert_pem, client=self._admin, user=ADMIN_USER
        )
        certs.write_kubeconfig(self.kubeconfig, config)

    def add_user(self, name: str, *, groups: Sequence[str] = ()) -> Path:
        """Mint a client certificate for `name` in `groups`; returns its kubeconfig file.

        The user has no permissions until RBAC grants some (unless a group such as
        system:masters does).
        """
        if self._ca is None:
            raise ControlPlaneError("the control plane is not prepared (call start())")
        if not re.fullmatch(r"[A-Za-z0-9:._@-]+", name):
            raise ValueError(f"unsupported user name for a file name: {name!r}")
        client = self._ca.issue_client(user=name, groups=groups)
        config = certs.kubeconfig(
            server=self.url, ca_pem=self._ca.cert_pem, client=client, user=name
        )
        return certs.write_kubeconfig(self.workdir / "users" / f"{name}.kubeconfig", config)

    def etcd_argv(self) -> list[str]:
        peer = f"http://127.0.0.1:{self.etcd_peer_port}"
        client = self.etcd_url
        return [
            str(self.assets.etcd),
            "--name=capl-testbed",
            f"--data-dir={self.workdir / 'etcd'}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=capl-testbed={peer}",
            "--initial-cluster-state=new",
            # A throw-away store: skipping fsync makes it several times faster on slow disks.
            "--unsafe-no-fsync=true",
            *self._extra_etcd_args,
        ]

    def apiserver_argv(self) -> list[str]:
        pki = self.pki_dir
        argv = [
            str(self.assets.kube_apiserver),
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={self.apiserver_port}",
            f"--cert-dir={pki}",
            f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={self.ca_file}",
            f"--etcd-servers={self.etcd_url}",
            f"--service-cluster-ip-range={self.service_cluster_ip_range}",
            "--allow-privileged=true",
            "--authorization-mode=RBAC",
            # No controller-manager mints tokens, so pods must not require them.
            "--disable-admission-plugins=ServiceAccount",
            *(
                [f"--enable-admission-plugins={','.join(self.admission_plugins)}"]
                if self.admission_plugins
                else []
            ),
            f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            # The `kubernetes` service endpoint would be 127.0.0.1, which Endpoints reject.
            "--endpoint-reconciler-type=none",
            f"--watch-cache={'true' if self.watch_cache else 'false'}",
        ]
        if self.audit_log is not None:
            argv += [
                f"--audit-policy-file={self.workdir / 'audit-policy.yaml'}",
                f"--audit-log-path={self.audit_log}",
                "--audit-log-format=json",
                "--audit-log-mode=blocking",
                "--audit-log-maxsize=0",
            ]
        return argv + self._extra_apiserver_args

    # ---------------------------------------------------------------- lifecycle

    async def __aenter__(self) -> ControlPlane:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        """Start etcd, then kube-apiserver; return when /readyz passes."""
        if self._etcd is not None or self._apiserver is not None:
            raise ControlPlaneError("the control plane was already started")
        t0 = time.monotonic()
        try:
            self.prepare()
            t1 = time.monotonic()
            await retry_lost_port(
                self.start_etcd, log_path=self.etcd_log, repick=self._pick_etcd_ports, what="etcd"
            )
            t2 = time.monotonic()
            await retry_lost_port(
                self.start_apiserver,
                log_path=self.apiserver_log,
                repick=self._pick_apiserver_port,
                what="kube-apiserver",
            )
            t3 = time.monotonic()
        except BaseException:
            await asyncio.shield(self.stop())
            raise
        self.timings = {"prepare": t1 - t0, "etcd": t2 - t1, "kube-apiserver": t3 - t2}
        self.startup_seconds = t3 - t0
        log.info(
            "control plane ready at %s in %.1f s "
            "(certs %.1f s, etcd %.1f s, kube-apiserver %.1f s)",
            self.url,
            self.startup_seconds,
            *self.timings.values(),
        )

    async def ensure_running(self) -> None:
        """Start whichever of etcd and kube-apiserver is not running (after a failed test
        that stopped one, or a crash); return when kube-apiserver is ready."""
        if self._etcd is None or self._apiserver is None:
            raise ControlPlaneError("the control plane was not started")
        if not self._etcd.running:
            log.warning("etcd is not running (status %s); starting it", self._etcd.returncode)
            await self.start_etcd()
        if not self._apiserver.running:
            log.warning(
                "kube-apiserver is not running (status %s); starting it",
                self._apiserver.returncode,
            )
            await self.start_apiserver()
        else:
            await self.wait_ready()

    async def stop(self) -> None:
        """Stop kube-apiserver, then etcd; remove the temporary working directory.

        Safe to call more than once and after a failed start.
        """
        try:
            if self._apiserver is not None:
                # Without etcd, kube-apiserver's graceful shutdown hangs until it is killed.
                etcd_up = self._etcd is not None and self._etcd.running
                grace = self.stop_grace if etcd_up else min(self.stop_grace, 2.0)
                await self._apiserver.stop(grace=grace)
            if self._etcd is not None:
                await self._etcd.stop(grace=self.stop_grace)
        finally:
            self._cleanup_workdir()

    def close(self) -> None:
        """Synchronous, best-effort `stop` for paths without an event loop (atexit)."""
        for proc in (self._apiserver, self._etcd):
            if proc is not None:
                with contextlib.suppress(Exception):
                    proc.stop_sync(grace=min(self.stop_grace, 3.0))
        self._cleanup_workdir()

    def _cleanup_workdir(self) -> None:
        with self._open_lock:
            self._open.discard(self)
        if self._workdir is not None and self._given_workdir is None:
            shutil.rmtree(self._workdir, ignore_errors=True)

    @classmethod
    def close_all(cls) -> None:
        with cls._open_lock:
            planes = list(cls._open)
        for plane in planes:
            plane.close()

    # ---------------------------------------------------------------- etcd

    async def start_etcd(self) -> None:
        """Start etcd (again, on the same ports and data) and wait until it is healthy."""
        self.prepare()
        if self._etcd is not None and self._etcd.running:
            raise ControlPlaneError("etcd is already running")
        self._etcd = ManagedProcess(
            name="etcd",
            argv=self.etcd_argv(),
            log_path=self.etcd_log,
            env=child_env(drop_prefixes=("ETCD_",)),
        )
        self._etcd.start()
        await self._wait(self._etcd, self._etcd_healthy, what="etcd")

    async def stop_etcd(self, *, grace: float | None = None) -> None:
        """Stop etcd alone (kube-apiserver, if running, loses its storage until restarted).

        etcd drains its client streams for up to ~7 s on SIGTERM while kube-apiserver holds
        watches open; `grace=0` kills it at once, like a crash (no data is lost: the page
        cache outlives the process).
        """
        if self._etcd is not None:
            await self._etcd.stop(grace=self.stop_grace if grace is None else grace)

    async def restart_etcd(self, *, grace: float | None = None) -> None:
        """Stop and start etcd alone; if kube-apiserver runs, wait until it is ready again."""
        await self.stop_etcd(grace=grace)
        await self.start_etcd()
        if self._apiserver is not None and self._apiserver.running:
            await self.wait_ready()

    async def _etcd_healthy(self) -> tuple[bool, str]:
        return await etcd.health(self.etcd_url)

    async def current_revision(self) -> int:
        """etcd's current revision (the newest resourceVersion kube-apiserver handed out)."""
        return await etcd.current_revision(self.etcd_url)

    async def compact(self) -> int:
        """Compact etcd's history up to its current revision; returns that revision
        (`capl.testbed.etcd.compact`: older watches then fail with 410 Gone)."""
        return await etcd.compact(self.etcd_url)

    # ---------------------------------------------------------------- kube-apiserver

    async def start_apiserver(self) -> None:
        """Start kube-apiserver (again, on the same port) and wait until /readyz passes."""
        self.prepare()
        if self._apiserver is not None and self._apiserver.running:
            raise ControlPlaneError("kube-apiserver is already running")
        self._apiserver = ManagedProcess(
            name="kube-apiserver",
            argv=self.apiserver_argv(),
            log_path=self.apiserver_log,
            env=child_env(),
        )
        launched = time.time()
        self._apiserver.start()
        await self.wait_ready()
        self.apiserver_starts.append((launched, time.time()))

    async def stop_apiserver(self, *, grace: float | None = None) -> None:
        """Stop kube-apiserver alone (SIGTERM; SIGKILL after the grace period)."""
        if self._apiserver is not None:
            await self._apiserver.stop(grace=self.stop_grace if grace is None else grace)

    async def restart_apiserver(self, *, grace: float | None = None) -> None:
        """Stop and start kube-apiserver alone (same port, same etcd, same certificates)."""
        await self.stop_apiserver(grace=grace)
        await self.start_apiserver()

    async def wait_ready(self, *, within: float | None = None) -> None:
        """Wait until kube-apiserver's /readyz passes (it is running already)."""
        if self._apiserver is None:
            raise ControlPlaneError("kube-apiserver was not started")
        await self._wait(
            self._apiserver, self._apiserver_ready, what="kube-apiserver", within=within
        )

    def _admin_ssl(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.ca_file))
        ctx.load_cert_chain(self.pki_dir / "admin.crt", self.pki_dir / "admin.key")
        return ctx

    async def admin_request(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | None = None,
        *,
        content_type: str = "application/json",
        within: float = 30.0,
    ) -> tuple[int, Any]:
        """One request as the admin, plain HTTPS (cheaper than a kubectl process): the
        status code and the decoded JSON answer."""
        connector = aiohttp.TCPConnector(ssl=self._admin_ssl())
        data = None if body is None else json.dumps(body).encode()
        async with (
            aiohttp.ClientSession(
                connector=connector, timeout=aiohttp.ClientTimeout(total=within)
            ) as session,
            session.request(
                method, f"{self.url}{path}", data=data, headers={"Content-Type": content_type}
            ) as resp,
        ):
            text = await resp.text()
            try:
                return resp.status, json.loads(text) if text else None
            except ValueError:
                return resp.status, text

    async def _apiserver_ready(self) -> tuple[bool, str]:
        connector = aiohttp.TCPConnector(ssl=self._admin_ssl())
        async with (
            aiohttp.ClientSession(
                connector=connector, timeout=aiohttp.ClientTimeout(total=5)
            ) as session,
            session.get(f"{self.url}/readyz", params={"verbose": "1"}) as resp,
        ):
            body = await resp.text()
            if resp.status == 200:
                return True, "ok"
            failing = [line for line in body.splitlines() if line.startswith("[-]")]
            return False, f"HTTP {resp.status}: " + ("; ".join(failing) or body.strip()[:500])

    async def _wait(
        self, proc: ManagedProcess, check: ReadyCheck, *, what: str, within: float | None = None
    ) -> None:
        await wait_until_ready(
            proc,
            check,
            what=what,
            within=self.ready_timeout if within is None else within,
            poll=_POLL_INTERVAL,
            timeout_error=ControlPlaneError,
            # a temporary workdir is removed after a failed start: name the log only if kept
            show_log_path=self._given_workdir is not None,
        )

    # ---------------------------------------------------------------- kubectl and CRDs

    async def kubectl(self, *args: str, stdin: bytes | None = None, within: float = 120.0) -> str:
        """Run kubectl as the admin against this control plane; returns its stdout."""
        return await run_kubectl(self._kubectl_context(), *args, stdin=stdin, within=within)

    async def install_crds(self, directory: Path, *, within: float = 60.0) -> list[str]:
        """Apply every manifest in `directory` (server-side) and wait for its CRDs
        (`capl.testbed.kubectl.apply_and_wait_for_crds`); returns the CRDs' names."""
        return await apply_and_wait_for_crds(self._kubectl_context(), directory, within=within)

    def _kubectl_context(self) -> Kubectl:
        return Kubectl(
            binary=self.assets.kubectl,
            kubeconfig=self.kubeconfig,
            cache_dir=self.workdir / "kubectl-cache",
        )

    # ---------------------------------------------------------------- audit log

    def audit_offset(self) -> int:
        """The audit log's current size: pass it to `audit_events` to read only later events."""
        if self.audit_log is None:
            raise ControlPlaneError("the audit log is off (pass audit_log= to ControlPlane)")
        try:
            return self.audit_log.stat().st_size
        except FileNotFoundError:
            return 0

    def audit_events(self, *, since: int = 0) -> list[dict[str, Any]]:
        """Audit events (one dict per request and stage) written after byte offset `since`.

        kube-apiserver writes an event shortly after it sent the response: wait for the
        events you expect with a deadline instead of reading once.
        """
        if self.audit_log is None:
            raise ControlPlaneError("the audit log is off (pass audit_log= to ControlPlane)")
        events, _ = read_audit_events(self.audit_log, offset=since)
        return events


def _close_all_at_exit() -> None:
    ControlPlane.close_all()


# Registered after capl.testbed.process's hook, so it runs first (atexit is LIFO).
atexit.register(_close_all_at_exit)
