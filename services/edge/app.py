"""The edge's HTTP API (OpenAI-compatible).

A request is validated, given a request id and seed, published to the requests topic, and
answered from the request's Redis token stream: relayed as SSE when ``stream`` is true,
gathered into one JSON body otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from aiokafka import AIOKafkaProducer
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse

from services.edge.config import EdgeSettings
from services.edge.openai_api import ChatBody, CompletionBody
from services.edge.sse import DONE, KEEPALIVE, frame
from shared import token_stream
from shared.codec import encode
from shared.kafka_io import make_producer
from shared.messages import GenerateRequest, TokenEvent


def error_body(status: int, message: str, kind: str, code: str | None = None) -> JSONResponse:
    """An OpenAI-style error response."""
    return JSONResponse(
        {"error": {"message": message, "type": kind, "param": None, "code": code}},
        status_code=status,
    )


@dataclass
class EdgeState:
    settings: EdgeSettings
    redis: aioredis.Redis
    producer: AIOKafkaProducer


def create_app(settings: EdgeSettings) -> FastAPI:
    """The edge application; Kafka and Redis clients live for the app's lifespan."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        producer = make_producer(settings, client_id="edge")
        await producer.start()
        client = aioredis.Redis.from_url(settings.redis_url)
        app.state.edge = EdgeState(settings, client, producer)
        try:
            yield
        finally:
            await producer.stop()
            await client.aclose()

    app = FastAPI(title="tokenwire edge", version="0.1.0", lifespan=lifespan)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        if not errors:
            return error_body(400, "invalid request", "invalid_request_error")
        loc = ".".join(str(p) for p in errors[0]["loc"] if p != "body")
        msg = str(errors[0]["msg"])
        return error_body(400, f"{loc}: {msg}" if loc else msg, "invalid_request_error")

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {
                    "id": settings.model_name,
                    "object": "model",
                    "created": 0,
                    "owned_by": "tokenwire",
                }
            ],
        }

    @app.post("/v1/completions", response_model=None)
    async def completions(body: CompletionBody, request: Request) -> Any:
        return await _serve(request.app.state.edge, body, body.to_request("default"), chat=False)

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(body: ChatBody, request: Request) -> Any:
        return await _serve(request.app.state.edge, body, body.to_request("default"), chat=True)

    return app


async def _serve(
    st: EdgeState, body: CompletionBody | ChatBody, req: GenerateRequest, *, chat: bool
) -> StreamingResponse | JSONResponse:
    if body.model != st.settings.model_name:
        return error_body(
            404, f"model '{body.model}' does not exist", "invalid_request_error", "model_not_found"
        )
    await st.producer.send_and_wait(
        st.settings.names.requests, encode(req), key=req.request_id.encode()
    )
    events = token_stream.follow(
        st.redis, st.settings.names, req.request_id, idle_timeout_s=st.settings.request_timeout_s
    )
    shape = _Shape(req, st.settings.model_name, chat)
    if req.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return StreamingResponse(
            _sse(events, shape, include_usage, st.settings.keepalive_s),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Request-Id": req.request_id},
        )
    text, last = [], None
    try:
        async for ev in events:
            text.append(ev.text)
            last = ev
    except TimeoutError:
        return error_body(504, "the request timed out", "server_error", "timeout")
    assert last is not None
    if last.error is not None:
        return error_body(
            400 if last.error.code != "internal" else 500,
            last.error.message,
            "invalid_request_error",
            last.error.code,
        )
    return JSONResponse(shape.whole("".join(text), last), headers={"X-Request-Id": req.request_id})


@dataclass
class _Shape:
    """OpenAI response shapes for one request."""

    req: GenerateRequest
    model: str
    chat: bool

    @property
    def id(self) -> str:
        return ("chatcmpl-" if self.chat else "cmpl-") + self.req.request_id

    def _head(self, obj: str) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": obj,
            "created": int(self.req.created_at),
            "model": self.model,
        }

    def chunk(self, ev: TokenEvent) -> dict[str, Any]:
        finish = ev.finish_reason.value if ev.finish_reason else None
        if self.chat:
            delta = (
                {"role": "assistant", "content": ev.text} if ev.seq == 0 else {"content": ev.text}
            )
            choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish}
            return {**self._head("chat.completion.chunk"), "choices": [choice]}
        choice = {"index": 0, "text": ev.text, "logprobs": None, "finish_reason": finish}
        return {**self._head("text_completion"), "choices": [choice]}

    def usage(self, ev: TokenEvent) -> dict[str, Any] | None:
        if ev.usage is None:
            return None
        u = ev.usage
        return {
            "prompt_tokens": u.prompt_tokens,
            "completion_tokens": u.completion_tokens,
            "total_tokens": u.total_tokens,
            "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
        }

    def whole(self, text: str, last: TokenEvent) -> dict[str, Any]:
        finish = last.finish_reason.value if last.finish_reason else None
        if self.chat:
            msg = {"role": "assistant", "content": text}
            choices = [{"index": 0, "message": msg, "finish_reason": finish, "logprobs": None}]
            return {**self._head("chat.completion"), "choices": choices, "usage": self.usage(last)}
        choices = [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}]
        return {**self._head("text_completion"), "choices": choices, "usage": self.usage(last)}


async def _sse(
    events: AsyncIterator[TokenEvent], shape: _Shape, include_usage: bool, keepalive_s: float
) -> AsyncIterator[bytes]:
    """Relay events as SSE (``id:`` is the event's seq), with keep-alive comments."""
    it = aiter(events)
    nxt: asyncio.Task[TokenEvent] | None = None
    try:
        while True:
            nxt = nxt or asyncio.ensure_future(anext(it))
            done, _ = await asyncio.wait({nxt}, timeout=keepalive_s)
            if not done:
                yield KEEPALIVE
                continue
            try:
                ev = nxt.result()
            except StopAsyncIteration:
                break
            except TimeoutError:
                yield frame(
                    {
                        "error": {
                            "message": "the request timed out",
                            "type": "server_error",
                            "code": "timeout",
                        }
                    }
                )
                break
            nxt = None
            if ev.error is not None:
                yield frame(
                    {
                        "error": {
                            "message": ev.error.message,
                            "type": "invalid_request_error",
                            "code": ev.error.code,
                        }
                    },
                    ev.seq,
                )
                break
            yield frame(shape.chunk(ev), ev.seq)
            if ev.final:
                usage = shape.usage(ev)
                if include_usage and usage:
                    yield frame(
                        {**shape._head(shape.chunk(ev)["object"]), "choices": [], "usage": usage}
                    )
                break
        yield DONE
    finally:
        if nxt is not None and not nxt.done():
            nxt.cancel()
            with contextlib.suppress(BaseException):
                await nxt
        await it.aclose()  # type: ignore[attr-defined]
