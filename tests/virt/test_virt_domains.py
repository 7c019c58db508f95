"""Domains through the libvirt adapter on the test driver: lifecycle, identity, ownership."""

from __future__ import annotations

import secrets
import uuid

import libvirt
import pytest

from capl.ports.errors import AlreadyExists, DomainNotFound, ForeignDomainError, InvalidSpec
from capl.ports.naming import machine_mac, machine_names
from capl.ports.virt import (
    AddressSource,
    DiskSpec,
    DomainNic,
    DomainOwner,
    DomainSpec,
    DomainState,
    FwCfgEntry,
    NicSpec,
    StopResult,
)
from capl.virt import LibvirtHost, LibvirtHosts

URI = "test:///default"


def _owner(name: str | None = None, *, uid: str | None = None, cluster: str = "c1") -> DomainOwner:
    return DomainOwner(
        cluster=cluster,
        namespace="ns",
        name=name or "m-" + secrets.token_hex(3),
        uid=uid or str(uuid.uuid4()),
    )


def _spec(owner: DomainOwner, **changes: object) -> DomainSpec:
    names = machine_names(namespace=owner.namespace, name=owner.name)
    values: dict[str, object] = {
        "name": names.domain,
        "uuid": str(uuid.uuid4()),
        "owner": owner,
        "vcpus": 1,
        "memory_mib": 128,
        "domain_type": "test",
        "disks": (DiskSpec(path=f"/pool/{names.root_volume}"),),
        "nics": (
            NicSpec(
                mac=machine_mac(cluster=owner.cluster, namespace=owner.namespace, name=owner.name),
                network="default",
            ),
        ),
        "fw_cfg": (
            FwCfgEntry(name="opt/com.coreos/config", file=f"/pool/{names.ignition_volume}"),
        ),
        "console_log": f"/pool/{names.console_log}",
    }
    values.update(changes)
    return DomainSpec(**values)  # type: ignore[arg-type]


async def test_define_start_stop_undefine(host: LibvirtHost) -> None:
    owner = _owner()
    spec = _spec(owner)
    defined = await host.define_domain(spec)
    assert (defined.uuid, defined.state, defined.autostart) == (
        spec.uuid,
        DomainState.SHUTOFF,
        True,
    )
    assert defined.owner == owner
    again = await host.define_domain(spec)  # idempotent
    assert again.uuid == spec.uuid
    running = await host.start_domain(spec.uuid, owner=owner)
    assert running.state is DomainState.RUNNING
    assert (await host.start_domain(spec.uuid, owner=owner)).state is DomainState.RUNNING
    got = await host.get_domain(spec.uuid)
    assert got is not None
    assert got.reason == "booted"
    assert got.owner == owner
    assert await host.stop_domain(spec.uuid, owner=owner, grace_period=5) is StopResult.SHUTDOWN
    assert (
        await host.stop_domain(spec.uuid, owner=owner, grace_period=5) is StopResult.ALREADY_STOPPED
    )
    assert await host.undefine_domain(spec.uuid, owner=owner)
    assert await host.get_domain(spec.uuid) is None
    assert not await host.undefine_domain(spec.uuid, owner=owner)  # not found = success
    assert not await host.destroy_domain(spec.uuid, owner=owner)


