"""Hand-rolled Server-Sent Events framing: one ``bytes`` per event, nothing per-event that
is not needed (measured several times faster than a framework's per-event objects)."""

from __future__ import annotations

from typing import Any

import orjson

DONE = b"data: [DONE]\n\n"
KEEPALIVE = b": keep-alive\n\n"


def frame(payload: dict[str, Any], event_id: int | None = None) -> bytes:
    head = b"id: %d\n" % event_id if event_id is not None else b""
    return head + b"data: " + orjson.dumps(payload) + b"\n\n"
