"""A workload cluster's control plane as host processes: `kubeadm init` without the static pods.

Real nodes (capl's node image: kubelet, containerd, kubeadm) join a workload cluster with the
bootstrap data of Cluster API's kubeadm bootstrap provider. Booting its control plane as a
KubeadmControlPlane machine under TCG is slow (a worker alone needs minutes), so the test bed
and `capl demo` run the control plane on the host instead, and build it with kubeadm itself:

- `kubeadm init phase certs all` and `kubeconfig all` make the PKI and the kubeconfigs
  (ECDSA-P256, the endpoint `<address>:6443`, `certificatesDir` in the working directory);
- `kubeadm init phase control-plane all --dry-run` writes the static pod manifests kubeadm
  would give kubelet; their `command` lines are what runs here, as host processes, with
  three changes: kube-apiserver binds only `address` (the cluster network's host address,
  never every interface), kube-controller-manager and kube-scheduler get free loopback ports
  for their own servers, and `/etc/kubernetes/*.conf` paths point into the working directory;
- etcd is a plain member on free loopback ports (kubeadm's external etcd mode);
- once kube-apiserver is ready: the `kubeadm:cluster-admins` binding of admin.conf,
  `kubeadm init phase upload-config all` (kubeadm-config, kubelet-config) and
  `kubeadm init phase bootstrap-token` (cluster-info in kube-public and its anonymous Role,
  the RBAC that lets bootstrap tokens join and get their CSRs approved) — everything a
  `kubeadm join` reads. The addon phases (CoreDNS, kube-proxy) are skipped: the node image
  preloads no images for them, and nothing the tests do needs Services inside the cluster.

For Cluster API (`management_objects`): the Secrets `<cluster>-ca` (the CA the bootstrap
provider hashes for token discovery) and `<cluster>-kubeconfig` (what the Cluster API
controllers and capl use to reach the workload cluster; a system:masters client, as
KubeadmControlPlane makes it), and the status of a `TestbedControlPlane`. That kind is a
stand-in made for the test bed — Cluster API has no control-plane provider for "already
running elsewhere" — and does only what the control-plane contract asks: it carries
`spec.controlPlaneEndpoint` and reports `status.initialization.controlPlaneInitialized`,
`externalManagedControlPlane` and an `Available` condition, written by `publish()`; the
Cluster controller does the rest.

Like the rest of capl.testbed: kubectl and plain processes only, no other capl layer.
"""

from __future__ import annotations

import base64
import os
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import yaml

from capl.testbed.controlplane import free_port
from capl.testbed.process import ManagedProcess, ProcessFailed, run_captured, wait_until_ready

NODE_BIN_ENV: Final = "CAPL_NODE_BIN"
API_PORT: Final = 6443
CP_GROUP: Final = "controlplane.testbed.capl.dev"
CP_VERSION: Final = "v1alpha1"
CP_KIND: Final = "TestbedControlPlane"
CP_PLURAL: Final = "testbedcontrolplanes"
_CLUSTER_NAME_LABEL: Final = "cluster.x-k8s.io/cluster-name"
_SECRET_TYPE: Final = "cluster.x-k8s.io/secret"


class HostedControlPlaneError(RuntimeError):
    pass


@dataclass(frozen=True)
class NodeAssets:
    """The binaries: kubeadm, kube-controller-manager, kube-scheduler (hack/node-bin.sh) and
    kube-apiserver, etcd, kubectl (hack/envtest.sh)."""

    kubeadm: Path
    kube_apiserver: Path
    kube_controller_manager: Path
    kube_scheduler: Path
    etcd: Path
    kubectl: Path


def find_node_assets(
    node_bin: str | os.PathLike[str] | None = None,
    envtest: str | os.PathLike[str] | None = None,
) -> NodeAssets:
    """The binaries from `$CAPL_NODE_BIN/bin` and `$KUBEBUILDER_ASSETS` (or the given dirs)."""
    nb = node_bin or os.environ.get(NODE_BIN_ENV)
    et = envtest or os.environ.get("KUBEBUILDER_ASSETS")
    if not nb or not et:
        raise HostedControlPlaneError(
            f"set {NODE_BIN_ENV} (hack/node-bin.sh prints it) and KUBEBUILDER_ASSETS"
            " (hack/envtest.sh) to run a hosted control plane"
        )
    bin_dir, envtest_dir = Path(nb) / "bin", Path(et)
    assets = NodeAssets(
        kubeadm=bin_dir / "kubeadm",
        kube_apiserver=envtest_dir / "kube-apiserver",
        kube_controller_manager=bin_dir / "kube-controller-manager",
        kube_scheduler=bin_dir / "kube-scheduler",
        etcd=envtest_dir / "etcd",
        kubectl=envtest_dir / "kubectl",
    )
    missing = [str(p) for p in vars(assets).values() if not os.access(p, os.X_OK)]
    if missing:
        raise HostedControlPlaneError(f"missing binaries: {', '.join(missing)}")
    return assets


