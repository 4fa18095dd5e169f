"""OpenAI response shapes, built from relayed event dicts.

A request's ``id`` is its request id (``cmpl-…`` or ``chatcmpl-…``), so the id a client
sees is the one it resumes or cancels with; the id also carries the response shape and
the ``created`` time, so any edge resumes a stream exactly as it began.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import orjson

from services.edge.relay import Event
from services.edge.sse import frame

CHAT_PREFIX = "chatcmpl-"
TEXT_PREFIX = "cmpl-"


def is_chat_id(request_id: str) -> bool:
    return request_id.startswith(CHAT_PREFIX)


def new_request_id(chat: bool, created: float) -> str:
    """``cmpl-``/``chatcmpl-``, the creation second (8 hex digits), 24 random hex digits:
    the id alone tells a resuming edge the response shape and its ``created`` time."""
    prefix = CHAT_PREFIX if chat else TEXT_PREFIX
    return f"{prefix}{int(created) & 0xFFFFFFFF:08x}{uuid.uuid4().hex[:24]}"


def created_of(request_id: str) -> int:
    """The creation time encoded in an id made by ``new_request_id`` (now, for others)."""
    stamp = request_id.removeprefix(CHAT_PREFIX).removeprefix(TEXT_PREFIX)[:8]
    try:
        return int(stamp, 16)
    except ValueError:
        return int(time.time())


def usage_of(ev: Event) -> dict[str, Any] | None:
    u = ev.get("usage")
    if not u:
        return None
    prompt, completion = u.get("prompt_tokens", 0), u.get("completion_tokens", 0)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": u.get("cached_tokens", 0)},
    }


def error_of(ev: Event) -> dict[str, Any]:
    """The OpenAI error object for a stream that ended in an error event."""
    err = ev.get("error") or {}
    code = err.get("code", "internal")
    kind = "invalid_request_error" if code in CLIENT_ERROR_CODES else "server_error"
    return {"message": err.get("message", "generation failed"), "type": kind, "code": code}


# Error codes a worker or batcher reports that are the request's fault (HTTP 400).
CLIENT_ERROR_CODES = frozenset({"invalid_request", "invalid", "undecodable"})


@dataclass
class Shape:
    """The OpenAI response shapes of one request (text or chat completion)."""

    request_id: str
    model: str
    created: int
    # vLLM's ``return_token_ids``: each choice also carries the token ids it adds.
    token_ids: bool = False
    chat: bool = field(init=False)

    def __post_init__(self) -> None:
        self.chat = is_chat_id(self.request_id)
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        # Each token's chunk is this prefix, its text and a fixed tail: the per-event path
        # encodes one string rather than a nested dict.
        head = orjson.dumps(
            {"id": self.request_id, "object": obj, "created": self.created, "model": self.model}
        )
        self._prefix = head[:-1] + b',"choices":[{"index":0,'
        self._tail = b',"logprobs":null,"finish_reason":null}]}'

    def head(self, obj: str) -> dict[str, Any]:
        return {"id": self.request_id, "object": obj, "created": self.created, "model": self.model}

    def chunk_json(self, ev: Event) -> bytes:
        """One event as the JSON of a streamed chunk."""
        if ev.get("finish_reason") is None:
            text = orjson.dumps(ev.get("text", ""))
            tail = self._tail
            if self.token_ids:
                tail = b',"token_ids":' + orjson.dumps(ev.get("token_ids", [])) + tail
            if not self.chat:
                return self._prefix + b'"text":' + text + tail
            role = b'"role":"assistant",' if ev["seq"] == 0 else b""
            return self._prefix + b'"delta":{' + role + b'"content":' + text + b"}" + tail
        return orjson.dumps(self.final_chunk(ev))

    def final_chunk(self, ev: Event) -> dict[str, Any]:
        finish = ev["finish_reason"]
        text = ev.get("text", "")
        if self.chat:
            delta: dict[str, Any] = {"content": text}
            if ev["seq"] == 0:
                delta["role"] = "assistant"
            choice = {"index": 0, "delta": delta, **self._ids(ev.get("token_ids", []))}
            choice.update(logprobs=None, finish_reason=finish)
            return {**self.head("chat.completion.chunk"), "choices": [choice]}
        choice = {"index": 0, "text": text, **self._ids(ev.get("token_ids", []))}
        choice.update(logprobs=None, finish_reason=finish)
        return {**self.head("text_completion"), "choices": [choice]}

    def _ids(self, token_ids: list[int]) -> dict[str, Any]:
        return {"token_ids": token_ids} if self.token_ids else {}

    def usage_chunk(self, ev: Event) -> bytes | None:
        """The extra chunk with ``usage`` and no choices (``stream_options.include_usage``)."""
        usage = usage_of(ev)
        if usage is None:
            return None
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return frame({**self.head(obj), "choices": [], "usage": usage})

    def sse(self, ev: Event) -> bytes:
        """One event as an SSE frame whose ``id`` is its seq."""
        if ev.get("error"):
            return frame({"error": error_of(ev)}, ev["seq"])
        return b"id: %d\ndata: %s\n\n" % (ev["seq"], self.chunk_json(ev))

    def whole(self, text: str, last: Event, token_ids: list[int] | None = None) -> dict[str, Any]:
        """The non-streamed response."""
        finish = last.get("finish_reason")
        ids = self._ids(token_ids or [])
        if self.chat:
            msg = {"role": "assistant", "content": text}
            choice = {"index": 0, "message": msg, **ids, "finish_reason": finish, "logprobs": None}
            return {**self.head("chat.completion"), "choices": [choice], "usage": usage_of(last)}
        choice = {"index": 0, "text": text, **ids, "logprobs": None, "finish_reason": finish}
        return {**self.head("text_completion"), "choices": [choice], "usage": usage_of(last)}
