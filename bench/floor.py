"""The work floor: exactly the libvirt calls and API writes capl made, by a tight script.

The manager of a scale-out runs with ``CAPL_LIBVIRT_TRACE`` (``capl.virt.calltrace``): every
libvirt call it makes — on the object it was made on, with its arguments — is appended to a
trace file. After the run (and after capl's domains, volumes, pools and networks are removed
from the test driver), this module replays, with plain libvirt-python and no capl:

- untimed, the calls capl made before the machines were created (the LibvirtClusters'
  networks and pools), then the base volume the benchmark puts into each pool;
- timed, per machine, the machine's recorded libvirt calls in the order they started (volume
  creates and uploads, network updates, define, start, lease and agent lookups, and every
  lookup capl made on the way, failed ones included), with the API writes capl made for it
  (bench/machines_testdriver.py's replay: the spec patch with its resourceVersion
  precondition, the status patch, the Event) around them — the spec patch first, the status
  patch and the Event after the libvirt calls, as capl orders them — once by one loop and
  once by ``concurrency`` loops (capl's ``--concurrency``: its workers), each with a libvirt
  connection of its own.

Which machine a call belongs to is read from the call itself: a machine's name appears in
the name of its domain and volumes and in the XML of its network updates. A call naming no
machine (a pool or network lookup) belongs to the next call of the same thread that does
(one ``HostConnection.run`` operation runs on one thread, start to end), else to the
previous one of that thread within 0.2 s; the rest (the cluster health checks during the
run) is replayed in the timed part too, before the machines, by the first loop.

Objects a replayed call returns are kept by name (as the recorded call's result names them)
and used by the calls after it, as capl used them; an object capl held that the floor got no
call for (rare) is looked up, and those extra lookups are counted (``extra_lookups``).
Calls that failed in capl's run are expected to fail in the floor too (a volume looked up
before it is created); ``outcome_mismatches`` counts those whose outcome differed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import libvirt

__all__ = ["CallRecord", "Replayer", "Trace", "read_trace", "split_by_machine"]


@dataclass(frozen=True)
class CallRecord:
    t: float
    duration: float
    thread: int
    host: str
    method: str
    on: Any
    args: Any
    result: Any
    failed: bool
    trace_cpu: float

    @classmethod
    def parse(cls, line: Mapping[str, Any]) -> CallRecord:
        return cls(
            t=float(line["t"]),
            duration=float(line.get("d", 0.0)),
            thread=int(line["th"]),
            host=str(line["host"]),
            method=str(line["m"]),
            on=line.get("on"),
            args=line.get("a") or [],
            result=line.get("r"),
            failed=bool(line.get("err")),
            trace_cpu=float(line.get("tc", 0.0)),
        )


@dataclass
class Trace:
    calls: list[CallRecord]

    @property
    def trace_cpu_seconds(self) -> float:
        """CPU the recording itself cost the manager over these calls."""
        if len(self.calls) < 2:
            return 0.0
        return self.calls[-1].trace_cpu - self.calls[0].trace_cpu

    def by_method(self) -> dict[str, int]:
        counts: dict[str, int] = defaultdict(int)
        for call in self.calls:
            counts[call.method] += 1
        return dict(sorted(counts.items()))


def read_trace(path: Path, start: int = 0, end: int | None = None) -> Trace:
    """The calls recorded between two byte offsets of the trace file."""
    with path.open("rb") as f:
        f.seek(start)
        data = f.read() if end is None else f.read(max(0, end - start))
    data = data[: data.rfind(b"\n") + 1]
    return Trace([CallRecord.parse(json.loads(line)) for line in data.splitlines() if line.strip()])


def _strings(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)


_WORD = re.compile(r"[A-Za-z0-9]+")
"""A machine's name (bench/common.py's `machine_names`: letters and digits) as a word."""
GAP = 0.05
"""Seconds between two calls of one thread that still count as one operation."""


def _named(call: CallRecord) -> Iterable[str]:
    yield from _strings([call.on, call.args])
    if isinstance(call.result, dict) and "ref" in call.result:  # a lookup's result
        yield from _strings(call.result)


def split_by_machine(
    calls: Sequence[CallRecord], machines: Sequence[str]
) -> tuple[dict[str, list[CallRecord]], list[CallRecord]]:
    """Each machine's calls in recorded order, and the calls of no machine (module
    docstring: how a call is attributed)."""
    known = set(machines)
    # in the order the calls started (the trace has them in the order they ended)
    calls = sorted(calls, key=lambda call: call.t)
    owner: list[str | None] = []
    for call in calls:
        found = None
        for text in _named(call):
            found = next((w for w in _WORD.findall(text) if w in known), None)
            if found is not None:
                break
        owner.append(found)
    # a call naming no machine: the next call of its thread if that one follows at once and
    # is attributed, else the previous attributed one of the thread if it came just before
    by_thread: dict[int, list[int]] = defaultdict(list)
    for i, call in enumerate(calls):
        by_thread[call.thread].append(i)
    for indexes in by_thread.values():
        for pos in range(len(indexes) - 2, -1, -1):  # backwards: chains of lookups
            i, j = indexes[pos], indexes[pos + 1]
            if owner[i] is None and owner[j] is not None and _gap(calls[i], calls[j]) <= GAP:
                owner[i] = owner[j]
        for pos in range(1, len(indexes)):
            i, j = indexes[pos - 1], indexes[pos]
            if owner[j] is None and owner[i] is not None and _gap(calls[i], calls[j]) <= GAP:
                owner[j] = owner[i]
    per_machine: dict[str, list[CallRecord]] = {m: [] for m in machines}
    rest: list[CallRecord] = []
    for call, name in zip(calls, owner, strict=True):
        (per_machine[name] if name is not None else rest).append(call)
    return per_machine, rest


def _gap(first: CallRecord, second: CallRecord) -> float:
    return second.t - (first.t + first.duration)


@dataclass
class ReplayStats:
    calls: int = 0
    extra_lookups: int = 0
    outcome_mismatches: int = 0
    skipped: int = 0
    mismatched_methods: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    mismatch_errors: list[str] = field(default_factory=list)
    """The first few errors of calls that failed here but not in capl's run (diagnosis)."""

    def add(self, other: ReplayStats) -> None:
        self.calls += other.calls
        self.extra_lookups += other.extra_lookups
        self.outcome_mismatches += other.outcome_mismatches
        self.skipped += other.skipped
        for k, v in other.mismatched_methods.items():
            self.mismatched_methods[k] += v
        self.mismatch_errors.extend(other.mismatch_errors[: 5 - len(self.mismatch_errors)])

    def as_dict(self) -> dict[str, Any]:
        return {
            "libvirt_calls": self.calls,
            "extra_lookups": self.extra_lookups,
            "outcome_mismatches": self.outcome_mismatches,
            "outcome_mismatches_by_method": dict(sorted(self.mismatched_methods.items())),
            "mismatch_errors": list(self.mismatch_errors),
            "skipped": self.skipped,
        }


