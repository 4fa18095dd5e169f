"""The operator's dashboard: a page of charts and tables, and the server-sent stream that
feeds it (``services/edge/dashboard.py``).

Like ``/metrics``, ``/healthz`` and the chat page, neither needs an API key: an API key
names a tenant, not an operator, and what the dashboard shows is what ``/metrics`` and
``tokenwire status`` show (hosts, queues, memory; no prompt, tenant or key). Keep these
paths off a public listener, as ``/metrics``."""

from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from starlette.responses import FileResponse, StreamingResponse

from services.edge.routes.common import JsonRoute, edge_state
from services.edge.routes.ops import STATIC
from services.edge.sse import KEEPALIVE, frame

router = APIRouter(route_class=JsonRoute)
RETRY_MS = 2000  # how soon a page reconnects after the stream drops


@router.get("/dashboard", include_in_schema=False)
async def dashboard_page() -> FileResponse:
    return FileResponse(STATIC / "dashboard.html", media_type="text/html")


# Out of the OpenAPI document, as the page: a stream without end is no API operation (a
# fuzzer calling it would wait out its timeout on every example).
@router.get("/dashboard/events", include_in_schema=False)
async def dashboard_events(request: Request) -> StreamingResponse:
    """Server-sent events: the last minutes of chart points first (``history``), then
    every second one snapshot of ``tokenwire status --json`` (``status``) and its chart
    point (``point``)."""
    feed = edge_state(request).dashboard

    async def events() -> AsyncIterator[bytes]:
        yield b"retry: %d\n\n" % RETRY_MS
        async for event in feed.listen():
            yield KEEPALIVE if event is None else frame(event)

    return StreamingResponse(
        events(),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )
