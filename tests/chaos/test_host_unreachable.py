"""A libvirt host unreachable for a while: its machines say so, the others carry on.

The cluster has two hosts: h1, the shared test driver (`test+unix:///default`), and h2, the
test driver of a private libvirtd inside a network namespace, reached over a veth pair with
TLS (`test+tls://10.a.b.2:16514/default`, credentials from a Secret; tests/chaos/netns.py).
8 machines go on each host (Machine failure domain). Then the test takes h2's link down:

- h2's machines report it: Ready turns False with a condition message naming h2's address,
  and a Warning event says the host is unreachable (time to detection measured);
- meanwhile h1 keeps working: 4 new machines there become Ready and 2 deleted ones go away
  (fully: audited on h1 while h2 is still down), although 12 machines — more than the
  manager has workers — are created on h2 and 1 of its machines is deleted, all of which
  must wait; the link stays down at least 25 s, past libvirt's keepalive window (5 s x 3),
  so the manager's established connection to h2 dies of it, and 2 more machines on h1 must
  still become Ready after that while h2's machines keep reporting the outage;
- the link comes back: everything converges (recovery time measured from link-up), and both
  hosts, listed directly (h2 through its UNIX socket, which the link does not carry), hold
  exactly the live machines and nothing else.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from capl.api import constants as c
from capl.runtime.objects import Obj
from capl.runtime.resources import LIBVIRT_MACHINE
from capl.testing.objects import condition_of
from tests.chaos.bed import ChaosBed, record
from tests.chaos.conftest import ChaosManager
from tests.chaos.netns import netns_libvirtd
from tests.fixtures.bed import Host

pytestmark = [pytest.mark.apiserver, pytest.mark.libvirtd]

PER_HOST = 8
H2_NEW = 12
"""More than the manager's workers (--concurrency=10): a reconcile stuck on the cut link must
not take a worker the other host's machines need."""
DETECT_WITHIN = 60.0
OUTAGE_MIN = 25.0
"""Longer than libvirt's keepalive window (interval 5 s x count 3 plus the tick)."""


def reports_unreachable(obj: Obj, address: str) -> bool:
    ready = condition_of(obj, c.ConditionType.READY)
    return ready.get("status") == "False" and address in str(ready.get("message") or "")


@pytest.mark.timeout(600)
async def test_unreachable_host_is_reported_others_unaffected_and_recovery(
    bed: ChaosBed,
    chaos_manager: ChaosManager,
    shared_test_driver: str,
) -> None:
    with netns_libvirtd() as remote:
        await bed.secret("h2-tls", remote.credentials)
        manager = await chaos_manager("capl-unreachable")
        try:
            cluster = await bed.create_cluster(
                "unreach",
                hosts=[
                    Host(name="h1", uri=shared_test_driver),
                    Host(
                        name="h2",
                        uri=remote.uri(),
                        direct_uri=remote.local_uri(),
                        credentials_secret="h2-tls",
                    ),
                ],
                adopt_network=True,  # several hosts: an adopted network (see create_cluster)
            )
            await bed.many(
                bed.create_machine(cluster, f"{h}-{i}", host=h)
                for h in ("h1", "h2")
                for i in range(PER_HOST)
            )
            await bed.wait_converged(within=120)
            assert not await bed.audit(cluster)
            on_h2 = [n for n, h in bed.live.items() if h == "h2"]

            remote.link_down()
            down_at = time.monotonic()
            try:
                await bed.many(
                    [bed.create_machine(cluster, f"h1-new-{i}", host="h1") for i in range(4)]
                    + [bed.create_machine(cluster, f"h2-new-{i}", host="h2") for i in range(H2_NEW)]
                    + [bed.delete_machine(n) for n in ("h1-0", "h1-1", "h2-0")]
                )
                h1_names = [n for n, h in bed.live.items() if h == "h1"] + ["h1-0", "h1-1"]
                h1_s, _ = await bed.wait_converged(within=60, names=h1_names)
                h1_problems = await bed.audit(
                    cluster, [m for m in await bed.list_objects(LIBVIRT_MACHINE)], hosts=["h1"]
                )
                # the h2 machines are not audited on h1, only the API view is: filter them
                h1_problems = [p for p in h1_problems if not p.startswith("API:")]
                assert not h1_problems, "\n".join(h1_problems)

                watched = [n for n in on_h2 if n != "h2-0"]
                deadline = time.monotonic() + DETECT_WITHIN
                objs: dict[str, Obj] = {}
                while True:
                    objs = {
                        o["metadata"]["name"]: o for o in await bed.list_objects(LIBVIRT_MACHINE)
                    }
                    silent = [n for n in watched if not reports_unreachable(objs[n], remote.ns_ip)]
                    if not silent:
                        break
                    if time.monotonic() > deadline:
                        raise AssertionError(
                            f"h2's machines do not report the host unreachable after "
                            f"{DETECT_WITHIN:.0f} s: "
                            + "; ".join(
                                f"{n}: {condition_of(objs[n], c.ConditionType.READY)}"
                                for n in silent[:5]
                            )
                        )
                    await asyncio.sleep(0.5)
                detected = time.monotonic() - down_at
                sample = condition_of(objs[watched[0]], c.ConditionType.READY)
                assert "h2-0" in objs  # its deletion waits for the host
                # keep the link down past libvirt's keepalive window (the manager's open
                # connection to h2 dies of it), then h1 must still work
                await asyncio.sleep(max(0.0, OUTAGE_MIN - (time.monotonic() - down_at)))
                await bed.many(
                    bed.create_machine(cluster, f"h1-late-{i}", host="h1") for i in range(2)
                )
                late_s, _ = await bed.wait_converged(within=60, names=["h1-late-0", "h1-late-1"])
                objs = {o["metadata"]["name"]: o for o in await bed.list_objects(LIBVIRT_MACHINE)}
                flapped = [n for n in watched if not reports_unreachable(objs[n], remote.ns_ip)]
                assert not flapped, f"h2 machines no longer report the outage: {flapped}"
                outage = time.monotonic() - down_at
            finally:
                remote.link_up()
            up_at = time.monotonic()
            _, machines = await bed.wait_converged(within=180)
            recovery = time.monotonic() - up_at
            problems = await bed.audit(cluster, machines)
            assert not problems, "after recovery:\n  " + "\n  ".join(problems[:40])
            events = await bed.events(watched[0])
            assert any(t == "Warning" and remote.ns_ip in m for t, _r, m in events), events
            record(
                f"host unreachable (netns link down {outage:.1f} s): h2's machines reported it "
                f"after {detected:.1f} s ({sample.get('reason')}: "
                f"{str(sample.get('message'))[:100]}); h1 converged meanwhile in {h1_s:.1f} s "
                f"and {late_s:.1f} s late in the outage; "
                f"recovery {recovery:.1f} s after link-up"
            )
            await bed.delete_cluster(cluster)
        finally:
            await manager.stop()
