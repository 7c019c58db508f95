"""BootstrapSucceeded through the guest agent (capl.controllers.machine.bootstrap).

The decisions and the redaction are pure and tested directly; the watcher runs against a
scripted host (agent answers, console log bytes) on a fake clock, so the 20-minute timeout
takes no time. Secrets printed on the console (kubeadm's join command, certificate keys, PEM
blocks, `token:` values) must never reach the condition, the event or the log.
"""

from __future__ import annotations

import base64
from typing import Any, cast

import pytest
import structlog

from capl.api import constants as c
from capl.controllers.machine.bootstrap import (
    AGENT_SILENT,
    NOT_THERE,
    SUCCESS_FILE,
    BootstrapMemory,
    BootstrapOptions,
    BootstrapSubject,
    BootstrapWatcher,
    Verdict,
    console_tail,
    decide,
    redact,
    settled,
    sooner,
    started_at,
    timed_out_message,
)
from capl.ports.errors import HostUnreachable
from capl.ports.virt import GuestFile, GuestFileState, Host, VolumeTail
from capl.runtime.clock import FakeClock
from capl.runtime.conditions import get_condition, rfc3339
from capl.runtime.controller import Result
from capl.runtime.events import MAX_MESSAGE, NullRecorder
from capl.runtime.objects import Obj

TOKEN = "abcdef.0123456789abcdef"
CERT_KEY = "f8902e114ef118304e561c3ecd4d0b543adc226b7a07f675f56564185ffe0c07"
CA_HASH = "sha256:" + "1234567890abcdef" * 4
PEM_BODY = "MIIEpAIBAAKCAQEA3Tz2mr7SZiAMfQyuvBjM2Kk3hKQ6nYVbOfTWyMZ3q9XkR0Jl"
PEM = (
    f"-----BEGIN RSA PRIVATE KEY-----\n{PEM_BODY}\n{PEM_BODY[::-1]}\n-----END RSA PRIVATE KEY-----"
)
KUBEADM_INIT = f"""\
[init] Using Kubernetes version: v1.35.4
[upload-certs] Using certificate key:
{CERT_KEY}
[bootstrap-token] Using token: {TOKEN}
Your Kubernetes control-plane has initialized successfully!
  kubeadm join api.lab.example:6443 --token {TOKEN} \\
\t--discovery-token-ca-cert-hash {CA_HASH} \\
\t--control-plane --certificate-key {CERT_KEY}
"""
SECRETS = (TOKEN, CERT_KEY, PEM_BODY, PEM_BODY[::-1])


def _clean(text: str) -> None:
    for secret in SECRETS:
        assert secret not in text
        assert secret[8:40] not in text  # no recognisable piece either


# --- redaction --------------------------------------------------------------------------------


def test_kubeadm_output_is_redacted_and_stays_readable() -> None:
    out = redact(KUBEADM_INIT)
    _clean(out)
    assert "[init] Using Kubernetes version: v1.35.4" in out
    assert "Your Kubernetes control-plane has initialized successfully!" in out
    assert "kubeadm join api.lab.example:6443 --token [redacted]" in out
    assert "--certificate-key [redacted]" in out
    assert CA_HASH in out  # a public hash, useful to compare; kept


@pytest.mark.parametrize(
    "line",
    [
        f"token: {TOKEN}",
        "token: s3cr3t-value",
        '{"token": "s3cr3t-value", "kind": "Config"}',
        "  bootstrapToken=s3cr3t-value",
        "password: s3cr3t-value",
        "client-key-data: s3cr3t-value",
        "kubeadm join x:6443 --token=s3cr3t-value --discovery-token-unsafe-skip-ca-verification",
        "--certificate-key=s3cr3t-value",
        "Bearer eyJhbGciOiJSUzI1NiIsImtpZCI6Ij.eyJpc3MiOiJrdWJlcm5ldGVz.c2lnbmF0dXJl",
        "data: QWxhZGRpbjpvcGVuIHNlc2FtZQ0123456789s3cr3tvalue",
    ],
)
def test_secret_shapes_are_redacted(line: str) -> None:
    out = redact(line)
    assert "s3cr3t" not in out
    assert TOKEN not in out
    assert "eyJpc3Mi" not in out
    assert "[redacted]" in out


