"""The semantic cache: a request whose prompt means the same as a cached one is answered
with that one's stored answer.

Entries live in Redis, one stream per tenant scope and cache generation (the prompt's
unit vector and its content words' vectors and keys, the exact-cache digest of its answer,
its text, conversation context and sampling class, and the embedder's identity), so every
edge shares them and an edge that
starts, or a Redis that restarts with its data, rebuilds the same index. Each edge keeps
a FAISS inner-product index per scope, brought up to date from the stream (only new
entries are read) while each lookup's prompt is embedded.

A hit needs, besides a similarity of at least ``TW_SEMANTIC_THRESHOLD``: the same
conversation context and sampling class, the same embedder, no disagreement in negation,
numbers, named entities, antonyms or direction (``shared/cache/guard.py``), the
verifier's consent (``shared/cache/verify.py``: the words the two prompts do not share
must be matched by the other's words; the prompt's word vectors come from its own forward
pass), and the answer itself still in the exact cache (it is written when the first
request finishes). An entry stored without word vectors is never served.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import faiss
import numpy as np
import orjson
import redis.asyncio as aioredis

from services.edge.config import EdgeSettings
from shared.cache.align import WordVectors
from shared.cache.guard import disagreement
from shared.cache.keys import context_digest, last_user_text, sampling_class
from shared.cache.store import read_entry
from shared.cache.verify import CANDIDATES, VERIFIER
from shared.embedding import Embedder
from shared.messages import GenerateRequest

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Meta:
    """What a semantic entry says besides its vector."""

    digest: str
    text: str
    context: str
    sampling: str
    embedder: str
    words: WordVectors | None = None  # None: stored without them, never served


@dataclass
class ScopeIndex:
    """One scope's FAISS index at one generation, and how far it has read the stream."""

    generation: int
    dim: int
    index: Any = None
    meta: dict[int, Meta] = field(default_factory=dict)
    last_id: str = "0-0"
    next_id: int = 0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def __post_init__(self) -> None:
        self.index = faiss.IndexIDMap2(faiss.IndexFlatIP(self.dim))

    def add(self, vectors: np.ndarray, metas: list[Meta], keep: int) -> None:
        ids = np.arange(self.next_id, self.next_id + len(metas), dtype=np.int64)
        self.index.add_with_ids(vectors, ids)
        for i, m in zip(ids.tolist(), metas, strict=True):
            self.meta[i] = m
        self.next_id += len(metas)
        oldest = self.next_id - keep
        if oldest > 0 and len(self.meta) > keep:
            gone = [i for i in self.meta if i < oldest]
            self.index.remove_ids(np.array(gone, dtype=np.int64))
            for i in gone:
                del self.meta[i]


def load_single_threaded(model_dir: str | None, dtype: str = "auto") -> Embedder:
    """The embedder, with torch and FAISS on one thread each in this process: a lookup
    embeds one text and searches one vector, and on a busy host their thread pools cost
    far more than they give (measured on 2 loaded cores: 529 ms per text with torch's 2
    threads against 38 ms with one; a search 17 ms with 2 OpenMP threads, 0.015 ms with
    one). The edge runs no other torch or FAISS work."""
    import torch

    from shared.embedding import load_embedder

    torch.set_num_threads(1)
    faiss.omp_set_num_threads(1)
    embedder = load_embedder(model_dir, dtype=dtype)
    how = "traced" if embedder.traced else "eager (the trace failed or disagreed)"
    log.info(
        "embedder %s loaded from %s: %s, %s",
        embedder.identity,
        embedder.model_dir,
        how,
        embedder.dtype,
    )
    return embedder


Embedded = tuple[np.ndarray, WordVectors | None]


