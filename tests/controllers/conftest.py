"""The controller tests' fixture and helpers on `capl.testing.harness.ControllerHarness`.

The controllers run for real (see capl/testing/harness.py): a `capl.runtime.Manager` with
`capl.kube.KubeClient` against the session's kube-apiserver (`control_plane`),
`capl.virt.LibvirtHosts` against a libvirt test driver (or the real libvirtd in
tests/libvirtd), `capl.kube.workload` for workload clusters. Nothing is faked.

Fixture (besides `capi_crds` from tests/fixtures/objects.py)
- `harness`: a `ControllerHarness` in the test's `namespace`, not started; stopped (and the
  libvirt resources it prepared removed) after the test (also imported by tests/libvirtd).
  Its manager runs as deployed: as the control plane's manager identity, bound to exactly
  config/rbac's roles (`capl.testbed.identities`); `h.api` is the admin's.

Helpers reading what the controllers left behind: `leftovers` (a machine's domains, volumes,
DHCP and DNS entries on a host), `events_of` (the Events about an object), `domain_owner`
(the owner tag the controller writes), `network_of` (a LibvirtCluster's CIDR).
"""

from __future__ import annotations

import contextlib
import ipaddress
from collections.abc import AsyncIterator

import pytest

from capl.api import constants as c
from capl.controllers.common import layout
from capl.ports.errors import PoolNotFound
from capl.ports.naming import machine_hostname, machine_names
from capl.ports.virt import DomainOwner
from capl.runtime.objects import Obj
from capl.runtime.resources import EVENT
from capl.testbed import ControlPlane
from capl.testbed.identities import manager_kubeconfig
from capl.testing.harness import (
    TEST_DRIVER,
    ClusterObjects,
    ControllerHarness,
    close_harness,
    new_harness,
)


async def leftovers(
    harness: ControllerHarness, cluster: ClusterObjects, machine: str, *, uri: str = TEST_DRIVER
) -> list[str]:
    """What of machine `machine` exists on the host: domains, volumes, DHCP hosts, DNS names
    (empty when nothing is left)."""
    found: list[str] = []
    model = cluster.layout_model()
    lay = layout(model)
    names = machine_names(namespace=harness.namespace, name=machine)
    hostname = machine_hostname(machine)
    host = harness.observer.get(uri=uri)
    for info in await host.list_domains():
        if info.name == names.domain or (
            info.owner is not None
            and (info.owner.namespace, info.owner.name) == (harness.namespace, machine)
        ):
            found.append(f"domain {info.name} ({info.uuid})")
    with contextlib.suppress(PoolNotFound):
        for ref in await host.list_volumes(pool=lay.pool, prefix=names.prefix, refresh=True):
            found.append(f"volume {ref.name}")
    network = await host.get_network(lay.network)
    if network is not None:
        found += [f"dhcp {h.mac} {h.name}" for h in network.dhcp_hosts if h.name == hostname]
        found += [
            f"dns {d.ip} {d.hostnames}"
            for d in network.dns_hosts
            if any(n == hostname or n.startswith(hostname + ".") for n in d.hostnames)
        ]
    return found


async def events_of(harness: ControllerHarness, name: str) -> list[tuple[str, str, str]]:
    """(type, reason, message) of the Events about object `name` in the namespace."""
    listing = await harness.api.resource(EVENT).list(namespace=harness.namespace)
    return [
        (str(e.get("type")), str(e.get("reason")), str(e.get("message")))
        for e in listing.items
        if (e.get("involvedObject") or {}).get("name") == name
    ]


def domain_owner(obj: Obj) -> DomainOwner:
    """The owner tag the controller writes for a LibvirtMachine."""
    md = obj["metadata"]
    return DomainOwner(
        cluster=md["labels"][c.CLUSTER_NAME_LABEL],
        namespace=md["namespace"],
        name=md["name"],
        uid=md["uid"],
    )


def network_of(obj: Obj) -> ipaddress.IPv4Network:
    return ipaddress.IPv4Network(obj["spec"]["network"]["cidr"])


# --- fixtures --------------------------------------------------------------------------------


@pytest.fixture
async def harness(
    control_plane: ControlPlane, capi_crds: list[str], namespace: str
) -> AsyncIterator[ControllerHarness]:
    h = await new_harness(
        control_plane.kubeconfig,
        namespace,
        manager_kubeconfig=await manager_kubeconfig(control_plane),
    )
    try:
        yield h
    finally:
        await close_harness(h)