def test_pem_blocks_whole_unterminated_and_cut_off() -> None:
    out = redact(f"before\n{PEM}\nafter")
    assert out == "before\n[redacted PEM block]\nafter"
    # still being printed when the log was read: everything after BEGIN goes
    out = redact(f"before\n-----BEGIN PRIVATE KEY-----\n{PEM_BODY}\n")
    assert out == "before\n[redacted PEM block]"
    # its BEGIN fell before the window: everything up to END goes
    out = redact(f"{PEM_BODY}\n-----END CERTIFICATE-----\nafter")
    assert out == "[redacted PEM block]\nafter"


def test_plain_console_lines_are_untouched() -> None:
    lines = (
        "[  OK  ] Started kubelet.service - kubelet: The Kubernetes Node Agent.",
        "cloud-init[812]: Cloud-init v. 24.1 finished at Mon, 01 Jan 2024 00:00:00 +0000",
        "ignition[650]: files: createFilesystemsFiles: op(1): [finished] writing file",
        "eth0: 192.168.150.101/24 fe80::5054:ff:fe12:3456/64",
        "/var/lib/kubelet/pki/kubelet-client-current.pem",
    )
    for line in lines:
        assert redact(line) == line


# --- the console tail -------------------------------------------------------------------------


def test_tail_drops_the_cut_first_line_so_half_a_secret_never_shows() -> None:
    log = f"join --token {TOKEN}\nline two\nline three\n".encode()
    window = log[len("join --token abcd") :]  # the read window started inside the token
    assert console_tail(window, cut=True, lines=20, max_bytes=4096) == ["line two", "line three"]
    assert console_tail(log, cut=False, lines=20, max_bytes=4096) == [
        "join --token [redacted]",
        "line two",
        "line three",
    ]


def test_tail_keeps_the_newest_lines_within_the_bounds() -> None:
    log = "".join(f"line {i}\r\n" for i in range(100)).encode()
    assert console_tail(log, cut=False, lines=3, max_bytes=4096) == [
        "line 97",
        "line 98",
        "line 99",
    ]
    bounded = console_tail(log, cut=False, lines=20, max_bytes=20)
    assert bounded == ["line 98", "line 99"]
    assert sum(len(x) + 1 for x in bounded) <= 20
    long = ("x" * 5000 + "the end").encode()
    (only,) = console_tail(long, cut=False, lines=20, max_bytes=100)
    assert only.endswith("the end")
    assert only.startswith("… ")
    assert len(only.encode()) + 1 <= 100


def test_tail_removes_escapes_before_redacting() -> None:
    # a token split by colour codes and a carriage-return redraw must still be found
    log = b"\x1b[1mabcdef\x1b[0m.0123456789abcdef\r\n\x1b]0;title\x07done\x00\n\n"
    assert console_tail(log, cut=False, lines=20, max_bytes=4096) == ["[redacted]", "done"]


def test_tail_keeps_only_the_newest_systemd_progress_line() -> None:
    # systemd redraws its progress once a second: it must not push the error out of the tail
    log = b"CRITICAL : Ignition failed: config is not valid\n" + b"".join(
        b"\x1b[0;1;31m[**    ]\x1b[0m Job containerd.service/start running (%ds / 2min 20s)\r\n" % i
        for i in range(40)
    )
    assert console_tail(log, cut=False, lines=5, max_bytes=4096) == [
        "CRITICAL : Ignition failed: config is not valid",
        "[**    ] Job containerd.service/start running (39s / 2min 20s)",
    ]


def test_tail_of_invalid_utf8_and_empty_logs() -> None:
    assert console_tail(b"\xff\xfeok\n", cut=False, lines=20, max_bytes=100) == ["\ufffd\ufffdok"]
    assert console_tail(b"", cut=False, lines=20, max_bytes=100) == []
    assert console_tail(b"no newline at all", cut=True, lines=20, max_bytes=100) == []


def test_timed_out_message_is_bounded_and_keeps_the_newest_lines() -> None:
    options = BootstrapOptions(timeout=1200)
    tail = [f"line {i} " + "y" * 60 for i in range(20)]
    message = timed_out_message(tail, options=options, why_no_tail="-", max_bytes=MAX_MESSAGE)
    assert len(message.encode()) <= MAX_MESSAGE
    assert message.startswith("bootstrap did not finish within 20m of the domain's start")
    assert message.endswith(tail[-1])
    assert SUCCESS_FILE in message
    assert timed_out_message(None, options=options, why_no_tail="no log", max_bytes=100).endswith(
        "; no log"
    )


