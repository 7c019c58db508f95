"""The libvirt call recording (capl/virt/calltrace.py) and the work floor's replay of it
(bench/floor.py), on libvirt's in-process test driver."""

from __future__ import annotations

import json
from pathlib import Path

import libvirt
import pytest

from bench.floor import CallRecord, Session, read_trace, split_by_machine
from capl.ports.virt import HostId
from capl.virt.calltrace import CallTrace

HOST = HostId("test:///default")


def _quiet(_ctx: object, _err: object) -> None:
    pass


libvirt.registerErrorHandler(_quiet, None)


def test_calls_are_recorded_with_objects_by_name_and_failures(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    trace = CallTrace(str(path))
    conn = libvirt.open("test:///default")
    try:
        dom = trace.call(HOST, "virConnect.lookupByName", conn, conn.lookupByName, ("test",), {})
        trace.call(HOST, "virDomain.state", dom, dom.state, (0,), {})
        with pytest.raises(libvirt.libvirtError):
            trace.call(HOST, "virConnect.lookupByName", conn, conn.lookupByName, ("nope",), {})
        trace.call(HOST, "virConnect.echo", conn, lambda data: data, (b"secret",), {})
    finally:
        conn.close()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["m"] for line in lines] == [
        "virConnect.lookupByName",
        "virDomain.state",
        "virConnect.lookupByName",
        "virConnect.echo",
    ]
    assert lines[0]["on"] is None
    assert lines[0]["r"] == {"ref": ["dom", "test"]}
    assert lines[1]["on"] == ["dom", "test"]
    assert lines[2].get("err") is True
    assert "err" not in lines[1]
    assert lines[3]["a"] == [{"bytes": 6}]  # bytes by their length only
    assert "secret" not in path.read_text()
    assert all(line["tc"] >= 0 for line in lines)


def _call(t: float, thread: int, method: str, on: object, *args: object) -> CallRecord:
    return CallRecord(t, 0.001, thread, "h", method, on, list(args), None, False, 0.0)


def test_calls_go_to_the_machine_they_name_or_the_next_call_of_their_thread() -> None:
    calls = [
        _call(0.0, 1, "virConnect.storagePoolLookupByName", None, "pool"),
        _call(0.002, 1, "virStoragePool.createXML", ["pool", "pool"], "<name>ns-m0001-root</name>"),
        _call(0.003, 2, "virConnect.networkLookupByName", None, "net"),
        _call(0.004, 2, "virNetwork.update", ["net", "net"], 3, 4, -1, "<host name='m0002'/>"),
        _call(0.005, 2, "virNetwork.XMLDesc", ["net", "net"], 0),  # right after: m0002's
        _call(5.0, 3, "virStoragePool.listVolumes", ["pool", "pool"]),  # a health check
        _call(5.1, 1, "virConnect.lookupByName", None, "capl-ns-m00010-x"),  # not m0001
    ]
    per_machine, rest = split_by_machine(calls, ["m0001", "m0002", "m00010"])
    assert [c.method for c in per_machine["m0001"]] == [
        "virConnect.storagePoolLookupByName",
        "virStoragePool.createXML",
    ]
    assert [c.method for c in per_machine["m0002"]] == [
        "virConnect.networkLookupByName",
        "virNetwork.update",
        "virNetwork.XMLDesc",
    ]
    assert [c.method for c in per_machine["m00010"]] == ["virConnect.lookupByName"]
    assert [c.method for c in rest] == ["virStoragePool.listVolumes"]


def test_a_recorded_trace_replays_on_a_fresh_connection(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    trace = CallTrace(str(path))
    xml = (
        "<domain type='test'><name>floor-m0001</name><memory>1024</memory>"
        "<os><type>hvm</type></os></domain>"
    )
    conn = libvirt.open("test:///default")
    try:
        with pytest.raises(libvirt.libvirtError):
            trace.call(
                HOST, "virConnect.lookupByName", conn, conn.lookupByName, ("floor-m0001",), {}
            )
        dom = trace.call(HOST, "virConnect.defineXML", conn, conn.defineXML, (xml,), {})
        trace.call(HOST, "virDomain.create", dom, dom.create, (), {})
        dom.destroy()  # the test driver's state is the process's: start the replay afresh
        dom.undefine()
    finally:
        conn.close()
    recorded = read_trace(path)
    assert len(recorded.calls) == 3
    session = Session("test:///default")
    try:
        for call in recorded.calls:
            session.replay(call)
        assert session.stats.calls == 3
        assert session.stats.outcome_mismatches == 0
        assert session.stats.extra_lookups == 0
        assert session.conn.lookupByName("floor-m0001").isActive() == 1
    finally:
        session.close()
