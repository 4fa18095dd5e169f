"""A submitted request by id: resume its stream (any edge, ``Last-Event-ID``) or cancel it.
Both are tenant-scoped: another tenant's request is a 404, like one that never existed."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, Path, Query, Request
from starlette.responses import JSONResponse, Response

from services.edge.cancel import cancel_request, owned
from services.edge.errors import bad_request
from services.edge.responses import RelayPlan, SseRelay
from services.edge.routes.common import ERROR_RESPONSES, Caller, JsonRoute, edge_state
from services.edge.shapes import Shape, created_of

router = APIRouter(responses=ERROR_RESPONSES, tags=["requests"], route_class=JsonRoute)

RequestIdParam = Annotated[str, Path(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._:-]+$")]


@router.get("/v1/requests/{request_id}/stream", response_model=None)
async def resume(
    request_id: RequestIdParam,
    request: Request,
    who: Caller,
    last_event_id: Annotated[str | None, Header(alias="Last-Event-ID")] = None,
    after: Annotated[
        int | None, Query(ge=-1, le=1 << 40, description="same as Last-Event-ID")
    ] = None,
    include_usage: bool = True,
    return_token_ids: bool = False,
) -> Response:
    """The request's events after ``Last-Event-ID`` (all of them without one), then the
    live rest, as SSE. Works on any edge, during or after generation while the log lives."""
    st = edge_state(request)
    after_seq = _after_seq(last_event_id, after)
    st.health.check(request_id)
    owner = await owned(st, request_id, who.tenant)
    stream = st.event_stream(request_id, after_seq=after_seq)
    with st.health.guard("stream open", request_id):
        await stream.open()
    shape = Shape(
        request_id,
        st.settings.model_name,
        created_of(request_id),
        token_ids=return_token_ids,
        token_text=st.model.token_text,
        tools=owner.tools,
        fingerprint=st.fingerprint,
    )
    plan = RelayPlan(
        st, stream, shape, who.tenant, cancel_on_disconnect=False, include_usage=include_usage
    )
    return SseRelay(plan)


@router.post("/v1/requests/{request_id}/cancel")
async def cancel(request_id: RequestIdParam, request: Request, who: Caller) -> JSONResponse:
    """Cancel a request and wait (briefly) for its stream to end. ``last_event_id`` is the
    seq of its final event: no token follows it."""
    st = edge_state(request)
    await owned(st, request_id, who.tenant)
    with st.health.guard("cancel", request_id):
        final = await cancel_request(st, request_id, who.tenant, "api")
    body: dict[str, Any] = {"id": request_id, "object": "request.cancellation"}
    if final is None:
        return JSONResponse({**body, "status": "cancelling"}, status_code=202)
    status = "cancelled" if final.get("finish_reason") == "cancelled" else "finished"
    return JSONResponse(
        {
            **body,
            "status": status,
            "finish_reason": final.get("finish_reason"),
            "last_event_id": final["seq"],
            "usage": final.get("usage"),
        }
    )


def _after_seq(header: str | None, query: int | None) -> int:
    if header is None:
        return -1 if query is None else query
    try:
        value = int(header.strip())
    except ValueError:
        raise bad_request(
            "Last-Event-ID must be an event id (an integer)", param="Last-Event-ID"
        ) from None
    if not -1 <= value <= 1 << 40:
        raise bad_request("Last-Event-ID is out of range", param="Last-Event-ID")
    return value
