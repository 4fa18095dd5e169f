"""OpenAI response shapes, built from relayed event dicts.

A request's ``id`` is its request id (``cmpl-…`` or ``chatcmpl-…``), so the id a client
sees is the one it resumes or cancels with; the id also carries the response shape and
the ``created`` time, so any edge resumes a stream exactly as it began.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from services.edge.relay import Event
from services.edge.sse import frame
from services.edge.structured import CALL_HEAD, call_id, split_call

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
    """The OpenAI error object for a stream that ended in an error event, or was
    cancelled (OpenAI's finish reasons have no "cancelled": the stream ends with an
    error ``request_cancelled`` instead)."""
    if ev.get("finish_reason") == CANCELLED and not ev.get("error"):
        return {
            "message": "the request was cancelled before it finished",
            "type": "invalid_request_error",
            "code": CANCELLED_CODE,
        }
    err = ev.get("error") or {}
    code = err.get("code", "internal")
    kind = "invalid_request_error" if code in CLIENT_ERROR_CODES else "server_error"
    return {"message": err.get("message", "generation failed"), "type": kind, "code": code}


def ends_badly(ev: Event) -> bool:
    """Whether ``ev`` ends its stream without an answer: an error, or a cancel."""
    return bool(ev.get("error")) or ev.get("finish_reason") == CANCELLED


def error_status(err: dict[str, Any]) -> int:
    """The HTTP status of a non-streamed response that ended in ``err``."""
    if err["code"] == CANCELLED_CODE:
        return 409
    return 400 if err["code"] in CLIENT_ERROR_CODES else 500


# Error codes a worker or batcher reports that are the request's fault (HTTP 400).
CLIENT_ERROR_CODES = frozenset({"invalid_request", "invalid", "undecodable"})
CANCELLED = "cancelled"
CANCELLED_CODE = "request_cancelled"


def fingerprint_of(model_identity: str) -> str:
    """``system_fingerprint``: changes when anything that decides the output does (the
    model folder's identity: weights, config, tokenizer, template)."""
    return "fp_" + hashlib.blake2b(model_identity.encode(), digest_size=5).hexdigest()


@dataclass
class ChoiceResult:
    """One choice of a non-streamed response, gathered from its events."""

    index: int
    text: str
    last: Event  # its final event
    token_ids: list[int] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)  # those that carry log-probabilities