# --- decisions --------------------------------------------------------------------------------

OPTIONS = BootstrapOptions(timeout=1200, poll=15, slow_poll=60)
WAITING = {"type": "BootstrapSucceeded", "status": "False", "reason": "WaitingForBootstrap"}
TIMED_OUT = {"type": "BootstrapSucceeded", "status": "False", "reason": "BootstrapTimedOut"}
TRUE = {"type": "BootstrapSucceeded", "status": "True", "reason": "BootstrapSucceeded"}


@pytest.mark.parametrize(
    ("state", "condition", "elapsed", "verdict", "stop", "requeue"),
    [
        (GuestFileState.PRESENT, None, 5, Verdict.SUCCEEDED, True, None),
        (GuestFileState.PRESENT, TIMED_OUT, 5000, Verdict.SUCCEEDED, True, None),
        (GuestFileState.ABSENT, None, 5, Verdict.WAITING, False, 15),
        (GuestFileState.ABSENT, WAITING, 1199, Verdict.WAITING, False, 15),
        (GuestFileState.ABSENT, WAITING, 1200, Verdict.TIMED_OUT, False, 60),
        (GuestFileState.ABSENT, None, 1300, Verdict.TIMED_OUT, False, 60),
        (GuestFileState.ABSENT, TIMED_OUT, 5000, Verdict.TIMED_OUT, False, 60),
        # no agent (yet): no condition until the deadline, then a timeout, asked slowly
        (GuestFileState.AGENT_UNAVAILABLE, None, 5, Verdict.KEEP, False, 15),
        (GuestFileState.AGENT_UNAVAILABLE, None, 1200, Verdict.TIMED_OUT, False, 60),
        (GuestFileState.AGENT_UNAVAILABLE, TIMED_OUT, 5000, Verdict.TIMED_OUT, False, 60),
        # the agent answered before and is silent now: the condition stays, then times out
        (GuestFileState.AGENT_UNAVAILABLE, WAITING, 5, Verdict.KEEP, False, 15),
        (GuestFileState.AGENT_UNAVAILABLE, WAITING, 1200, Verdict.TIMED_OUT, False, 60),
        # the driver or the domain cannot: never again, nothing reported
        (GuestFileState.UNSUPPORTED, None, 5, Verdict.KEEP, True, None),
        (GuestFileState.UNSUPPORTED, WAITING, 5000, Verdict.KEEP, True, None),
    ],
)
def test_decide(
    state: GuestFileState,
    condition: dict[str, str] | None,
    elapsed: float,
    verdict: Verdict,
    stop: bool,
    requeue: float | None,
) -> None:
    decision = decide(state=state, condition=condition, started=1000.0, now=1000.0 + elapsed,
                      options=OPTIONS)  # fmt: skip
    assert (decision.verdict, decision.stop, decision.requeue_after) == (verdict, stop, requeue)


def test_settled_needs_no_question_to_the_agent() -> None:
    assert settled(None, node_joined=False) is None
    assert settled(WAITING, node_joined=False) is None
    true = settled(TRUE, node_joined=False)
    assert true is not None
    assert (true.verdict, true.stop) == (Verdict.KEEP, True)
    joined = settled(WAITING, node_joined=True)
    assert joined is not None
    assert (joined.verdict, joined.stop) == (Verdict.SUCCEEDED, True)
    assert "nodeRef" in joined.reason_text
    # no condition yet: the agent is asked once (a domain without agent support gets none)
    assert settled(None, node_joined=True) is None


@pytest.mark.parametrize(
    ("state", "verdict"),
    [
        (GuestFileState.PRESENT, Verdict.SUCCEEDED),
        (GuestFileState.ABSENT, Verdict.SUCCEEDED),
        (GuestFileState.AGENT_UNAVAILABLE, Verdict.SUCCEEDED),  # a slow or absent agent
        (GuestFileState.UNSUPPORTED, Verdict.KEEP),  # the test driver: no condition
    ],
)
def test_a_joined_node_without_the_condition(state: GuestFileState, verdict: Verdict) -> None:
    decision = decide(state=state, condition=None, started=1000.0, now=1005.0,
                      options=OPTIONS, node_joined=True)  # fmt: skip
    assert (decision.verdict, decision.stop, decision.requeue_after) == (verdict, True, None)