def _meta(fields: dict[str, Any], word_bytes: bytes | None, dim: int) -> Meta:
    """An entry's :class:`Meta` from its stream fields; its word vectors only when their
    keys and rows agree (an entry stored without them has none)."""
    keys = fields.pop("words", None)
    words = None
    if keys is not None and word_bytes is not None:
        rows = np.frombuffer(word_bytes, dtype=np.float16).astype(np.float32)
        if len(rows) == len(keys) * dim:
            words = WordVectors(tuple(str(k) for k in keys), rows.reshape(len(keys), dim))
    return Meta(**fields, words=words)


class EmbedBatcher:
    """Embeds texts in a worker thread, one batch at a time: texts that arrive while a
    batch is computing go together in the next one, so a lone lookup is not held back
    and a burst shares forward passes. With ``words``, each text's content-word vectors
    come from the same forward pass (:meth:`embed_words`)."""

    def __init__(self, load: Callable[[], Embedder], *, words: bool = False) -> None:
        self._load = load
        self._words = words
        self._embedder: Embedder | None = None
        self._pending: list[tuple[str, asyncio.Future[Embedded]]] = []
        self._running = False
        self._task: asyncio.Task[None] | None = None
        self.batches = 0
        self.texts = 0

    async def embedder(self) -> Embedder:
        if self._embedder is None:
            self._embedder = await asyncio.to_thread(self._load)
        return self._embedder

    async def embed(self, text: str) -> np.ndarray:
        """The unit vector of ``text``."""
        return (await self._submit(text))[0]

    async def embed_words(self, text: str) -> tuple[np.ndarray, WordVectors]:
        """The unit vector of ``text`` and its content words' vectors (a batcher made
        with ``words``)."""
        vector, words = await self._submit(text)
        if words is None:
            raise RuntimeError("this embedding batcher was made without word vectors")
        return vector, words

    async def _submit(self, text: str) -> Embedded:
        fut: asyncio.Future[Embedded] = asyncio.get_running_loop().create_future()
        self._pending.append((text, fut))
        if not self._running:
            self._running = True
            self._task = asyncio.create_task(self._drain())
        return await fut

    def _run(self, embedder: Embedder, texts: list[str]) -> list[Embedded]:
        if not self._words:
            return [(v, None) for v in embedder.embed(texts)]
        vectors, words = embedder.embed_words(texts)
        return list(zip(vectors, words, strict=True))

    async def _drain(self) -> None:
        try:
            embedder = await self.embedder()
            while self._pending:
                # A lookup answered before its turn (an exact hit) dropped its text.
                batch = [(t, fut) for t, fut in self._pending if not fut.done()]
                self._pending = []
                if not batch:
                    continue
                try:
                    results = await asyncio.to_thread(self._run, embedder, [t for t, _ in batch])
                except Exception as exc:  # an embedder failure fails its lookups, not the edge
                    for _, fut in batch:
                        if not fut.done():
                            fut.set_exception(exc)
                    continue
                self.batches += 1
                self.texts += len(batch)
                for (_, fut), result in zip(batch, results, strict=True):
                    if not fut.done():
                        fut.set_result(result)
        finally:
            self._running = False


@dataclass(frozen=True, slots=True)
class Probe:
    """A semantic lookup's outcome: the hit's stored answer (or None) and the prompt's
    vector and word vectors, kept to remember the request on a miss."""

    entry: bytes | None
    vector: np.ndarray
    words: WordVectors
    similarity: float = 0.0