_LOOKUP = {
    "dom": "lookupByName",
    "net": "networkLookupByName",
    "pool": "storagePoolLookupByName",
    "vol": "storageVolLookupByKey",
}


class Session:
    """One libvirt connection and the objects its replayed calls returned."""

    def __init__(self, uri: str) -> None:
        self.conn = libvirt.open(uri)
        self.objects: dict[str, Any] = {}
        self.stats = ReplayStats()

    def close(self) -> None:
        with contextlib.suppress(libvirt.libvirtError):
            self.conn.close()

    def resolve(self, ident: Any) -> Any:
        if ident is None:
            return self.conn
        key = json.dumps(ident)
        obj = self.objects.get(key)
        if obj is None:
            kind, name = ident
            self.stats.extra_lookups += 1
            obj = getattr(self.conn, _LOOKUP[kind])(name)
            self.objects[key] = obj
        return obj

    def decode(self, value: Any) -> Any:
        if isinstance(value, list):
            return [self.decode(v) for v in value]
        if isinstance(value, dict):
            if "bytes" in value and len(value) == 1:
                return b"\0" * int(value["bytes"])
            if "ref" in value and len(value) == 1:
                return self.resolve(value["ref"])
            return {k: self.decode(v) for k, v in value.items()}
        return value

    def replay(self, call: CallRecord) -> None:
        attr = call.method.split(".", 1)[1]
        if _has_callable(call.args):
            self.stats.skipped += 1
            return
        error: Exception | None = None
        result: Any = None
        try:
            target = self.resolve(call.on)
            result = getattr(target, attr)(*self.decode(call.args))
        except (libvirt.libvirtError, KeyError) as exc:  # KeyError: an object capl got elsewhere
            error = exc
        failed = error is not None
        self.stats.calls += 1
        if failed != call.failed:
            self.stats.outcome_mismatches += 1
            self.stats.mismatched_methods[call.method] += 1
            if error is not None and len(self.stats.mismatch_errors) < 5:
                self.stats.mismatch_errors.append(f"{call.method}: {error}"[:300])
        if not failed:
            self._keep(call.result, result)

    def _keep(self, recorded: Any, result: Any) -> None:
        """Keep the objects a call returned under the names the recorded call gave them."""
        if isinstance(recorded, dict) and "ref" in recorded and recorded["ref"] is not None:
            self.objects[json.dumps(recorded["ref"])] = result
        elif isinstance(recorded, list) and isinstance(result, list | tuple):
            for r, obj in zip(recorded, result, strict=False):
                self._keep(r, obj)


