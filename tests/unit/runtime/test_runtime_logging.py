"""Structured logs: JSON lines with the reconcile context bound by the controller."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest
import structlog

from capl.runtime.logging import configure_logging, parse_level


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    structlog.reset_defaults()
    root.handlers[:] = handlers
    root.setLevel(level)


def test_json_lines_carry_context(restore_logging: None) -> None:
    out = io.StringIO()
    configure_logging(level="info", format="json", stream=out, cache=False)
    log = structlog.get_logger("test")
    with structlog.contextvars.bound_contextvars(
        controller="libvirtmachine",
        kind="LibvirtMachine",
        namespace="ns",
        name="m",
        reconcileID="r-1",
    ):
        log.info("domain created", domain="ns_m")
        log.debug("dropped")
    logging.getLogger("aiohttp.access").warning("from stdlib")
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert len(lines) == 2
    first = lines[0]
    assert first["event"] == "domain created"
    assert first["level"] == "info"
    assert (first["controller"], first["kind"], first["namespace"], first["name"]) == (
        "libvirtmachine",
        "LibvirtMachine",
        "ns",
        "m",
    )
    assert first["reconcileID"] == "r-1"
    assert first["timestamp"].endswith("Z")
    assert lines[1]["event"] == "from stdlib"


def test_console_renderer_when_asked(restore_logging: None) -> None:
    out = io.StringIO()
    configure_logging(level="debug", format="console", stream=out, cache=False)
    structlog.get_logger("t").debug("hello", x=1)
    assert "hello" in out.getvalue()
    assert "x" in out.getvalue()


def test_levels() -> None:
    assert parse_level("WARN") == logging.WARNING
    with pytest.raises(ValueError, match="unknown log level"):
        parse_level("loud")
