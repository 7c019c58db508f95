"""`clusterctl move` takes the credentials Secrets even where owner references are refused.

A kube-apiserver of its own with the OwnerReferencesPermissionEnforcement admission plugin
(as OpenShift runs it: changing an object's ownerReferences needs `delete` on it), the
LibvirtCluster controller under the shipped ClusterRole (config/rbac/role.yaml bound to a
user of its own, no system:masters; the role grants `patch` on Secrets, not `delete`):

- the credentials Secret gets the label `clusterctl.cluster.x-k8s.io/move` (what makes
  clusterctl move take it);
- the owner reference is refused (HTTP 403) and not set;
- the LibvirtCluster's `CredentialsOwned` condition is False/OwnerReferenceRefused naming the
  Secret and the answer, with a Warning Event; the refusal is not asked again while the
  Secret is unchanged (no 403 every health interval).
"""

from __future__ import annotations

import functools
import secrets
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from capl.api import constants as c
from capl.controllers import libvirtcluster
from capl.controllers.libvirtcluster import LibvirtClusterOptions
from capl.kube import KubeClient
from capl.runtime.objects import ObjectKey
from capl.runtime.resources import LIBVIRT_CLUSTER, NAMESPACE, SECRET
from capl.testbed import AssetsMissing, ControlPlane, find_assets
from capl.testbed.identities import MANAGER_AUDIT_POLICY, manager_kubeconfig
from capl.testing.crds import CRD_DIR
from capl.testing.harness import TEST_DRIVER, ControllerHarness
from capl.testing.objects import random_cidr
from capl.virt import LibvirtHosts
from tests.controllers.conftest import events_of
from tests.controllers.test_cluster_support import (
    create_cluster,
    create_secret,
    reconcile_again,
    unique,
    wait_condition,
)
from tests.fixtures.common import eventually, require_part
from tests.fixtures.objects import install_capi_crds

pytestmark = pytest.mark.apiserver
SETUP = functools.partial(libvirtcluster.setup, options=LibvirtClusterOptions(health_interval=None))


@pytest.fixture(scope="module")
async def enforcing_plane(
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[ControlPlane]:
    try:
        assets = find_assets()
    except AssetsMissing as e:
        require_part("the Kubernetes control plane (kube-apiserver, etcd, kubectl)", str(e))
        raise
    plane = ControlPlane(
        assets=assets,
        workdir=tmp_path_factory.mktemp("ownerref-plane"),
        audit_log=tmp_path_factory.mktemp("ownerref-audit") / "audit.log",
        audit_policy=MANAGER_AUDIT_POLICY,
        admission_plugins=["OwnerReferencesPermissionEnforcement"],
    )
    try:
        await plane.start()
        await plane.install_crds(CRD_DIR)
        with tempfile.TemporaryDirectory() as tmp:
            await install_capi_crds(plane, Path(tmp))
        await manager_kubeconfig(plane)  # the shipped roles bound to the manager's user
        yield plane
    finally:
        await plane.stop()


@pytest.fixture
async def restricted(enforcing_plane: ControlPlane) -> AsyncIterator[ControllerHarness]:
    """The harness with the manager's client as the role-bound user, the test's as admin."""
    plane = enforcing_plane
    namespace = f"ownerref-{secrets.token_hex(3)}"
    api = await KubeClient.connect(str(plane.kubeconfig))
    await api.resource(NAMESPACE).create({"metadata": {"name": namespace}})
    user = await manager_kubeconfig(plane)
    client = await KubeClient.connect(str(user), track_objects=True)
    h = ControllerHarness(client=client, api=api, hosts=LibvirtHosts(), namespace=namespace)
    try:
        yield h
    finally:
        try:
            await h.close()
        finally:
            await h.hosts.close()
            await h.observer.close()
            await client.close()
            await api.close()


@pytest.mark.manager_refusals_allowed(r"patch secrets")  # the refusal this test is about
async def test_refused_owner_reference_label_and_condition(
    restricted: ControllerHarness,
) -> None:
    h = restricted
    await h.start(SETUP)
    secret_name = unique("creds")
    await create_secret(h, secret_name, {"known_hosts": b"127.0.0.1 ssh-ed25519 AAAA\n"})
    name = await create_cluster(
        h,
        unique("move"),
        {
            "hosts": [
                {"name": "kvm1", "uri": TEST_DRIVER, "credentialsRef": {"name": secret_name}}
            ],
            "network": {"mode": "isolated", "cidr": random_cidr()},
        },
    )
    cond = await wait_condition(h, name, c.ConditionType.CREDENTIALS_OWNED, "False")
    assert cond["reason"] == c.Reason.OWNER_REFERENCE_REFUSED
    assert cond["message"].startswith(
        "the owner reference to this LibvirtCluster was refused on credentials Secret(s) "
        f"{h.namespace}/{secret_name} (HTTP 403: "
    )
    assert cond["message"].endswith(
        f"they carry the label {c.CLUSTERCTL_MOVE_LABEL}, so clusterctl move takes them anyway"
    )
    assert "AAAA" not in cond["message"]  # never the content
    secret = await h.api.resource(SECRET).get(ObjectKey(h.namespace, secret_name))
    assert secret["metadata"]["labels"] == {c.CLUSTERCTL_MOVE_LABEL: ""}
    assert not secret["metadata"].get("ownerReferences")
    # the Event is posted after the status patch: wait for it (seen missing on a busy machine)
    warning = ("Warning", c.Reason.OWNER_REFERENCE_REFUSED, cond["message"])

    async def warned() -> bool:
        return warning in await events_of(h, name)

    await eventually(warned, within=30, what="the OwnerReferenceRefused Warning event")
    # the manager's requests on the Secret: the label patch, the refused owner reference;
    # a later reconcile does not ask again while the Secret is unchanged
    asked = h.writes(SECRET, secret_name)
    assert asked == {"PATCH": 2}
    await reconcile_again(h, name)
    assert h.writes(SECRET, secret_name) == asked
    obj = await h.get(LIBVIRT_CLUSTER, name) or {}
    assert c.ConditionType.CREDENTIALS_OWNED in {
        cond["type"] for cond in obj["status"]["conditions"]
    }