def _has_callable(value: Any) -> bool:
    if isinstance(value, list):
        return any(_has_callable(v) for v in value)
    if isinstance(value, dict):
        return "callable" in value or any(_has_callable(v) for v in value.values())
    return False


def replay_setup(uri: str, calls: Sequence[CallRecord]) -> ReplayStats:
    """The calls before the machines (networks, pools), untimed."""
    session = Session(uri)
    try:
        for call in calls:
            session.replay(call)
        return session.stats
    finally:
        session.close()


class Replayer:
    """Per-thread sessions for the timed replay (one libvirt connection per loop)."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self._local = threading.local()
        self._sessions: list[Session] = []
        self._lock = threading.Lock()

    def session(self) -> Session:
        session = getattr(self._local, "session", None)
        if session is None:
            session = Session(self.uri)
            self._local.session = session
            with self._lock:
                self._sessions.append(session)
        return session

    def run(self, calls: Sequence[CallRecord]) -> None:
        session = self.session()
        for call in calls:
            session.replay(call)

    def stats(self) -> ReplayStats:
        total = ReplayStats()
        for s in self._sessions:
            total.add(s.stats)
        return total

    def close(self) -> None:
        for s in self._sessions:
            s.close()


async def run_floor(
    replayer: Replayer,
    machines: Sequence[str],
    libvirt_calls: Mapping[str, Sequence[CallRecord]],
    rest: Sequence[CallRecord],
    api: Any,
    *,
    loops: int,
) -> float:
    """Seconds for every machine's libvirt calls and API writes by `loops` loops (`api`:
    a per-machine async writer ``api.before(name)`` / ``api.after(name)``). libvirt calls run
    on `loops` threads of their own (libvirt-python blocks)."""
    from concurrent.futures import ThreadPoolExecutor

    loop_ = asyncio.get_running_loop()
    work = iter(machines)
    with ThreadPoolExecutor(max_workers=loops, thread_name_prefix="floor") as pool:
        # the connections are opened before the clock starts
        await asyncio.gather(
            *(loop_.run_in_executor(pool, _open_and_wait, replayer, loops) for _ in range(loops))
        )

        async def one_loop(first: bool) -> None:
            if first and rest:
                await loop_.run_in_executor(pool, replayer.run, rest)
            for name in work:
                await api.before(name)
                await loop_.run_in_executor(pool, replayer.run, libvirt_calls.get(name, ()))
                await api.after(name)

        started = time.perf_counter()
        await asyncio.gather(*(one_loop(i == 0) for i in range(loops)))
        return time.perf_counter() - started


def _open_and_wait(replayer: Replayer, n: int) -> None:
    """Open this thread's session; wait until `n` threads did (so every loop has one)."""
    replayer.session()
    deadline = time.monotonic() + 30
    while len(replayer._sessions) < n and time.monotonic() < deadline:
        time.sleep(0.01)
