"""Retrieval in the batcher: the requests of one dispatch that ask for passages are
grounded together, their queries embedded in one call and each index searched once.

Why here: every request passes the batcher (the edge's and those producers publish to
Kafka directly), and the window already holds requests back for 50-100 ms, so a
dispatch's queries make a batch for free. Embedding is what batching pays for: on one CPU
thread all-MiniLM-L6-v2 took 59 ms for one query per call against 15.7 ms per query at 16
per call (`tokenwire bench index`). The work runs in a thread, off the event loop; the
embedder loads on the first request that asks for retrieval.

A request that cannot be grounded (no such index, no indexes at all, an index of another
embedder, a corrupt index, the embedder failing) is refused with that reason: a dead
letter and an error event, as any request the batcher will not serve.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

from services.batcher.metrics import NO_SUCH_INDEX, RetrievalMetrics
from shared.embedding import EmbedderError, load_embedder
from shared.messages import GenerateRequest
from shared.prompts import Prompts
from shared.retrieval.grounding import CountTokens, byte_count, fit, ground, query_text
from shared.retrieval.retriever import Query, Retriever
from shared.retrieval.store import IndexStore, NoIndexes, RetrievalError, UnknownIndex
from shared.settings import CommonSettings

log = logging.getLogger(__name__)


class Grounder:
    """Grounds requests in the indexes of ``settings.index_root``; passage tokens are
    counted with the served model's tokenizer when the batcher has it, else as UTF-8
    bytes (an upper bound for byte-level tokenizers). With ``metrics``, each dispatch's
    retrieval is counted there."""

    def __init__(
        self,
        settings: CommonSettings,
        tokenizer: Prompts | None = None,
        metrics: RetrievalMetrics | None = None,
    ) -> None:
        self.metrics = metrics
        model_dir, dtype = settings.embed_model_dir or None, settings.embed_dtype
        self.retriever = Retriever(
            IndexStore(settings.index_root), lambda: load_embedder(model_dir, dtype=dtype)
        )
        self.count: CountTokens = byte_count
        if tokenizer is not None:
            self.count = lambda text: len(tokenizer.encode(text, special_tokens=False))

    async def ground(
        self, requests: Sequence[GenerateRequest]
    ) -> list[GenerateRequest | RetrievalError]:
        """Each request with its passages placed, or why it cannot be served."""
        started = time.perf_counter()
        out = await asyncio.to_thread(self._ground, requests)
        if self.metrics is not None:
            self.metrics.seconds.observe(time.perf_counter() - started)
            self._count(requests, out)
        return out

    def _count(
        self, requests: Sequence[GenerateRequest], out: Sequence[GenerateRequest | RetrievalError]
    ) -> None:
        assert self.metrics is not None
        for req, res in zip(requests, out, strict=True):
            assert req.retrieval is not None
            index = req.retrieval.index
            if isinstance(res, RetrievalError):
                if isinstance(res, UnknownIndex | NoIndexes):
                    index = NO_SUCH_INDEX
                self.metrics.requests.labels(index, res.code).inc()
                continue
            self.metrics.requests.labels(index, "ok").inc()
            placed = len(res.grounding.passage_ids) if res.grounding is not None else 0
            self.metrics.passages.labels(index).inc(placed)

    def _ground(
        self, requests: Sequence[GenerateRequest]
    ) -> list[GenerateRequest | RetrievalError]:
        specs = [r.retrieval for r in requests if r.retrieval is not None]
        if len(specs) != len(requests):
            raise ValueError("every request given must ask for retrieval")
        queries = [
            Query(s.index, query_text(r), s.top_k) for r, s in zip(requests, specs, strict=True)
        ]
        try:
            results = self.retriever.retrieve(queries)
        except (EmbedderError, OSError, RuntimeError) as exc:  # the embedder or FAISS failed
            log.error("retrieval failed for %d requests: %r", len(requests), exc)
            failed = RetrievalError(f"retrieval failed: {exc}")
            return [failed for _ in requests]
        out: list[GenerateRequest | RetrievalError] = []
        for req, spec, res in zip(requests, specs, results, strict=True):
            if isinstance(res, RetrievalError):
                out.append(res)
            else:
                chosen = fit(res.passages, spec.budget_tokens, self.count)
                out.append(ground(req, spec.index, res.version, chosen))
        return out
