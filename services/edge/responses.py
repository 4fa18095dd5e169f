"""Responses that relay a request's event stream: SSE, or one JSON body at the end.

Both are plain ASGI callables (Starlette ``Response`` subclasses, so routes can return
them) that own their ``EventStream``: they watch for the client going away while they wait,
unsubscribe deterministically, and cancel the request on a disconnect when asked to.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from services.edge.cancel import cancel_in_background
from services.edge.choices import ChoiceStreams
from services.edge.relay import Event, EventStream
from services.edge.shapes import ChoiceResult, Shape, ends_badly, error_of, error_status
from services.edge.sse import DONE, KEEPALIVE, frame
from services.edge.state import EdgeState
from shared.tasks import cancel_and_wait

CACHE_HEADER = b"x-tokenwire-cache"
SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


@dataclass
class RelayPlan:
    """What a relay needs besides the stream."""

    st: EdgeState
    stream: EventStream | ChoiceStreams
    shape: Shape
    tenant: str
    cancel_on_disconnect: bool
    include_usage: bool = False
    created_at: float | None = None  # the request's creation (wall clock), for the metric
    cache: str = "miss"  # x-tokenwire-cache: miss, exact or semantic


class _Relay(Response):
    def __init__(self, plan: RelayPlan) -> None:
        super().__init__(status_code=200)
        self.plan = plan

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        plan = self.plan
        plan.st.metrics.streams.inc()
        completed = False
        try:
            completed = await _until_disconnect(receive, self.relay(send))
        finally:
            plan.stream.close()
            plan.st.metrics.streams.dec()
            # A client gone cancels what it would have read; a response ended by one
            # choice's failure cancels its other choices.
            gone = not completed and plan.cancel_on_disconnect
            if gone or plan.stream.finished:
                source = "disconnect" if gone else "failed"
                for rid in plan.stream.unfinished():
                    plan.st.spawn(cancel_in_background(plan.st, rid, plan.tenant, source))

    async def relay(self, send: Send) -> None:
        raise NotImplementedError

    def _count(self, events: list[Event]) -> None:
        m = self.plan.st.metrics
        m.events.inc(len(events))
        if self.plan.created_at is not None:
            ttft = max(0.0, time.time() - self.plan.created_at)
            m.first_event.observe(ttft)
            self.plan.st.cache.metrics.ttft.labels(self.plan.cache).observe(ttft)
            self.plan.created_at = None


class SseRelay(_Relay):
    """Relays events as SSE: ``id:`` is the seq, comments keep idle connections open,
    ``data: [DONE]`` ends the stream."""

    async def relay(self, send: Send) -> None:
        plan = self.plan
        stream, shape = plan.stream, plan.shape
        settings = plan.st.settings
        headers = [
            *SSE_HEADERS,
            (b"x-request-id", stream.request_id.encode()),
            (CACHE_HEADER, plan.cache.encode()),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        loop = asyncio.get_running_loop()
        idle_since = loop.time()
        while True:
            events = await stream.next(settings.keepalive_s)
            if not events:
                if stream.finished:  # resumed after the final event: nothing is missing
                    await _body(send, DONE, more=False)
                    return
                if loop.time() - idle_since > settings.request_timeout_s:
                    err = {"message": "the request timed out", "type": "server_error"}
                    await _body(send, frame({"error": {**err, "code": "timeout"}}) + DONE, False)
                    return
                await _body(send, KEEPALIVE, more=True)
                continue
            idle_since = loop.time()
            self._count(events)
            out = b"".join([shape.sse(ev) for ev in events])
            if not stream.finished:
                await _body(send, out, more=True)
                continue
            final = stream.final_event or events[-1]
            usage = shape.usage_chunk(final) if plan.include_usage else None
            await _body(send, out + (usage or b"") + DONE, more=False)
            return


class JsonRelay(_Relay):
    """Gathers the whole stream and answers once, in the OpenAI non-streamed shape."""

    async def relay(self, send: Send) -> None:
        plan = self.plan
        stream = plan.stream
        loop = asyncio.get_running_loop()
        idle_since = loop.time()
        choices: dict[int, ChoiceResult] = {}
        while True:
            events = await stream.next(plan.st.settings.keepalive_s)
            if not events:
                if stream.finished:
                    break
                if loop.time() - idle_since > plan.st.settings.request_timeout_s:
                    body = {"error": {"message": "the request timed out", "type": "server_error"}}
                    await _json(send, 504, body, stream.request_id, plan.cache)
                    return
                continue
            idle_since = loop.time()
            self._count(events)
            for ev in events:
                index = ev.get("index", 0)
                c = choices.get(index)
                if c is None:
                    c = choices[index] = ChoiceResult(index, "", ev)
                c.text += ev.get("text", "")
                c.token_ids += ev.get("token_ids", ())
                c.last = ev
                if ev.get("logprobs") is not None:
                    c.events.append(ev)
        last = stream.final_event or {}
        if ends_badly(last):
            err = error_of(last)
            refusal: dict[str, Any] = {"error": {**err, "param": None}}
            await _json(send, error_status(err), refusal, stream.request_id, plan.cache)
            return
        ordered = [choices[i] for i in sorted(choices)]
        whole = plan.shape.whole_choices(ordered, last)
        await _json(send, 200, whole, stream.request_id, plan.cache)


async def _body(send: Send, data: bytes, more: bool) -> None:
    await send({"type": "http.response.body", "body": data, "more_body": more})


async def _json(send: Send, status: int, body: dict[str, Any], request_id: str, cache: str) -> None:
    data = orjson.dumps(body)
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(data)).encode()),
        (b"x-request-id", request_id.encode()),
        (CACHE_HEADER, cache.encode()),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await _body(send, data, more=False)


async def _until_disconnect(receive: Receive, work: Awaitable[None]) -> bool:
    """Run ``work`` unless the client disconnects first; True when it ran to the end."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(receive))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        # Again until they end: a Redis read in the relay can lose a cancel.
        await cancel_and_wait(task, watcher)
    if not task.done():
        return False  # left behind after the stop's bound (and logged)
    if task.cancelled() or task.exception() is not None:
        exc = None if task.cancelled() else task.exception()
        if exc is not None and not isinstance(exc, OSError):
            raise exc  # a bug, not a client gone
        return False
    return True


async def _disconnected(receive: Callable[[], Awaitable[Any]]) -> None:
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            return
