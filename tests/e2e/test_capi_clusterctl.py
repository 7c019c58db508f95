"""clusterctl against the test bed: `init --infrastructure libvirt` from local repositories,
`generate cluster` from capl's templates, `describe`, `upgrade plan` (the upgrade itself:
test_clusterctl_upgrade.py).

One fresh control plane per module (init installs things the session one must not carry).
After `init`, the Cluster API core manager runs as a local process with the clusterctl-installed
CRDs and webhooks re-pointed at it, and capl's admission webhooks (capl.webhooks, served in
this process) take the place of capl's Deployment.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from capl.testbed import ControlPlane, hostedcp
from capl.testbed.capi import CapiAssets, CapiCore
from capl.testbed.capibuild import CERT_MANAGER_TEST_NAMESPACE
from capl.testbed.clusterctl import Clusterctl, LocalProvider, next_minor
from tests.fixtures.capi import (
    ControlPlaneFactory,
    capl_webhooks,
    kubeadm_crd_dirs,
    new_clusterctl,
    record_timing,
    timed,
)
from tests.fixtures.common import require_part

pytestmark = [pytest.mark.e2e, pytest.mark.apiserver]

KUBERNETES_VERSION = "v1.35.4"
TEMPLATE_VARIABLES = {
    "LIBVIRT_IMAGE_URL": "http://127.0.0.1:8/images/capl-test.qcow2",
    # the offline flavors boot the node image from a file on the host
    "LIBVIRT_IMAGE_PATH": "/var/lib/libvirt/images/capl-node.qcow2",
}
CLUSTERCTL_LABEL = "clusterctl.cluster.x-k8s.io"


@dataclass
class Management:
    plane: ControlPlane
    clusterctl: Clusterctl
    core: CapiCore
    init_log: str
    workdir: Path


@pytest.fixture(scope="module")
async def management(
    control_plane_factory: ControlPlaneFactory,
    capi_assets: CapiAssets,
    libvirt_provider: LocalProvider,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[Management]:
    workdir = tmp_path_factory.mktemp("clusterctl")
    with timed("clusterctl flow: start an empty control plane"):
        plane = await control_plane_factory()
    clusterctl = new_clusterctl(
        capi=capi_assets, plane=plane, workdir=workdir, providers=[libvirt_provider]
    )
    with timed("clusterctl flow: write the local repository (kustomize core components)"):
        await clusterctl.prepare()
    with timed("clusterctl flow: clusterctl init --infrastructure libvirt"):
        init_log = await clusterctl.init(plane)
    # ClusterTopology on (upstream's default is off in v1.13): the "topology" flavor's
    # ClusterClass and Cluster with spec.topology are refused without it.
    core = CapiCore(
        plane=plane,
        capi=capi_assets,
        workdir=workdir / "capi-core",
        feature_gates={"ClusterTopology": True},
    )
    try:
        with timed("clusterctl flow: CAPI core re-pointed + started"):
            await core.start()
        yield Management(
            plane=plane, clusterctl=clusterctl, core=core, init_log=init_log, workdir=workdir
        )
    finally:
        await core.stop()


@pytest.fixture(scope="module")
async def capl_admission(management: Management) -> AsyncIterator[str]:
    async with capl_webhooks(management.plane, cert_dir=management.workdir / "capl-webhook") as url:
        yield url


async def kubectl_json(plane: ControlPlane, *args: str) -> dict[str, Any]:
    out = await plane.kubectl("get", *args, "-o", "json")
    parsed: dict[str, Any] = json.loads(out)
    return parsed


async def test_init_installs_core_and_libvirt_providers_without_cert_manager(
    management: Management, libvirt_provider: LocalProvider, capi_assets: CapiAssets
) -> None:
    plane = management.plane
    assert "Skipping installing cert-manager as it is already installed" in management.init_log

    providers = await kubectl_json(plane, "providers.clusterctl.cluster.x-k8s.io", "-A")
    found = {
        p["metadata"]["name"]: (
            p["type"],
            p["providerName"],
            p["version"],
            p["metadata"]["namespace"],
        )
        for p in providers["items"]
    }
    assert found == {
        "cluster-api": ("CoreProvider", "cluster-api", capi_assets.version, "capi-system"),
        "infrastructure-libvirt": (
            "InfrastructureProvider",
            "libvirt",
            libvirt_provider.version,
            "capl-system",
        ),
    }

    # cert-manager was neither installed nor left behind; its test namespace was finalized.
    namespaces = {n["metadata"]["name"] for n in (await kubectl_json(plane, "namespaces"))["items"]}
    assert "cert-manager" not in namespaces
    assert CERT_MANAGER_TEST_NAMESPACE not in namespaces
    assert {"capi-system", "capl-system"} <= namespaces

    # capl's CRDs came from its components file, labelled by clusterctl.
    crds = await kubectl_json(
        plane, "customresourcedefinitions", "-l", "cluster.x-k8s.io/provider=infrastructure-libvirt"
    )
    names = {c["metadata"]["name"] for c in crds["items"]}
    assert names == {
        f"{plural}.infrastructure.cluster.x-k8s.io"
        for plural in (
            "libvirtclusters",
            "libvirtclustertemplates",
            "libvirtmachines",
            "libvirtmachinetemplates",
            "libvirtmachinemigrations",
        )
    }
    for crd in crds["items"]:
        assert crd["metadata"]["labels"][CLUSTERCTL_LABEL] == ""
        assert crd["metadata"]["labels"]["cluster.x-k8s.io/v1beta2"] == "v1alpha1"

    # The core CRDs clusterctl installed now convert through the local manager, and keep
    # clusterctl's labels (re-pointed in place, not re-created).
    core_crds = await kubectl_json(
        plane, "customresourcedefinitions", "-l", "cluster.x-k8s.io/provider=cluster-api"
    )
    assert len(core_crds["items"]) == 13
    for crd in core_crds["items"]:
        client_config = crd["spec"]["conversion"]["webhook"]["clientConfig"]
        assert client_config["url"] == f"{management.core.webhook_url}/convert"
        assert "service" not in client_config
        assert CLUSTERCTL_LABEL in crd["metadata"]["labels"]

    # the repository carries capl's next minor too (tests/e2e/test_clusterctl_upgrade.py)
    t0 = time.monotonic()
    plan = await management.clusterctl.upgrade_plan(plane)
    record_timing("clusterctl upgrade plan", time.monotonic() - t0)
    assert plan["cluster-api"].next is None
    libvirt = plan["infrastructure-libvirt"]
    assert (libvirt.current, libvirt.next) == (
        libvirt_provider.version,
        next_minor(libvirt_provider.version),
    )


def _flavors(provider: LocalProvider) -> list[str | None]:
    flavors: list[str | None] = []
    for path in sorted(provider.directory.glob("cluster-template*.yaml")):
        match = re.fullmatch(r"cluster-template(?:-(.+))?\.yaml", path.name)
        if match:
            flavors.append(match.group(1))
    return flavors


async def _install_kubeadm_crds(plane: ControlPlane, capi: CapiAssets) -> None:
    dirs = kubeadm_crd_dirs(capi)
    if dirs is None:
        require_part(
            "the kubeadm bootstrap/control-plane CRDs of Cluster API " + capi.version,
            "copy bootstrap/kubeadm/config and controlplane/kubeadm/config of the module "
            "into the `make capi` output",
        )
        return
    for directory in dirs:
        await plane.install_crds(directory)


async def test_generated_clusters_apply_cleanly(
    management: Management,
    capl_admission: str,
    libvirt_provider: LocalProvider,
    capi_assets: CapiAssets,
) -> None:
    """Every flavor in capl's repository generates YAML that a server-side dry-run accepts,
    through the real Cluster API webhooks and capl's own webhooks."""
    plane = management.plane
    hooks = await kubectl_json(
        plane,
        "validatingwebhookconfigurations",
        "-l",
        "cluster.x-k8s.io/provider=infrastructure-libvirt",
    )
    urls = [w["clientConfig"]["url"] for c in hooks["items"] for w in c["webhooks"]]
    assert urls, "clusterctl installed no capl validating webhooks"
    assert all(u.startswith(capl_admission + "/") for u in urls), urls
    flavors = _flavors(libvirt_provider)
    assert flavors, f"no cluster-template*.yaml in {libvirt_provider.directory}"
    kubeadm_installed = False
    for flavor in flavors:
        label = flavor or "default"
        namespace = f"generated-{label}"
        t0 = time.monotonic()
        manifest = await management.clusterctl.generate_cluster(
            "demo",
            kubeconfig=plane.kubeconfig,
            flavor=flavor,
            target_namespace=namespace,
            kubernetes_version=KUBERNETES_VERSION,
            control_plane_machine_count=1,
            worker_machine_count=2,
            variables=TEMPLATE_VARIABLES,
        )
        record_timing(f"clusterctl generate cluster (flavor {label})", time.monotonic() - t0)
        assert "${" not in manifest, f"flavor {label}: unresolved variables"
        docs = [d for d in yaml.safe_load_all(manifest) if d]
        kinds = {d["kind"] for d in docs}
        # the topology flavor's Cluster names ClusterClass "libvirt": clusterctl adds the class
        # and its templates from clusterclass-libvirt.yaml (none in the namespace yet)
        infra = "LibvirtClusterTemplate" if flavor == "topology" else "LibvirtCluster"
        assert {"Cluster", infra} <= kinds, f"flavor {label}: {sorted(kinds)}"
        assert ("ClusterClass" in kinds) == (flavor == "topology"), f"flavor {label}"
        assert all(d["metadata"]["namespace"] == namespace for d in docs)
        if any(k.startswith("Kubeadm") for k in kinds) and not kubeadm_installed:
            await _install_kubeadm_crds(plane, capi_assets)
            kubeadm_installed = True
        if hostedcp.CP_KIND in kinds:
            # the offline flavor's control plane is the test bed's stand-in kind
            crd = json.dumps(hostedcp.control_plane_crd()).encode()
            await plane.kubectl("apply", "--server-side", "-f", "-", stdin=crd)
            await plane.kubectl(
                "wait", "--for=condition=Established",
                f"crd/{hostedcp.CP_PLURAL}.{hostedcp.CP_GROUP}",
            )  # fmt: skip

        await plane.kubectl("create", "namespace", namespace)
        t1 = time.monotonic()
        out = await plane.kubectl(
            "apply", "--server-side", "--dry-run=server", "--field-manager=capl-e2e",
            "-f", "-", stdin=manifest.encode(),
        )  # fmt: skip
        record_timing(f"server-side dry-run apply (flavor {label})", time.monotonic() - t1)
        applied = [line for line in out.splitlines() if "serverside-applied" in line]
        assert len(applied) == len(docs), f"flavor {label}:\n{out}"


