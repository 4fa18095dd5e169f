"""``POST /v1/completions`` and ``POST /v1/chat/completions``: admit, publish, relay."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from services.edge.auth import Principal
from services.edge.openai_api import ChatBody, CompletionBody
from services.edge.responses import JsonRelay, RelayPlan, SseRelay
from services.edge.routes.common import ERROR_RESPONSES, Caller, JsonRoute, edge_state
from services.edge.submit import open_response

router = APIRouter(responses=ERROR_RESPONSES, route_class=JsonRoute)


@router.post("/v1/completions", response_model=None, tags=["openai"])
async def completions(body: CompletionBody, request: Request, who: Caller) -> Response:
    """Complete a prompt (OpenAI-compatible; ``stream: true`` answers with SSE)."""
    return await generate(request, who, body)


@router.post("/v1/chat/completions", response_model=None, tags=["openai"])
async def chat_completions(body: ChatBody, request: Request, who: Caller) -> Response:
    """Answer a conversation (OpenAI-compatible; the worker applies the chat template)."""
    return await generate(request, who, body)


async def generate(request: Request, who: Principal, body: CompletionBody | ChatBody) -> Response:
    st = edge_state(request)
    opened = await open_response(st, who, body)
    plan = RelayPlan(
        st,
        opened.stream,
        opened.shape,
        who.tenant,
        cancel_on_disconnect=not body.resumable,
        include_usage=body.include_usage,
        created_at=opened.created_at,
        cache=opened.cache,
    )
    return SseRelay(plan) if body.stream else JsonRelay(plan)
