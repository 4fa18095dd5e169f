"""``tokenwire bench cache``: what the response caches save and cost, against baselines
measured in the same run on the same stack.

One worker and one batcher serve three edges: ``on`` (exact and semantic caches),
``exact`` (exact cache only) and ``off`` (no cache). Rows:

- TTFT of a miss, of an exact hit and of a semantic hit (greedy chat, streamed; the time
  from sending the request to its first token chunk), p50 and p95; a hit against the miss.
- The time a lookup adds to a miss: misses sent alternately to ``on``, ``exact`` and
  ``off``, their TTFT p50 differences; and the edges' own lookup times
  (``tw_cache_lookup_seconds``).
- Throughput of a chat mix with 30% repeats through ``exact`` (the default configuration)
  and through ``on``, each against the same mix (fresh prompts) through ``off``.

FAISS query latency and recall by index size, and query-embedding cost by batch size, are
``tokenwire bench index``'s rows.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import orjson

from services.bench.cluster import Stack, make_stack
from services.bench.sse_client import SsePool
from services.bench.stats import pct
from shared.cache.labelled import INTENTS

MODEL = "tokenwire-tiny"


def body(text: str, max_tokens: int) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
    }


async def ttft(http: httpx.AsyncClient, url: str, payload: dict[str, Any]) -> tuple[float, str]:
    """(seconds to the first token chunk, the x-tokenwire-cache header) of one request."""
    t0 = time.perf_counter()
    first = 0.0
    async with http.stream("POST", url + "/v1/chat/completions", json=payload) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if line.startswith("data: {") and not first:
                first = time.perf_counter() - t0
        return first, r.headers["x-tokenwire-cache"]


def ms(values: list[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "p50_ms": round(pct(values, 0.5) * 1000, 2),
        "p95_ms": round(pct(values, 0.95) * 1000, 2),
    }


async def hit_rows(stack: Stack, http: httpx.AsyncClient, n: int, max_tokens: int) -> Any:
    """Misses, then the same requests (exact hits), then paraphrases (semantic hits)."""
    url = stack.url("on")
    intents = INTENTS[: max(1, n)]
    tag = uuid.uuid4().hex[:6]
    questions = [f"{paras[0]} ({tag})" for paras, _ in intents]
    miss = [(await ttft(http, url, body(q, max_tokens))) for q in questions]
    await asyncio.sleep(1.0)  # the worker stores each answer as it settles the request
    exact = [(await ttft(http, url, body(q, max_tokens))) for q in questions]
    para = [(await ttft(http, url, body(f"{p[1]} ({tag})", max_tokens))) for p, _ in intents]
    return {
        "miss": ms([t for t, c in miss if c == "miss"]),
        "exact_hit": ms([t for t, c in exact if c == "exact"]),
        "semantic_hit": ms([t for t, c in para if c == "semantic"]),
        "semantic_hit_rate": sum(c == "semantic" for _, c in para) / len(para),
    }


async def lookup_rows(stack: Stack, http: httpx.AsyncClient, n: int, max_tokens: int) -> Any:
    """Misses alternately through the three edges: what each edge's lookup adds."""
    times: dict[str, list[float]] = {"on": [], "exact": [], "off": []}
    for i in range(n):
        for edge in times:
            text = f"Explain item {i} of list {uuid.uuid4().hex[:8]} for the {edge} edge."
            t, cache = await ttft(http, stack.url(edge), body(text, max_tokens))
            assert cache == "miss", cache
            times[edge].append(t)
    p50 = {edge: pct(v, 0.5) for edge, v in times.items()}
    return {
        "miss_ttft_p50_ms": {e: round(v * 1000, 2) for e, v in p50.items()},
        "added_by_exact_p50_ms": round((p50["exact"] - p50["off"]) * 1000, 2),
        "added_by_exact_and_semantic_p50_ms": round((p50["on"] - p50["off"]) * 1000, 2),
        "edge_lookup_mean_ms": await lookup_means(http, stack.url("on")),
    }


async def lookup_means(http: httpx.AsyncClient, url: str) -> dict[str, float]:
    """Mean of ``tw_cache_lookup_seconds`` by kind, as the edge measured it."""
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    for line in (await http.get(url + "/metrics")).text.splitlines():
        for suffix, into in (("_sum", sums), ("_count", counts)):
            head = f"tw_cache_lookup_seconds{suffix}{{"
            if line.startswith(head):
                kind = line.split('kind="')[1].split('"')[0]
                into[kind] = float(line.split()[-1])
    return {k: round(sums[k] / counts[k] * 1000, 3) for k in sums if counts.get(k)}


