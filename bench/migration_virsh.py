"""The floor of bench/migration.py: the same live migration done by hand with virsh.

A guest of the same shape as capl's machine — the same image (an overlay of the same base
volume in the same pool), 1 vCPU, 256 MiB, TCG, the same devices (the domain XML comes from
the builders capl's machine controller uses: virtio disk, NoCloud ISO on a virtio-scsi cdrom,
a NIC bridged to the bed's LAN, pty serial logged to a file in the pool) — is defined and
booted on the source by virsh (untimed), until the LAN's dnsmasq leases its MAC. Its owner
tag names a namespace no manager watches, so no capl sweep touches it.

One move (`VirshFloor.move`), timed from the first command to the end of the last:

    preparation  one virsh process on the destination: `vol-create-as` of the root overlay
                 (same name, size, backing volume and format as on the source) and of the
                 ISO, `vol-upload` of the ISO — what `--copy-storage-inc` needs there (libvirt
                 does not pre-create storage for an incremental copy; the read-only cdrom is
                 not copied at all)
    migrate      `virsh -c <source> migrate --live --persistent --undefinesource
                 --copy-storage-inc <domain> <destination>`

Then, untimed: `virsh domjobinfo --completed` on the destination (libvirt's job time and the
guest's downtime) and the clean-up of the source (`vol-delete` of the two volumes, the
serial log removed in the host's namespace), timed on its own (`cleanup_s`), so that the next
move back finds the destination as capl's does: without the machine's volumes.

Both hosts are reached as capl reaches them: ``qemu+tls://<lan ip>/system`` with the bed's
client certificate (`MultihostBed.client_uri`: libvirt's ``pkipath`` parameter).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import secrets
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from capl.api.machine import LibvirtMachineSpec
from capl.controllers.machine.plan import NicPlan, build_domain_spec
from capl.ports.bootstrap import build_nocloud_iso
from capl.ports.naming import MachineNames
from capl.ports.virt import DomainOwner
from capl.testbed.multihost import MultihostBed
from capl.testing.objects import random_mac
from capl.virt.domainxml import build_domain_xml

NAMESPACE = "bench-virsh-floor"
"""The owner tag's namespace: watched by no manager (the capl side runs in another)."""
_MS = re.compile(r"^\s*([A-Za-z /]+?):\s+(\d+)\s+ms\s*$", re.MULTILINE)
_DATA = re.compile(r"^\s*Data processed:\s+([\d.]+)\s+(B|KiB|MiB|GiB)\s*$", re.MULTILINE)
_UNITS = {"B": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3}


class VirshError(RuntimeError):
    pass