async def test_a_domain_just_defined_is_defined_and_started_without_reading_it_again(
    hosts: LibvirtHosts, host: LibvirtHost
) -> None:
    """The create path: neither UUID nor name exists (absent), then start with what define
    returned: 4 calls (define: defineXML, setAutostart; start: lookup, create) and the
    answer is what a fresh read says."""
    owner = _owner()
    spec = _spec(owner)
    assert await host.get_domain(spec.uuid) is None  # (connects)
    before = hosts.calls.snapshot()[host.host_id]
    defined = await host.define_domain(spec, absent=True)
    running = await host.start_domain(spec.uuid, owner=owner, defined=defined)
    after = hosts.calls.snapshot()[host.host_id]
    assert {k: n - before.get(k, 0) for k, n in after.items() if n != before.get(k, 0)} == {
        "virConnect.defineXML": 1,
        "virDomain.setAutostart": 1,
        "virConnect.lookupByUUIDString": 1,
        "virDomain.create": 1,
    }
    assert await host.get_domain(spec.uuid) == running
    assert running.state is DomainState.RUNNING
    # started by someone else in between: the domain is read
    other = _spec(_owner())
    defined = await host.define_domain(other, absent=True)
    await host.start_domain(other.uuid, owner=other.owner)
    again = await host.start_domain(other.uuid, owner=other.owner, defined=defined)
    assert again == await host.get_domain(other.uuid)
    # a definition of another domain is refused
    with pytest.raises(ValueError, match="not that of"):
        await host.start_domain(spec.uuid, owner=owner, defined=defined)
    # absent, and yet the name exists under another UUID: libvirt's define refuses
    with pytest.raises(AlreadyExists):
        await host.define_domain(_spec(owner, uuid=str(uuid.uuid4())), absent=True)


async def test_create_domain_defines_and_starts_in_one_operation(
    hosts: LibvirtHosts, host: LibvirtHost
) -> None:
    """Host.create_domain, the create path: defineXML, setAutostart, create and the lease
    query (no agent runs in a domain just started), all through the object define returned,
    no look-up by UUID; `on_defined` runs between the definition and the start; the answer
    is what a fresh read of the lease says. Not absent (the domain may exist): define's
    checks and a start of what is there."""
    owner = _owner()
    spec = _spec(owner)
    assert await host.get_domain(spec.uuid) is None  # (connects)
    seen: list[DomainState | None] = []

    def between() -> None:  # on the worker thread: read through a connection of its own
        conn = libvirt.open(URI)
        try:
            code, _ = conn.lookupByUUIDString(spec.uuid).state()
            seen.append(DomainState.SHUTOFF if code == libvirt.VIR_DOMAIN_SHUTOFF else None)
        finally:
            conn.close()

    before = hosts.calls.snapshot()[host.host_id]
    running, observed = await host.create_domain(spec, absent=True, on_defined=between)
    after = hosts.calls.snapshot()[host.host_id]
    assert {k: n - before.get(k, 0) for k, n in after.items() if n != before.get(k, 0)} == {
        "virConnect.defineXML": 1,
        "virDomain.setAutostart": 1,
        "virDomain.create": 1,
        "virDomain.interfaceAddresses": 1,  # the lease: no guest agent runs yet
    }
    assert seen == [DomainState.SHUTOFF]
    leased = [a for a in await host.domain_addresses(spec.uuid) if a.source is AddressSource.LEASE]
    assert observed == leased
    assert observed
    assert running.state is DomainState.RUNNING
    assert await host.get_domain(spec.uuid) == running
    # not absent: an existing domain of ours is taken as it is (running: no start)
    assert await host.create_domain(spec) == (running, await host.domain_addresses(spec.uuid))
    # a foreign domain under the name is refused before anything changes
    foreign = _spec(_owner(), name=spec.name, uuid=str(uuid.uuid4()))
    with pytest.raises(ForeignDomainError):
        await host.create_domain(foreign)
    # absent, and yet the name exists under another UUID: libvirt's define refuses
    with pytest.raises(AlreadyExists):
        await host.create_domain(_spec(owner, uuid=str(uuid.uuid4())), absent=True)
    assert await host.get_domain(spec.uuid) == running


async def test_undefine_a_running_domain_destroys_it_first(host: LibvirtHost) -> None:
    owner = _owner()
    spec = _spec(owner)
    await host.define_domain(spec)
    await host.start_domain(spec.uuid, owner=owner)
    assert await host.destroy_domain(spec.uuid, owner=owner)
    await host.start_domain(spec.uuid, owner=owner)
    assert await host.undefine_domain(spec.uuid, owner=owner)  # flags fall back on the test driver
    assert await host.get_domain(spec.uuid) is None


