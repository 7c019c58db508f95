"""Pure placement rules: failure domains are authoritative, and the Node's topology labels."""

from __future__ import annotations

import pytest

from capl.api import constants as c
from capl.controllers.machine.plan_placement import (
    FailureDomainConflict,
    topology_labels,
    wanted_host,
)

M = "ns/m-0"


@pytest.mark.parametrize(
    ("host_name", "failure_domain", "expected"),
    [
        (None, None, None),  # capl chooses
        ("kvm1", None, "kvm1"),  # pinned by the user, no spreading asked for
        (None, "kvm2", "kvm2"),  # Cluster API's spreading
        ("kvm2", "kvm2", "kvm2"),  # both agree
        ("", "kvm2", "kvm2"),
    ],
)
def test_wanted_host_when_they_agree(
    host_name: str | None, failure_domain: str | None, expected: str | None
) -> None:
    assert (
        wanted_host(host_name=host_name, failure_domain=failure_domain, created=False, machine=M)
        == expected
    )


def test_a_conflicting_host_name_is_refused_naming_both_fields() -> None:
    got = wanted_host(host_name="kvm1", failure_domain="kvm2", created=False, machine=M)
    assert isinstance(got, FailureDomainConflict)
    assert got.message.startswith(
        "spec.hostName 'kvm1' conflicts with Machine ns/m-0's spec.failureDomain 'kvm2'"
    )
    assert "LibvirtMachineTemplate whose hostName is empty or 'kvm2'" in got.message
    assert "nothing is created" in got.message


def test_a_created_machine_lives_where_its_host_name_says() -> None:
    # a live migration moved it out of its failure domain: where it is wins, no conflict
    assert wanted_host(host_name="kvm1", failure_domain="kvm2", created=True, machine=M) == "kvm1"


def test_topology_labels() -> None:
    assert topology_labels(host="kvm1", region=None) == {c.ZONE_LABEL: "kvm1"}
    assert topology_labels(host="kvm2", region="eu-west") == {
        "topology.kubernetes.io/zone": "kvm2",
        "topology.kubernetes.io/region": "eu-west",
    }
