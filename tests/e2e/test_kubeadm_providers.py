"""The real kubeadm bootstrap (CABPK) and KubeadmControlPlane (KCP) providers against capl.

1. On the session control plane, beside the core manager (`running_kubeadm_providers`,
   tests/fixtures/capi.py) and a `capl manager` process for the test's namespace: a Cluster
   whose control plane is a KubeadmControlPlane (1 replica, `kubeadmConfigSpec.format:
   ignition`, the kubeadm.service drop-in of capl's default template) on a LibvirtMachineTemplate,
   and a LibvirtCluster on libvirtd's shared test driver (`test+unix:///default`: no VM boots,
   what is asserted is the providers' output and capl taking it). KCP generates the cluster
   certificates and the kubeconfig Secret from the endpoint capl chose and creates the
   Machine, its KubeadmConfig and LibvirtMachine; CABPK writes the bootstrap data Secret
   (`format: ignition`, `value` Ignition spec 2.3.0 with `kubeadm.service` and
   `/etc/kubeadm.yml`); capl delivers it to the domain. Deleting the Cluster removes all of it
   through the same controllers.
2. On a fresh control plane, `clusterctl init --bootstrap kubeadm --control-plane kubeadm
   --infrastructure libvirt` from the local repository (`Clusterctl.prepare` writes the
   kubeadm providers beside the core): the inventory lists them, their CRDs and webhooks are
   re-pointed at the local managers (clusterctl's labels kept), `upgrade plan` is up to date,
   and capl's default template (KubeadmControlPlane + KubeadmConfigTemplate with Ignition)
   passes a server-side dry-run through the real kubeadm webhooks.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
import urllib.parse
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from capl.runtime.objects import Obj
from capl.runtime.resources import (
    CLUSTER,
    LIBVIRT_CLUSTER,
    LIBVIRT_MACHINE,
    LIBVIRT_MACHINE_TEMPLATE,
    MACHINE,
    SECRET,
    Resource,
)
from capl.testbed import ControlPlane
from capl.testbed.capi import (
    KUBEADM_BOOTSTRAP_COMPONENTS,
    KUBEADM_CONTROL_PLANE_COMPONENTS,
    CapiAssets,
    CapiCore,
)
from capl.testbed.clusterctl import Clusterctl, LocalProvider
from capl.testbed.kubeadm_providers import (
    BOOTSTRAP_GROUP,
    CONTROL_PLANE_GROUP,
    KubeadmProviders,
)
from capl.testing.objects import BASE_VOLUME, condition_of, libvirt_machine_spec
from tests.fixtures.bed import BedCluster, Host, ManagerBed, bed_for
from tests.fixtures.capi import (
    ControlPlaneFactory,
    capl_webhooks,
    new_clusterctl,
    record_timing,
    timed,
)
from tests.fixtures.capl import CaplManagerFactory
from tests.fixtures.common import eventually
from tests.fixtures.libvirt_direct import free_cidr, put_base_volume

pytestmark = [pytest.mark.e2e, pytest.mark.apiserver]

KUBERNETES_VERSION = "v1.35.4"
KUBEADM_CONTROL_PLANE = Resource(
    CONTROL_PLANE_GROUP, "v1beta2", "KubeadmControlPlane", "kubeadmcontrolplanes"
)
KUBEADM_CONFIG = Resource(BOOTSTRAP_GROUP, "v1beta2", "KubeadmConfig", "kubeadmconfigs")
CONTROL_PLANE_LABEL = "cluster.x-k8s.io/control-plane"
CLUSTERCTL_LABEL = "clusterctl.cluster.x-k8s.io"
# What capl's default template (templates/cluster-template.yaml) adds to CABPK's own units.
ADDITIONAL_CONFIG = """\
systemd:
  units:
    - name: kubeadm.service
      enabled: true
      dropins:
        - name: 10-capl.conf
          contents: |
            [Unit]
            Requires=containerd.service
            After=containerd.service
