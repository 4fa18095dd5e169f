"""The ``retrieval`` extension at the edge: the body field, and its admission.

The edge does not retrieve (the batcher does, for a whole dispatch at once); it refuses
what could never be served, with a 400 before anything is queued: retrieval on a server
without indexes, an unknown index, a corrupt one, or one built with an embedder other
than the one this deployment embeds queries with. It also sizes the passages' token
budget to the room the model's context leaves beside the prompt and ``max_tokens``; a
chat request that leaves ``max_tokens`` to its default gives up to ``PASSAGE_RESERVE``
tokens of that default to the passages.
"""

from __future__ import annotations

import asyncio
import functools
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from services.edge.errors import bad_request
from shared.messages import Retrieval
from shared.retrieval.store import IndexStore, RetrievalError
from shared.settings import CommonSettings

PASSAGE_RESERVE = 1024
DEFAULT_BUDGET = 1024  # the model's context is unknown: the wire's default


class RetrievalBody(BaseModel):
    """``retrieval: {"index": NAME, "top_k": K}`` (tokenwire extension)."""

    model_config = ConfigDict(extra="forbid")

    index: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._-]+$")
    top_k: int = Field(4, ge=1, le=50, description="passages to retrieve, at most")
    budget_tokens: int | None = Field(
        None,
        ge=0,
        le=1_000_000,
        description="most prompt tokens the passages may take (default, and at most: the "
        "room the context leaves)",
    )

    def to_wire(self) -> Retrieval:
        budget = DEFAULT_BUDGET if self.budget_tokens is None else self.budget_tokens
        return Retrieval(index=self.index, top_k=self.top_k, budget_tokens=budget)


@functools.lru_cache(maxsize=4)
def embedder_identity(model_dir: str) -> str:
    """The identity of the embedder the batchers load from ``model_dir`` (empty: the
    installed default), computed from its files without loading the model."""
    from shared.embedding import DEFAULT_MAX_TOKENS, default_model_dir, model_identity

    folder = Path(model_dir) if model_dir else default_model_dir()
    return model_identity(folder, DEFAULT_MAX_TOKENS)


async def admit_retrieval(
    settings: CommonSettings,
    spec: RetrievalBody | None,
    context: int | None,
    prompt_tokens: int,
    max_tokens: int,
    max_tokens_asked: bool,
) -> int:
    """Check ``spec`` and fix its token budget; returns ``max_tokens``, less what a
    defaulted chat ``max_tokens`` gives to the passages."""
    if spec is None:
        return max_tokens
    try:
        manifest = IndexStore(settings.index_root).manifest(spec.index)
    except RetrievalError as exc:
        raise bad_request(str(exc), code=exc.code, param="retrieval.index") from None
    ours = await asyncio.to_thread(embedder_identity, settings.embed_model_dir)
    if manifest.embedder != ours:
        raise bad_request(
            f"index {spec.index!r} was built with embedder {manifest.embedder}; this server "
            f"embeds queries with {ours}: rebuild it with `tokenwire index build`",
            code="embedder_mismatch",
            param="retrieval.index",
        )
    if context is None:
        return max_tokens
    if not max_tokens_asked:
        reserve = min(PASSAGE_RESERVE, (context - prompt_tokens) // 2)
        max_tokens = max(1, min(max_tokens, context - prompt_tokens - reserve))
    room = max(0, context - prompt_tokens - max_tokens)
    asked = spec.budget_tokens
    spec.budget_tokens = room if asked is None else min(asked, room)
    return max_tokens