def control_plane_crd() -> dict[str, Any]:
    """The CRD of the test bed's stand-in control-plane kind (see the module docstring)."""
    schema = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{CP_PLURAL}.{CP_GROUP}",
            # the contract version Cluster API reads from the CRD
            "labels": {"cluster.x-k8s.io/v1beta2": CP_VERSION},
        },
        "spec": {
            "group": CP_GROUP,
            "names": {
                "kind": CP_KIND,
                "listKind": f"{CP_KIND}List",
                "plural": CP_PLURAL,
                "singular": CP_KIND.lower(),
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": CP_VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "schema": {"openAPIV3Schema": schema},
                }
            ],
        },
    }


def control_plane_rbac() -> dict[str, Any]:
    """What the Cluster API core manager needs on the kind (an aggregated ClusterRole)."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {
            "name": "capl-testbed-control-plane",
            "labels": {"cluster.x-k8s.io/aggregate-to-manager": "true"},
        },
        "rules": [
            {
                "apiGroups": [CP_GROUP],
                "resources": [CP_PLURAL, f"{CP_PLURAL}/status"],
                "verbs": ["get", "list", "watch", "patch", "update"],
            }
        ],
    }


def _rewrite_command(
    command: Sequence[str], *, binary: Path, kube_dir: Path, overrides: Mapping[str, str]
) -> list[str]:
    """kubeadm's static pod command as a host process (see the module docstring)."""
    argv = [str(binary)]
    seen: set[str] = set()
    for arg in command[1:]:
        flag, _, value = arg.partition("=")
        if flag in overrides:
            seen.add(flag)
            argv.append(f"{flag}={overrides[flag]}")
            continue
        if value.startswith("/etc/kubernetes/"):
            value = str(kube_dir / value.removeprefix("/etc/kubernetes/"))
            arg = f"{flag}={value}"
        argv.append(arg)
    argv += [f"{f}={v}" for f, v in overrides.items() if f not in seen]
    return argv


