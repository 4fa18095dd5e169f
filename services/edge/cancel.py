"""Cancellation: broadcast a ``CancelRequest`` until the request's final event shows.

Workers abort a request they hold within one engine step and publish a final event with
``finish_reason: "cancelled"``. A request still queued in Kafka or a batcher is held by no
worker yet: the cancelled marker makes the worker that picks it up end it at once, and the
broadcast repeats (covering a pick-up racing the marker) until the final event appears.
"""

from __future__ import annotations

import asyncio

from services.edge.relay import Event, EventStream
from services.edge.state import EdgeState
from shared import token_stream
from shared.codec import encode
from shared.messages import CancelRequest

RESEND_S = 0.5


async def owner_of(st: EdgeState, request_id: str) -> str | None:
    raw = await st.redis.get(st.names.owner(request_id))
    if raw is None:
        return None
    return raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)


async def cancel_request(st: EdgeState, request_id: str, tenant: str, source: str) -> Event | None:
    """Cancel and wait for the request's final event (returned; ``None`` on timeout)."""
    st.metrics.cancels.labels(source).inc()
    tail = await token_stream.last_published_seq(st.redis, st.names, request_id)
    stream = EventStream(st.hub, st.redis, st.names, request_id, after_seq=tail)
    msg = encode(CancelRequest(request_id=request_id, tenant=tenant))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + st.settings.cancel_wait_s
    async with stream:
        if stream.final_event is not None:
            return stream.final_event
        while loop.time() < deadline:
            pipe = st.redis.pipeline(transaction=False)
            # The marker stops a worker that picks the request up later; the broadcast
            # stops the one holding it now.
            pipe.set(st.names.cancelled(request_id), b"1", ex=st.settings.owner_ttl_s)
            pipe.publish(st.names.cancel_channel, msg)
            await pipe.execute()
            resend_at = min(deadline, loop.time() + RESEND_S)
            while (left := resend_at - loop.time()) > 0:
                await stream.next(left)
                if stream.final_event is not None:
                    return stream.final_event
    return None
