"""`capl manager` as a real process beside a test control plane (e2e and chaos tests).

`CaplManager` runs the `capl manager` command — the product's entry point, not an in-process
imitation — against one `ControlPlane` (the process, its ports, certificates and readiness
wait are `capl.testbed.localmanager.LocalManager`'s, shared with the Cluster API core):

- its admission webhooks are served on 127.0.0.1 with a certificate from a private CA
  (`--webhook-cert-dir`), and `install_webhooks()` points the `infrastructure-libvirt`
  webhook configurations of that control plane (installed by `clusterctl init`, or given as
  manifests) at that loopback URL, the way envtest wires webhooks (see
  `capl.testbed.manifests.point_provider_webhooks`);
- health (`/healthz`, `/readyz`) and Prometheus metrics are bound to free loopback ports;
  ports, certificate and CA survive `restart()` and `kill()` + `start()`, so the webhook
  configurations stay valid across restarts;
- it is ready when `/readyz` passes (informers synced) and, once webhooks are installed,
  kube-apiserver reaches them (a server-side dry-run create of a LibvirtCluster goes
  through the mutating and the validating webhook);
- its output (JSON log lines) is appended across restarts to `log_path`, which is kept
  after the test: the security tests grep it for leaked secrets.

Identity: as deployed, never an administrator — by default the control plane's manager
identity (`capl.testbed.identities`: clusterctl's ServiceAccount with a token, or a user
bound to config/rbac's ClusterRole and leader-election Role), minted once per control plane.

Lifecycle: `start()` (process + readiness), `stop()` (SIGTERM, SIGKILL after the grace
period), `kill()` (SIGKILL: a crash), `restart()`. Leader election is off unless
`leader_elect=True` (then the Lease is in `leader_election_namespace`).

Used by the tests (fixture `capl_manager_factory` in tests/fixtures/capl.py) and by bench/.
Like the rest of capl.testbed this module drives kubectl and plain HTTP only.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from capl.testbed.controlplane import ControlPlane, ControlPlaneError
from capl.testbed.identities import manager_identity
from capl.testbed.localmanager import LocalManager
from capl.testbed.manifests import point_provider_webhooks

INFRA_PROVIDER: Final = "infrastructure-libvirt"
REPO: Final = Path(__file__).resolve().parents[2]
# A LibvirtCluster that only a working webhook chain lets through a dry run: the mutating
# webhook fills the network defaults, the validating one checks the result.
_PROBE: Final[Mapping[str, Any]] = {
    "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1",
    "kind": "LibvirtCluster",
    "metadata": {"name": "capl-e2e-webhook-probe", "namespace": "default"},
    "spec": {
        "hosts": [{"name": "probe", "uri": "test:///default"}],
        "network": {"cidr": "192.168.250.0/24", "mode": "isolated"},
    },
}


class CaplManagerError(RuntimeError):
    """The capl manager did not start, or did not become ready in time."""


def capl_command() -> list[str]:
    """How to run `capl`: the venv's console script, else `python -m capl.cli`."""
    script = Path(sys.executable).with_name("capl")
    if os.access(script, os.X_OK):
        return [str(script)]
    return [sys.executable, "-m", "capl.cli"]


class CaplManager(LocalManager):
    """One `capl manager` process against one control plane (see the module docstring)."""

    error = CaplManagerError

    def __init__(
        self,
        *,
        plane: ControlPlane,
        workdir: Path,
        name: str = "capl-manager",
        kubeconfig: Path | None = None,
        webhooks: bool = True,
        leader_elect: bool = False,
        leader_election_namespace: str | None = None,
        namespace: str | None = None,
        log_level: str = "debug",
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        ready_timeout: float = 90.0,
        stop_grace: float = 15.0,
    ) -> None:
        """Configure; nothing runs until `start()`.

        kubeconfig: default the manager identity of the plane
            (`capl.testbed.identities.manager_identity`: clusterctl's ServiceAccount where
            clusterctl installed capl, else a user bound to config/rbac's generated roles),
            minted at the first `start()`; never the admin kubeconfig.
        webhooks: serve capl's admission webhooks (call `install_webhooks()` to route the
            control plane's webhook configurations to them); False passes --webhook-port=0.
        extra_args: more `capl manager` flags (e.g. --machine-shutdown-timeout=20s).
        env: extra environment of the process (e.g. CAPL_FAULT for crash tests).
        """
        super().__init__(
            plane=plane,
            name=name,
            workdir=workdir,
            ca_name=f"{name}-ca",
            ready_timeout=ready_timeout,
            stop_grace=stop_grace,
        )
        self._kubeconfig = kubeconfig
        self._own_identity = kubeconfig is None
        self.webhooks = webhooks
        self.leader_elect = leader_elect
        self.leader_election_namespace = leader_election_namespace
        self.namespace = namespace
        self.log_level = log_level
        self.extra_args = list(extra_args)
        self.env = dict(env or {})
        self.webhooks_installed = False

    @property
    def kubeconfig(self) -> Path:
        """The kubeconfig the process runs with (the minted identity's once started)."""
        if self._kubeconfig is None:
            raise CaplManagerError("the manager's identity is minted by start()")
        return self._kubeconfig

    @property
    def lease_namespace(self) -> str | None:
        """Where its leader-election Lease is (None: no leader election)."""
        if not self.leader_elect:
            return None
        return self.leader_election_namespace or "default"

    @property
    def cwd(self) -> Path:
        return REPO

    def child_env(self) -> dict[str, str]:
        keep = ("PATH", "LANG", "LC_ALL", "TMPDIR", "TZ", "HOME", "CAPL_FAULT")
        env = {k: os.environ[k] for k in keep if k in os.environ}
        return {**env, "PYTHONUNBUFFERED": "1", **self.env}

    def argv(self) -> list[str]:
        args = [
            *capl_command(),
            "manager",
            f"--kubeconfig={self.kubeconfig}",
            f"--health-probe-bind-address=127.0.0.1:{self.health_port}",
            f"--metrics-bind-address=127.0.0.1:{self.metrics_port}",
            f"--log-level={self.log_level}",
            "--log-format=json",
            "--graceful-shutdown-timeout=10s",
        ]
        if self.webhooks:
            args += [
                f"--webhook-port={self.webhook_port}",
                "--webhook-host=127.0.0.1",
                f"--webhook-cert-dir={self.cert_dir}",
            ]
        else:
            args.append("--webhook-port=0")
        if self.leader_elect:
            args.append("--leader-elect")
            if self.leader_election_namespace:
                args.append(f"--leader-election-namespace={self.leader_election_namespace}")
        if self.namespace:
            args.append(f"--namespace={self.namespace}")
        return args + self.extra_args

    # ---------------------------------------------------------------- lifecycle

    async def install_webhooks(self, manifests: Sequence[Mapping[str, Any]] = ()) -> None:
        """Point the control plane's capl webhook configurations at this process.

        Without `manifests` the configurations must exist (labelled
        cluster.x-k8s.io/provider=infrastructure-libvirt, as `clusterctl init` installs
        them); with them, missing ones are created from the manifests.
        """
        if not self.webhooks:
            raise CaplManagerError("this manager runs without webhooks (webhooks=False)")
        self.prepare()  # ports and CA exist before the manager first starts
        await point_provider_webhooks(
            self.plane,
            provider=INFRA_PROVIDER,
            base_url=self.webhook_url,
            ca_pem=self.ca_pem,
            manifests=manifests,
        )
        self.webhooks_installed = True

    async def _ports_changed(self) -> None:
        if self.webhooks_installed:
            await self.install_webhooks()

    async def start(self) -> None:
        """Start the process (same ports and certificates as before) and wait until ready."""
        if self._own_identity:  # cached per control plane; binds a new lease namespace
            identity = await manager_identity(self.plane, lease_namespace=self.lease_namespace)
            self._kubeconfig = identity.kubeconfig
        await self.launch()

    def log_records(self) -> list[dict[str, Any]]:
        """The JSON log lines parsed (other lines skipped)."""
        records = []
        for line in self.log_text().splitlines():
            if line.startswith("{"):
                try:
                    records.append(json.loads(line))
                except ValueError:
                    continue
        return records

    # ---------------------------------------------------------------- readiness

    async def _ready_beyond_health(self) -> tuple[bool, str]:
        """With webhooks installed: kube-apiserver reaches them (a dry-run create)."""
        if not (self.webhooks and self.webhooks_installed):
            return True, "ok"
        try:
            await self.plane.kubectl(
                "create", "--dry-run=server", "-o", "name", "-f", "-",
                stdin=json.dumps(_PROBE).encode(), within=30,
            )  # fmt: skip
        except ControlPlaneError as e:
            if "failed calling webhook" in str(e):
                return False, f"webhooks not reachable yet: {e}"
            raise CaplManagerError(f"the webhook probe was rejected: {e}") from e
        return True, "ok"