async def virsh(uri: str, commands: str, *, within: float = 300.0) -> str:
    """``virsh -q -c <uri> '<commands>'`` (several commands separated by ``;`` share one
    connection); its stdout."""
    proc = await asyncio.create_subprocess_exec(
        "virsh", "-q", "-c", uri, commands,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        out, err = await asyncio.wait_for(proc.communicate(), within)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        what = commands.split()[0]
        raise VirshError(f"virsh {what} on {uri}: no answer in {within:g} s") from None
    if proc.returncode != 0:
        raise VirshError(
            f"virsh -c {uri} {commands!r} exited {proc.returncode}: {err.decode().strip()}"
        )
    return out.decode()


def job_info_ms(text: str) -> dict[str, int]:
    """``virsh domjobinfo`` output -> {"time_elapsed": ms, "total_downtime": ms, ...}."""
    return {
        m.group(1).strip().lower().replace(" ", "_"): int(m.group(2)) for m in _MS.finditer(text)
    }


def data_processed_bytes(text: str) -> int | None:
    """``Data processed: 99.123 MiB`` of ``virsh domjobinfo`` in bytes."""
    found = _DATA.search(text)
    return None if found is None else round(float(found.group(1)) * _UNITS[found.group(2)])


def _outside(call_s: float, job_ms: int | None) -> float | None:
    """Seconds of the migrate call outside libvirt's job (connections, Begin, Prepare with
    the incoming QEMU, Finish, Confirm)."""
    return None if job_ms is None else round(call_s - job_ms / 1000, 3)


@dataclass
class VirshFloor:
    """One hand-made guest moved between two hosts of the bed with virsh."""

    bed: MultihostBed
    pool: str
    pool_path: str
    base_path: str
    capacity_bytes: int
    bridge: str
    token: str = field(default_factory=lambda: secrets.token_hex(3))
    mac: str = field(default_factory=random_mac)
    domain_uuid: str = field(default_factory=lambda: str(uuid.uuid4()))
    host: str = ""
    """Where the guest runs now ("" before `boot`)."""
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="capl-virsh-")))

    @property
    def name(self) -> str:
        return f"bench-virsh-{self.token}"

    @property
    def root(self) -> str:
        return f"{self.name}-root.qcow2"

    @property
    def iso(self) -> str:
        return f"{self.name}-cidata.iso"

    @property
    def console_log(self) -> str:
        return f"{self.pool_path}/{self.name}-console.log"

    @property
    def iso_file(self) -> Path:
        return self.workdir / self.iso

    def uri(self, host: str) -> str:
        return self.bed.client_uri(host)

    def _prepare_commands(self) -> str:
        size = self.iso_file.stat().st_size
        return (
            f"vol-create-as {self.pool} {self.root} {self.capacity_bytes} --format qcow2 "
            f"--backing-vol {self.base_path} --backing-vol-format qcow2; "
            f"vol-create-as {self.pool} {self.iso} {size} --format raw; "
            f"vol-upload --pool {self.pool} {self.iso} {self.iso_file}"
        )

    def domain_xml(self, spec: LibvirtMachineSpec) -> str:
        names = MachineNames(
            prefix=self.name,
            domain=self.name,
            root_volume=self.root,
            ignition_volume=f"{self.name}-ignition.ign",
            cidata_volume=self.iso,
            console_log=f"{self.name}-console.log",
        )
        owner = DomainOwner(cluster="virsh", namespace=NAMESPACE, name=self.name, uid=self.name)
        nic = NicPlan(
            index=0, network=None, bridge=self.bridge, cluster_network=True, mac=None, ip=None
        )
        return build_domain_xml(
            build_domain_spec(
                names=names,
                uuid=self.domain_uuid,
                owner=owner,
                spec=spec,
                domain_type=spec.domain_type,
                arch="x86_64",
                root_path=f"{self.pool_path}/{self.root}",
                extra_paths=(),
                ignition_path=None,
                cidata_path=f"{self.pool_path}/{self.iso}",
                nics=((nic, self.mac),),
                console_log=self.console_log,
            )
        )

    async def boot(self, host: str, spec: LibvirtMachineSpec, *, within: float) -> float:
        """Define and start the guest on `host` (untimed set-up); waits until the LAN's
        dnsmasq leased its MAC. Returns the seconds that took."""
        started = time.perf_counter()
        iso = build_nocloud_iso(
            user_data=b"#cloud-config\n", instance_id=self.name, hostname=self.name
        )
        self.iso_file.write_bytes(iso)
        xml = self.workdir / f"{self.name}.xml"
        xml.write_text(self.domain_xml(spec))
        self.host = host
        await virsh(self.uri(host), self._prepare_commands())
        await virsh(self.uri(host), f"define {xml}; start {self.name}")
        deadline = time.monotonic() + within
        while self.mac not in self.bed.leases().lower():
            if time.monotonic() > deadline:
                raise VirshError(f"{self.name}: no DHCP lease for {self.mac} in {within:g} s")
            await asyncio.sleep(0.2)
        return time.perf_counter() - started

    async def move(self, to: str) -> dict[str, Any]:
        """Prepare `to` and migrate there (timed); job info and source clean-up (untimed)."""
        source, dest = self.uri(self.host), self.uri(to)
        t0 = time.perf_counter()
        wall0 = time.time()
        await virsh(dest, self._prepare_commands())
        t1 = time.perf_counter()
        await virsh(
            source,
            f"migrate --live --persistent --undefinesource --copy-storage-inc {self.name} {dest}",
        )
        t2 = time.perf_counter()
        text = await virsh(dest, f"domjobinfo --completed {self.name}")
        info = job_info_ms(text)
        where = await virsh(dest, f"domstate {self.name}")
        if where.strip() != "running":
            raise VirshError(f"{self.name} is {where.strip()!r} on {to} after the migration")
        t3 = time.perf_counter()
        await self._clean(self.host)
        t4 = time.perf_counter()
        origin, self.host = self.host, to
        return {
            "from": origin,
            "to": to,
            "started_at": wall0,
            "seconds": t2 - t0,
            "prepare_s": t1 - t0,
            "migrate_s": t2 - t1,
            "job_ms": info.get("time_elapsed"),
            "downtime_ms": info.get("total_downtime"),
            "outside_job_s": _outside(t2 - t1, info.get("time_elapsed")),
            "data_processed_bytes": data_processed_bytes(text),
            "job_info_ms": info,
            "cleanup_s": t4 - t3,
        }

    async def _clean(self, host: str) -> None:
        """The guest's volumes and serial log on `host` (where it does not run)."""
        with contextlib.suppress(VirshError):
            await virsh(self.uri(host), f"pool-refresh {self.pool}")
        for volume in (self.root, self.iso):
            with contextlib.suppress(VirshError):
                await virsh(self.uri(host), f"vol-delete --pool {self.pool} {volume}")
        proc = await asyncio.create_subprocess_exec(
            *self.bed.in_host(host, ["rm", "-f", self.console_log]),
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        await proc.wait()

    async def remove(self, hosts: tuple[str, ...]) -> list[str]:
        """Everything of the guest on every host of `hosts`, whatever state it is in."""
        removed = []
        for host in hosts:
            uri = self.uri(host)
            with contextlib.suppress(VirshError):
                await virsh(uri, f"destroy {self.name}")
                removed.append(f"{host}: destroyed {self.name}")
            with contextlib.suppress(VirshError):
                await virsh(uri, f"undefine {self.name}")
                removed.append(f"{host}: undefined {self.name}")
            await self._clean(host)
        with contextlib.suppress(OSError):
            for path in self.workdir.iterdir():
                path.unlink()
            self.workdir.rmdir()
        return removed