def test_timeout_says_what_the_agent_said() -> None:
    absent = decide(state=GuestFileState.ABSENT, condition=WAITING, started=0.0, now=1200.0,
                    options=OPTIONS)  # fmt: skip
    silent = decide(state=GuestFileState.AGENT_UNAVAILABLE, condition=None, started=0.0,
                    now=1200.0, options=OPTIONS)  # fmt: skip
    assert absent.reason_text == NOT_THERE
    assert silent.reason_text == AGENT_SILENT
    message = timed_out_message(None, options=OPTIONS, why_no_tail="no log", max_bytes=4096,
                                seen=silent.reason_text)  # fmt: skip
    assert message == (
        "bootstrap did not finish within 20m of the domain's start: the guest agent does not "
        "answer (is qemu-guest-agent in the image and running?); no log"
    )


def test_started_at_is_the_earlier_of_the_two_conditions() -> None:
    obj = _machine(provisioned_at=2000.0)
    assert started_at(obj) == 2000.0
    obj["status"]["conditions"].append(
        {**WAITING, "lastTransitionTime": rfc3339(1500.0), "message": ""}
    )
    assert started_at(obj) == 1500.0
    assert started_at({"metadata": {}, "status": {}}) is None


def test_sooner() -> None:
    assert sooner(Result(), None) == Result()
    assert sooner(Result(), 15.0) == Result(requeue_after=15.0)
    assert sooner(Result(requeue_after=1.0), 15.0) == Result(requeue_after=1.0)
    assert sooner(Result(requeue_after=30.0), 15.0) == Result(requeue_after=15.0)


def test_options_are_checked() -> None:
    with pytest.raises(ValueError, match="timeout"):
        BootstrapOptions(timeout=0)


# --- the watcher, on a fake clock -------------------------------------------------------------


class _Host:
    """Scripted answers of the agent and the console log; records what was asked."""

    def __init__(self, *states: GuestFileState | Exception, log: bytes = b"") -> None:
        self.states = list(states)
        self.log = log
        self.file_reads: list[tuple[str, str]] = []
        self.tail_reads: list[tuple[str, str, int]] = []

    async def read_guest_file(self, uuid: str, path: str, *, limit: int = 4096) -> GuestFile:
        self.file_reads.append((uuid, path))
        state = self.states.pop(0) if len(self.states) > 1 else self.states[0]
        if isinstance(state, Exception):
            raise state
        data = b"success" if state is GuestFileState.PRESENT else b""
        return GuestFile(state=state, data=data)

    async def read_volume_tail(self, *, pool: str, name: str, limit: int) -> VolumeTail | None:
        self.tail_reads.append((pool, name, limit))
        return VolumeTail(data=self.log[-limit:], offset=max(0, len(self.log) - limit))


def _machine(*, provisioned_at: float) -> Obj:
    return {
        "apiVersion": c.API_VERSION,
        "kind": "LibvirtMachine",
        "metadata": {"name": "m1", "namespace": "ns", "uid": "uid-1", "generation": 1},
        "status": {
            "conditions": [
                {
                    "type": "DomainProvisioned",
                    "status": "True",
                    "reason": "Running",
                    "message": "",
                    "lastTransitionTime": rfc3339(provisioned_at),
                }
            ]
        },
    }


class _Bed:
    def __init__(self, host: _Host, *, options: BootstrapOptions = OPTIONS) -> None:
        self.clock = FakeClock()
        self.recorder = NullRecorder()
        self.host = host
        self.obj = _machine(provisioned_at=self.clock.wall())
        self.watcher = BootstrapWatcher(recorder=self.recorder, clock=self.clock, options=options)
        self.memory: BootstrapMemory | None = None

    async def observe(self, *, node_joined: bool = False) -> float | None:
        subject = BootstrapSubject(
            obj=self.obj,
            host=cast(Host, self.host),
            domain_uuid="u-1",
            pool="pool",
            console_volume="m1-console.log",
            node_joined=node_joined,
        )
        self.memory = self.watcher.memory_for(self.memory, self.obj)
        return await self.watcher.observe(subject, self.memory)

    def condition(self) -> dict[str, Any] | None:
        return get_condition(self.obj, c.ConditionType.BOOTSTRAP_SUCCEEDED)


