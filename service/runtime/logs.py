"""Structured logs: one JSON object per line, each carrying the id of the request it belongs to.

The request id lives in a contextvar set by the request middleware, so every log call made
while serving a request (in its task) is tagged without passing the id around. Lines logged
outside a request carry `"request_id": null`.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import uuid
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any, Literal

import orjson

LogFormat = Literal["json", "text"]

request_id_var: ContextVar[str | None] = ContextVar("tandem_request_id", default=None)

# Short and safe to echo into headers and logs: no spaces, quotes, control characters or separators.
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")
# LogRecord attributes that are not user-supplied `extra` fields.
_RESERVED = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "request_id"}
# Dataclasses and datetimes go to `default=str`, as with json.dumps; orjson writes no spaces between items.
_ORJSON = orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME


def valid_request_id(value: str | None) -> str | None:
    return value if value is not None and _REQUEST_ID.match(value) else None


def new_request_id() -> str:
    return uuid.uuid4().hex


class RequestIdFilter(logging.Filter):
    """Stamps `record.request_id` from the contextvar (on handlers, so records of every logger get it)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = request_id_var.get()
        return True


class JsonFormatter(logging.Formatter):
    """time, level, logger, message, request_id, pid (which of `--processes N` logged it), any `extra={...}`
    fields, and exc_info as `exception`."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": getattr(record, "request_id", None),
            "pid": record.process,
        }
        for key, value in vars(record).items():
            if key not in _RESERVED and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        try:  # the access log formats one line per request: orjson, the cheaper encoder, on the hot path
            return orjson.dumps(entry, default=str, option=_ORJSON).decode()
        except (orjson.JSONEncodeError, TypeError):  # an integer past 64 bits, a key that is not a string
            return json.dumps(entry, default=str, ensure_ascii=False)


TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(request_id)s]: %(message)s"


def make_handler(fmt: LogFormat, stream: Any = None) -> logging.Handler:
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    handler.addFilter(RequestIdFilter())
    return handler


def configure_logging(fmt: LogFormat, level: str) -> None:
    """Route every logger (uvicorn's included) through one handler on the root logger."""
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(make_handler(fmt))
    root.setLevel(level.upper() if level != "trace" else "DEBUG")
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        uv = logging.getLogger(name)
        uv.handlers.clear()
        uv.propagate = True
    logging.getLogger("faiss.loader").setLevel(logging.WARNING)