class SemanticCache:
    """Per-scope FAISS indexes over prompt embeddings, synchronised from Redis."""

    def __init__(
        self, settings: EdgeSettings, redis: aioredis.Redis, embedder: EmbedBatcher
    ) -> None:
        self.settings = settings
        self.redis = redis
        self.names = settings.names
        self.embedder = embedder
        self._scopes: dict[str, ScopeIndex] = {}

    def _stream(self, scope: str, generation: int) -> str:
        return self.names.cache(scope, "s", str(generation))

    async def lookup(self, scope: str, generation: int, req: GenerateRequest) -> Probe:
        """The stored answer of the nearest agreeing entry, if any. The index is brought up
        to date while the prompt is embedded (the forward pass is most of a lookup)."""
        text = last_user_text(req)
        embedding = asyncio.create_task(self.embedder.embed_words(text))
        try:
            index = await self._synced(scope, generation)
        except BaseException:
            embedding.cancel()
            raise
        vector, words = await embedding
        identity = (await self.embedder.embedder()).identity
        if index.index.ntotal == 0:
            return Probe(None, vector, words)
        sims, ids = index.index.search(vector[None, :], min(CANDIDATES, index.index.ntotal))
        context, cls = context_digest(req), sampling_class(req)
        for sim, i in zip(sims[0].tolist(), ids[0].tolist(), strict=True):
            if sim < self.settings.semantic_threshold:
                break
            meta = index.meta.get(i)
            if meta is None or (meta.context, meta.sampling, meta.embedder) != (
                context,
                cls,
                identity,
            ):
                continue
            if disagreement(text, meta.text) is not None:
                continue
            if meta.words is None or not VERIFIER.accepts(sim, words, meta.words):
                continue
            key = self.names.cache_exact(scope, generation, meta.digest)
            entry = await read_entry(self.redis, key)
            if entry:
                return Probe(entry, vector, words, sim)
        return Probe(None, vector, words)

    async def remember(
        self,
        scope: str,
        generation: int,
        req: GenerateRequest,
        digest: str,
        probe: Probe | None,
    ) -> None:
        """Add a missed request as an entry (its answer is stored when it finishes), with
        the vectors its lookup computed."""
        embedder = await self.embedder.embedder()
        if probe is None:  # a no-cache request: not looked up, so not embedded yet
            vector, words = await self.embedder.embed_words(last_user_text(req))
        else:
            vector, words = probe.vector, probe.words
        meta = {
            "digest": digest,
            "text": last_user_text(req),
            "context": context_digest(req),
            "sampling": sampling_class(req),
            "embedder": embedder.identity,
            "words": list(words.keys),
        }
        key = self._stream(scope, generation)
        pipe = self.redis.pipeline(transaction=False)
        pipe.xadd(
            key,
            {
                b"v": np.asarray(vector, dtype=np.float32).tobytes(),
                # float16 halves the entry; the verifier's cosines move by < 1e-3.
                b"w": np.asarray(words.vectors, dtype=np.float16).tobytes(),
                b"m": orjson.dumps(meta),
            },
            maxlen=self.settings.semantic_max_entries,
            approximate=True,
        )
        pipe.expire(key, self.settings.cache_ttl_s)
        await pipe.execute()

    async def _synced(self, scope: str, generation: int) -> ScopeIndex:
        """The scope's index with every entry of the stream read."""
        index = self._scopes.get(scope)
        if index is None or index.generation != generation:
            dim = (await self.embedder.embedder()).dim
            index = self._scopes[scope] = ScopeIndex(generation, dim)
        async with index.lock:
            key = self._stream(scope, generation)
            while True:
                rows = await self.redis.xrange(key, min=f"({index.last_id}", count=1000)
                if not rows:
                    return index
                self._add_rows(index, rows)

    def _add_rows(self, index: ScopeIndex, rows: list[Any]) -> None:
        vectors, metas = [], []
        for entry_id, fields in rows:
            index.last_id = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
            try:
                vec = np.frombuffer(fields[b"v"], dtype=np.float32)
                meta = _meta(orjson.loads(fields[b"m"]), fields.get(b"w"), index.dim)
            except (KeyError, TypeError, ValueError, orjson.JSONDecodeError):
                log.warning("semantic entry %s unreadable: skipped", index.last_id)
                continue
            if vec.shape != (index.dim,):
                continue  # another embedder's vector: never comparable
            vectors.append(vec)
            metas.append(meta)
        if metas:
            index.add(np.stack(vectors), metas, self.settings.semantic_max_entries)

    def sizes(self) -> dict[str, int]:
        """Entries held per scope (for tests and the benchmark)."""
        return {scope: idx.index.ntotal for scope, idx in self._scopes.items()}