async def test_foreign_domain_is_never_touched(host: LibvirtHost) -> None:
    conn = libvirt.open(URI)
    try:
        name = "capl-test-foreign-" + secrets.token_hex(3)
        foreign = conn.defineXML(
            f"<domain type='test'><name>{name}</name><memory unit='MiB'>64</memory>"
            "<os><type arch='x86_64'>hvm</type></os></domain>"
        )
        foreign.create()
        foreign_uuid = foreign.UUIDString()
        owner = _owner()
        for call in (
            host.start_domain(foreign_uuid, owner=owner),
            host.destroy_domain(foreign_uuid, owner=owner),
            host.undefine_domain(foreign_uuid, owner=owner),
            host.request_shutdown(foreign_uuid, owner=owner),
            host.stop_domain(foreign_uuid, owner=owner, grace_period=0),
            host.retag_domain(foreign_uuid, owner=owner),
        ):
            with pytest.raises(ForeignDomainError) as info:
                await call
            assert info.value.reason == "ForeignDomain"
            assert name in str(info.value)
        # a spec that reuses the foreign domain's name: refused, foreign domain intact
        with pytest.raises(ForeignDomainError):
            await host.define_domain(_spec(owner, name=name))
        assert foreign.isActive()
        assert foreign.UUIDString() == foreign_uuid
        assert (await host.get_domain(foreign_uuid)).owner is None  # type: ignore[union-attr]
    finally:
        foreign.destroy()
        foreign.undefine()
        conn.close()


async def test_another_machines_domain_is_never_touched(host: LibvirtHost) -> None:
    owner = _owner()
    spec = _spec(owner)
    await host.define_domain(spec)
    await host.start_domain(spec.uuid, owner=owner)
    successor = DomainOwner(
        cluster=owner.cluster, namespace=owner.namespace, name=owner.name, uid="another-uid"
    )
    with pytest.raises(ForeignDomainError):
        await host.destroy_domain(spec.uuid, owner=successor)
    with pytest.raises(ForeignDomainError):
        await host.define_domain(_spec(successor, name=spec.name))  # same name, other UID
    other_cluster = _owner(owner.name, uid=owner.uid, cluster="other")
    with pytest.raises(ForeignDomainError):
        await host.undefine_domain(spec.uuid, owner=other_cluster)
    info = await host.get_domain(spec.uuid)
    assert info is not None
    assert info.state is DomainState.RUNNING
    assert await host.undefine_domain(spec.uuid, owner=owner)


async def test_stale_uuid_for_the_same_machine_is_reported(host: LibvirtHost) -> None:
    owner = _owner()
    first = _spec(owner)
    await host.define_domain(first)
    with pytest.raises(AlreadyExists, match=first.uuid):
        await host.define_domain(_spec(owner, uuid=str(uuid.uuid4())))
    assert await host.undefine_domain(first.uuid, owner=owner)


async def test_retag_after_move_keeps_the_domain(host: LibvirtHost) -> None:
    owner = _owner()
    spec = _spec(owner)
    await host.define_domain(spec)
    await host.start_domain(spec.uuid, owner=owner)
    moved = DomainOwner(
        cluster=owner.cluster, namespace=owner.namespace, name=owner.name, uid="new"
    )
    info = await host.retag_domain(spec.uuid, owner=moved)
    assert info.owner == moved
    assert (await host.get_domain(spec.uuid)).owner == moved  # type: ignore[union-attr]
    with pytest.raises(ForeignDomainError):
        await host.destroy_domain(spec.uuid, owner=owner)  # the old UID no longer matches
    assert await host.undefine_domain(spec.uuid, owner=moved)


