"""Bootstrap success, read through the guest agent: the BootstrapSucceeded condition.

Cluster API's bootstrap contract has the guest write ``/run/cluster-api/
bootstrap-success.complete`` once its bootstrap (``kubeadm init``/``join`` and the rest of
the cloud-init or Ignition run) finished. capl reads that file through qemu-guest-agent
(``Host.read_guest_file``: no SSH, no network) and reports it on the LibvirtMachine:

- ``BootstrapSucceeded=True`` (reason ``BootstrapSucceeded``): the file is there, or the
  Machine got a nodeRef (its Node joined) on a domain with the agent channel. Then the
  machine is never asked again (remembered per machine; after a restart the True condition
  says it).
- ``False``, ``WaitingForBootstrap``: the agent answers and the file is not there yet.
  Requeued every ``poll`` seconds (never sooner: a reconcile in between is told how long
  is left, so a settled machine does not stop the polling either).
- ``False``, ``BootstrapTimedOut``: still no file (or no answer from the agent) ``timeout``
  seconds after the domain started (``--bootstrap-timeout``). The message and one Warning
  event carry the last lines of the machine's serial console log, read from the host through
  libvirt's storage API (``Host.read_volume_tail``), **redacted** (``redact``): bootstrap
  tokens, ``kubeadm`` certificate keys, PEM blocks, JWTs, ``token:``/``password:`` values
  and long random base64 never reach a condition, an event or a log. Polling goes on slowly
  (``slow_poll``): a late success still turns it True, and the message's console lines are
  read again each time (what the guest printed after the deadline; the event is not
  repeated).

An agent that is not connected or does not answer (yet: a TCG guest on a busy host may
take minutes to start it) adds no condition and is asked again every ``poll`` seconds; at
the deadline a silent agent is a timeout like a missing file (capl's domains have the
agent channel, so an image without the agent is told so, with the console tail), and it
is asked slowly from then on. A Machine whose Node joined (nodeRef) is True: said without
asking when the condition is there; asked once when it is not, because a driver or domain
without agent support (the libvirt test driver, a domain without the agent channel, an
agent that refuses file commands) gets no condition at all and is not asked again. The
condition is not part of Ready: Ready says the infrastructure is there, bootstrap is the
guest's part.

When did the domain start? The earlier of the lastTransitionTimes of DomainProvisioned=True
and of BootstrapSucceeded=False (kept while it stays False): both live in the object, so a
restarted manager keeps counting from the same moment.

Decisions are pure (``settled``, ``decide``, ``console_tail``, ``redact``: no I/O, time
passed in); ``BootstrapWatcher`` does the I/O; what it remembers of a machine
(``BootstrapMemory``) is kept in the machine's memory record
(``capl.controllers.machine.memory``), forgotten with it.
"""

from __future__ import annotations

import datetime
import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import structlog

from capl.api import constants as c
from capl.ports.errors import VirtError
from capl.ports.virt import GuestFileState, Host, VolumeTail
from capl.runtime.clock import Clock
from capl.runtime.conditions import get_condition, rfc3339, set_condition
from capl.runtime.controller import Result
from capl.runtime.events import MAX_MESSAGE, Recorder
from capl.runtime.objects import Obj, meta

__all__ = [
    "SUCCESS_FILE",
    "BootstrapMemory",
    "BootstrapOptions",
    "BootstrapSubject",
    "BootstrapWatcher",
    "Decision",
    "Verdict",
    "console_tail",
    "decide",
    "redact",
    "settled",
    "sooner",
    "started_at",
    "timed_out_message",
]

log = structlog.get_logger("capl.controllers.machine_bootstrap")