async def test_a_silent_agent_is_a_timeout_at_the_deadline_then_asked_slowly() -> None:
    bed = _Bed(_Host(GuestFileState.AGENT_UNAVAILABLE, log=b"[  OK  ] Reached target Basic\n"))
    assert await bed.observe() == 15
    assert bed.condition() is None
    bed.clock.advance(5)
    assert await bed.observe() == 10  # not asked again before the poll interval
    assert len(bed.host.file_reads) == 1
    for _ in range(200):
        bed.clock.advance(15)
        if await bed.observe() == 60:
            break
    asked = len(bed.host.file_reads)
    assert asked == 1200 // 15 + 1
    cond = bed.condition()
    assert cond is not None
    assert (cond["status"], cond["reason"]) == ("False", c.Reason.BOOTSTRAP_TIMED_OUT)
    assert AGENT_SILENT in cond["message"]
    assert cond["message"].endswith("Reached target Basic")
    assert [e[2] for e in bed.recorder.events] == [c.Reason.BOOTSTRAP_TIMED_OUT]
    bed.clock.advance(60)
    assert await bed.observe() == 60
    assert len(bed.host.file_reads) == asked + 1
    # the guest finally joins: True, never asked again
    bed.clock.advance(60)
    assert await bed.observe(node_joined=True) is None
    cond = bed.condition()
    assert cond is not None
    assert cond["status"] == "True"
    assert "nodeRef" in cond["message"]
    assert len(bed.recorder.events) == 1


async def test_a_node_that_joins_before_the_agent_answers_is_true() -> None:
    bed = _Bed(_Host(GuestFileState.AGENT_UNAVAILABLE))
    assert await bed.observe() == 15
    assert bed.condition() is None
    bed.clock.advance(15)
    assert await bed.observe(node_joined=True) is None
    cond = bed.condition()
    assert cond is not None
    assert (cond["status"], cond["reason"]) == ("True", c.Reason.BOOTSTRAP_SUCCEEDED)
    assert len(bed.host.file_reads) == 2
    bed.clock.advance(600)
    assert await bed.observe(node_joined=True) is None
    assert len(bed.host.file_reads) == 2


async def test_unsupported_driver_is_asked_once() -> None:
    bed = _Bed(_Host(GuestFileState.UNSUPPORTED))
    assert await bed.observe() is None
    bed.clock.advance(60)
    assert await bed.observe() is None
    assert len(bed.host.file_reads) == 1
    assert bed.condition() is None


async def test_unreachable_host_changes_nothing_and_retries() -> None:
    bed = _Bed(_Host(HostUnreachable("gone", host="h"), GuestFileState.ABSENT))
    assert await bed.observe() == 15
    assert bed.condition() is None
    bed.clock.advance(15)
    assert await bed.observe() == 15
    cond = bed.condition()
    assert cond is not None
    assert cond["reason"] == c.Reason.WAITING_FOR_BOOTSTRAP


async def test_waiting_then_succeeded_then_never_asked_again() -> None:
    bed = _Bed(_Host(GuestFileState.ABSENT, GuestFileState.ABSENT, GuestFileState.PRESENT))
    assert await bed.observe() == 15
    cond = bed.condition()
    assert cond is not None
    assert (cond["status"], cond["reason"]) == ("False", c.Reason.WAITING_FOR_BOOTSTRAP)
    assert SUCCESS_FILE in cond["message"]
    first = dict(cond)
    bed.clock.advance(15)
    assert await bed.observe() == 15
    assert bed.condition() == first  # unchanged: no status patch while waiting
    bed.clock.advance(15)
    assert await bed.observe() is None
    cond = bed.condition()
    assert cond is not None
    assert (cond["status"], cond["reason"]) == ("True", c.Reason.BOOTSTRAP_SUCCEEDED)
    bed.clock.advance(600)
    assert await bed.observe() is None
    assert len(bed.host.file_reads) == 3
    assert bed.recorder.events == []
    assert bed.host.tail_reads == []


