"""Child process of test_remote_connection_drop.py (not a test module).

    python -m tests.chaos.connection_drop URI CREDENTIALS_DIR HOST_INTERFACE

Opens the host `URI` through capl's own libvirt adapter (`capl.virt.LibvirtHosts`, the
credentials are the files `ca.crt`, `tls.crt`, `tls.key` of CREDENTIALS_DIR), keeps
`POLLERS` concurrent `Host.info()` calls going (what several reconciles of one host do), cuts
the host's link (`ip link set HOST_INTERFACE down`), and expects every poller to get an error
within `DETECT_WITHIN` seconds; then restores the link and expects every poller to succeed
again within `RECOVER_WITHIN` seconds. Prints one JSON line with what happened and exits 0
when both held, 1 when not. It runs in its own process because what it looks for can kill
the process (a segfault inside libvirt shows up as exit status -11).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from capl.virt import LibvirtHosts

POLLERS = 4
DETECT_WITHIN = 35.0
RECOVER_WITHIN = 60.0


async def set_link(interface: str, state: str) -> None:
    await asyncio.to_thread(subprocess.run, ["ip", "link", "set", interface, state], check=True)


async def run(uri: str, credentials_dir: Path, interface: str) -> dict[str, object]:
    credentials = {
        name: (credentials_dir / name).read_bytes() for name in ("ca.crt", "tls.crt", "tls.key")
    }
    hosts = LibvirtHosts()
    host = hosts.get(uri=uri, credentials=credentials)
    await host.info()
    last: dict[int, tuple[float, str]] = {}
    stop = asyncio.Event()

    async def poll(index: int) -> None:
        while not stop.is_set():
            try:
                await host.info()
                outcome = "ok"
            except Exception as exc:  # any error is an answer here
                outcome = f"{type(exc).__name__}: {exc}"
            last[index] = (time.monotonic(), outcome)
            await asyncio.sleep(0.2)

    tasks = [asyncio.create_task(poll(i)) for i in range(POLLERS)]
    report: dict[str, object] = {"pollers": POLLERS}
    try:
        await asyncio.sleep(1.0)
        await set_link(interface, "down")
        down = time.monotonic()
        while True:
            failed = [i for i, (t, o) in last.items() if t > down and o != "ok"]
            if len(failed) == POLLERS:
                report["all_failed_after_s"] = round(time.monotonic() - down, 1)
                break
            if time.monotonic() - down > DETECT_WITHIN:
                report["stuck_pollers"] = sorted(set(range(POLLERS)) - set(failed))
                break
            await asyncio.sleep(0.2)
        await set_link(interface, "up")
        up = time.monotonic()
        while True:
            fine = [i for i, (t, o) in last.items() if t > up and o == "ok"]
            if len(fine) == POLLERS:
                report["recovered_after_s"] = round(time.monotonic() - up, 1)
                break
            if time.monotonic() - up > RECOVER_WITHIN:
                report["not_recovered"] = sorted(set(range(POLLERS)) - set(fine))
                break
            await asyncio.sleep(0.2)
        report["last"] = {i: o[:160] for i, (_t, o) in sorted(last.items())}
        return report
    finally:
        stop.set()
        for task in tasks:
            task.cancel()
        await asyncio.wait_for(hosts.close(), timeout=10)


def main(argv: list[str]) -> int:
    uri, credentials_dir, interface = argv
    report = asyncio.run(run(uri, Path(credentials_dir), interface))
    print(json.dumps(report), flush=True)
    return 0 if "all_failed_after_s" in report and "recovered_after_s" in report else 1


if __name__ == "__main__":
    # os._exit: worker threads stuck in libvirt calls would block the interpreter's exit
    os._exit(main(sys.argv[1:]))
