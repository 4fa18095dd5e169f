"""Structured JSON logs for every service: one object per line, with the service name and,
where one is known, the request id (``extra={"request_id": ...}`` or ``request_context``)."""

from __future__ import annotations

import contextlib
import contextvars
import logging
import sys
from collections.abc import Iterator

import orjson

_request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("request_id", default=None)


@contextlib.contextmanager
def request_context(request_id: str) -> Iterator[None]:
    """Tag every log record made inside the block with ``request_id``."""
    token = _request_id.set(request_id)
    try:
        yield
    finally:
        _request_id.reset(token)


class JsonFormatter(logging.Formatter):
    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        doc = {
            "t": round(record.created, 6),
            "level": record.levelname,
            "service": self.service,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        rid = getattr(record, "request_id", None) or _request_id.get()
        if rid:
            doc["request_id"] = rid
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(doc, default=str).decode()


def setup_logging(service: str, level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(service))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
