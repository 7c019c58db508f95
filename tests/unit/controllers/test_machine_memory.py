"""What the machine controller remembers per key (capl.controllers.machine.memory): one
record, forgotten in one place, except the orphans the sweep confirmed meanwhile."""

from __future__ import annotations

from dataclasses import replace
from typing import cast

from capl.api.machine import LibvirtMachineSpec
from capl.controllers.machine.memory import Memory, OwnStarts
from capl.controllers.machine.target import Identity, Leftover, Target
from capl.ports.virt import Host
from capl.runtime.objects import ObjectKey

KEY = ObjectKey("ns", "m")


def leftover(uid: str, *, swept: bool) -> Leftover:
    target = Target(
        name="h1",
        uri="test:///default",
        host=cast(Host, object()),
        pool="pool",
        network="net",
        dns_domain=None,
        bridge_mode=False,
        credentials_secret=None,
    )
    ident = Identity.of(namespace="ns", name="m", uid=uid, cluster="c")
    return Leftover(ident=ident, domain_uuid=f"d-{uid}", target=target, spec_json=None, swept=swept)


def test_touch_unsettles_and_counts() -> None:
    memory = Memory(orphan_grace=0)
    record = memory.of(KEY)
    record.settled = ("7", 1.0)
    memory.touch(KEY)
    assert record.settled is None
    assert record.epoch == 1
    assert memory.of(KEY) is record


def test_forget_drops_the_record_and_our_last_write_but_keeps_confirmed_orphans() -> None:
    memory = Memory(orphan_grace=0)
    record = memory.of(KEY)
    record.failures, record.api_failures, record.shutdown_requested = 3, 2, True
    record.nodes_done.add("libvirt:///d-u1")
    record.made = leftover("u1", swept=False)
    memory.writes.wrote(KEY, before="1", answer={"metadata": {"resourceVersion": "2"}})
    assert memory.has_leftovers(KEY)
    memory.forget(KEY)
    assert memory.get(KEY) is None
    assert not memory.has_leftovers(KEY)
    assert KEY not in memory.writes
    # an orphan the sweep confirmed belongs to no live object: the next reconcile removes it
    memory.of(KEY).orphans["d-u0"] = leftover("u0", swept=True)
    memory.of(KEY).failures = 5
    memory.forget(KEY)
    kept = memory.get(KEY)
    assert kept is not None
    assert list(kept.orphans) == ["d-u0"]
    assert kept.failures == 0
    assert memory.has_leftovers(KEY)


def test_own_starts_are_an_echo_once_and_only_in_time() -> None:
    starts = OwnStarts()
    starts.add("u1", now=100.0)
    assert starts.echo("u1", now=110.0)
    assert not starts.echo("u1", now=110.0)  # seen: the next STARTED is not ours
    starts.add("u2", now=100.0)
    assert not starts.echo("u2", now=131.0)  # too late to be our own start
    starts.add("u3", now=0.0)
    starts.discard("u3")
    assert not starts.echo("u3", now=1.0)


def test_a_leftover_keeps_its_spec_as_json_and_gives_it_back_equal() -> None:
    spec = LibvirtMachineSpec.model_validate(
        {
            "cpus": 2,
            "memoryMiB": 2048,
            "image": {"volume": "base.qcow2", "format": "qcow2"},
            "networkInterfaces": [
                {"network": "default", "mac": "52:54:00:aa:bb:01", "ip": "10.0.0.5"},
                {"bridge": "br0", "mac": "52:54:00:aa:bb:02"},
            ],
            "extraDisks": [{"name": "data", "sizeGiB": 10}],
            "providerID": "libvirt:///00000000-0000-0000-0000-000000000001",
        }
    )
    made = replace(leftover("u1", swept=False), spec_json=Leftover.of_spec(spec))
    assert made.spec == spec
    assert made.spec is not None
    assert made.spec.network_interfaces is not None
    assert [n.mac for n in made.spec.network_interfaces] == [
        "52:54:00:aa:bb:01",
        "52:54:00:aa:bb:02",
    ]
    assert made.spec is not spec
    assert made.spec_json is not None
    assert len(made.spec_json) < 600
    assert leftover("u2", swept=True).spec is None
