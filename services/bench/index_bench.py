"""``tokenwire bench index``: what retrieval costs, by index size, against exact search.

Per size (synthetic clustered 384-dim unit vectors, ``shared.retrieval.vectors.Clustered``):
the index the store would build (exact under ``FLAT_MAX``, else IVF with nprobe tuned at
build time), its build time, one-thread latency of single queries (p50 and mean) and
recall@10 against exact search, on queries drawn from the same clusters but never
indexed; and, as the same run's baseline, exact search's one-thread latency. Then the
embedder: milliseconds per query when a call embeds 1 query against 16 (one thread),
the figure that puts query embedding where a batch of requests already waits (the
batcher's window).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import faiss
import numpy as np
import orjson

from shared.retrieval.vectors import Clustered, IndexPlan, build, recall_at_k, tune_nprobe

DIM = 384
QUERIES = 500
EXACT_QUERIES = 50  # the exact baseline is slow at a million vectors


def _single_queries_ms(index: Any, queries: np.ndarray) -> list[float]:
    out = []
    for q in queries:
        t0 = time.perf_counter()
        index.search(q[None, :], 10)
        out.append((time.perf_counter() - t0) * 1000)
    return out


def size_row(n: int, seed: int = 0) -> dict[str, Any]:
    """One size's figures (see the module's docstring)."""
    data = Clustered(DIM, clusters=max(1, n // 100), seed=seed)
    vectors = data.sample(n, seed=seed + 1)
    ids = np.arange(n, dtype=np.int64)
    queries = data.sample(QUERIES, seed=seed + 2)
    plan = IndexPlan.for_size(n)
    t0 = time.perf_counter()
    index = build(vectors, ids, plan, seed)
    nprobe = tune_nprobe(index, vectors, ids, seed)
    build_s = time.perf_counter() - t0
    _, truth = faiss.knn(queries, vectors, 10, metric=faiss.METRIC_INNER_PRODUCT)
    exact = faiss.IndexFlatIP(DIM)
    exact.add(vectors)
    threads = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    try:
        lat = _single_queries_ms(index, queries)
        exact_lat = _single_queries_ms(exact, queries[:EXACT_QUERIES])
    finally:
        faiss.omp_set_num_threads(threads)
    _, got = index.search(queries, 10)
    p50 = statistics.median(lat)
    exact_p50 = statistics.median(exact_lat)
    return {
        "vectors": n,
        "kind": plan.kind,
        "nlist": plan.nlist,
        "nprobe": nprobe,
        "build_s": round(build_s, 2),
        "query_p50_ms": round(p50, 3),
        "query_mean_ms": round(statistics.fmean(lat), 3),
        "query_p99_ms": round(float(np.percentile(lat, 99)), 3),
        "recall_at_10": round(recall_at_k(got, ids[truth]), 4),
        "exact_p50_ms": round(exact_p50, 3),
        "speedup_vs_exact": round(exact_p50 / p50, 1),
    }


def embed_rows(batches: tuple[int, ...] = (1, 16), rounds: int = 4) -> list[dict[str, Any]]:
    """Milliseconds per query and per call of the serving embedder, one thread, by how
    many queries one call embeds."""
    import torch

    from shared.embedding import load_embedder

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        emb = load_embedder()
        texts = [
            f"What does clause {i} of the agreement say about late delivery?" for i in range(64)
        ]
        emb.embed(texts[:16])  # warm
        rows = []
        for b in batches:
            calls, start = 0, time.perf_counter()
            for _ in range(rounds):
                for s in range(0, 32, b):
                    emb.embed(texts[s : s + b])
                    calls += 1
            total_ms = (time.perf_counter() - start) * 1000
            rows.append(
                {
                    "queries_per_call": b,
                    "ms_per_query": round(total_ms / (calls * b), 2),
                    "ms_per_call": round(total_ms / calls, 1),
                }
            )
        return rows
    finally:
        torch.set_num_threads(threads)


def run(args: argparse.Namespace) -> None:
    rows = []
    print(
        f"{'vectors':>9} {'index':>12} {'nprobe':>6} {'build s':>8} {'p50 ms':>7} {'p99 ms':>7} "
        f"{'mean ms':>8} "
        f"{'recall@10':>9} {'exact p50 ms':>12} {'vs exact':>8}"
    )
    for n in args.sizes:
        r = size_row(n)
        rows.append(r)
        kind = f"ivf{r['nlist']}" if r["kind"] == "ivf" else "flat"
        print(
            f"{r['vectors']:>9} {kind:>12} {r['nprobe']:>6} {r['build_s']:>8} "
            f"{r['query_p50_ms']:>7} {r['query_p99_ms']:>7} {r['query_mean_ms']:>8} "
            f"{r['recall_at_10']:>9} "
            f"{r['exact_p50_ms']:>12} {r['speedup_vs_exact']:>7}x",
            flush=True,
        )
    emb = [] if args.no_embed else embed_rows()
    for e in emb:
        print(
            f"embedding, {e['queries_per_call']:>2} queries per call (one thread): "
            f"{e['ms_per_query']} ms per query, {e['ms_per_call']} ms per call"
        )
    if len(emb) == 2:
        print(
            f"batching 16 queries per call: {emb[0]['ms_per_query'] / emb[1]['ms_per_query']:.1f}x "
            "less time per query than one per call"
        )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(orjson.dumps({"faiss": rows, "embedding": emb}, option=orjson.OPT_INDENT_2))
    print(f"report: {out}")