@dataclass
class Shape:
    """The OpenAI response shapes of one request (text or chat completion). Events of a
    response with several choices carry their choice's ``index``; without one, choice 0."""

    request_id: str
    model: str
    created: int
    # vLLM's ``return_token_ids``: each choice also carries the token ids it adds.
    token_ids: bool = False
    # A token's text, for log-probabilities (events carry ids only).
    token_text: Callable[[int], str] = str
    # The output may be a tool call (chat with tools): rendered as ``tool_calls``.
    tools: bool = False
    fingerprint: str | None = None  # ``system_fingerprint``
    # ``echo``: each choice's prompt text, put before its first text.
    echo: list[str] | None = None
    # Several choices, each its own stream: SSE frames carry no ``id`` (no single seq
    # orders them; such responses are not resumable).
    multi: bool = False
    chat: bool = field(init=False)
    _calls: dict[int, _CallStream] = field(init=False, default_factory=dict)
    _prefixes: dict[int, bytes] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.chat = is_chat_id(self.request_id)
        self._obj = "chat.completion.chunk" if self.chat else "text_completion"
        # Each token's chunk is a prefix, its text and a fixed tail: the per-event path
        # encodes one string rather than a nested dict.
        self._tail = b',"logprobs":null,"finish_reason":null}]}'

    def _prefix(self, index: int) -> bytes:
        prefix = self._prefixes.get(index)
        if prefix is None:
            head = orjson.dumps(self.head(self._obj))
            prefix = head[:-1] + b',"choices":[{"index":%d,' % index
            self._prefixes[index] = prefix
        return prefix

    def head(self, obj: str) -> dict[str, Any]:
        head = {"id": self.request_id, "object": obj, "created": self.created, "model": self.model}
        if self.fingerprint is not None:
            head["system_fingerprint"] = self.fingerprint
        return head

    def _text(self, ev: Event) -> str:
        """The event's text, after its choice's prompt on the first event (``echo``)."""
        text: str = ev.get("text", "")
        if self.echo is not None and ev["seq"] == 0:
            return self.echo[ev.get("index", 0)] + text
        return text

    def chunk_json(self, ev: Event) -> bytes:
        """One event as the JSON of a streamed chunk."""
        if ev.get("finish_reason") is None and ev.get("logprobs") is None:
            text = orjson.dumps(self._text(ev))
            tail = self._tail
            if self.token_ids:
                tail = b',"token_ids":' + orjson.dumps(ev.get("token_ids", [])) + tail
            prefix = self._prefix(ev.get("index", 0))
            if not self.chat:
                return prefix + b'"text":' + text + tail
            role = b'"role":"assistant",' if ev["seq"] == 0 else b""
            return prefix + b'"delta":{' + role + b'"content":' + text + b"}" + tail
        return orjson.dumps(self.final_chunk(ev))

    def final_chunk(self, ev: Event) -> dict[str, Any]:
        """A chunk built as a dict: the final one, or one that carries log-probabilities."""
        finish = ev.get("finish_reason")
        text = self._text(ev)
        index = ev.get("index", 0)
        logprobs = self.logprobs([ev]) if ev.get("logprobs") is not None else None
        if self.chat:
            delta: dict[str, Any] = {"content": text}
            if ev["seq"] == 0:
                delta["role"] = "assistant"
            choice = {"index": index, "delta": delta, **self._ids(ev.get("token_ids", []))}
            choice.update(logprobs=logprobs, finish_reason=finish)
            return {**self.head("chat.completion.chunk"), "choices": [choice]}
        choice = {"index": index, "text": text, **self._ids(ev.get("token_ids", []))}
        choice.update(logprobs=logprobs, finish_reason=finish)
        return {**self.head("text_completion"), "choices": [choice]}

    def logprobs(self, events: list[Event]) -> dict[str, Any]:
        """The ``logprobs`` of a choice made of ``events``, in the chat shape
        (``content``: one entry per token) or the completions one (parallel lists)."""
        entries = [
            (e, ev.get("text_offset") or 0) for ev in events for e in ev.get("logprobs") or ()
        ]
        if self.chat:
            return {"content": [self._chat_logprob(e) for e, _ in entries], "refusal": None}
        tokens, offsets = [], []
        at, last_start = 0, -1
        for e, start in entries:
            if start != last_start:  # each event's tokens count from where its text starts
                at, last_start = start, start
            piece = self.token_text(e["token_id"])
            tokens.append(piece)
            offsets.append(at)
            at += len(piece)
        return {
            "tokens": tokens,
            "token_logprobs": [e["logprob"] for e, _ in entries],
            "top_logprobs": [
                {self.token_text(t["token_id"]): t["logprob"] for t in e.get("top", ())}
                for e, _ in entries
            ],
            "text_offset": offsets,
        }

    def _chat_logprob(self, e: dict[str, Any]) -> dict[str, Any]:
        def one(token_id: int, logprob: float) -> dict[str, Any]:
            text = self.token_text(token_id)
            return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

        return {
            **one(e["token_id"], e["logprob"]),
            "top_logprobs": [one(t["token_id"], t["logprob"]) for t in e.get("top", ())],
        }

    def _ids(self, token_ids: list[int]) -> dict[str, Any]:
        return {"token_ids": token_ids} if self.token_ids else {}

    def usage_chunk(self, ev: Event) -> bytes | None:
        """The extra chunk with ``usage`` and no choices (``stream_options.include_usage``)."""
        usage = usage_of(ev)
        if usage is None:
            return None
        return frame({**self.head(self._obj), "choices": [], "usage": usage})

    def _frame(self, ev: Event, data: bytes) -> bytes:
        if self.multi:
            return b"data: %s\n\n" % data
        return b"id: %d\ndata: %s\n\n" % (ev["seq"], data)

    def sse(self, ev: Event) -> bytes:
        """One event as SSE: a frame whose ``id`` is its seq (one choice), an error frame
        for a stream that ended without an answer."""
        if ends_badly(ev):
            head = b""
            if ev.get("text") and not ev.get("error"):  # a cancel's last text still counts
                head = self._frame(ev, self.chunk_json({**ev, "finish_reason": None}))
            return head + frame({"error": error_of(ev)}, None if self.multi else ev["seq"])
        if self.tools and self.chat:
            return self._tool_sse(ev)
        return self._frame(ev, self.chunk_json(ev))

    def _tool_sse(self, ev: Event) -> bytes:
        """An event of a chat that may call a tool. Text not starting with ``{`` streams
        as content; a call streams as OpenAI streams one: a first ``delta.tool_calls``
        with the index, id and name, then fragments of the arguments (the closing brace
        of the call held back until the end), then ``finish_reason: tool_calls``."""
        index = ev.get("index", 0)
        call = self._calls.get(index)
        if call is None and (ev.get("text") or ev.get("finish_reason")):
            call = self._calls[index] = _CallStream(is_call=ev.get("text", "").startswith("{"))
        if call is None or not call.is_call:
            return self._frame(ev, self.chunk_json(ev))
        chunks = []
        call_id_ = call_id(self.request_id, index)
        for delta in call.push(ev.get("text", ""), call_id_):
            chunks.append(self._tool_chunk(index, delta, None))
        finish = ev.get("finish_reason")
        if finish is not None:
            for delta in call.end(finish == "stop"):
                chunks.append(self._tool_chunk(index, delta, None))
            finish = "tool_calls" if finish == "stop" and call.named else finish
            chunks.append(self._tool_chunk(index, None, finish))
        return b"".join(self._frame(ev, orjson.dumps(c)) for c in chunks)

    def _tool_chunk(
        self, index: int, call: dict[str, Any] | None, finish: str | None
    ) -> dict[str, Any]:
        delta: dict[str, Any] = {}
        if call is not None:
            if "id" in call:
                delta.update(role="assistant", content=None)
            delta["tool_calls"] = [call]
        choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {**self.head("chat.completion.chunk"), "choices": [choice]}

    def whole(
        self,
        text: str,
        last: Event,
        token_ids: list[int] | None = None,
        events: list[Event] | None = None,
    ) -> dict[str, Any]:
        """The non-streamed response of one choice; ``events`` carry the
        log-probabilities, if asked."""
        return self.whole_choices(
            [ChoiceResult(0, text, last, token_ids or [], events or [])], last
        )

    def whole_choices(self, choices: list[ChoiceResult], final: Event) -> dict[str, Any]:
        """The non-streamed response: ``choices`` in index order, ``final`` carries the
        usage of the whole response."""
        obj = "chat.completion" if self.chat else "text_completion"
        return {
            **self.head(obj),
            "choices": [self._choice(c) for c in choices],
            "usage": usage_of(final),
        }

    def _choice(self, c: ChoiceResult) -> dict[str, Any]:
        finish = c.last.get("finish_reason")
        ids = self._ids(c.token_ids)
        asked = any(ev.get("logprobs") is not None for ev in c.events)
        logprobs = self.logprobs(c.events) if asked else None
        text = (self.echo[c.index] if self.echo is not None else "") + c.text
        if not self.chat:
            return {
                "index": c.index,
                "text": text,
                **ids,
                "logprobs": logprobs,
                "finish_reason": finish,
            }
        call = split_call(text) if self.tools else None
        if call is not None:
            name, arguments = call
            fn = {"name": name, "arguments": arguments}
            calls = [{"id": call_id(self.request_id, c.index), "type": "function", "function": fn}]
            msg: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": calls}
            finish = "tool_calls" if finish == "stop" else finish
        else:
            msg = {"role": "assistant", "content": text}
        return {
            "index": c.index,
            "message": msg,
            **ids,
            "finish_reason": finish,
            "logprobs": logprobs,
        }


@dataclass
class _CallStream:
    """A tool call being streamed: the text until its name is known, then the arguments
    but their last character (the call's closing brace, dropped at the end)."""

    is_call: bool
    buffer: str = ""
    named: bool = False

    def push(self, text: str, call_id_: str) -> list[dict[str, Any]]:
        self.buffer += text
        out = []
        if not self.named:
            head = CALL_HEAD.match(self.buffer)
            if head is None:
                return []
            self.named = True
            self.buffer = self.buffer[head.end() :]
            fn = {"name": head.group(1), "arguments": ""}
            out.append({"index": 0, "id": call_id_, "type": "function", "function": fn})
        if len(self.buffer) > 1:
            out.append({"index": 0, "function": {"arguments": self.buffer[:-1]}})
            self.buffer = self.buffer[-1:]
        return out

    def end(self, complete: bool) -> list[dict[str, Any]]:
        """What is left: all of it when the call was cut short, without the closing brace
        when it completed."""
        rest = self.buffer[:-1] if complete and self.buffer.endswith("}") else self.buffer
        self.buffer = ""
        if not self.named or not rest:
            return []
        return [{"index": 0, "function": {"arguments": rest}}]