async def test_describe_shows_a_cluster_on_libvirt(
    management: Management, capl_admission: str
) -> None:
    """A Cluster created through both webhooks is adopted by the core manager and shows up in
    `clusterctl describe` with its LibvirtCluster."""
    plane = management.plane
    namespace, name = "describe", "demo"
    await plane.kubectl("create", "namespace", namespace)
    objects = [
        {
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1",
            "kind": "LibvirtCluster",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "hosts": [{"name": "host0", "uri": "test:///default"}],
                "network": {"cidr": "192.168.151.0/24", "mode": "isolated"},
            },
        },
        {
            "apiVersion": "cluster.x-k8s.io/v1beta2",
            "kind": "Cluster",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "infrastructureRef": {
                    "apiGroup": "infrastructure.cluster.x-k8s.io",
                    "kind": "LibvirtCluster",
                    "name": name,
                }
            },
        },
    ]
    listing = {"apiVersion": "v1", "kind": "List", "items": objects}
    await plane.kubectl("create", "-f", "-", stdin=json.dumps(listing).encode())
    t0 = time.monotonic()
    deadline = t0 + 60
    while True:
        lc = await kubectl_json(plane, "libvirtclusters", "-n", namespace, name)
        owners = lc["metadata"].get("ownerReferences") or []
        if any(o["kind"] == "Cluster" and o["name"] == name for o in owners):
            break
        assert time.monotonic() < deadline, "the Cluster controller did not adopt it"
        await asyncio.sleep(0.2)
    record_timing("clusterctl flow: Cluster adopted by the core manager", time.monotonic() - t0)
    # capl's defaulting webhook ran: it fills in the DHCP range left out above.
    assert lc["spec"]["network"].get("dhcp"), lc["spec"]

    t1 = time.monotonic()
    tree = await management.clusterctl.run(
        "describe", "cluster", name, "-n", namespace, "--show-conditions=all",
        kubeconfig=plane.kubeconfig,
    )  # fmt: skip
    record_timing("clusterctl describe cluster", time.monotonic() - t1)
    assert f"Cluster/{name}" in tree
    assert f"LibvirtCluster/{name}" in tree
