"""Retrieval for a batch of requests: one embedding call for all their queries, one
FAISS search per index, each request's own result or error.

The index's current version is read for every batch (a small file), so the batch after
an ``index add`` or ``remove`` returns searches the new version; a version is loaded
once and kept until the next one replaces it. Blocking (the embedder, FAISS, file
reads): call it off an event loop.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from shared.retrieval.store import (
    CorruptIndex,
    EmbedderMismatch,
    IndexStore,
    LoadedIndex,
    Passage,
    RetrievalError,
)


class EmbedderLike(Protocol):
    identity: str

    def embed(self, texts: Sequence[str]) -> np.ndarray: ...


@dataclass(frozen=True, slots=True)
class Query:
    """One request's search: the index, the text, how many passages."""

    index: str
    text: str
    top_k: int


@dataclass(frozen=True, slots=True)
class Found:
    """The passages found for a query, best first, and the version searched."""

    version: str
    passages: list[Passage]


class Retriever:
    """Searches the indexes of one store with one embedder (loaded on first use)."""

    def __init__(self, store: IndexStore, load_embedder: Callable[[], EmbedderLike]) -> None:
        self.store = store
        self._load_embedder = load_embedder
        self._embedder: EmbedderLike | None = None
        self._loaded: dict[str, LoadedIndex] = {}

    @property
    def embedder(self) -> EmbedderLike:
        if self._embedder is None:
            self._embedder = self._load_embedder()
        return self._embedder

    def retrieve(self, queries: Sequence[Query]) -> list[Found | RetrievalError]:
        """Each query's passages, or the error that refuses it."""
        out: list[Found | RetrievalError | None] = [None] * len(queries)
        by_index: dict[str, list[int]] = defaultdict(list)
        for i, q in enumerate(queries):
            by_index[q.index].append(i)
        ready: dict[str, LoadedIndex] = {}
        for name, rows in by_index.items():
            try:
                ready[name] = self._current(name)
            except RetrievalError as exc:
                for i in rows:
                    out[i] = exc
        todo = [i for name in ready for i in by_index[name]]
        if todo:
            vectors = self.embedder.embed([queries[i].text for i in todo])
            row_of = {i: r for r, i in enumerate(todo)}
            for name, loaded in ready.items():
                rows = by_index[name]
                k = max(queries[i].top_k for i in rows)
                hits = loaded.search(vectors[[row_of[i] for i in rows]], k)
                for i, found in zip(rows, hits, strict=True):
                    top = [p for _, p in found[: queries[i].top_k]]
                    out[i] = Found(loaded.manifest.version, top)
        return [r if r is not None else RetrievalError("not searched") for r in out]

    def _current(self, name: str) -> LoadedIndex:
        version = self.store.current_version(name)
        loaded = self._loaded.get(name)
        if loaded is not None and loaded.manifest.version == version:
            return loaded
        try:
            loaded = self._load(name, version)
        except CorruptIndex:
            # Two changes in a row may have pruned the version read a moment ago: a
            # version that is no longer current is not an error, the current one is read.
            newer = self.store.current_version(name)
            if newer == version:
                raise
            loaded = self._load(name, newer)
        self._loaded[name] = loaded
        return loaded

    def _load(self, name: str, version: str) -> LoadedIndex:
        manifest = self.store.manifest(name, version)
        if manifest.embedder != self.embedder.identity:
            raise EmbedderMismatch(
                f"index {name!r} was built with embedder {manifest.embedder}; this server "
                f"embeds with {self.embedder.identity}"
            )
        return self.store.load(name, version)
