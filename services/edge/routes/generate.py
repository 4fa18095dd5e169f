"""``POST /v1/completions`` and ``POST /v1/chat/completions``: admit, publish, relay."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from services.edge.auth import Principal
from services.edge.openai_api import ChatBody, CompletionBody
from services.edge.responses import JsonRelay, RelayPlan, SseRelay
from services.edge.routes.common import ERROR_RESPONSES, Caller, edge_state
from services.edge.shapes import Shape, created_of
from services.edge.submit import admit, submit_cached

router = APIRouter(responses=ERROR_RESPONSES)


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
    req = await admit(st, who, body)
    stream, cached = await submit_cached(st, req, body)
    plan = RelayPlan(
        st,
        stream,
        Shape(
            req.request_id,
            st.settings.model_name,
            created_of(req.request_id),
            token_ids=body.return_token_ids,
            token_text=st.model.token_text,
            tools=isinstance(body, ChatBody) and body.calls_tools,
        ),
        who.tenant,
        cancel_on_disconnect=not body.resumable,
        include_usage=body.include_usage,
        created_at=req.created_at,
        cache=cached.value,
    )
    return SseRelay(plan) if body.stream else JsonRelay(plan)