class HostedControlPlane:
    """etcd, kube-apiserver, kube-controller-manager, kube-scheduler of one workload cluster."""

    def __init__(
        self,
        *,
        cluster: str,
        address: str,
        workdir: Path,
        assets: NodeAssets | None = None,
        kubernetes_version: str = "v1.35.4",
        pod_cidr: str = "10.244.0.0/16",
        service_cidr: str = "10.96.0.0/12",
        ready_timeout: float = 120.0,
    ) -> None:
        self.cluster = cluster
        self.address = address
        self.workdir = workdir
        self.assets = assets if assets is not None else find_node_assets()
        self.kubernetes_version = kubernetes_version
        self.pod_cidr = pod_cidr
        self.service_cidr = service_cidr
        self.ready_timeout = ready_timeout
        self.etcd_port = 0
        self._procs: dict[str, ManagedProcess] = {}
        self.timings: dict[str, float] = {}

    # ------------------------------------------------------------------ paths

    @property
    def endpoint(self) -> str:
        return f"https://{self.address}:{API_PORT}"

    @property
    def pki(self) -> Path:
        return self.workdir / "pki"

    @property
    def kube_dir(self) -> Path:
        return self.workdir / "kubernetes"

    @property
    def admin_kubeconfig(self) -> Path:
        """system:masters (kubeadm's super-admin.conf): the test's and Cluster API's client."""
        return self.kube_dir / "super-admin.conf"

    @property
    def config_path(self) -> Path:
        return self.workdir / "kubeadm.yaml"

    def log_path(self, name: str) -> Path:
        return self.workdir / "logs" / f"{name}.log"

    # ------------------------------------------------------------------ kubeadm

    def kubeadm_config(self, *, local: bool = True) -> str:
        """kubeadm's configuration; `local` puts the PKI in the working directory. What is
        uploaded for joining nodes (kubeadm-config) keeps the nodes' own certificatesDir."""
        init = {
            "apiVersion": "kubeadm.k8s.io/v1beta4",
            "kind": "InitConfiguration",
            "localAPIEndpoint": {"advertiseAddress": self.address, "bindPort": API_PORT},
            "nodeRegistration": {
                "name": f"{self.cluster}-hosted-control-plane",
                "criSocket": "unix:///var/run/containerd/containerd.sock",
            },
        }
        cluster = {
            "apiVersion": "kubeadm.k8s.io/v1beta4",
            "kind": "ClusterConfiguration",
            "clusterName": self.cluster,
            "kubernetesVersion": self.kubernetes_version,
            "controlPlaneEndpoint": f"{self.address}:{API_PORT}",
            **({"certificatesDir": str(self.pki)} if local else {}),
            "encryptionAlgorithm": "ECDSA-P256",
            "networking": {"podSubnet": self.pod_cidr, "serviceSubnet": self.service_cidr},
            "etcd": {"external": {"endpoints": [f"http://127.0.0.1:{self.etcd_port}"]}},
        }
        return yaml.safe_dump_all([init, cluster], sort_keys=False)

    async def _kubeadm(self, *args: str, env: Mapping[str, str] | None = None) -> str:
        argv = [str(self.assets.kubeadm), *args]
        status, out, err = await run_captured(
            argv, env={**os.environ, **(env or {})}, cwd=self.workdir, within=120.0
        )
        if status != 0:
            raise HostedControlPlaneError(
                f"kubeadm {' '.join(args)} failed ({status}):\n{(err or out)[-3000:]}"
            )
        return out

    async def kubectl(self, *args: str, stdin: bytes | None = None) -> str:
        argv = [str(self.assets.kubectl), f"--kubeconfig={self.admin_kubeconfig}", *args]
        status, out, err = await run_captured(argv, env=dict(os.environ), stdin=stdin, within=60.0)
        if status != 0:
            raise HostedControlPlaneError(f"kubectl {' '.join(args)}: {err.strip() or out}")
        return out

    async def prepare(self) -> dict[str, list[str]]:
        """PKI, kubeconfigs and the command lines of the processes (from kubeadm)."""
        for sub in ("logs", "etcd", "manifests"):
            (self.workdir / sub).mkdir(parents=True, exist_ok=True)
        self.etcd_port = self.etcd_port or free_port()
        self.config_path.write_text(self.kubeadm_config())
        cfg = f"--config={self.config_path}"
        await self._kubeadm("init", "phase", "certs", "all", cfg)
        await self._kubeadm(
            "init", "phase", "kubeconfig", "all", cfg, f"--kubeconfig-dir={self.kube_dir}"
        )
        manifests = self.workdir / "manifests"
        await self._kubeadm(
            "init", "phase", "control-plane", "all", cfg, "--dry-run",
            env={"KUBEADM_INIT_DRYRUN_DIR": str(manifests)},
        )  # fmt: skip
        return self._commands(manifests)

    def _commands(self, manifests: Path) -> dict[str, list[str]]:
        binaries = {
            "kube-apiserver": self.assets.kube_apiserver,
            "kube-controller-manager": self.assets.kube_controller_manager,
            "kube-scheduler": self.assets.kube_scheduler,
        }
        overrides: dict[str, dict[str, str]] = {
            "kube-apiserver": {"--bind-address": self.address},
            "kube-controller-manager": {"--secure-port": str(free_port())},
            "kube-scheduler": {"--secure-port": str(free_port())},
        }
        commands: dict[str, list[str]] = {}
        for name, binary in binaries.items():
            path = manifests / f"{name}.yaml"
            if not path.exists():
                raise HostedControlPlaneError(f"kubeadm wrote no manifest {path}")
            pod = yaml.safe_load(path.read_text())
            command = pod["spec"]["containers"][0]["command"]
            commands[name] = _rewrite_command(
                command, binary=binary, kube_dir=self.kube_dir, overrides=overrides[name]
            )
        return commands

    # ------------------------------------------------------------------ lifecycle

    def _etcd_argv(self) -> list[str]:
        client = f"http://127.0.0.1:{self.etcd_port}"
        peer = f"http://127.0.0.1:{free_port()}"
        return [
            str(self.assets.etcd),
            f"--name={self.cluster}",
            f"--data-dir={self.workdir / 'etcd'}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster={self.cluster}={peer}",
            "--unsafe-no-fsync=true",
        ]

    def _start(self, name: str, argv: list[str]) -> ManagedProcess:
        proc = ManagedProcess(
            name=f"{self.cluster} {name}", argv=argv, log_path=self.log_path(name)
        )
        proc.start()
        self._procs[name] = proc
        return proc

    async def start(self) -> None:
        """Start every process and create what `kubeadm join` reads; idempotent per instance."""
        t0 = time.monotonic()
        commands = await self.prepare()
        self._start("etcd", self._etcd_argv())
        apiserver = self._start("kube-apiserver", commands["kube-apiserver"])
        await wait_until_ready(
            apiserver, self._apiserver_ready, what=f"{self.cluster} kube-apiserver",
            within=self.ready_timeout,
        )  # fmt: skip
        self.timings["apiserver"] = time.monotonic() - t0
        self._start("kube-controller-manager", commands["kube-controller-manager"])
        self._start("kube-scheduler", commands["kube-scheduler"])
        await self._join_objects()
        self.timings["ready"] = time.monotonic() - t0

    async def _apiserver_ready(self) -> tuple[bool, str]:
        try:
            out = await self.kubectl("get", "--raw=/readyz")
        except HostedControlPlaneError as e:
            return False, str(e)
        return out.strip() == "ok", out.strip()

    async def _join_objects(self) -> None:
        upload = self.workdir / "kubeadm-upload.yaml"
        upload.write_text(self.kubeadm_config(local=False))
        cfg = f"--config={upload}"
        kubeconfig = f"--kubeconfig={self.admin_kubeconfig}"
        # `kubeadm init` binds admin.conf's group to cluster-admin with super-admin.conf
        binding = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "kubeadm:cluster-admins"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "cluster-admin",
            },
            "subjects": [
                {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "Group",
                    "name": "kubeadm:cluster-admins",
                }
            ],
        }
        await self.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(binding).encode())
        await self._kubeadm("init", "phase", "upload-config", "all", cfg, kubeconfig)
        await self._kubeadm(
            "init", "phase", "bootstrap-token", cfg, kubeconfig, "--skip-token-print"
        )

    async def stop(self, *, grace: float = 10.0) -> None:
        for name in ("kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"):
            proc = self._procs.pop(name, None)
            if proc is not None:
                await proc.stop(grace=grace)

    async def __aenter__(self) -> HostedControlPlane:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def check_running(self) -> None:
        """Raise with the log tail of a process that died."""
        for name, proc in self._procs.items():
            if not proc.running:
                raise ProcessFailed(
                    f"{self.cluster} {name} exited ({proc.returncode}):\n{proc.log_tail()}"
                )

    def remove_workdir(self) -> None:
        if any(p.running for p in self._procs.values()):
            raise HostedControlPlaneError("stop the control plane before removing its files")
        shutil.rmtree(self.workdir, ignore_errors=True)

    # ------------------------------------------------------------------ Cluster API

    def management_objects(self, namespace: str) -> list[dict[str, Any]]:
        """The Secrets Cluster API reads for this cluster (see the module docstring)."""

        def secret(suffix: str, data: Mapping[str, bytes]) -> dict[str, Any]:
            return {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {
                    "name": f"{self.cluster}-{suffix}",
                    "namespace": namespace,
                    "labels": {_CLUSTER_NAME_LABEL: self.cluster},
                },
                "type": _SECRET_TYPE,
                "data": {k: base64.b64encode(v).decode() for k, v in data.items()},
            }

        return [
            secret(
                "ca",
                {
                    "tls.crt": (self.pki / "ca.crt").read_bytes(),
                    "tls.key": (self.pki / "ca.key").read_bytes(),
                },
            ),
            secret("kubeconfig", {"value": self.admin_kubeconfig.read_bytes()}),
        ]

    def control_plane_status(self) -> dict[str, Any]:
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        return {
            "initialization": {"controlPlaneInitialized": True},
            "externalManagedControlPlane": True,
            "version": self.kubernetes_version,
            "conditions": [
                {
                    "type": "Available",
                    "status": "True",
                    "reason": "Available",
                    "message": f"kube-apiserver on {self.address}:{API_PORT} (host processes)",
                    "lastTransitionTime": now,
                }
            ],
        }
