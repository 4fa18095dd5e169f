"""Which FAISS index a knowledge base gets, how it is built and tuned, and how recall is
measured.

Below ``FLAT_MAX`` vectors the index is exact (``IndexFlatIP``: an inner product over
unit vectors is the cosine): a query scans them in well under a millisecond. Above, an
IVF index (``IndexIVFFlat``, ``nlist`` about sqrt(n) inverted lists): a query scans only
the ``nprobe`` lists nearest to it. IVF rather than HNSW because a knowledge base
changes: IVF takes adds and removes in place by id (``add_with_ids``, ``remove_ids``),
while an HNSW graph cannot remove a vector and would be rebuilt on every change. ``nprobe``
is tuned at build time, against exact search on queries near the indexed vectors, to the
smallest value whose recall@10 reaches ``TUNE_RECALL`` (a margin over the 0.95 target).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import faiss
import numpy as np

FLAT_MAX = 5_000
TUNE_RECALL = 0.97
TUNE_QUERIES = 200
TUNE_NOISE = 1.0  # norm of the noise added to an indexed unit vector to make a query
TRAIN_PER_LIST = 64  # training points per inverted list (FAISS warns under 39)


@dataclass(frozen=True, slots=True)
class IndexPlan:
    """The index a size gets: ``flat`` (exact) or ``ivf`` with ``nlist`` lists."""

    kind: str
    nlist: int = 0

    @classmethod
    def for_size(cls, n: int) -> IndexPlan:
        if n < FLAT_MAX:
            return cls("flat")
        return cls("ivf", max(16, int(math.sqrt(n))))


def build(vectors: np.ndarray, ids: np.ndarray, plan: IndexPlan, seed: int = 0) -> Any:
    """A FAISS index over ``vectors`` (unit rows, float32) with the given int64 ids."""
    dim = vectors.shape[1]
    index: Any
    if plan.kind == "flat":
        index = faiss.IndexIDMap2(faiss.IndexFlatIP(dim))
    else:
        quantizer = faiss.IndexFlatIP(dim)
        index = faiss.IndexIVFFlat(quantizer, dim, plan.nlist, faiss.METRIC_INNER_PRODUCT)
        rng = np.random.default_rng(seed)
        take = min(len(vectors), TRAIN_PER_LIST * plan.nlist)
        sample = vectors[np.sort(rng.choice(len(vectors), take, replace=False))]
        index.train(sample)
    if len(vectors):
        index.add_with_ids(np.ascontiguousarray(vectors), ids.astype(np.int64))
    return index


def set_nprobe(index: Any, nprobe: int) -> None:
    """Lists an IVF index scans per query (nothing for an exact index)."""
    if isinstance(index, faiss.IndexIVF):
        index.nprobe = nprobe


def tune_nprobe(index: Any, vectors: np.ndarray, ids: np.ndarray, seed: int = 0) -> int:
    """The smallest ``nprobe`` whose recall@10 against exact search reaches
    ``TUNE_RECALL`` on queries near the indexed ``vectors`` (with their ``ids``); 0 for an
    exact index."""
    if not isinstance(index, faiss.IndexIVF) or len(vectors) == 0:
        return 0
    queries = near_queries(vectors, min(TUNE_QUERIES, len(vectors)), seed)
    _, truth = faiss.knn(queries, vectors, 10, metric=faiss.METRIC_INNER_PRODUCT)
    truth_ids = ids[truth]
    lo, hi = 0, 1
    while hi < index.nlist:
        if _recall_with(index, queries, truth_ids, hi) >= TUNE_RECALL:
            break
        lo, hi = hi, hi * 2
    hi = min(hi, index.nlist)
    while hi - lo > 1:  # the smallest passing value between the last failing and hi
        mid = (lo + hi) // 2
        if _recall_with(index, queries, truth_ids, mid) >= TUNE_RECALL:
            hi = mid
        else:
            lo = mid
    set_nprobe(index, hi)
    return hi


def _recall_with(index: Any, queries: np.ndarray, truth_ids: np.ndarray, nprobe: int) -> float:
    set_nprobe(index, nprobe)
    _, got = index.search(queries, truth_ids.shape[1])
    return recall_at_k(got, truth_ids)


def near_queries(vectors: np.ndarray, count: int, seed: int) -> np.ndarray:
    """Unit queries near indexed vectors: a sampled vector plus noise of norm ``TUNE_NOISE``."""
    rng = np.random.default_rng(seed)
    base = vectors[rng.choice(len(vectors), count, replace=False)]
    noise = rng.standard_normal(base.shape).astype(np.float32)
    noise *= TUNE_NOISE / np.linalg.norm(noise, axis=1, keepdims=True)
    return unit(base + noise)


def recall_at_k(got: np.ndarray, truth: np.ndarray) -> float:
    """Share of the true k nearest ids found among the returned k, over all queries."""
    hits = sum(len(set(g.tolist()) & set(t.tolist())) for g, t in zip(got, truth, strict=True))
    return hits / truth.size


def unit(x: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return np.ascontiguousarray(x / np.maximum(norms, 1e-12), dtype=np.float32)


class Clustered:
    """Synthetic clustered unit vectors, as sentence embeddings are: topics, clusters
    around them (a cluster centre is its topic plus a random direction of norm ``mix``),
    and points around those (Gaussian noise of norm about ``spread``), so clusters
    overlap their neighbours. Queries drawn with another seed come from the same clusters
    but are none of the indexed points."""

    def __init__(
        self, dim: int, clusters: int, spread: float = 1.2, mix: float = 0.6, seed: int = 0
    ) -> None:
        rng = np.random.default_rng(seed)
        self.dim, self.spread = dim, spread
        topics = unit(rng.standard_normal((max(1, clusters // 20), dim)).astype(np.float32))
        offsets = unit(rng.standard_normal((clusters, dim)).astype(np.float32))
        self.centres = unit(topics[rng.integers(0, len(topics), clusters)] + mix * offsets)

    def sample(self, n: int, seed: int) -> np.ndarray:
        rng = np.random.default_rng(seed)
        out = np.empty((n, self.dim), np.float32)
        step = 100_000  # bounded temporaries at a million vectors
        for s in range(0, n, step):
            m = min(step, n - s)
            noise = rng.standard_normal((m, self.dim)).astype(np.float32)
            noise *= self.spread / math.sqrt(self.dim)
            out[s : s + m] = unit(self.centres[rng.integers(0, len(self.centres), m)] + noise)
        return out
