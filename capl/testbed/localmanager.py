"""A controller manager run as a local process beside a test control plane.

The test bed runs two managers this way, both outside any cluster (no kubelet, no Service
routing, no cert-manager): the Cluster API core manager (`capl.testbed.capi.CapiCore`) and
`capl manager` itself (tests/fixtures/capl.py `CaplManager`). What they share lives here,
in `LocalManager`; a subclass says only how to run its program (`argv`, `child_env`) and
what "ready" means beyond `/readyz` (`_ready_beyond_health`), and re-points whatever calls
its webhooks when its ports change (`_ports_changed`).

- Serving: admission/conversion webhooks on 127.0.0.1 with a certificate from a CA made for
  this instance (`WebhookServing`, files in `cert_dir`); health (`/healthz`, `/readyz`) and
  Prometheus metrics on loopback; three free ports, picked once (`prepare`) and kept across
  `restart()` and `kill()` + `launch()`, so the webhook configurations and CRD conversion
  settings pointed at them stay valid.
- Start (`launch`): the process (a `ManagedProcess`: own process group, dies with its
  parent, output appended to `log_path` across restarts), then readiness with a deadline
  (`capl.testbed.process.wait_until_ready`); a port lost to another process on the way is
  retried with fresh ports (`retry_lost_port`), after which `_ports_changed` re-points the
  webhooks.
- Stop: `stop()` (SIGTERM, SIGKILL after the grace period; returns the exit status),
  `kill()` (SIGKILL at once: a crash), `restart()`.

Like the rest of capl.testbed it drives processes, files and plain HTTP(S) only.
"""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import Mapping
from pathlib import Path

import aiohttp

from capl.testbed import certs
from capl.testbed.controlplane import ControlPlane, free_port
from capl.testbed.process import (
    ManagedProcess,
    read_from,
    retry_lost_port,
    wait_until_ready,
)

log = logging.getLogger(__name__)

_POLL_INTERVAL = 0.2


class WebhookServing:
    """A CA and a serving certificate for 127.0.0.1, written as tls.crt/tls.key (+ ca.crt)."""

    def __init__(self, *, cert_dir: Path, common_name: str = "capl-testbed-webhook-ca") -> None:
        self.cert_dir = cert_dir
        self._ca = certs.CertificateAuthority(common_name=common_name)
        pair = self._ca.issue_serving(hosts=("127.0.0.1", "localhost"))
        pair.write(cert_path=cert_dir / "tls.crt", key_path=cert_dir / "tls.key")
        certs.write_file(cert_dir / "ca.crt", self._ca.cert_pem, mode=0o644)

    @property
    def ca_pem(self) -> bytes:
        return self._ca.cert_pem

    @property
    def ca_bundle(self) -> str:
        """The CA certificate, base64-encoded, as clientConfig.caBundle wants it."""
        return base64.b64encode(self._ca.cert_pem).decode()