SUCCESS_FILE: Final = "/run/cluster-api/bootstrap-success.complete"
TYPE: Final = c.ConditionType.BOOTSTRAP_SUCCEEDED
_READ_LIMIT = 4096
"""Bytes of the success file read (its content does not matter, only that it exists)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class BootstrapOptions:
    """Timings and bounds of the BootstrapSucceeded condition (seconds, bytes, lines)."""

    timeout: float = 1200.0
    """``--bootstrap-timeout``: from the domain's start until BootstrapTimedOut."""
    poll: float = 15.0
    """How often the agent is asked while waiting."""
    slow_poll: float = 60.0
    """How often after a timeout (a late success still counts)."""
    tail_lines: int = 20
    tail_bytes: int = 2048
    """The console tail in the condition message: at most this many lines and bytes."""
    read_bytes: int = 16 * 1024
    """How much of the end of the console log is read from the host."""

    def __post_init__(self) -> None:
        for name in ("timeout", "poll", "slow_poll"):
            if not getattr(self, name) > 0:
                raise ValueError(f"bootstrap {name} must be positive, got {getattr(self, name)!r}")


# --- redaction and the console tail -----------------------------------------------------------

_REDACTED = "[redacted]"
_PEM = "[redacted PEM block]"
_PEM_PATTERNS = (
    re.compile(r"-----BEGIN [A-Z0-9 ]{1,64}-----.*?-----END [A-Z0-9 ]{1,64}-----", re.DOTALL),
    re.compile(r"-----BEGIN [A-Z0-9 ]{1,64}-----.*\Z", re.DOTALL),  # still being printed
    re.compile(r"\A.*?-----END [A-Z0-9 ]{1,64}-----", re.DOTALL),  # its start was cut off
)
_SUBSTITUTIONS: tuple[tuple[re.Pattern[str], str], ...] = (
    # JSON Web Tokens (service account tokens): header.payload[.signature], base64url
    (re.compile(r"eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}(?:\.[A-Za-z0-9_-]*)?"), _REDACTED),
    # kubeadm bootstrap tokens: [a-z0-9]{6}.[a-z0-9]{16}, wherever they appear
    (re.compile(r"[a-z0-9]{6}\.[a-z0-9]{16}"), _REDACTED),
    # `kubeadm join --token X --certificate-key Y`, whatever X and Y look like
    (re.compile(r"(--(?:token|certificate-key)(?:=|\s+))\S+"), r"\1" + _REDACTED),
    # `token: X`, `"password": "X"`, `client-key-data: X`, `bootstrapToken=X`, ...
    (
        re.compile(
            r"((?:token|password|passwd|secret|key-data|certificate-data)"
            r"[\"']?\s*[:=]\s*[\"']?)[^\s\"',;}]+",
            re.IGNORECASE,
        ),
        r"\1" + _REDACTED,
    ),
    # 64 hex digits: the certificate key as `kubeadm init --upload-certs` prints it on a line
    # of its own (a `sha256:` hash, e.g. the CA cert hash of a join command, is public)
    (re.compile(r"(?<![0-9A-Fa-f])(?<!sha256:)[0-9A-Fa-f]{64}(?![0-9A-Fa-f])"), _REDACTED),
)
# long runs of base64 with upper case, lower case and digits: key material, not words
_BASE64_RUN = re.compile(r"[A-Za-z0-9+/_-]{32,}={0,2}")
_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
# systemd's console progress ("[ ***  ] A start job is running for ...", "[**    ] Job x/start
# running (1min 43s / 2min 20s)"): one line a second while a unit starts, which would push
# everything else out of the tail; only the newest is kept
_PROGRESS = re.compile(r"^\[[ *]{6}\] (?:A (?:start|stop) job is running|Job \S+ running)")


def _random_looking(match: re.Match[str]) -> str:
    run = match.group(0)
    mixed = (
        any(ch.isupper() for ch in run)
        and any(ch.islower() for ch in run)
        and any(ch.isdigit() for ch in run)
    )
    return _REDACTED if mixed else run


def redact(text: str) -> str:
    """``text`` with everything that may be a secret replaced (see the module docstring).

    PEM blocks go first and whole, also one whose END is not printed yet and one whose BEGIN
    was cut off by the window the text was read from."""
    for pattern in _PEM_PATTERNS:
        text = pattern.sub(_PEM, text)
    for pattern, replacement in _SUBSTITUTIONS:
        text = pattern.sub(replacement, text)
    return _BASE64_RUN.sub(_random_looking, text)


