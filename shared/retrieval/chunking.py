"""Text cut into passages for retrieval.

Passages are bounded in characters, not tokens: two tokenizers see them (the embedder's,
which truncates at 256 tokens, and the served model's, which counts them against the
context), so a character bound is the one both can rely on. 800 characters of English are
about 200 embedder tokens, under its truncation. A passage ends at the last sentence end
(else whitespace) before the bound, and the next starts ``overlap`` characters earlier, at
a word start, so a fact cut at a boundary is whole in one of the two.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_CHARS = 800
OVERLAP_CHARS = 100
_SENTENCE_ENDS = (". ", "! ", "? ", "\n")


@dataclass(frozen=True, slots=True)
class ChunkSpec:
    """How passages are cut: at most ``max_chars`` each, ``overlap`` shared with the next."""

    max_chars: int = MAX_CHARS
    overlap: int = OVERLAP_CHARS

    def __post_init__(self) -> None:
        if self.max_chars < 16 or not 0 <= self.overlap < self.max_chars // 2:
            raise ValueError("need max_chars >= 16 and 0 <= overlap < max_chars / 2")


def chunk_text(text: str, spec: ChunkSpec = ChunkSpec()) -> list[str]:
    """The passages of ``text``: stripped, non-empty, each at most ``spec.max_chars``.
    Blank-line-separated paragraphs that fit are kept whole."""
    passages: list[str] = []
    for para in (p.strip() for p in text.split("\n\n")):
        if para:
            passages += _cut(" ".join(para.split()), spec)
    return passages


def _cut(text: str, spec: ChunkSpec) -> list[str]:
    out: list[str] = []
    start = 0
    while len(text) - start > spec.max_chars:
        window = text[start : start + spec.max_chars]
        end = _break_at(window)
        out.append(window[:end].strip())
        nxt = start + end - spec.overlap
        # Start the overlap at a word, and always move forward.
        space = text.find(" ", nxt, start + end)
        start = max(start + 1, space + 1 if space >= 0 else nxt)
    tail = text[start:].strip()
    if tail:
        out.append(tail)
    return [p for p in out if p]


def _break_at(window: str) -> int:
    """Where to end a full window: after its last sentence end in the second half, else
    at its last space, else at the bound."""
    half = len(window) // 2
    best = max(window.rfind(mark, half) for mark in _SENTENCE_ENDS)
    if best >= 0:
        return best + 1
    space = window.rfind(" ", half)
    return space if space > 0 else len(window)
