"""``POST /tokenize`` and ``POST /detokenize``, as vLLM serves them: the served model's
token ids of a prompt or a conversation (as the worker computes them), and the text of
token ids."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Request
from pydantic import Field, model_validator

from services.edge.errors import ApiError, bad_request, model_not_found
from services.edge.model_info import ModelInfo
from services.edge.openai_api import ChatMessageBody, Strict
from services.edge.routes.common import ERROR_RESPONSES, Caller, JsonRoute, edge_state
from shared.prompts import TemplateError

router = APIRouter(responses=ERROR_RESPONSES, tags=["tokens"], route_class=JsonRoute)


class TokenizeBody(Strict):
    """A prompt or a conversation to tokenize (exactly one)."""

    model: str = Field(max_length=256)
    prompt: str | None = Field(None, max_length=4_000_000)
    messages: list[ChatMessageBody] | None = Field(None, min_length=1, max_length=1024)

    @model_validator(mode="after")
    def _one_input(self) -> TokenizeBody:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("exactly one of 'prompt' and 'messages' must be given")
        return self


class DetokenizeBody(Strict):
    """Token ids to turn back into text."""

    model: str = Field(max_length=256)
    tokens: list[Annotated[int, Field(ge=0)]] = Field(max_length=1_000_000)


def _served(request: Request, model: str) -> ModelInfo:
    st = edge_state(request)
    if model != st.settings.model_name:
        raise model_not_found(model, st.settings.model_name)
    if st.model.tokenizer is None:
        raise ApiError(501, "this edge has no tokenizer (TW_MODEL_DIR names no tokenizer.json)")
    return st.model


@router.post("/tokenize")
async def tokenize(body: TokenizeBody, request: Request, _: Caller) -> dict[str, Any]:
    """Token ids of a prompt (special tokens added) or of a conversation (the model's chat
    template applied), with their count and the model's context."""
    model = _served(request, body.model)
    if body.messages is not None:
        if model.chat_template is None:
            raise bad_request("the model has no chat template", param="messages")
        try:
            ids = model.encode_chat([m.to_wire() for m in body.messages])
        except TemplateError as exc:
            raise bad_request(f"cannot apply the chat template: {exc}", param="messages") from None
    else:
        ids = model.encode_prompt(body.prompt or "")
    return {"count": len(ids), "max_model_len": model.context, "tokens": ids}


@router.post("/detokenize")
async def detokenize(body: DetokenizeBody, request: Request, _: Caller) -> dict[str, Any]:
    """The text of token ids."""
    model = _served(request, body.model)
    vocab = model.vocab_size
    if any(t >= vocab for t in body.tokens):
        raise bad_request(f"token ids must lie in [0, {vocab})", param="tokens")
    return {"prompt": model.decode(body.tokens)}
