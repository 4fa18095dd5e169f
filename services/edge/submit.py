"""Admission: from a validated OpenAI body to a request on the requests topic.

Checks run cheapest first and each refusal carries its status: unknown model or a prompt
that does not fit the context (400), a request larger than a Kafka record (413), Redis
away (503 ``stream_unavailable``), batchers over their queue limit (503), the key's token
buckets (429). Then the owner is recorded (resume and cancel are tenant-scoped) and the
request is published, keyed by its id; Kafka away is a 503 ``queue_unavailable``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

from aiokafka.errors import KafkaError, KafkaTimeoutError
from pydantic import ValidationError

from services.edge.auth import Principal
from services.edge.cache import publish_hit
from services.edge.cancel import Owner, cancel_in_background
from services.edge.choices import ChoiceStreams
from services.edge.errors import (
    ApiError,
    bad_request,
    forbidden,
    model_not_found,
    rate_limited,
    unavailable,
)
from services.edge.model_info import INLINE_TOKENIZE_CHARS
from services.edge.openai_api import ChatBody, CompletionBody
from services.edge.relay import EventStream
from services.edge.retrieval import admit_retrieval
from services.edge.shapes import Shape, created_of, new_request_id
from services.edge.state import EdgeState
from shared.codec import encode
from shared.kafka_io import too_large
from shared.messages import CacheMode, CacheResult, GenerateRequest
from shared.prompts import TemplateError
from shared.retry import REDIS_DOWN

log = logging.getLogger(__name__)

# Completions default to 16 tokens (OpenAI's default); chat to the rest of the context, as
# OpenAI and vLLM do.
COMPLETIONS_DEFAULT_MAX_TOKENS = 16
CHAT_DEFAULT_WITHOUT_CONTEXT = 256  # a model folder that names no context


async def admit(
    st: EdgeState, who: Principal, body: CompletionBody | ChatBody
) -> tuple[str, list[GenerateRequest]]:
    """The response's id and the requests to publish for ``body`` (one per choice), or an
    ``ApiError`` saying why not."""
    chat = isinstance(body, ChatBody)
    if body.model != st.settings.model_name:
        raise model_not_found(body.model, st.settings.model_name)
    _check_policy(who, body)
    _check_vocabulary(st, body)
    inputs = body.inputs()
    limits: list[int] = []
    cost = 0
    for fields in inputs:
        prompt_tokens = await _count(st, body, fields)
        if prompt_tokens == 0:
            raise bad_request("the prompt is empty", param="prompt")
        max_tokens = _max_tokens(st, body, prompt_tokens, chat)
        max_tokens = await admit_retrieval(
            st.settings,
            body.retrieval,
            st.model.context,
            prompt_tokens,
            max_tokens,
            body.requested_max_tokens() is not None,
        )
        limits.append(max_tokens)
        cost += (prompt_tokens + max_tokens) * body.n
    rid = new_request_id(chat, time.time())
    try:
        reqs = body.to_requests(
            rid, who.tenant, limits, unfollowed_grace_s=st.settings.unfollowed_grace_s
        )
    except ValidationError as exc:
        raise bad_request(f"invalid request: {exc.errors()[0]['msg']}") from None
    for req in reqs:
        if (why := too_large(len(encode(req)))) is not None:
            raise ApiError(413, why, code="request_too_large", param="prompt")
    st.health.check()
    _shed(st)
    with st.health.guard("rate limit"):
        verdict = await st.limiter.take(
            who.key_id,
            cost,
            requests_per_min=who.requests_per_min,
            tokens_per_min=who.tokens_per_min,
        )
    if not verdict.allowed:
        st.metrics.rejected.labels("rate_limit").inc()
        if verdict.never:
            _, tpm = st.limiter.limits(who.requests_per_min, who.tokens_per_min)
            raise rate_limited(
                f"this request needs {cost} tokens, more than the "
                f"{tpm} tokens per minute this key may use",
                verdict.retry_after_s,
                code="request_too_large",
            )
        raise rate_limited(
            "rate limit reached for this API key; retry after the time in Retry-After",
            verdict.retry_after_s,
        )
    return rid, reqs


def _check_vocabulary(st: EdgeState, body: CompletionBody | ChatBody) -> None:
    """The token ids a request names beside its prompt are the served model's: a bias or a
    stop id it does not have is refused (OpenAI refuses such a bias), never ignored. The
    prompt's own are checked where it is counted; without a tokenizer, by the worker."""
    if st.model.tokenizer is None:
        return
    vocab = st.model.vocab_size
    for param, ids in (
        ("logit_bias", body.token_biases()),
        ("stop_token_ids", body.stop_token_ids),
    ):
        if any(t >= vocab for t in ids):
            raise bad_request(f"token ids must lie in [0, {vocab})", param=param)