def console_tail(data: bytes, *, cut: bool, lines: int, max_bytes: int) -> list[str]:
    """The last ``lines`` non-empty lines of console output, redacted, at most ``max_bytes``
    (UTF-8, a newline per line counted) in all.

    Of systemd's progress lines only the newest is kept.

    ``cut``: ``data`` does not start at the beginning of the log, so its first line is
    partial and is dropped (a secret cut in half would not be recognised). Terminal escape
    sequences and control characters are removed *before* redaction (they could otherwise
    split a token), and the bound is applied *after* it (cutting never uncovers anything)."""
    if cut:
        newline = data.find(b"\n")
        data = data[newline + 1 :] if newline >= 0 else b""
    text = data.decode("utf-8", errors="replace").replace("\r", "")
    text = _CONTROL.sub("", _ANSI.sub("", text))
    kept = [line.rstrip() for line in redact(text).split("\n") if line.strip()]
    progress = [i for i, line in enumerate(kept) if _PROGRESS.match(line)]
    if progress:
        drop = set(progress[:-1])
        kept = [line for i, line in enumerate(kept) if i not in drop]
    return _bounded(kept[-lines:] if lines > 0 else [], max_bytes)


def _bounded(lines: list[str], max_bytes: int) -> list[str]:
    """The newest lines that fit in ``max_bytes``; a single line too long keeps its end."""
    result: list[str] = []
    used = 0
    for line in reversed(lines):
        size = len(line.encode()) + 1
        if used + size <= max_bytes:
            result.append(line)
            used += size
            continue
        room = max_bytes - used - len("… ".encode()) - 1
        if not result and room > 0:
            end = line.encode()[-room:].decode("utf-8", errors="ignore")
            result.append("… " + end)
        break
    return result[::-1]


# --- decisions --------------------------------------------------------------------------------


class Verdict(enum.StrEnum):
    SUCCEEDED = "succeeded"
    WAITING = "waiting"
    TIMED_OUT = "timed-out"
    KEEP = "keep"
    """Leave the condition as it is (or absent)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Decision:
    verdict: Verdict
    stop: bool = False
    """Never ask this machine's agent again (in this process)."""
    requeue_after: float | None = None
    reason_text: str = ""
    """SUCCEEDED: how it is known; TIMED_OUT: what the agent said (``NOT_THERE``,
    ``AGENT_SILENT``)."""


NOT_THERE: Final = f"{SUCCESS_FILE} is not in the guest"
AGENT_SILENT: Final = (
    "the guest agent does not answer (is qemu-guest-agent in the image and running?)"
)


def _duration(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    text = (f"{hours}h" if hours else "") + (f"{minutes}m" if minutes else "")
    return text + (f"{secs}s" if secs or not text else "")


def _parse_time(value: object) -> float | None:
    try:
        parsed = datetime.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=datetime.UTC)
    return parsed.timestamp()


def started_at(obj: Obj) -> float | None:
    """When the domain started (wall seconds): the earlier of DomainProvisioned=True's and
    BootstrapSucceeded=False's lastTransitionTime; None when neither is there."""
    times = []
    for type_, status in ((c.ConditionType.DOMAIN_PROVISIONED, "True"), (TYPE, "False")):
        cond = get_condition(obj, type_)
        if cond is not None and cond.get("status") == status:
            when = _parse_time(cond.get("lastTransitionTime"))
            if when is not None:
                times.append(when)
    return min(times) if times else None


def settled(condition: Mapping[str, Any] | None, *, node_joined: bool) -> Decision | None:
    """The decision that needs no question to the agent, or None: True already, or the
    Machine has a nodeRef while the condition is there (a machine without the condition is
    asked once: a domain without agent support gets none, see ``decide``)."""
    if condition is not None and condition.get("status") == "True":
        return Decision(verdict=Verdict.KEEP, stop=True)
    if node_joined and condition is not None:
        return _joined()
    return None


def _joined() -> Decision:
    return Decision(
        verdict=Verdict.SUCCEEDED,
        stop=True,
        reason_text="the Machine's Node joined the cluster (nodeRef)",
    )


