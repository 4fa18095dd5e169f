"""N-gram (prompt-lookup) speculation: draft tokens from a request's own history (pure: no
torch, no I/O).

When the last ``n`` tokens of a sequence occurred before in its prompt or output, the tokens
that followed them then are a cheap guess at what follows now: extractive answers (quoting,
editing, summarising with the source's words) copy long runs. The engine verifies a guess in
one forward pass and keeps the part the model agrees with, so a guess costs at most one
wider step and never changes what is generated."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SpecConfig:
    """How far a request may guess ahead, and when the engine stops guessing.

    ``k`` draft tokens at most per step (0: speculation off), from a match of the last
    ``max_n`` tokens down to the last ``min_n``; fewer as the batch fills, so that one step
    verifies at most ``step_tokens`` draft tokens; with more than ``max_running`` sequences
    running nobody speculates: a full batch already spends each weight pass on many tokens,
    and the drafts' extra positions would only widen it.

    Off unless asked for: a rejected draft still widens its step (a verifying pass of five
    tokens costs about 1.3x a decode on the small preset), and on the
    embedded tiny model the drafts of extractive prompts are accepted about one token in
    three to five, for a gain of 1.1x to 1.25x at one request; a workload that copies more
    (code edits, quoting) turns it on with ``TW_SPEC_NGRAM_K``.

    ``method="draft"``: the guesses come from a draft model instead (``DraftModel``), the
    same ``k`` and cap; ``max_n`` and ``min_n`` are the n-gram method's alone."""

    k: int = 0
    max_n: int = 4
    min_n: int = 1
    max_running: int = 8
    method: str = "ngram"
    step_tokens: int = 8  # draft tokens of all requests in one step, at most

    def __post_init__(self) -> None:
        if self.method not in ("ngram", "draft"):
            raise ValueError(f"unknown speculation method {self.method!r}: ngram or draft")

    @property
    def enabled(self) -> bool:
        return self.k > 0

    def active(self, running: int) -> bool:
        """Whether requests speculate this step, with ``running`` sequences in the batch."""
        return self.per_request(running) > 0

    def per_request(self, running: int) -> int:
        """Draft tokens each request may bring this step: ``k``, fewer as the batch fills
        (the step's draft tokens stay within ``step_tokens``), none above ``max_running``.
        A wider verifying pass costs about what a decode of that many more rows does, which
        on a CPU is most of a step already at a few rows."""
        if not self.enabled or running > self.max_running:
            return 0
        return min(self.k, self.step_tokens // max(1, running))


def propose(tokens: Sequence[int], k: int, max_n: int, min_n: int = 1) -> list[int]:
    """Up to ``k`` tokens that followed the latest earlier occurrence of the longest suffix of
    ``tokens`` (``max_n`` tokens down to ``min_n``); empty when no suffix recurs. One
    backward scan: each earlier position holding the last token is a candidate, its match
    length counted back from there; the first candidate matching ``max_n`` tokens ends it."""
    size = len(tokens)
    if k <= 0 or size < 2 or min_n < 1:
        return []
    max_n = min(max_n, size - 1)
    last = tokens[-1]
    best_len, best_at = 0, -1
    for i in range(size - 2, -1, -1):
        if tokens[i] != last:
            continue
        m = 1
        while m < max_n and m <= i and tokens[i - m] == tokens[size - 1 - m]:
            m += 1
        if m > best_len:
            best_len, best_at = m, i
            if m == max_n:
                break
    if best_len < min_n:
        return []
    return list(tokens[best_at + 1 : best_at + 1 + k])
