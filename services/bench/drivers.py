"""The end-to-end benchmark's load drivers: a closed loop of streaming HTTP clients
through the edge, and an open loop of Poisson arrivals published straight to Kafka."""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import orjson

from services.bench.cluster import Stack, StreamRecorder
from services.bench.sse_client import SsePool
from services.bench.stats import summary
from services.bench.workload import Mix
from shared.codec import encode
from shared.kafka_io import make_producer
from shared.messages import GenerateRequest, Priority, SamplingParams

COMPLETIONS = "/v1/completions"


@dataclass
class Sample:
    """One request as a load driver saw it: time to first token, inter-token gaps, end to end, token counts and each chunk's arrival."""

    ttft: float
    itl: list[float]
    e2e: float
    tokens: int
    prompt_tokens: int
    cached_tokens: int
    arrivals: list[tuple[float, int]]  # (perf_counter, tokens) of each chunk


@dataclass
class Throughput:
    """A closed loop's tokens/s over the whole run, and while all its streams were busy:
    from the start until the first client finds no request left to send. After that the
    last requests drain with fewer streams in flight than the level names."""

    whole: float
    full: float


async def sse_request(pool: SsePool, body: dict[str, Any]) -> Sample:
    """One streamed completion; each chunk is timed and counted as it arrives."""
    t0 = time.perf_counter()
    arrivals: list[tuple[float, int]] = []
    usage: dict[str, Any] = {}

    def on_data(payload: bytes, now: float) -> None:
        if payload == b"[DONE]":
            return
        chunk = orjson.loads(payload)
        if chunk.get("usage"):
            usage.update(chunk["usage"])
        if chunk.get("choices"):
            arrivals.append((now, len(chunk["choices"][0].get("token_ids", ()))))

    body = {
        **body,
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,  # so tokens are counted as they arrive
    }
    await pool.post(COMPLETIONS, orjson.dumps(body), on_data)
    tokens = usage.get("completion_tokens", 0)
    if not arrivals or sum(n for _, n in arrivals) != tokens:
        raise RuntimeError(f"the chunks' token ids do not add up to usage ({tokens} tokens)")
    times = [t for t, _ in arrivals]
    return Sample(
        ttft=times[0] - t0,
        itl=[b - a for a, b in pairwise(times)],
        e2e=times[-1] - t0,
        tokens=tokens,
        prompt_tokens=usage.get("prompt_tokens", 0),
        cached_tokens=(usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0),
        arrivals=arrivals,
    )


def edge_pool(stack: Stack) -> SsePool:
    """Keep-alive connections to the stack's edge, with its API key when it has one."""
    return SsePool("127.0.0.1", stack.edge_ports["edge"], stack.auth_headers())


async def closed_loop(
    stack: Stack, bodies: list[dict[str, Any]], concurrency: int, model: str
) -> tuple[list[Sample], float, Throughput]:
    """``concurrency`` clients send ``bodies`` (from the end) one after another; the
    samples, the wall time and the tokens/s."""
    samples: list[Sample] = []
    async with edge_pool(stack) as pool:
        queue = [{**b, "model": model} for b in bodies]
        idle_at: list[float] = []  # when each client found the queue empty

        async def client_loop() -> None:
            while queue:
                samples.append(await sse_request(pool, queue.pop()))
            idle_at.append(time.perf_counter())

        t0 = time.perf_counter()
        await asyncio.gather(*(client_loop() for _ in range(concurrency)))
        wall = time.perf_counter() - t0
    tokens = sum(x.tokens for x in samples)
    if len(bodies) <= concurrency:  # never more requests than streams: no busy phase
        return samples, wall, Throughput(tokens / wall, tokens / wall)
    full = min(idle_at)
    in_full = sum(n for x in samples for t, n in x.arrivals if t <= full)
    return samples, wall, Throughput(tokens / wall, in_full / (full - t0))


def latency_summary(samples: list[Sample]) -> dict[str, Any]:
    """TTFT, inter-token and end-to-end percentiles (ms), the prefix-cache hit rate and
    the TTFT distribution of a level's samples."""
    prompt = sum(s.prompt_tokens for s in samples)
    return {
        "requests": len(samples),
        "ttft_ms": {k: v * 1000 for k, v in summary([s.ttft for s in samples]).items()},
        "itl_ms": {k: v * 1000 for k, v in summary([x for s in samples for x in s.itl]).items()},
        "e2e_ms": {k: v * 1000 for k, v in summary([s.e2e for s in samples]).items()},
        "prefix_hit_rate": sum(s.cached_tokens for s in samples) / max(1, prompt),
        "ttft_cdf_ms": sorted(s.ttft * 1000 for s in samples),
    }


async def open_loop(stack: Stack, mix: Mix, rate: float, seconds: float) -> dict[str, Any]:
    """Poisson arrivals published straight to Kafka (as backend producers do)."""
    rng = random.Random(int(rate * 1000))
    producer = make_producer(stack.settings, client_id="tw-bench", linger_ms=0)
    await producer.start()
    sent: dict[str, float] = {}
    try:
        async with StreamRecorder(stack.env["TW_REDIS_URL"], stack.names) as rec:
            t_end = time.time() + seconds
            while time.time() < t_end:
                b = mix.body()
                req = GenerateRequest(
                    prompt=b["prompt"],
                    priority=Priority(b["priority"]),
                    sampling=SamplingParams(
                        max_tokens=b["max_tokens"], temperature=0, ignore_eos=True
                    ),
                )
                await rec.watch([req.request_id])
                sent[req.request_id] = time.time()
                await producer.send_and_wait(
                    stack.names.requests, encode(req), key=req.request_id.encode()
                )
                await asyncio.sleep(rng.expovariate(rate))
            await rec.wait_finished(set(sent), within_s=300, stack=stack)
            ttft = [rec.first_at[r] - t for r, t in sent.items()]
            e2e = [rec.last_at[r] - t for r, t in sent.items()]
    finally:
        await producer.stop()
    return {
        "rate": rate,
        "requests": len(sent),
        "ttft_ms": {k: v * 1000 for k, v in summary(ttft).items()},
        "e2e_ms": {k: v * 1000 for k, v in summary(e2e).items()},
    }