async def test_list_domains_by_cluster(host: LibvirtHost) -> None:
    cluster = "list-" + secrets.token_hex(3)
    owners = [_owner(cluster=cluster) for _ in range(3)]
    specs = [_spec(o) for o in owners]
    for spec in specs:
        await host.define_domain(spec)
    stray = _spec(_owner(cluster="elsewhere-" + secrets.token_hex(3)))
    await host.define_domain(stray)
    listed = await host.list_domains(cluster=cluster)
    assert sorted(d.uuid for d in listed) == sorted(s.uuid for s in specs)
    assert stray.uuid in {d.uuid for d in await host.list_domains()}
    # the orphan sweep leaves out the domains it knows (their tags are not read)
    known = {specs[0].uuid.lower(), stray.uuid.lower()}
    rest = await host.list_domains(skip_uuids=known)
    assert {d.uuid for d in rest} >= {s.uuid for s in specs[1:]}
    assert not {d.uuid.lower() for d in rest} & known
    for spec in [*specs, stray]:
        await host.undefine_domain(spec.uuid, owner=spec.owner)


async def test_missing_domain_errors(host: LibvirtHost) -> None:
    missing = str(uuid.uuid4())
    owner = _owner()
    with pytest.raises(DomainNotFound) as info:
        await host.start_domain(missing, owner=owner)
    assert info.value.reason == "DomainNotFound"
    with pytest.raises(DomainNotFound):
        await host.domain_addresses(missing)
    with pytest.raises(InvalidSpec, match="not a UUID"):
        await host.define_domain(_spec(owner, uuid="not-a-uuid"))


async def test_addresses_of_a_running_domain(host: LibvirtHost) -> None:
    owner = _owner()
    spec = _spec(owner)
    await host.define_domain(spec)
    assert await host.domain_addresses(spec.uuid) == []  # not running
    await host.start_domain(spec.uuid, owner=owner)
    addresses = await host.domain_addresses(spec.uuid)
    # the test driver synthesizes one address for both sources
    assert {a.source.value for a in addresses} == {"lease", "agent"}
    assert all(a.ip and a.mac for a in addresses)
    await host.undefine_domain(spec.uuid, owner=owner)


async def test_calls_are_counted_per_method(hosts: LibvirtHosts, host: LibvirtHost) -> None:
    owner = _owner()
    spec = _spec(owner)
    await host.get_domain(spec.uuid)  # connects
    assert hosts.calls.snapshot()[host.host_id]["virConnect.open"] == 1
    before = hosts.calls.total(host.host_id)
    await host.define_domain(spec)
    await host.start_domain(spec.uuid, owner=owner)
    counts = hosts.calls.snapshot()[host.host_id]
    assert counts["virConnect.defineXML"] >= 1
    assert counts["virDomain.create"] >= 1
    assert "virDomain.UUIDString" not in counts  # local, not a libvirt call
    assert hosts.calls.total(host.host_id) - before <= 11
    await host.undefine_domain(spec.uuid, owner=owner)


async def test_domain_nics_are_read_from_the_definition(host: LibvirtHost) -> None:
    owner = _owner()
    fallback = machine_mac(
        cluster=owner.cluster, namespace=owner.namespace, name=owner.name, attempt=2
    )
    spec = _spec(
        owner,
        nics=(
            NicSpec(mac=fallback.upper(), network="default"),
            NicSpec(mac="52:54:00:aa:bb:cc", bridge="br-test"),
        ),
    )
    await host.define_domain(spec)
    try:
        nics = await host.domain_nics(spec.uuid)
        assert nics == [
            DomainNic(mac=fallback.lower(), network="default"),
            DomainNic(mac="52:54:00:aa:bb:cc", bridge="br-test"),
        ]
    finally:
        await host.undefine_domain(spec.uuid, owner=owner)
    with pytest.raises(DomainNotFound):
        await host.domain_nics(spec.uuid)
