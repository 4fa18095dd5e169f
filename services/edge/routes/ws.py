"""``/v1/ws``: the same events over a WebSocket, for clients that prefer one.

Client → server, one JSON message per action (``api_key`` may ride on any of them when
the handshake had no ``Authorization`` header, as in browsers):
``{"type": "completions" | "chat.completions", "body": {…OpenAI body…}}``,
``{"type": "resume", "request_id": …, "last_event_id": n}``,
``{"type": "cancel"}`` (the request being relayed) or ``{"type": "cancel", "request_id": …}``.

Server → client: ``{"type": "request", "id": …, "cache": "miss" | "exact" | "semantic"}``
(``miss`` on a resume), then ``{"type": "event", "id": seq,
"data": <the SSE chunk>}`` per event, ``{"type": "usage", …}``, ``{"type": "done"}``;
a refusal is ``{"type": "error", "status": 4xx, "error": {…}}``.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

import orjson
from fastapi import APIRouter, WebSocket, WebSocketDisconnect
from pydantic import ValidationError

from services.edge.auth import Principal, bearer_token
from services.edge.cancel import cancel_in_background, cancel_request, owned
from services.edge.choices import ChoiceStreams
from services.edge.errors import ApiError, bad_request
from services.edge.openai_api import ChatBody, CompletionBody
from services.edge.relay import EventStream
from services.edge.shapes import Shape, created_of, ends_badly, error_of, usage_of
from services.edge.state import EdgeState
from services.edge.submit import open_response
from shared.tasks import cancel_and_wait

router = APIRouter()
# Where ``_receive`` says why a frame was no message (a key no message of the API has).
NOT_AN_OBJECT = " not an object"
BODIES: dict[str, type[CompletionBody] | type[ChatBody]] = {
    "completions": CompletionBody,
    "chat.completions": ChatBody,
}


@router.websocket("/v1/ws")
async def websocket_stream(ws: WebSocket) -> None:
    st: EdgeState = ws.app.state.edge
    await ws.accept()
    header_key = bearer_token(ws.headers.get("authorization"))
    inbox = _Inbox(ws)
    try:
        while True:
            msg = await inbox.next()
            try:
                with st.health.guard("api key lookup"):
                    who = await st.keys.authenticate(msg.get("api_key") or header_key)
                await _handle(ws, inbox, st, who, msg)
            except ApiError as err:
                await _send(ws, {"type": "error", "status": err.status, **err.body()})
                if err.status == 401:
                    await ws.close(code=1008)
                    return
    except WebSocketDisconnect:
        return


async def _handle(
    ws: WebSocket, inbox: _Inbox, st: EdgeState, who: Principal, msg: dict[str, Any]
) -> None:
    kind = msg.get("type")
    if kind in BODIES:
        try:
            body = BODIES[kind].model_validate(msg.get("body"))
        except ValidationError as exc:
            first = exc.errors()[0]
            loc = ".".join(str(p) for p in first["loc"])
            raise bad_request(f"{loc}: {first['msg']}" if loc else str(first["msg"])) from None
        opened = await open_response(st, who, body)
        await _relay(
            ws,
            inbox,
            st,
            who,
            opened.stream,
            opened.shape,
            cancel_on_disconnect=not body.resumable,
            cache=opened.cache,
        )
    elif kind == "resume":
        rid = str(msg.get("request_id", ""))
        owner = await owned(st, rid, who.tenant)
        after = msg.get("last_event_id", -1)
        if not isinstance(after, int) or after < -1:
            raise bad_request("last_event_id must be an integer ≥ -1")
        st.health.check(rid)
        stream = st.event_stream(rid, after_seq=after)
        with st.health.guard("stream open", rid):
            await stream.open()
        shape = Shape(
            rid,
            st.settings.model_name,
            created_of(rid),
            token_text=st.model.token_text,
            tools=owner.tools,
            fingerprint=st.fingerprint,
        )
        await _relay(ws, inbox, st, who, stream, shape, cancel_on_disconnect=False)
    elif kind == "cancel" and msg.get("request_id"):
        rid = str(msg["request_id"])
        await owned(st, rid, who.tenant)
        with st.health.guard("cancel", rid):
            final = await cancel_request(st, rid, who.tenant, "api")
        await _send(ws, {"type": "cancelled", "id": rid, "final": final})
    elif (why := msg.get(NOT_AN_OBJECT)) is not None:
        raise bad_request(f"a message must be a JSON object: it was {why}")
    else:
        raise bad_request(
            "unknown message type; expected completions, chat.completions, resume or cancel"
        )


async def _relay(
    ws: WebSocket,
    inbox: _Inbox,
    st: EdgeState,
    who: Principal,
    stream: EventStream | ChoiceStreams,
    shape: Shape,
    *,
    cancel_on_disconnect: bool,
    cache: str = "miss",
) -> None:
    """Pump the stream to the socket while listening for a cancel or a disconnect. The
    first message names the request and where its answer comes from (``cache``)."""
    rid = stream.request_id
    listener = asyncio.ensure_future(_listen(inbox, st, who, stream))
    pump = asyncio.ensure_future(_pump(ws, st, stream, shape))
    st.metrics.streams.inc()
    try:
        await _send(ws, {"type": "request", "id": rid, "cache": cache})
        await asyncio.wait({listener, pump}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stream.close()
        st.metrics.streams.dec()
        await cancel_and_wait(listener, pump)  # again until they end (a lost cancel)
    gone = not pump.done() or pump.cancelled() or pump.exception() is not None
    if (gone and cancel_on_disconnect) or stream.finished:
        # What a gone client would have read, or a failed response's other choices.
        for left in stream.unfinished():
            st.spawn(cancel_in_background(st, left, who.tenant, "disconnect" if gone else "failed"))
    if gone:
        raise WebSocketDisconnect()


async def _pump(
    ws: WebSocket, st: EdgeState, stream: EventStream | ChoiceStreams, shape: Shape
) -> None:
    settings = st.settings
    idle = 0.0
    while True:
        events = await stream.next(settings.keepalive_s)
        if not events:
            if stream.finished:
                break
            idle += settings.keepalive_s
            if idle > settings.request_timeout_s:
                err = {
                    "message": "the request timed out",
                    "type": "server_error",
                    "code": "timeout",
                }
                await _send(ws, {"type": "error", "status": 504, "error": err})
                return
            continue
        idle = 0.0
        st.metrics.events.inc(len(events))
        for ev in events:
            if ends_badly(ev):
                await _send(ws, {"type": "error", "id": ev["seq"], "error": error_of(ev)})
            else:
                frame = b'{"type":"event","id":%d,"data":%s}' % (ev["seq"], shape.chunk_json(ev))
                await ws.send_text(frame.decode())
    usage = usage_of(stream.final_event or {})
    if usage is not None:
        await _send(ws, {"type": "usage", "usage": usage})
    await _send(ws, {"type": "done"})


async def _listen(
    inbox: _Inbox, st: EdgeState, who: Principal, stream: EventStream | ChoiceStreams
) -> None:
    """Until the client goes: a ``cancel`` message cancels the request being relayed (all
    its choices); any other message waits in the inbox until the relay ends."""
    rid = stream.request_id
    while True:
        msg = await _receive(inbox.ws)
        # Nothing awaits between the receive and this: cancelling the listener when the
        # relay ends never drops a message (a client may send its next one right after
        # the "done" frame).
        if msg.get("type") == "cancel" and msg.get("request_id", rid) == rid:
            for left in stream.unfinished():
                st.spawn(cancel_in_background(st, left, who.tenant, "api"))
        else:
            inbox.later.append(msg)


class _Inbox:
    """The client's messages: those received during a relay first, then the socket's."""

    def __init__(self, ws: WebSocket) -> None:
        self.ws = ws
        self.later: deque[dict[str, Any]] = deque()

    async def next(self) -> dict[str, Any]:
        return self.later.popleft() if self.later else await _receive(self.ws)


async def _receive(ws: WebSocket) -> dict[str, Any]:
    """The next JSON object from the client (text or binary frame); anything else reads as
    no message, with why (``NOT_AN_OBJECT``), answered with a 400 frame."""
    message = await ws.receive()
    if message["type"] == "websocket.disconnect":
        raise WebSocketDisconnect(message.get("code", 1000))
    raw = message.get("text") or message.get("bytes") or b""
    try:
        msg = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        return {"type": None, NOT_AN_OBJECT: f"not valid JSON: {exc}"}
    return msg if isinstance(msg, dict) else {"type": None, NOT_AN_OBJECT: "not a JSON object"}


async def _send(ws: WebSocket, obj: dict[str, Any]) -> None:
    await ws.send_text(orjson.dumps(obj).decode())
