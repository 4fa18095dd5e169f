"""Operations and discovery: health, readiness, metrics, the model list, the chat page."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import FileResponse, JSONResponse, RedirectResponse, Response

from services.edge.errors import model_not_found
from services.edge.metrics import CONTENT_TYPE_LATEST
from services.edge.routes.common import ERROR_RESPONSES, Caller, JsonRoute, edge_state

router = APIRouter(route_class=JsonRoute)
STATIC = Path(__file__).resolve().parents[1] / "static"
PROBE_TIMEOUT_S = 2.0


@router.get("/healthz", tags=["ops"])
async def healthz() -> dict[str, str]:
    """The process is up (liveness)."""
    return {"status": "ok"}


@router.get("/readyz", tags=["ops"], responses={503: {"description": "a dependency is down"}})
async def readyz(request: Request) -> JSONResponse:
    """Ready to serve: Kafka and Redis both answer, and the shared subscriber is connected."""
    st = edge_state(request)
    checks = await asyncio.gather(
        _probe(st.producer.client.fetch_all_metadata()),
        _probe(st.redis.ping()),
        return_exceptions=False,
    )
    status = {
        "kafka": checks[0],
        "redis": checks[1],
        "pubsub": "ok" if st.hub.connected else "down",
    }
    ok = all(v == "ok" for v in status.values())
    return JSONResponse(
        {"status": "ok" if ok else "unavailable", **status}, status_code=200 if ok else 503
    )


async def _probe(aw: Any) -> str:
    try:
        await asyncio.wait_for(aw, PROBE_TIMEOUT_S)
    except Exception as exc:
        return f"down: {type(exc).__name__}"
    return "ok"


@router.get("/metrics", tags=["ops"], response_class=Response)
async def metrics(request: Request) -> Response:
    """Prometheus metrics of this edge process."""
    st = edge_state(request)
    st.metrics.queued.set(st.load.current.queued_requests)
    st.metrics.pubsub_reconnects.set(st.hub.reconnects)
    for name, size in st.tracked_sizes().items():
        st.metrics.tracked.labels(name).set(size)
    return Response(st.metrics.render(), media_type=CONTENT_TYPE_LATEST)


@router.get("/v1/models", tags=["openai"], responses=ERROR_RESPONSES)
async def models(request: Request, _: Caller) -> dict[str, Any]:
    """The served model (OpenAI-compatible)."""
    return {"object": "list", "data": [_served_model(request)]}


@router.get("/v1/models/{model_id}", tags=["openai"], responses=ERROR_RESPONSES)
async def model(request: Request, model_id: str, _: Caller) -> dict[str, Any]:
    """One model by id: the served one, or 404 ``model_not_found``."""
    served = _served_model(request)
    if model_id != served["id"]:
        raise model_not_found(model_id, served["id"])
    return served


def _served_model(request: Request) -> dict[str, Any]:
    st = edge_state(request)
    model = {"id": st.settings.model_name, "object": "model", "created": 0, "owned_by": "tokenwire"}
    if st.model.context:
        model["context_length"] = st.model.context
    return model


@router.get("/", include_in_schema=False)
async def root() -> RedirectResponse:
    return RedirectResponse("/chat")


@router.get("/chat", include_in_schema=False)
async def chat_page() -> FileResponse:
    return FileResponse(STATIC / "index.html", media_type="text/html")