class LocalManager:
    """A manager process serving webhooks, health and metrics on loopback (see the module
    docstring). Subclasses implement `argv` and `child_env`."""

    error: type[Exception] = RuntimeError
    """What `launch`/`wait_ready` raise when the process is not ready in time."""

    def __init__(
        self,
        *,
        plane: ControlPlane,
        name: str,
        workdir: Path | None,
        ca_name: str,
        ready_timeout: float,
        stop_grace: float,
    ) -> None:
        self.plane = plane
        self.name = name
        self._workdir = workdir
        self._ca_name = ca_name
        self.ready_timeout = ready_timeout
        self.stop_grace = stop_grace
        self.webhook_port = 0
        self.health_port = 0
        self.metrics_port = 0
        self.starts = 0
        """How often the process was started (a restart or a lost port counts)."""
        self.resolv_conf: Path | None = None
        """When set (before `launch`), the process resolves names through this file instead
        of /etc/resolv.conf (`capl.testbed.process.own_resolver`)."""
        self._serving: WebhookServing | None = None
        self._process: ManagedProcess | None = None

    # ---------------------------------------------------------------- to implement

    def argv(self) -> list[str]:
        raise NotImplementedError

    def child_env(self) -> Mapping[str, str]:
        raise NotImplementedError

    @property
    def cwd(self) -> Path:
        return self.workdir

    async def _ready_beyond_health(self) -> tuple[bool, str]:
        """What else must work once /readyz passes (e.g. kube-apiserver reaching the
        webhooks); (ready?, what was seen)."""
        return True, "ok"

    async def _ports_changed(self) -> None:
        """Called after a lost port race made `launch` pick new ports."""

    # ---------------------------------------------------------------- paths and addresses

    @property
    def workdir(self) -> Path:
        if self._workdir is None:
            raise self.error(f"{self.name} has no working directory")
        return self._workdir

    @property
    def cert_dir(self) -> Path:
        return self.workdir / "webhook-certs"

    @property
    def log_path(self) -> Path:
        return self.workdir / "logs" / f"{self.name}.log"

    @property
    def webhook_url(self) -> str:
        return f"https://127.0.0.1:{self.webhook_port}"

    @property
    def health_url(self) -> str:
        return f"http://127.0.0.1:{self.health_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    @property
    def ca_pem(self) -> bytes:
        """The CA the webhook serving certificate is signed by (prepares if needed)."""
        self.prepare()
        assert self._serving is not None
        return self._serving.ca_pem

    @property
    def process(self) -> ManagedProcess | None:
        return self._process

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.running

    # ---------------------------------------------------------------- lifecycle

    def prepare(self) -> None:
        """Serving certificates and ports (idempotent; `launch` calls it)."""
        if self._serving is not None:
            return
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._serving = WebhookServing(cert_dir=self.cert_dir, common_name=self._ca_name)
        self._pick_ports()

    def _pick_ports(self) -> None:
        ports: set[int] = set()
        while len(ports) < 3:
            ports.add(free_port())
        self.webhook_port, self.health_port, self.metrics_port = sorted(ports)

    async def launch(self) -> None:
        """Start the process (same ports and certificates as before) and wait until ready;
        a port lost to another process is retried with new ports."""
        self.prepare()
        if self.running:
            raise self.error(f"{self.name} is already running (pid {self.pid})")

        async def repick() -> None:
            self._pick_ports()
            await self._ports_changed()

        await retry_lost_port(
            self._start_once, log_path=self.log_path, repick=repick, what=self.name
        )

    async def _start_once(self) -> None:
        process = ManagedProcess(
            name=self.name,
            argv=self.argv(),
            log_path=self.log_path,
            env=self.child_env(),
            cwd=self.cwd,
            resolv_conf=self.resolv_conf,
        )
        self._process = process
        process.start()
        self.starts += 1
        try:
            await self.wait_ready()
        except BaseException:
            await asyncio.shield(process.stop(grace=2.0))
            raise

    async def stop(self) -> int | None:
        """SIGTERM, SIGKILL after the grace period; the exit status (None if never started)."""
        if self._process is None:
            return None
        return await self._process.stop(grace=self.stop_grace)

    def kill(self) -> None:
        """SIGKILL right away (a crash: no graceful shutdown, no lease release)."""
        if self._process is not None:
            self._process.kill()

    async def restart(self) -> None:
        await self.stop()
        await self.launch()

    def log_text(self) -> str:
        """Everything the process (all its starts) wrote so far."""
        return read_from(self.log_path)

    # ---------------------------------------------------------------- readiness

    async def wait_ready(self, *, within: float | None = None) -> None:
        """Until /readyz passes and `_ready_beyond_health` says ready."""
        if self._process is None:
            raise self.error(f"{self.name} was not started")
        await wait_until_ready(
            self._process,
            self._ready,
            what=self.name,
            within=self.ready_timeout if within is None else within,
            poll=_POLL_INTERVAL,
            timeout_error=self.error,
        )

    async def _ready(self) -> tuple[bool, str]:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session,
            session.get(f"{self.health_url}/readyz") as resp,
        ):
            if resp.status != 200:
                return False, f"/readyz: HTTP {resp.status} {(await resp.text()).strip()[:300]}"
        return await self._ready_beyond_health()

    async def metrics(self) -> str:
        """The Prometheus exposition of the running manager."""
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session,
            session.get(self.metrics_url) as resp,
        ):
            resp.raise_for_status()
            return await resp.text()