def decide(
    *,
    state: GuestFileState,
    condition: Mapping[str, Any] | None,
    started: float,
    now: float,
    options: BootstrapOptions,
    node_joined: bool = False,
) -> Decision:
    """What the agent's answer means for the condition (see the module docstring)."""
    if state is GuestFileState.PRESENT:
        return Decision(
            verdict=Verdict.SUCCEEDED,
            stop=True,
            reason_text=f"the guest wrote {SUCCESS_FILE} (read through the guest agent)",
        )
    if state is GuestFileState.UNSUPPORTED:
        return Decision(verdict=Verdict.KEEP, stop=True)
    if node_joined:  # an agent that is there, silent or not: the Node is the proof
        return _joined()
    if now - started < options.timeout:
        if state is GuestFileState.ABSENT:
            return Decision(verdict=Verdict.WAITING, requeue_after=options.poll)
        return Decision(verdict=Verdict.KEEP, requeue_after=options.poll)  # still booting?
    # overdue: the file is not there, or the agent (the domain has its channel) is silent
    seen = NOT_THERE if state is GuestFileState.ABSENT else AGENT_SILENT
    return Decision(verdict=Verdict.TIMED_OUT, requeue_after=options.slow_poll, reason_text=seen)


def waiting_message(options: BootstrapOptions) -> str:
    return (
        f"waiting for the guest to write {SUCCESS_FILE} (asked through the guest agent; "
        f"times out {_duration(options.timeout)} after the domain started)"
    )


def timed_out_message(
    tail: list[str] | None,
    *,
    options: BootstrapOptions,
    why_no_tail: str,
    max_bytes: int,
    seen: str = NOT_THERE,
) -> str:
    """The BootstrapTimedOut message: what happened (``seen``: what the agent said), then
    the (redacted) console tail, the whole at most ``max_bytes`` (the tail gives way: its
    newest lines are kept)."""
    head = (
        f"bootstrap did not finish within {_duration(options.timeout)} of the domain's "
        f"start: {seen}"
    )
    if not tail:
        return f"{head}; {why_no_tail}"
    head += "; last lines of the serial console (secrets redacted):\n"
    room = max_bytes - len(head.encode())
    return head + "\n".join(_bounded(tail, room))


def sooner(result: Result, delay: float | None) -> Result:
    """``result``, or a requeue after ``delay`` when that comes first."""
    if delay is None or (result.requeue_after is not None and result.requeue_after <= delay):
        return result
    return Result(requeue=result.requeue, requeue_after=delay)


# --- the I/O --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class BootstrapSubject:
    """One running machine whose bootstrap is watched, as a reconcile sees it."""

    obj: Obj
    """The object being written (its status is patched at the end of the reconcile): the
    condition is read and set here."""
    host: Host
    domain_uuid: str
    pool: str
    console_volume: str
    """The console log's volume name in ``pool`` (``MachineNames.console_log``)."""
    node_joined: bool


@dataclass(slots=True)
class BootstrapMemory:
    """What the watcher remembers of one incarnation (UID) of a machine."""

    uid: str
    first_seen: float
    """Wall seconds: the start when the object says nothing (it always does once running)."""
    next_check: float = 0.0
    """Monotonic seconds: the agent is not asked before."""
    done: bool = False
    warned: bool = False


