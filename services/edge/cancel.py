"""Cancellation: broadcast a ``CancelRequest`` until the request's final event shows.

Workers abort a request they hold within one engine step and publish a final event with
``finish_reason: "cancelled"``. A request still queued in Kafka or a batcher is held by no
worker yet: the cancelled marker makes the worker that picks it up end it at once, and the
broadcast repeats (covering a pick-up racing the marker) until the final event appears.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from services.edge.errors import not_found
from services.edge.relay import Event
from services.edge.state import EdgeState
from shared import token_stream
from shared.codec import encode
from shared.messages import CancelRequest
from shared.retry import REDIS_DOWN, backoff

log = logging.getLogger(__name__)

RESEND_S = 0.5
# How long a cancel that Redis is away for keeps trying. Past it, a request nobody follows
# has been cancelled by its worker (``reply.unfollowed_grace_s``) unless it is resumable.
RETRY_FOR_S = 60.0


@dataclass(frozen=True, slots=True)
class Owner:
    """Who a request belongs to, recorded at submission (the owner key's value), and how
    its stream is rendered on a resume: ``tools``, a chat that may answer with a call."""

    tenant: str
    tools: bool = False

    def encode(self) -> str:
        return self.tenant + (" tools" if self.tools else "")  # a tenant id has no space

    @classmethod
    def decode(cls, raw: bytes | str) -> Owner:
        text = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
        tenant, _, flags = text.partition(" ")
        return cls(tenant, "tools" in flags.split())


async def owner_of(st: EdgeState, request_id: str) -> Owner | None:
    raw = await st.redis.get(st.names.owner(request_id))
    return None if raw is None else Owner.decode(raw)


async def owned(st: EdgeState, request_id: str, tenant: str) -> Owner:
    """The request's owner record if ``tenant`` owns it; otherwise a 404, as for a
    request that never existed (another tenant's requests are not even confirmed)."""
    owner = None
    if request_id:
        with st.health.guard("owner lookup", request_id):
            owner = await owner_of(st, request_id)
    if owner is None or owner.tenant != tenant:
        raise not_found(f"no request '{request_id}'")
    return owner


async def cancel_request(st: EdgeState, request_id: str, tenant: str, source: str) -> Event | None:
    """Cancel and wait for the request's final event (returned; ``None`` on timeout)."""
    st.metrics.cancels.labels(source).inc()
    return await _cancel(st, request_id, tenant)


async def _cancel(st: EdgeState, request_id: str, tenant: str) -> Event | None:
    tail = await token_stream.last_published_seq(st.redis, st.names, request_id)
    stream = st.event_stream(request_id, after_seq=tail)
    msg = encode(CancelRequest(request_id=request_id, tenant=tenant))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + st.settings.cancel_wait_s
    async with stream:
        if stream.final_event is not None:
            return stream.final_event
        while loop.time() < deadline:
            await send_cancels(st, [(request_id, msg)])
            resend_at = min(deadline, loop.time() + RESEND_S)
            while (left := resend_at - loop.time()) > 0:
                await stream.next(left)
                if stream.final_event is not None:
                    return stream.final_event
    return None


async def send_cancels(st: EdgeState, cancels: list[tuple[str, bytes]]) -> None:
    """Cancel requests on every worker (request id, its encoded ``CancelRequest``): each
    gets its marker, which stops a worker that picks the request up later, and a broadcast
    on the cancel channel, which stops the one holding it now. One round trip on a single
    Redis; a cluster's pipelines cannot publish, so there the broadcasts follow."""
    pipe = st.redis.pipeline(transaction=False)
    for request_id, _ in cancels:
        pipe.set(st.names.cancelled(request_id), b"1", ex=st.settings.owner_ttl_s)
    if not st.settings.redis_cluster:
        for _, msg in cancels:
            pipe.publish(st.names.cancel_channel, msg)
    await pipe.execute()
    if st.settings.redis_cluster:
        for _, msg in cancels:
            await st.redis.publish(st.names.cancel_channel, msg)


async def cancel_in_background(st: EdgeState, request_id: str, tenant: str, source: str) -> None:
    """``cancel_request`` for a request whose client is gone (run with ``st.spawn``):
    while Redis is away it tries again with capped backoff, for up to ``RETRY_FOR_S``."""
    st.metrics.cancels.labels(source).inc()
    loop = asyncio.get_running_loop()
    give_up_at = loop.time() + RETRY_FOR_S
    failures = 0
    while True:
        try:
            await _cancel(st, request_id, tenant)
            return
        except REDIS_DOWN as exc:
            st.metrics.redis_retries.labels("cancel").inc()
            pause = backoff(failures, cap_s=5.0)
            failures += 1
            if loop.time() + pause > give_up_at:
                log.warning(
                    "cancel abandoned, Redis away: %r", exc, extra={"request_id": request_id}
                )
                return
            await asyncio.sleep(pause)