async def test_true_condition_after_a_restart_is_not_asked() -> None:
    bed = _Bed(_Host(GuestFileState.ABSENT))
    bed.obj["status"]["conditions"].append({**TRUE, "lastTransitionTime": rfc3339(0)})
    assert await bed.observe() is None
    assert bed.host.file_reads == []


async def test_node_ref_turns_a_waiting_condition_true_without_asking() -> None:
    bed = _Bed(_Host(GuestFileState.ABSENT))
    await bed.observe()
    assert await bed.observe(node_joined=True) is None
    cond = bed.condition()
    assert cond is not None
    assert cond["status"] == "True"
    assert len(bed.host.file_reads) == 1


async def test_timeout_reports_the_redacted_console_tail_and_warns_once() -> None:
    noise = "".join(f"[ {i:4d}.000] boot noise\n" for i in range(2000))
    log = (noise + KUBEADM_INIT + PEM + "\nkubelet: waiting for the API server\n").encode()
    bed = _Bed(_Host(GuestFileState.ABSENT, log=log))
    with structlog.testing.capture_logs() as logs:
        assert await bed.observe() == 15
        for _ in range(200):
            bed.clock.advance(15)
            if await bed.observe() == 60:
                break
        cond = bed.condition()
        assert cond is not None
        assert (cond["status"], cond["reason"]) == ("False", c.Reason.BOOTSTRAP_TIMED_OUT)
        assert cond["message"].startswith("bootstrap did not finish within 20m")
        assert cond["message"].endswith("kubelet: waiting for the API server")
        assert "[redacted PEM block]" in cond["message"]
        assert "kubeadm join api.lab.example:6443 --token [redacted]" in cond["message"]
        assert len(cond["message"].encode()) <= OPTIONS.tail_bytes + 512
        lines = cond["message"].split("\n")[1:]
        assert len(lines) <= OPTIONS.tail_lines
        assert bed.host.tail_reads == [("pool", "m1-console.log", OPTIONS.read_bytes)]
        (event,) = bed.recorder.events
        name, type_, reason, message = event
        assert (name, type_, reason) == ("m1", "Warning", c.Reason.BOOTSTRAP_TIMED_OUT)
        assert len(message) <= MAX_MESSAGE
        assert message.endswith("kubelet: waiting for the API server")
        # later checks: slow polling, the tail read again each time (the message follows
        # the console), no second event and no second warning line
        for _ in range(3):
            bed.clock.advance(60)
            assert await bed.observe() == 60
        assert len(bed.recorder.events) == 1
        assert len(bed.host.tail_reads) == 4
        assert bed.condition() == cond  # the same console: the same condition
        bed.host.log = log + b"[ 1300.000] kubeadm: error execution phase preflight\n"
        bed.clock.advance(60)
        assert await bed.observe() == 60
        later = bed.condition()
        assert later is not None
        assert later["message"].endswith("kubeadm: error execution phase preflight")
        assert later["lastTransitionTime"] == cond["lastTransitionTime"]
        assert len(bed.recorder.events) == 1
        assert sum(e["event"] == "bootstrap timed out" for e in logs) == 1
    for text in (cond["message"], message, repr(logs)):
        _clean(text)
    # a restarted manager (new memory) sees the condition and does not warn again
    restarted = BootstrapWatcher(recorder=bed.recorder, clock=bed.clock, options=OPTIONS)
    bed.watcher = restarted
    bed.clock.advance(60)
    assert await bed.observe() == 60
    assert len(bed.recorder.events) == 1
    # a late success still counts
    bed.host.states = [GuestFileState.PRESENT]
    bed.clock.advance(60)
    assert await bed.observe() is None
    cond = bed.condition()
    assert cond is not None
    assert cond["status"] == "True"


async def test_timeout_without_a_console_log_says_so() -> None:
    class _NoLog(_Host):
        async def read_volume_tail(self, *, pool: str, name: str, limit: int) -> None:
            return None

    bed = _Bed(_NoLog(GuestFileState.ABSENT), options=BootstrapOptions(timeout=30, poll=15))
    bed.clock.advance(31)
    assert await bed.observe() == 60
    cond = bed.condition()
    assert cond is not None
    assert cond["reason"] == c.Reason.BOOTSTRAP_TIMED_OUT
    assert cond["message"].endswith("the host has no serial console log of the domain to show")