class BootstrapWatcher:
    """The I/O of the bootstrap check (see the module docstring); its memory of a machine is
    passed in (``memory_for``)."""

    def __init__(
        self, *, recorder: Recorder, clock: Clock, options: BootstrapOptions | None = None
    ) -> None:
        self.recorder = recorder
        self.clock = clock
        self.options = options or BootstrapOptions()

    def memory_for(self, held: BootstrapMemory | None, obj: Obj) -> BootstrapMemory:
        """``held``, or a fresh memory when there is none or it is of another incarnation."""
        uid = str(meta(obj).get("uid") or "")
        if held is None or held.uid != uid:  # a new incarnation starts afresh
            return BootstrapMemory(uid=uid, first_seen=self.clock.wall())
        return held

    async def observe(self, subject: BootstrapSubject, memory: BootstrapMemory) -> float | None:
        """Ask the agent if due, set the condition on ``subject.obj``; how soon to look
        again (None: never, for this machine). ``memory``: ``memory_for(...)`` of it."""
        if memory.done:
            return None
        condition = get_condition(subject.obj, TYPE)
        early = settled(condition, node_joined=subject.node_joined)
        if early is not None:
            return await self._apply(subject, memory, early, condition)
        now = self.clock.now()
        if now < memory.next_check:
            return memory.next_check - now
        memory.next_check = now + self.options.poll
        try:
            answer = await subject.host.read_guest_file(
                subject.domain_uuid, SUCCESS_FILE, limit=_READ_LIMIT
            )
        except VirtError as exc:  # the host or the domain: the reconcile reports that itself
            log.debug("bootstrap check skipped", error=str(exc))
            return self.options.poll
        if answer.state in (GuestFileState.AGENT_UNAVAILABLE, GuestFileState.UNSUPPORTED):
            log.debug("no answer from the guest agent", state=answer.state, detail=answer.detail)
        decision = decide(
            state=answer.state,
            condition=condition,
            started=started_at(subject.obj) or memory.first_seen,
            now=self.clock.wall(),
            options=self.options,
            node_joined=subject.node_joined,
        )
        return await self._apply(subject, memory, decision, condition)

    async def _apply(
        self,
        subject: BootstrapSubject,
        memory: BootstrapMemory,
        decision: Decision,
        condition: Mapping[str, Any] | None,
    ) -> float | None:
        options = self.options
        if decision.verdict is Verdict.SUCCEEDED:
            self._set(subject, True, c.Reason.BOOTSTRAP_SUCCEEDED, decision.reason_text)
        elif decision.verdict is Verdict.WAITING:
            self._set(subject, False, c.Reason.WAITING_FOR_BOOTSTRAP, waiting_message(options))
        elif decision.verdict is Verdict.TIMED_OUT:
            await self._timed_out(subject, memory, condition, seen=decision.reason_text)
        memory.done = decision.stop
        if decision.requeue_after is not None:
            memory.next_check = self.clock.now() + decision.requeue_after
        return decision.requeue_after

    async def _timed_out(
        self,
        subject: BootstrapSubject,
        memory: BootstrapMemory,
        condition: Mapping[str, Any] | None,
        *,
        seen: str,
    ) -> None:
        """BootstrapTimedOut with the console tail, and one Warning event. The tail is read
        again at every slow poll while the condition stays so: the message follows what the
        guest prints after the deadline (a slow guest may reach kubeadm only then; an
        unchanged tail writes nothing), the event and the log line stay one."""
        reported = condition is not None and condition.get("reason") == c.Reason.BOOTSTRAP_TIMED_OUT
        tail, why = await self._console_tail(subject)
        options = self.options
        message = timed_out_message(
            tail, options=options, why_no_tail=why, max_bytes=options.tail_bytes + 512, seen=seen
        )
        self._set(subject, False, c.Reason.BOOTSTRAP_TIMED_OUT, message)
        if reported:
            return  # by this process or before a restart: no second event
        log.warning("bootstrap timed out", timeout=options.timeout, console_lines=len(tail or ()))
        if not memory.warned:
            memory.warned = True
            event = timed_out_message(
                tail, options=options, why_no_tail=why, max_bytes=MAX_MESSAGE, seen=seen
            )
            self.recorder.event(subject.obj, "Warning", c.Reason.BOOTSTRAP_TIMED_OUT, event)

    async def _console_tail(self, subject: BootstrapSubject) -> tuple[list[str] | None, str]:
        options = self.options
        try:
            found: VolumeTail | None = await subject.host.read_volume_tail(
                pool=subject.pool, name=subject.console_volume, limit=options.read_bytes
            )
        except VirtError as exc:
            return None, f"the serial console log could not be read: {exc}"
        if found is None:
            return None, "the host has no serial console log of the domain to show"
        tail = console_tail(
            found.data, cut=found.offset > 0, lines=options.tail_lines, max_bytes=options.tail_bytes
        )
        return tail, "the serial console log is empty"

    def _set(self, subject: BootstrapSubject, status: bool, reason: str, message: str) -> None:
        set_condition(subject.obj, TYPE, status, reason=reason, message=message, now=self._now)

    def _now(self) -> str:
        return rfc3339(self.clock.wall())
