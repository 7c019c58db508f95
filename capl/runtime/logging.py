"""Structured logs with structlog: JSON lines by default, a console renderer on a TTY.

`configure_logging(level=..., format="auto"|"json"|"console")` sets structlog up once per process;
every log line carries the contextvars bound by the controller workers (controller, kind,
namespace, name, reconcileID). Standard-library loggers (aiohttp, asyncio) are routed through the
same renderer.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, Literal, TextIO

import structlog

LogFormat = Literal["auto", "json", "console"]

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "warn": logging.WARNING,
    "error": logging.ERROR,
}


def parse_level(level: str | int) -> int:
    if isinstance(level, int):
        return level
    try:
        return _LEVELS[level.lower()]
    except KeyError:
        raise ValueError(f"unknown log level {level!r} (debug, info, warning, error)") from None


def configure_logging(
    *,
    level: str | int = "info",
    format: LogFormat = "auto",
    stream: TextIO | None = None,
    cache: bool = True,
) -> None:
    """Configure structlog and the stdlib root logger. Call once, before creating the manager
    (loggers bound earlier keep the previous configuration when `cache` is on)."""
    out = stream if stream is not None else sys.stderr
    numeric = parse_level(level)
    console = format == "console" or (format == "auto" and out.isatty())
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: Any = (
        structlog.dev.ConsoleRenderer() if console else structlog.processors.JSONRenderer()
    )
    structlog.configure(
        processors=[
            *shared,
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info if not console else _identity,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.WriteLoggerFactory(file=out),
        cache_logger_on_first_use=cache,
    )
    handler = logging.StreamHandler(out)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info if not console else _identity,
                renderer,
            ],
            foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(max(numeric, logging.INFO) if numeric > logging.DEBUG else numeric)


def _identity(_: Any, __: str, event_dict: Any) -> Any:
    return event_dict