def _check_policy(who: Principal, body: CompletionBody | ChatBody) -> None:
    """What the caller's key allows: a model outside its list is a 404, as OpenAI answers
    for a model the key cannot access; a priority it may not use is a 403."""
    if not who.may_use_model(body.model):
        raise ApiError(
            404,
            f"the model '{body.model}' does not exist or this API key cannot use it",
            code="model_not_found",
            param="model",
        )
    if not who.may_use_priority(body.priority):
        raise forbidden(f"this API key may not use priority '{body.priority}'", param="priority")


async def submit(
    st: EdgeState, req: GenerateRequest, key: str | None = None, *, tools: bool = False
) -> EventStream:
    """Subscribe to the request's stream, record its owner and hand the request to Kafka
    (acks=all), all at once: three round trips in the time of the longest, Kafka's. The
    stream reads the replay log once subscribed, so an event published before the
    subscription took hold is not missed. If Kafka refuses the request, it exists nowhere;
    if Redis fails while Kafka takes it, the request could be neither followed nor
    cancelled by its owner, so it is cancelled and the client told to retry (503).
    ``key`` is the Kafka key (the request id by default): the choices of one response
    share one, so one batcher routes them together. ``tools``: a chat that may answer
    with a tool call (recorded with the owner, so a resume renders the call)."""
    names = st.names
    stream = st.event_stream(req.request_id, after_seq=-1)
    record = Owner(req.tenant, tools).encode()
    owner = st.redis.set(names.owner(req.request_id), record, ex=st.settings.owner_ttl_s)
    send = _queue(st, req, key or req.request_id)
    # All run to the end, so a failure of one never leaves another half done.
    results: tuple[Any, ...] = await asyncio.gather(
        stream.open(), owner, send, return_exceptions=True
    )
    opened, owned, sent = results
    try:
        _raise_for(st, req, opened, owned, sent)
    except BaseException:
        stream.close()
        raise
    st.metrics.submitted.labels("chat" if req.messages is not None else "completions").inc()
    return stream


async def submit_cached(
    st: EdgeState,
    req: GenerateRequest,
    body: CompletionBody | ChatBody,
    key: str | None = None,
    *,
    coalesce: bool = True,
) -> tuple[EventStream, CacheResult]:
    """``submit``, unless the response cache has the answer: then the answer is replayed
    on a stream of the request's own (``serve_hit``) and nothing goes to Kafka. A miss
    identical to a request being generated waits for that answer unless ``coalesce`` is
    off (the choices of one response: one would wait for a sibling's whole answer before
    the response could start, where the worker generates both side by side)."""
    found = await st.cache.lookup(req, CacheMode(body.cache), client_seeded=body.seed is not None)
    tools = isinstance(body, ChatBody) and body.calls_tools
    if coalesce and found.coalesce is not None and found.coalesce.leader is not None:
        # An identical request is being generated: its answer, once stored, is this one's.
        found = await st.cache.coalesce(found, lambda leader: st.event_stream(leader, after_seq=-1))
    if found.entry is None:
        try:
            return await submit(st, found.request, key, tools=tools), found.result
        except BaseException:
            await st.cache.release(found)
            raise
    return await serve_hit(st, req, found.entry, found.result, tools=tools), found.result


