"""Word alignment of two prompts from their contextual token vectors: a BERTScore-style
check that every content word of each prompt has a close counterpart in the other.

A sentence vector is a mean, so one word changed in a long prompt moves it little
("chemical name" against "chemical formula"). The encoder's token vectors, before the
pooling, still tell that word apart: here each word is the mean of its sub-tokens' vectors,
stopwords and punctuation are dropped, and two prompts align when the worst-matched word on
either side is still at least a threshold from its best match on the other.

Pure numpy (no torch, no I/O): the embedder hands it token vectors and word ids.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from shared.cache.guard import word_key

# Function words, which paraphrases add and drop freely; a word of substance ("name",
# "way", "formula") stays, so a change of it is seen.
STOPWORDS = frozenset(
    "a an the of to in on at by for from with into onto and or is are was were be been "
    "being do does did how what which who whom when where why can could should would will "
    "shall may might must i you my me it its this that these those there their your our we "
    "us he she they them his her s am has have had".split()
)


@dataclass(frozen=True, slots=True)
class WordVectors:
    """A text's content words: each one's key (lower-cased, short forms expanded, crudely
    stemmed: :func:`shared.cache.guard.word_key`) and its unit vector, one row each."""

    keys: tuple[str, ...]
    vectors: np.ndarray  # (len(keys), dim) float32


def content_words(
    tokens: np.ndarray, word_ids: Sequence[int | None], words: Sequence[str]
) -> np.ndarray:
    """The unit vectors of a text's content words (see :func:`keyed_content_words`)."""
    return keyed_content_words(tokens, word_ids, words).vectors


def keyed_content_words(
    tokens: np.ndarray, word_ids: Sequence[int | None], words: Sequence[str]
) -> WordVectors:
    """A text's content words: ``tokens`` holds one row per token (``(n, dim)``),
    ``word_ids[i]`` is the word token ``i`` belongs to (None for special tokens and
    padding) and ``words[w]`` the text of word ``w``. A word's vector is the mean of its
    tokens'; stopwords and words with no letter or digit are dropped."""
    rows: dict[int, list[int]] = {}
    for i, w in enumerate(word_ids):
        if w is not None:
            rows.setdefault(w, []).append(i)
    kept = [w for w in rows if _is_content(words[w])]
    if not kept:
        return WordVectors((), np.zeros((0, tokens.shape[1]), dtype=np.float32))
    out = np.asarray([tokens[rows[w]].mean(axis=0) for w in kept], dtype=np.float32)
    out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)
    return WordVectors(tuple(word_key(words[w]) for w in kept), out)


def _is_content(word: str) -> bool:
    return any(c.isalnum() for c in word) and word.lower() not in STOPWORDS


def alignment(a: np.ndarray, b: np.ndarray) -> float:
    """The lowest similarity of a content word of either text to its best match in the
    other (rows are unit vectors): 1.0 when neither has content words, 0.0 when only one
    has (there is nothing to match its words with)."""
    if len(a) == 0 or len(b) == 0:
        return 1.0 if len(a) == len(b) else 0.0
    sims = a.astype(np.float32) @ b.astype(np.float32).T
    return float(min(sims.max(axis=1).min(), sims.max(axis=0).min()))


def aligned(a: np.ndarray, b: np.ndarray, threshold: float) -> bool:
    """Whether every content word of each text matches one of the other at ``threshold``."""
    return alignment(a, b) >= threshold
