"""An optional record of every counted libvirt call, for the work-floor benchmark.

When the environment variable ``CAPL_LIBVIRT_TRACE`` names a file at import time, every call
``capl.virt.counting.Counted`` counts is also appended to that file as one JSON line: the
host, the method (``virDomain.create``...), the object it was called on, its arguments, the
object it returned, whether it raised, the thread and the time. bench/floor.py replays these
calls with plain libvirt-python, without capl. Off (the default) it costs one global lookup
per call. Objects are named by what identifies them on their host: a domain, network or pool
by name, a volume by key, a stream by a number of its own; bytes by their length only (a
volume upload's data is not recorded; nothing a secret could be in reaches a libvirt call
other than the cloud-init ISO's bytes, which are not written). Each line also carries ``tc``:
the CPU seconds the record itself has cost so far (all threads), so that a benchmark can
tell its share of the process's CPU.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from typing import Any, BinaryIO

import libvirt
import orjson

from capl.ports.virt import HostId

__all__ = ["TRACE", "CallTrace"]


class CallTrace:
    """Appends one JSON line per libvirt call to a file (see the module docstring)."""

    def __init__(self, path: str) -> None:
        self._lock = threading.Lock()
        # unbuffered: one write per line, so that the file's size marks a phase at once
        self._file: BinaryIO = open(path, "ab", buffering=0)  # noqa: SIM115
        self._streams: dict[int, int] = {}
        self._stream_ids = itertools.count(1)
        self._cost = 0.0

    def ident(self, obj: Any) -> Any:
        """A JSON name for a libvirt object (None for a connection)."""
        obj = getattr(obj, "_target", obj)
        if isinstance(obj, libvirt.virDomain):
            return ["dom", obj.name()]
        if isinstance(obj, libvirt.virNetwork):
            return ["net", obj.name()]
        if isinstance(obj, libvirt.virStoragePool):
            return ["pool", obj.name()]
        if isinstance(obj, libvirt.virStorageVol):
            return ["vol", obj.key()]
        if isinstance(obj, libvirt.virStream):
            with self._lock:
                number = self._streams.setdefault(id(obj), next(self._stream_ids))
            return ["stream", number]
        if isinstance(obj, libvirt.virConnect):
            return None
        return self.encode(obj)

    def encode(self, value: Any) -> Any:
        if value is None or isinstance(value, str | int | float | bool):
            return value
        if isinstance(value, bytes | bytearray | memoryview):
            return {"bytes": len(value)}
        if isinstance(value, list | tuple):
            return [self.encode(v) for v in value]
        if isinstance(value, dict):
            return {str(k): self.encode(v) for k, v in value.items()}
        if callable(value) and not hasattr(value, "_target"):
            return {"callable": getattr(value, "__name__", "?")}
        return {"ref": self.ident(value)}

    def call(
        self,
        host: HostId,
        method: str,
        target: Any,
        fn: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        """``fn(*args, **kwargs)``, recorded."""
        started = time.monotonic()
        try:
            result = fn(*args, **kwargs)
        except BaseException:
            self.record(host, method, target, args, None, failed=True, started=started)
            raise
        self.record(host, method, target, args, result, failed=False, started=started)
        return result

    def record(
        self,
        host: HostId,
        method: str,
        target: Any,
        args: tuple[Any, ...],
        result: Any,
        *,
        failed: bool,
        started: float,
    ) -> None:
        cpu = time.thread_time()
        ended = time.monotonic()
        if isinstance(result, list) and len(result) > 8:
            shown: Any = {"list": len(result)}
        elif isinstance(result, str):
            shown = {"str": len(result)}
        else:
            shown = self.encode(result)
        line: dict[str, Any] = {
            "t": round(started, 6),
            "d": round(ended - started, 6),
            "th": threading.get_ident(),
            "host": str(host),
            "m": method,
            "on": self.ident(target),
            "a": self.encode(args),
            "r": shown,
        }
        if failed:
            line["err"] = True
        with self._lock:
            line["tc"] = round(self._cost, 6)
            self._file.write(orjson.dumps(line, option=orjson.OPT_APPEND_NEWLINE))
            self._cost += time.thread_time() - cpu


def _from_environment() -> CallTrace | None:
    path = os.environ.get("CAPL_LIBVIRT_TRACE")
    return CallTrace(path) if path else None


TRACE: CallTrace | None = _from_environment()