async def submit_choices(
    st: EdgeState, response_id: str, reqs: list[GenerateRequest], body: CompletionBody | ChatBody
) -> tuple[EventStream | ChoiceStreams, str]:
    """Submit the requests of a response's choices (``submit_cached`` each, all keyed by
    the response's id) and open one stream over them; with where the answer came from
    (one cache result, or ``miss`` when the choices differ). If one fails, those
    submitted are cancelled and the client gets the failure."""
    if len(reqs) == 1:
        stream, cached = await submit_cached(st, reqs[0], body)
        return stream, cached.value
    results: list[Any] = await asyncio.gather(
        *(submit_cached(st, r, body, response_id, coalesce=False) for r in reqs),
        return_exceptions=True,
    )
    failed = [res for res in results if isinstance(res, BaseException)]
    if failed:
        for req, res in zip(reqs, results, strict=True):
            if not isinstance(res, BaseException):
                res[0].close()
                st.spawn(cancel_in_background(st, req.request_id, req.tenant, "unavailable"))
        raise failed[0]
    kinds = {cached.value for _, cached in results}
    prompts = [i // body.n for i in range(len(reqs))]  # choice i answers prompt i // n
    merged = ChoiceStreams(response_id, [stream for stream, _ in results], prompts)
    return merged, kinds.pop() if len(kinds) == 1 else CacheResult.MISS.value


async def serve_hit(
    st: EdgeState, req: GenerateRequest, entry: bytes, result: CacheResult, *, tools: bool = False
) -> EventStream:
    """Record the owner and write the cached events to ``req``'s stream and replay log in
    one round trip, then answer from those events: the stream holds them all, final one
    included, so it neither subscribes nor reads the log back. A resume (any edge, with
    ``Last-Event-ID``) reads the log as it would a worker's."""
    names = st.names
    with st.health.guard("cache hit", req.request_id):
        owner = (names.owner(req.request_id), Owner(req.tenant, tools).encode())
        hit = await publish_hit(
            st.redis,
            names,
            req,
            entry,
            result,
            log_ttl_s=st.settings.owner_ttl_s,
            owner=(*owner, st.settings.owner_ttl_s),
        )
        stream = st.event_stream(req.request_id, after_seq=-1)
        if not stream.complete(hit.events):  # an entry without its end: follow the log
            await stream.open()
    for record in hit.records:  # a Kafka-only caller's completion, as a worker would send it
        topic = req.reply.kafka_topic
        assert topic is not None
        st.spawn(st.producer.send(topic, record, key=req.request_id.encode()))
    return stream


@dataclass
class Opened:
    """A submitted response: its stream, its shape and where its answer comes from."""

    stream: EventStream | ChoiceStreams
    shape: Shape
    cache: str
    created_at: float  # wall clock, when admitted


async def open_response(st: EdgeState, who: Principal, body: CompletionBody | ChatBody) -> Opened:
    """Admit ``body``, submit its choices and open its stream (what both the HTTP routes
    and the WebSocket serve)."""
    rid, reqs = await admit(st, who, body)
    echo = _echo_texts(st, body) if isinstance(body, CompletionBody) and body.echo else None
    stream, cached = await submit_choices(st, rid, reqs, body)
    shape = Shape(
        rid,
        st.settings.model_name,
        created_of(rid),
        token_ids=body.return_token_ids,
        token_text=st.model.token_text,
        tools=isinstance(body, ChatBody) and body.calls_tools,
        fingerprint=st.fingerprint,
        echo=echo,
        multi=len(reqs) > 1,
    )
    return Opened(stream, shape, cached, reqs[0].created_at)


def _echo_texts(st: EdgeState, body: CompletionBody) -> list[str]:
    """Each choice's prompt text, for ``echo`` (token ids decoded)."""
    texts = []
    for fields in body.inputs():
        ids = fields.get("prompt_token_ids")
        if ids is None:
            texts.append(fields["prompt"])
        elif st.model.tokenizer is None:
            raise bad_request("echo of token ids needs the edge's tokenizer", param="echo")
        else:
            texts.append(st.model.decode(ids))
    return [t for t in texts for _ in range(body.n)]


class QueueTimeout(KafkaTimeoutError):
    """Kafka did not acknowledge the request in time; it may still reach Kafka later."""


async def _queue(st: EdgeState, req: GenerateRequest, key: str) -> None:
    """Hand ``req`` to Kafka and wait for the acknowledgement, at most the request
    timeout. The idempotent producer never gives a message up (it retries until the
    broker is back), so past the timeout the client is answered while the message may
    still go out: ``QueueTimeout`` says so, and submit cancels the request."""
    timeout_s = st.settings.kafka_request_timeout_ms / 1000
    fut: asyncio.Future[Any] | None = None
    try:
        async with asyncio.timeout(timeout_s):
            fut = await st.producer.send(st.names.requests, encode(req), key=key.encode())
            await asyncio.shield(fut)
    except TimeoutError:
        if fut is None:  # still waiting for metadata: nothing was handed over
            raise KafkaTimeoutError(f"no Kafka metadata within {timeout_s:g} s") from None
        fut.add_done_callback(_retrieve)
        raise QueueTimeout(f"not acknowledged by Kafka within {timeout_s:g} s") from None


def _retrieve(fut: asyncio.Future[Any]) -> None:
    """Take a late send's outcome, so a failure is not reported as never retrieved."""
    if not fut.cancelled() and fut.exception() is not None:
        log.debug("a send given up on failed later: %r", fut.exception())


def _raise_for(
    st: EdgeState, req: GenerateRequest, opened: object, owned: object, sent: object
) -> None:
    """Raise what a failed part of ``submit`` means for the client, if one failed."""
    if isinstance(sent, KafkaError):
        st.metrics.rejected.labels("kafka_unavailable").inc()
        log.debug("refused, Kafka away: %r", sent, extra={"request_id": req.request_id})
        if isinstance(sent, QueueTimeout):
            st.spawn(cancel_in_background(st, req.request_id, req.tenant, "unavailable"))
        raise unavailable(f"cannot queue the request: {sent}", code="queue_unavailable")
    if isinstance(sent, BaseException):
        raise sent
    for res in (opened, owned):
        if isinstance(res, BaseException):
            st.spawn(cancel_in_background(st, req.request_id, req.tenant, "unavailable"))
            if isinstance(res, REDIS_DOWN):
                raise st.health.refusal("submit", req.request_id, res) from res
            raise res


async def _count(st: EdgeState, body: CompletionBody | ChatBody, fields: dict[str, Any]) -> int:
    """Prompt tokens of one input of ``body`` (``fields``: GenerateRequest fields)."""
    model = st.model
    try:
        if isinstance(body, ChatBody):
            msgs = body.wire_messages()
            size = sum(len(m.content) for m in msgs)
            tools = body.wire_tools()
            if size <= INLINE_TOKENIZE_CHARS:
                return model.count_chat(msgs, tools)
            return await asyncio.to_thread(model.count_chat, msgs, tools)
        ids = fields.get("prompt_token_ids")
        if ids is not None:
            if body.retrieval is not None:
                raise bad_request("retrieval needs a text prompt, not token ids", param="prompt")
            vocab = model.vocab_size if model.tokenizer is not None else None
            if vocab is not None and max(ids) >= vocab:
                raise bad_request(f"token ids must lie in [0, {vocab})", param="prompt")
            return len(ids)
        text = fields["prompt"]
        if len(text) <= INLINE_TOKENIZE_CHARS:
            return model.count_prompt(text)
        return await asyncio.to_thread(model.count_prompt, text)
    except TemplateError as exc:
        raise bad_request(f"cannot apply the chat template: {exc}", param="messages") from None


def _max_tokens(
    st: EdgeState, body: CompletionBody | ChatBody, prompt_tokens: int, chat: bool
) -> int:
    # The model folder's context, else the one the live workers advertise.
    context = st.model.context or st.load.current.worker_context
    limit = st.settings.max_tokens_limit or context
    asked = body.requested_max_tokens()
    param = (
        "max_completion_tokens"
        if chat and getattr(body, "max_completion_tokens", None)
        else "max_tokens"
    )
    if asked is not None and limit is not None and asked > limit:
        raise bad_request(f"{param} is {asked}; at most {limit} is allowed", param=param)
    if context is not None and prompt_tokens >= context:
        raise bad_request(
            f"this model's maximum context length is {context} tokens; the prompt has "
            f"{prompt_tokens}",
            code="context_length_exceeded",
            param="messages" if chat else "prompt",
        )
    if asked is None:
        if chat:
            asked = CHAT_DEFAULT_WITHOUT_CONTEXT if context is None else context - prompt_tokens
        else:
            asked = COMPLETIONS_DEFAULT_MAX_TOKENS
        if context is not None:
            asked = min(asked, context - prompt_tokens)
        if limit is not None:
            asked = min(asked, limit)
    elif context is not None and prompt_tokens + asked > context:
        raise bad_request(
            f"this model's maximum context length is {context} tokens; the prompt has "
            f"{prompt_tokens} and {param} asks for {asked} more",
            code="context_length_exceeded",
            param=param,
        )
    return asked


def _shed(st: EdgeState) -> None:
    limit = st.settings.max_queued_requests
    load = st.load.current
    if limit and load.queued_requests >= limit:
        st.metrics.rejected.labels("overloaded").inc()
        raise unavailable(
            f"the batchers hold {load.queued_requests} queued requests (limit {limit}); "
            "retry shortly"
        )


__all__ = ["ApiError", "Opened", "admit", "open_response", "serve_hit", "submit", "submit_cached"]
