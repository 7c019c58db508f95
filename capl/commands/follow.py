"""Following objects until something holds: what ``--wait`` of `capl maintenance start` and
`capl migrate` does.

``follow`` lists the objects of one resource (in one namespace or all; optionally only one
name, through a field selector), hands the current state to ``step``, then watches from the
list's resourceVersion and hands the new state to ``step`` after every change, until ``step``
returns something other than None. Nothing is polled: every change the API server makes is
seen in order, and a change made between the caller's write and the list is in the list.

- A watch the server ends (its timeout) or a dropped connection resumes from the last
  resourceVersion seen (events and bookmarks); 410 Gone re-lists, and objects missing from
  the new list count as deleted. Five connection failures in a row, or any other API error
  (forbidden, ...), end the wait with a one-line ``CliError``.
- The caller bounds the wait (``asyncio.timeout``) and says what it was waiting for when
  it passes.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from capl.commands.shared import api_failure

if TYPE_CHECKING:
    from capl.kube.client import KubeClient
    from capl.runtime.objects import Obj, ObjectKey
    from capl.runtime.resources import Resource

__all__ = ["follow", "format_bytes"]

T = TypeVar("T")
State = dict["ObjectKey", "Obj"]
_WATCH_SECONDS = 240
_FAILURES_IN_A_ROW = 5


def format_bytes(value: int | None) -> str:
    """1024-based sizes as libvirt reports them: "512 B", "1.5 KiB", "12.0 MiB", "2.0 GiB"."""
    if value is None:
        return "-"
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{value} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("not reached")


async def follow(
    client: KubeClient,
    resource: Resource,
    *,
    namespace: str | None,
    step: Callable[[State], T | None],
    name: str | None = None,
) -> T:
    """``step(state)`` after the list and after every change until it returns a value (see
    the module docstring); ``state`` maps the keys of the objects that exist to them."""
    from capl.runtime.errors import ApiError, Gone, TransportError
    from capl.runtime.objects import key_of, resource_version

    api = client.resource(resource)
    selector = f"metadata.name={name}" if name else None
    server = str(client.configuration.host)
    state: State = {}
    version, failures, need_list = "", 0, True
    while True:
        try:
            if need_list:
                listed = await api.list(namespace=namespace, field_selector=selector)
                state = {key_of(obj): obj for obj in listed.items}
                version, need_list = listed.resource_version, False
                result = step(state)
                if result is not None:
                    return result
            stream = api.watch(
                resource_version=version,
                namespace=namespace,
                field_selector=selector,
                timeout_seconds=_WATCH_SECONDS,
                inactivity_timeout=_WATCH_SECONDS + 60.0,
            )
            async with contextlib.aclosing(stream):
                async for event in stream:
                    failures = 0
                    version = resource_version(event.object) or version
                    if event.type == "BOOKMARK":
                        continue
                    if event.type == "DELETED":
                        state.pop(key_of(event.object), None)
                    else:
                        state[key_of(event.object)] = event.object
                    result = step(state)
                    if result is not None:
                        return result
        except Gone:
            need_list = True
        except TransportError as exc:
            failures += 1
            if failures >= _FAILURES_IN_A_ROW:
                raise api_failure(exc, server=server, what=f"watch {resource.plural}") from exc
            await asyncio.sleep(0.5 * 2**failures)  # backoff before reconnecting
        except ApiError as exc:
            raise api_failure(exc, server=server, what=f"watch {resource.plural}") from exc
