"""A request grounded in retrieved passages: the passages, as one block, go right after
the system prompt (appended to the system message, or as a system message of their own
when there is none; before a completion's prompt), so conversations that share a system
prompt still share that prefix of tokens and its KV cache. Passages are taken best first
while their tokens fit the request's budget; one that does not fit is skipped for the
next, shorter ones.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from shared.messages import ChatMessage, GenerateRequest, Grounding
from shared.retrieval.store import Passage

HEADER = "Passages that may help:"
SEPARATOR = "\n\n"
# Tokens counted apart differ from tokens counted together by a merge at each seam; this
# slack per passage (and for the block) keeps the total within the budget.
SEAM_TOKENS = 2

CountTokens = Callable[[str], int]


def query_text(req: GenerateRequest) -> str:
    """What is searched for: the last user message of a conversation, else the prompt."""
    if req.messages is not None:
        users = [m.content for m in req.messages if m.role == "user"]
        return users[-1] if users else req.messages[-1].content
    return req.prompt or ""


def byte_count(text: str) -> int:
    """Tokens of ``text`` when no tokenizer is at hand: its UTF-8 bytes, an upper bound for
    byte-level BPE tokenizers."""
    return len(text.encode())


def fit(passages: Sequence[Passage], budget: int, count: CountTokens) -> list[Passage]:
    """The passages to place, in rank order, whose block stays within ``budget`` tokens."""
    used = count(HEADER + SEPARATOR) + SEAM_TOKENS
    chosen: list[Passage] = []
    for p in passages:
        cost = count(_line(len(chosen) + 1, p)) + SEAM_TOKENS
        if used + cost <= budget:
            chosen.append(p)
            used += cost
    return chosen


def block(passages: Sequence[Passage]) -> str:
    return "\n".join([HEADER, *(_line(i, p) for i, p in enumerate(passages, 1))])


def _line(i: int, p: Passage) -> str:
    return f"[{i}] {p.text}"


def ground(
    req: GenerateRequest, index: str, version: str, passages: Sequence[Passage]
) -> GenerateRequest:
    """``req`` with ``passages`` placed after its system prompt, its retrieval done (the
    field cleared) and recorded in ``grounding``."""
    info = Grounding(index=index, version=version, passage_ids=[p.id for p in passages])
    update: dict[str, object] = {"retrieval": None, "grounding": info}
    if passages:
        text = block(passages)
        if req.messages is not None:
            update["messages"] = _after_system(req.messages, text)
        else:
            update["prompt"] = text + SEPARATOR + (req.prompt or "")
    return req.model_copy(update=update)


def _after_system(messages: list[ChatMessage], text: str) -> list[ChatMessage]:
    first = messages[0]
    if first.role == "system":
        joined = ChatMessage(role="system", content=first.content + SEPARATOR + text)
        return [joined, *messages[1:]]
    return [ChatMessage(role="system", content=text), *messages]