"""


# --- helpers -----------------------------------------------------------------------------------


def data_url_text(source: str) -> str:
    """The text of an Ignition `contents.source` data URL (`data:[type][;base64],...`)."""
    header, _, payload = source.partition(",")
    assert header.startswith("data:"), f"not a data URL: {source[:60]!r}"
    if header.endswith(";base64"):
        return base64.b64decode(payload).decode()
    return urllib.parse.unquote_to_bytes(payload).decode()


def ignition_files(config: dict[str, Any]) -> dict[str, str]:
    """path -> text of every file in an Ignition config."""
    return {
        f["path"]: data_url_text(f["contents"]["source"])
        for f in (config.get("storage") or {}).get("files") or []
    }


def owner_kinds(obj: Obj) -> dict[str, str]:
    return {o["kind"]: o["name"] for o in obj["metadata"].get("ownerReferences") or []}


def is_true(obj: Obj, type_: str) -> bool:
    return condition_of(obj, type_).get("status") == "True"


def kcp_objects(namespace: str, name: str, host: str) -> list[tuple[Resource, Obj]]:
    """Cluster (control plane: a KubeadmControlPlane) + LibvirtCluster on `host` +
    LibvirtMachineTemplate + KubeadmControlPlane (1 replica, Ignition)."""
    infra_group = LIBVIRT_CLUSTER.group
    return [
        (
            LIBVIRT_CLUSTER,
            {
                "apiVersion": LIBVIRT_CLUSTER.api_version,
                "kind": LIBVIRT_CLUSTER.kind,
                "metadata": {"name": name},
                "spec": {
                    "hosts": [{"name": "h1", "uri": host}],
                    "network": {"cidr": free_cidr(), "mode": "isolated"},
                },
            },
        ),
        (
            LIBVIRT_MACHINE_TEMPLATE,
            {
                "apiVersion": LIBVIRT_MACHINE_TEMPLATE.api_version,
                "kind": LIBVIRT_MACHINE_TEMPLATE.kind,
                "metadata": {"name": f"{name}-control-plane"},
                "spec": {"template": {"spec": libvirt_machine_spec()}},
            },
        ),
        (
            KUBEADM_CONTROL_PLANE,
            {
                "apiVersion": KUBEADM_CONTROL_PLANE.api_version,
                "kind": KUBEADM_CONTROL_PLANE.kind,
                "metadata": {"name": f"{name}-control-plane"},
                "spec": {
                    "replicas": 1,
                    "version": KUBERNETES_VERSION,
                    "machineTemplate": {
                        "spec": {
                            "infrastructureRef": {
                                "apiGroup": infra_group,
                                "kind": LIBVIRT_MACHINE_TEMPLATE.kind,
                                "name": f"{name}-control-plane",
                            }
                        }
                    },
                    "kubeadmConfigSpec": {
                        "format": "ignition",
                        "ignition": {
                            "containerLinuxConfig": {"additionalConfig": ADDITIONAL_CONFIG}
                        },
                    },
                },
            },
        ),
        (
            CLUSTER,
            {
                "apiVersion": CLUSTER.api_version,
                "kind": CLUSTER.kind,
                "metadata": {"name": name},
                "spec": {
                    "controlPlaneRef": {
                        "apiGroup": CONTROL_PLANE_GROUP,
                        "kind": KUBEADM_CONTROL_PLANE.kind,
                        "name": f"{name}-control-plane",
                    },
                    "infrastructureRef": {
                        "apiGroup": infra_group,
                        "kind": LIBVIRT_CLUSTER.kind,
                        "name": name,
                    },
                },
            },
        ),
    ]


# --- 1. KCP + CABPK + capl on the session control plane ----------------------------------------


@pytest.fixture
async def kcp_bed(
    control_plane: ControlPlane, namespace: str, running_kubeadm_providers: KubeadmProviders
) -> AsyncIterator[ManagerBed]:
    """The test's namespace with the core and kubeadm managers running; swept afterwards."""
    async with bed_for(ManagerBed, control_plane, namespace) as bed:
        yield bed