def test_the_manager_flag() -> None:
    from capl.cli import build_parser
    from capl.manager import options_from_args

    def options(*args: str) -> BootstrapOptions:
        parsed = build_parser().parse_args(["manager", *args])
        return options_from_args(parsed).machine.bootstrap

    assert options().timeout == 1200.0 == BootstrapOptions().timeout
    assert options("--bootstrap-timeout=45m").timeout == 2700.0
    with pytest.raises(SystemExit):
        options("--bootstrap-timeout=0")


def test_agent_file_read_in_the_adapter(monkeypatch: pytest.MonkeyPatch) -> None:
    """capl.virt.agent: open/read/close with base64 chunks; libvirt's errors as states."""
    import json

    import libvirt

    from capl.virt import agent

    def error(code: int, message: str) -> libvirt.libvirtError:
        exc = libvirt.libvirtError(message)
        exc.err = (code, 0, message, 2, None, None, None, 0, 0)
        return exc

    content = b"success\n" * 3
    sent: list[dict[str, Any]] = []
    failure: list[libvirt.libvirtError] = []

    def command(domain: object, request: str, timeout: int, flags: int) -> str:
        body = json.loads(request)
        sent.append(body)
        assert timeout == agent.AGENT_TIMEOUT
        if failure:
            raise failure[0]
        if body["execute"] == "guest-file-open":
            return json.dumps({"return": 7})
        if body["execute"] == "guest-file-read":
            reads = sum(1 for b in sent if b["execute"] == "guest-file-read")
            chunk = content[(reads - 1) * 10 : reads * 10]
            done = reads * 10 >= len(content)
            b64 = base64.b64encode(chunk).decode()
            return json.dumps({"return": {"count": len(chunk), "buf-b64": b64, "eof": done}})
        return json.dumps({"return": {}})

    class _Conn:
        def getURI(self) -> str:
            return "qemu:///system"

        def lookupByUUIDString(self, uuid: str) -> object:
            return object()

    monkeypatch.setattr(agent.libvirt_qemu, "qemuAgentCommand", command)
    found = agent.read_file(_Conn(), "u", SUCCESS_FILE, 4096)
    assert (found.state, found.data) == (GuestFileState.PRESENT, content)
    assert sent[0]["execute"] == "guest-file-open"
    assert sent[-1] == {"execute": "guest-file-close", "arguments": {"handle": 7}}
    sent.clear()
    assert agent.read_file(_Conn(), "u", SUCCESS_FILE, 12).data == content[:12]
    assert sent[-1]["execute"] == "guest-file-close"

    cases = [
        (libvirt.VIR_ERR_AGENT_UNRESPONSIVE, "QEMU guest agent is not connected",
         GuestFileState.AGENT_UNAVAILABLE),
        (libvirt.VIR_ERR_OPERATION_INVALID, "domain is not running",
         GuestFileState.AGENT_UNAVAILABLE),
        (libvirt.VIR_ERR_ARGUMENT_UNSUPPORTED, "QEMU guest agent is not configured",
         GuestFileState.UNSUPPORTED),
        (libvirt.VIR_ERR_INTERNAL_ERROR, "unable to execute QEMU agent command 'guest-file-open':"
         " The command guest-file-open has been disabled for this instance",
         GuestFileState.UNSUPPORTED),
        (libvirt.VIR_ERR_INTERNAL_ERROR, "unable to execute QEMU agent command 'guest-file-open':"
         f" failed to open file '{SUCCESS_FILE}' (mode: 'r'): No such file or directory",
         GuestFileState.ABSENT),
    ]  # fmt: skip
    for code, text, state in cases:
        failure[:] = [error(code, text)]
        assert agent.read_file(_Conn(), "u", SUCCESS_FILE, 4096).state is state, text
    failure[:] = [error(libvirt.VIR_ERR_INTERNAL_ERROR, "something else")]
    with pytest.raises(libvirt.libvirtError):
        agent.read_file(_Conn(), "u", SUCCESS_FILE, 4096)

    class _TestDriver(_Conn):
        def getURI(self) -> str:
            return "test:///default"

    sent.clear()
    assert agent.read_file(_TestDriver(), "u", SUCCESS_FILE, 4096).state is (
        GuestFileState.UNSUPPORTED
    )
    assert sent == []
