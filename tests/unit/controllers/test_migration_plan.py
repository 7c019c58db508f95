"""The pure decisions of the migration controller (capl.controllers.migration_plan)."""

from __future__ import annotations

import pytest

from capl.api.cluster import LibvirtHost
from capl.controllers.migration_plan import (
    Candidate,
    NoTarget,
    Recovery,
    choose_target,
    migration_address,
    recover,
)
from capl.ports.virt.migration import Whereabouts


def hosts(*names: str, **overrides: dict[str, object]) -> list[Candidate]:
    out = []
    for name in names:
        fields: dict[str, object] = {
            "reachable": True,
            "in_maintenance": False,
            "control_plane_allowed": True,
            "machines": 0,
        }
        fields.update(overrides.get(name, {}))
        out.append(Candidate(name=name, **fields))  # type: ignore[arg-type]
    return out


def test_the_emptiest_acceptable_host_is_chosen() -> None:
    candidates = hosts("kvm1", "kvm2", "kvm3", kvm2={"machines": 5}, kvm3={"machines": 1})
    assert (
        choose_target(source="kvm1", requested=None, candidates=candidates, control_plane=False)
        == "kvm3"
    )


def test_hosts_in_maintenance_unreachable_or_the_source_are_never_chosen() -> None:
    candidates = hosts(
        "kvm1", "kvm2", "kvm3", kvm2={"in_maintenance": True}, kvm3={"reachable": False}
    )
    chosen = choose_target(
        source="kvm1", requested=None, candidates=candidates, control_plane=False
    )
    assert isinstance(chosen, NoTarget)
    assert "kvm2: in maintenance" in chosen.message
    assert "kvm3: unreachable" in chosen.message
    assert "kvm1: the machine runs there" in chosen.message


def test_a_control_plane_machine_never_joins_another_control_plane_machine() -> None:
    candidates = hosts("kvm1", "kvm2", "kvm3", kvm3={"control_plane_allowed": False})
    chosen = choose_target(
        source="kvm1",
        requested=None,
        candidates=candidates,
        control_plane=True,
        control_plane_hosts={"kvm2", "kvm1"},
    )
    assert isinstance(chosen, NoTarget)
    assert "kvm2: runs another control-plane machine" in chosen.message
    assert "kvm3: does not take control-plane machines" in chosen.message
    # a worker may go there
    assert (
        choose_target(
            source="kvm1",
            requested=None,
            candidates=candidates,
            control_plane=False,
            control_plane_hosts={"kvm2"},
        )
        == "kvm2"
    )


@pytest.mark.parametrize(
    ("requested", "expected"),
    [
        ("kvm2", "kvm2"),
        ("kvm1", "targetHost kvm1: the machine runs there"),
        ("kvm9", "targetHost kvm9: not a host of the machine's LibvirtCluster"),
        ("kvm3", "targetHost kvm3: in maintenance"),
    ],
)
def test_a_requested_target_is_taken_or_refused_with_the_reason(
    requested: str, expected: str
) -> None:
    candidates = hosts("kvm1", "kvm2", "kvm3", kvm2={"machines": 9}, kvm3={"in_maintenance": True})
    chosen = choose_target(
        source="kvm1", requested=requested, candidates=candidates, control_plane=False
    )
    if isinstance(chosen, NoTarget):
        assert chosen.message == expected
    else:
        assert chosen == expected


@pytest.mark.parametrize(
    ("phase", "where", "abort", "expected"),
    [
        ("Running", Whereabouts.DESTINATION, False, Recovery.FINALIZE),
        ("Finalizing", Whereabouts.DESTINATION, True, Recovery.FINALIZE),
        ("PreparingTarget", Whereabouts.DESTINATION, False, Recovery.FINALIZE),
        ("Running", Whereabouts.INCOMING, False, Recovery.WAIT),
        ("Running", Whereabouts.BOTH, False, Recovery.CONFLICT),
        ("Running", Whereabouts.ABSENT, False, Recovery.LOST),
        ("PreparingTarget", Whereabouts.SOURCE, False, Recovery.RESTART),
        ("PreparingTarget", Whereabouts.SOURCE, True, Recovery.FAIL),
        ("Running", Whereabouts.SOURCE, False, Recovery.FAIL),
    ],
)
def test_recovery_follows_where_the_domain_is(
    phase: str, where: Whereabouts, abort: bool, expected: Recovery
) -> None:
    assert recover(phase=phase, where=where, abort_requested=abort) is expected


def test_the_migration_address_is_the_uri_host_unless_set() -> None:
    tls = LibvirtHost.model_validate({"name": "kvm1", "uri": "qemu+tls://10.0.0.11/system"})
    ssh = LibvirtHost.model_validate({"name": "kvm3", "uri": "qemu+ssh://root@kvm3.lan/system"})
    local = LibvirtHost.model_validate({"name": "local", "uri": "qemu:///system"})
    set_ = LibvirtHost.model_validate(
        {"name": "x", "uri": "qemu:///system", "migrationAddress": "10.0.0.5"}
    )
    assert migration_address(tls) == "10.0.0.11"
    assert migration_address(ssh) == "kvm3.lan"
    assert migration_address(local) is None
    assert migration_address(set_) == "10.0.0.5"