async def exact_hits(http: httpx.AsyncClient, url: str) -> float:
    """The edge's count of exact-cache hits so far."""
    for line in (await http.get(url + "/metrics")).text.splitlines():
        if line.startswith('tw_cache_lookups_total{kind="exact",result="hit"}'):
            return float(line.split()[-1])
    return 0.0


async def mix_rate(stack: Stack, edge: str, total: int, concurrency: int, tokens: int) -> float:
    """Requests per second of a chat mix, 30% of it repeats of earlier requests."""
    tag = uuid.uuid4().hex[:6]
    unique = [f"Summarise section {i} of report {tag}." for i in range(total - total * 3 // 10)]
    repeats = unique[: total * 3 // 10]
    head = unique[: len(unique) - len(repeats)]
    tail = [x for pair in zip(unique[len(head) :], repeats, strict=False) for x in pair]
    order = head + tail
    queue: asyncio.Queue[str] = asyncio.Queue()
    for text in order:
        queue.put_nowait(text)
    port = stack.edge_ports[edge]

    async def client(pool: SsePool) -> None:
        while not queue.empty():
            text = queue.get_nowait()
            await pool.post("/v1/chat/completions", orjson.dumps(body(text, tokens)), _ignore)

    t0 = time.perf_counter()
    async with SsePool("127.0.0.1", port, headers=_headers(stack)) as pool:
        await asyncio.gather(*(client(pool) for _ in range(concurrency)))
    return len(order) / (time.perf_counter() - t0)


def _ignore(_: bytes, __: float) -> None:
    return None


def _headers(stack: Stack) -> dict[str, str]:
    return {"content-type": "application/json", **stack.auth_headers()}


async def _stack(env: dict[str, str], model_dir: str, log_dir: Path) -> Stack:
    stack = make_stack(f"cache-{uuid.uuid4().hex[:6]}", env, model_dir, log_dir)
    stack.env.update(TW_RATE_REQUESTS_PER_MIN="0", TW_RATE_TOKENS_PER_MIN="0")
    await stack.create_topics()
    stack.start("worker")
    stack.start("batcher")
    stack.start("edge", name="on", TW_SEMANTIC_CACHE="true")
    stack.start("edge", name="exact")
    stack.start("edge", name="off", TW_CACHE="false")
    return stack


async def measure(args: argparse.Namespace, model_dir: str, log_dir: Path) -> dict[str, Any]:
    stack = await _stack(dict(os.environ), model_dir, log_dir)
    report: dict[str, Any] = {"config": {k: v for k, v in vars(args).items() if k != "fn"}}
    try:
        await stack.wait_ready(within_s=300)
        async with httpx.AsyncClient(timeout=120, headers=stack.auth_headers()) as http:
            for edge in ("on", "exact", "off"):  # warm each path once
                await ttft(http, stack.url(edge), body(f"warm {edge}", args.max_tokens))
            report["ttft"] = await hit_rows(stack, http, args.probes, args.max_tokens)
            report["lookup"] = await lookup_rows(stack, http, args.probes, args.max_tokens)
        # Two rounds in mirrored order, so warm-up and drift in the machine's load fall on
        # every edge alike; each edge's rate is the mean of its two.
        runs: dict[str, list[float]] = {"off": [], "exact": [], "on": []}
        async with httpx.AsyncClient(timeout=30) as http:
            hits_before = await exact_hits(http, stack.url("exact"))
            for edge in ("off", "exact", "on", "on", "exact", "off"):
                rate = await mix_rate(stack, edge, args.mix, args.concurrency, args.max_tokens)
                runs[edge].append(rate)
            hits = await exact_hits(http, stack.url("exact")) - hits_before
        rates = {edge: sum(r) / len(r) for edge, r in runs.items()}
        report["mix_30pct_repeats"] = {
            "exact_hits_per_run": hits / 2,
            "rps": {edge: round(r, 2) for edge, r in rates.items()},
            "exact_vs_off": round(rates["exact"] / rates["off"], 2),
            "exact_and_semantic_vs_off": round(rates["on"] / rates["off"], 2),
        }
    finally:
        stack.stop_all()
    t = report["ttft"]
    t["exact_hit_vs_miss_p50"] = round(t["exact_hit"]["p50_ms"] / t["miss"]["p50_ms"], 3)
    return report


def run(args: argparse.Namespace, model_dir: str) -> dict[str, Any]:
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    report = asyncio.run(measure(args, model_dir, out.parent))
    out.write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    return report