async def test_kcp_machine_gets_ignition_bootstrap_data_from_cabpk(
    kcp_bed: ManagerBed,
    running_kubeadm_providers: KubeadmProviders,
    capl_manager_factory: CaplManagerFactory,
    control_plane: ControlPlane,
    shared_test_driver: str,
) -> None:
    bed, name = kcp_bed, "kcp"
    manager = await capl_manager_factory(
        control_plane, name="capl-kubeadm", webhooks=False, namespace=bed.namespace
    )
    await manager.start()
    cluster = BedCluster(
        name=name, namespace=bed.namespace, hosts=[Host("h1", shared_test_driver)],
        cidr="", dns_domain=None,
    )  # fmt: skip
    bed.clusters.append(cluster)  # for the sweep after the test
    providers = running_kubeadm_providers

    def logs() -> str:
        return "\n".join(
            f"--- {m.name} (last lines)\n{m.log_text()[-3000:]}"
            for m in (*providers.managers, manager)
        )

    t0 = time.monotonic()
    for resource, obj in kcp_objects(bed.namespace, name, shared_test_driver):
        await bed.create(resource, obj)

    # capl provisions the network and pool and picks the endpoint; the base volume the
    # template names goes into the pool (as in the other stages on the test driver).
    cluster.libvirt_cluster = await bed.wait_for(
        LIBVIRT_CLUSTER, name,
        lambda o: bool((o.get("status") or {}).get("initialization", {}).get("provisioned")),
        within=60, what="LibvirtCluster provisioned",
    )  # fmt: skip
    await asyncio.to_thread(put_base_volume, shared_test_driver, cluster.pool, BASE_VOLUME)
    endpoint = cluster.libvirt_cluster["spec"]["controlPlaneEndpoint"]

    # KCP: cluster certificates, the kubeconfig Secret, one Machine with a KubeadmConfig.
    async def control_plane_machine() -> Obj | None:
        machines = [
            m
            for m in await bed.list_objects(MACHINE)
            if CONTROL_PLANE_LABEL in (m["metadata"].get("labels") or {})
        ]
        assert len(machines) <= 1, [m["metadata"]["name"] for m in machines]
        data_secret = machines[0]["spec"]["bootstrap"].get("dataSecretName") if machines else None
        assert data_secret, "no control-plane Machine with bootstrap.dataSecretName yet"
        return machines[0]

    try:
        machine: Obj = await eventually(
            control_plane_machine, within=90, what="the control-plane Machine's bootstrap data"
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{logs()}") from None
    record_timing(
        "kubeadm providers: Cluster created -> Machine bootstrap data", time.monotonic() - t0
    )
    machine_name = machine["metadata"]["name"]
    assert owner_kinds(machine).get("KubeadmControlPlane") == f"{name}-control-plane"
    assert machine["spec"]["version"] == KUBERNETES_VERSION
    config_ref = machine["spec"]["bootstrap"]["configRef"]
    assert (config_ref["apiGroup"], config_ref["kind"]) == (BOOTSTRAP_GROUP, "KubeadmConfig")
    config = await bed.get(KUBEADM_CONFIG, config_ref["name"])
    assert config is not None
    assert owner_kinds(config).get("Machine") == machine_name
    assert config["status"]["dataSecretName"] == machine["spec"]["bootstrap"]["dataSecretName"]
    for suffix in ("ca", "etcd", "proxy", "sa", "kubeconfig"):
        assert await bed.get(SECRET, f"{name}-{suffix}"), f"KCP made no Secret {name}-{suffix}"

    # CABPK: the bootstrap data Secret, Ignition spec 2.3.0 (the Flatcar transpiler's).
    secret = await bed.get(SECRET, config["status"]["dataSecretName"])
    assert secret is not None
    assert secret["type"] == "cluster.x-k8s.io/secret"
    assert owner_kinds(secret).get("KubeadmConfig") == config["metadata"]["name"]
    data = {k: base64.b64decode(v) for k, v in secret["data"].items()}
    assert data["format"] == b"ignition"
    ignition = json.loads(data["value"])
    assert ignition["ignition"]["version"] == "2.3.0"
    units = {u["name"]: u for u in (ignition.get("systemd") or {}).get("units") or []}
    assert "kubeadm.service" in units, sorted(units)
    assert units["kubeadm.service"].get("enabled") is True
    assert [d["name"] for d in units["kubeadm.service"].get("dropins") or []] == ["10-capl.conf"]
    files = ignition_files(ignition)
    assert "/etc/kubeadm.yml" in files, sorted(files)
    kubeadm_docs = {d["kind"]: d for d in yaml.safe_load_all(files["/etc/kubeadm.yml"]) if d}
    assert {"InitConfiguration", "ClusterConfiguration"} <= set(kubeadm_docs), sorted(kubeadm_docs)
    cluster_config = kubeadm_docs["ClusterConfiguration"]
    assert cluster_config["controlPlaneEndpoint"] == f"{endpoint['host']}:{endpoint['port']}"
    assert cluster_config["kubernetesVersion"] == KUBERNETES_VERSION
    assert "kubeadm init --config /etc/kubeadm.yml" in files.get("/etc/kubeadm.sh", ""), sorted(
        files
    )
    assert any(p.startswith("/etc/kubernetes/pki/") for p in files), sorted(files)

    # capl takes that data: the LibvirtMachine KCP cloned from the template gets it delivered.
    t1 = time.monotonic()
    infra = machine["spec"]["infrastructureRef"]
    assert infra["kind"] == LIBVIRT_MACHINE.kind
    try:
        await bed.wait_for(
            LIBVIRT_MACHINE, infra["name"],
            lambda o: is_true(o, "BootstrapDataDelivered"),
            within=60, what="LibvirtMachine BootstrapDataDelivered",
        )  # fmt: skip
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{logs()}") from None
    record_timing("kubeadm providers: bootstrap data -> delivered by capl", time.monotonic() - t1)

    # Deleting the Cluster: KCP deletes its Machine, the core the KubeadmConfig and the
    # LibvirtMachine, capl the domain, then the network and pool with the LibvirtCluster.
    t2 = time.monotonic()
    await bed.delete(CLUSTER, name)
    try:
        for resource, obj_name in (
            (MACHINE, machine_name),
            (KUBEADM_CONTROL_PLANE, f"{name}-control-plane"),
            (LIBVIRT_CLUSTER, name),
            (CLUSTER, name),
        ):
            await bed.wait_for(
                resource, obj_name, lambda _: False, absent_ok=True, within=120,
                what=f"{resource.kind} {obj_name} deleted",
            )  # fmt: skip
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{logs()}") from None
    record_timing("kubeadm providers: Cluster deletion (KCP, Machine, capl)", time.monotonic() - t2)
    assert await bed.get(KUBEADM_CONFIG, config_ref["name"]) is None
    assert await bed.get(LIBVIRT_MACHINE, infra["name"]) is None


# --- 2. clusterctl init --bootstrap kubeadm --control-plane kubeadm ----------------------------


@dataclass
class KubeadmManagement:
    plane: ControlPlane
    core: CapiCore
    providers: KubeadmProviders
    clusterctl: Clusterctl
    init_log: str
    workdir: Path


@pytest.fixture(scope="module")
async def kubeadm_management(
    control_plane_factory: ControlPlaneFactory,
    capi_assets: CapiAssets,
    libvirt_provider: LocalProvider,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[KubeadmManagement]:
    workdir = tmp_path_factory.mktemp("clusterctl-kubeadm")
    plane = await control_plane_factory()
    clusterctl = new_clusterctl(
        capi=capi_assets, plane=plane, workdir=workdir, providers=[libvirt_provider]
    )
    with timed("kubeadm flow: clusterctl init --bootstrap kubeadm --control-plane kubeadm"):
        init_log = await clusterctl.init(plane, bootstrap=("kubeadm",), control_plane=("kubeadm",))
    core = CapiCore(plane=plane, capi=capi_assets, workdir=workdir / "capi-core")
    providers = KubeadmProviders.for_plane(plane=plane, capi=capi_assets, workdir=workdir)
    try:
        with timed("kubeadm flow: CAPI core + kubeadm providers re-pointed + started"):
            await asyncio.gather(core.start(), providers.start())
        yield KubeadmManagement(
            plane=plane, core=core, providers=providers, clusterctl=clusterctl,
            init_log=init_log, workdir=workdir,
        )  # fmt: skip
    finally:
        await providers.stop()
        await core.stop()


async def kubectl_json(plane: ControlPlane, *args: str) -> dict[str, Any]:
    parsed: dict[str, Any] = json.loads(await plane.kubectl("get", *args, "-o", "json"))
    return parsed


async def test_clusterctl_init_installs_the_kubeadm_providers(
    kubeadm_management: KubeadmManagement, capi_assets: CapiAssets
) -> None:
    mgmt = kubeadm_management
    providers = await kubectl_json(mgmt.plane, "providers.clusterctl.cluster.x-k8s.io", "-A")
    found = {
        p["metadata"]["name"]: (p["type"], p["providerName"], p["version"])
        for p in providers["items"]
    }
    for components in (KUBEADM_BOOTSTRAP_COMPONENTS, KUBEADM_CONTROL_PLANE_COMPONENTS):
        assert found.get(components.provider_id) == (
            components.type, "kubeadm", capi_assets.version,
        ), found  # fmt: skip

    # Their CRDs (installed by clusterctl: its labels kept) convert through the local
    # managers; their admission webhooks call them too.
    for manager in mgmt.providers.managers:
        selector = f"cluster.x-k8s.io/provider={manager.provider}"
        crds = await kubectl_json(mgmt.plane, "customresourcedefinitions", "-l", selector)
        assert len(crds["items"]) == 2, [c["metadata"]["name"] for c in crds["items"]]
        for crd in crds["items"]:
            client_config = crd["spec"]["conversion"]["webhook"]["clientConfig"]
            assert client_config["url"] == f"{manager.webhook_url}/convert"
            assert "service" not in client_config
            assert CLUSTERCTL_LABEL in crd["metadata"]["labels"]
        hooks = await kubectl_json(
            mgmt.plane,
            "mutatingwebhookconfigurations,validatingwebhookconfigurations",
            "-l",
            selector,
        )
        urls = [w["clientConfig"]["url"] for h in hooks["items"] for w in h["webhooks"]]
        assert urls, f"no {manager.provider} admission webhooks"
        assert all(u.startswith(f"{manager.webhook_url}/") for u in urls), urls

    plan = await mgmt.clusterctl.run("upgrade", "plan", kubeconfig=mgmt.plane.kubeconfig)
    rows = {line.split()[0]: line for line in plan.splitlines() if line.strip()}
    for provider_id in ("cluster-api", "bootstrap-kubeadm", "control-plane-kubeadm"):
        assert "Already up to date" in rows[provider_id], plan


async def test_default_template_passes_the_real_kubeadm_webhooks(
    kubeadm_management: KubeadmManagement,
) -> None:
    """capl's default flavor (KubeadmControlPlane and KubeadmConfigTemplate with
    `format: ignition`) through the kubeadm providers' own webhooks and capl's."""
    mgmt = kubeadm_management
    async with capl_webhooks(mgmt.plane, cert_dir=mgmt.workdir / "capl-webhook"):
        manifest = await mgmt.clusterctl.generate_cluster(
            "demo",
            kubeconfig=mgmt.plane.kubeconfig,
            target_namespace="kubeadm-default",
            kubernetes_version=KUBERNETES_VERSION,
            control_plane_machine_count=1,
            worker_machine_count=1,
            variables={"LIBVIRT_IMAGE_URL": "http://127.0.0.1:8/images/capl-test.qcow2"},
        )
        docs = [d for d in yaml.safe_load_all(manifest) if d]
        assert {"KubeadmControlPlane", "KubeadmConfigTemplate"} <= {d["kind"] for d in docs}
        await mgmt.plane.kubectl("create", "namespace", "kubeadm-default")
        out = await mgmt.plane.kubectl(
            "apply", "--server-side", "--dry-run=server", "--field-manager=capl-e2e",
            "-f", "-", stdin=manifest.encode(),
        )  # fmt: skip
        applied = [line for line in out.splitlines() if "serverside-applied" in line]
        assert len(applied) == len(docs), out
