"""``tokenwire bench batcher``: the batcher's window and routing, measured on real Kafka,
Redis and worker processes (the batcher runs in-process so its own timings are visible).

Part A — window: added wait at low load (one request at a time, a worker with room) and
batch sizes under load. Part B — routing: a shared-prefix workload on two workers with a
small KV budget, prefix affinity versus round-robin: prefix-cache hit rate and tokens/s, with
prompts sharing long heads and with conversations sharing tool lists.

``--costs PATH`` merges into a costs file the requests/s one batcher routes: the burst's
requests over the CPU seconds this process spent on them. The process also runs the
benchmark's producer and stream recorder, so the figure is a lower bound on a batcher's own.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import statistics
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer

from services.batcher.config import BatcherSettings
from services.batcher.routing import RoutingMode
from services.batcher.service import BatcherService
from services.bench.cluster import Stack, StreamRecorder, make_stack
from services.bench.stats import pct
from services.ops.costs import Cost, measured, merge_costs
from shared.codec import encode
from shared.kafka_io import make_producer
from shared.messages import ChatMessage, GenerateRequest, SamplingParams
from shared.prompts import load_prompts

WORDS = (
    "return the value of each key in the mapping when it is not none and raise an error if the "
    "argument is a list of strings or a path to a file that does not exist yet"
).split()


@dataclass
class Run:
    """One running benchmark cluster: its stack, the batcher under test, a producer and a recorder of the token streams."""

    stack: Stack
    batcher: BatcherService
    producer: AIOKafkaProducer
    recorder: StreamRecorder


class Bench:
    """The batcher benchmark: starts a cluster per routing mode and worker count, and measures it."""

    def __init__(self, env: dict[str, str], model_dir: str, log_dir: Path) -> None:
        self.env, self.model_dir, self.log_dir = env, model_dir, log_dir

    @contextlib.asynccontextmanager
    async def cluster(
        self, tag: str, routing: RoutingMode, workers: int, **worker_env: str
    ) -> AsyncIterator[Run]:
        """Worker processes, an in-process batcher, a producer and a stream recorder; all
        stopped on exit."""
        stack = make_stack(
            f"bench-{tag}-{uuid.uuid4().hex[:6]}", self.env, self.model_dir, self.log_dir
        )
        await stack.create_topics(partitions=4)
        for i in range(workers):
            stack.start("worker", f"w{i}", **worker_env)
        try:
            await stack.wait_ready(workers=workers)
        except BaseException:  # the workers started must not outlive a failed start
            stack.stop_all()
            raise
        settings = BatcherSettings.from_env(
            stack.env, routing=routing, model_dir=self.model_dir, batcher_id=f"{stack.prefix}-b"
        )
        batcher = BatcherService(settings, load_prompts(self.model_dir))
        task = asyncio.create_task(batcher.run())
        producer = make_producer(stack.settings, client_id="tw-bench", linger_ms=0)
        await producer.start()
        try:
            async with StreamRecorder(stack.env["TW_REDIS_URL"], stack.names) as rec:
                await asyncio.sleep(1.0)  # the batcher joins its group
                yield Run(stack, batcher, producer, rec)
        finally:
            await producer.stop()
            batcher.stop()
            await task
            stack.stop_all()

    async def window(self) -> dict[str, Any]:
        async with self.cluster("window", RoutingMode.AFFINITY, 1) as run:
            stack, batcher, producer, rec = run.stack, run.batcher, run.producer, run.recorder
            ttft = []
            for i in range(40):  # low load: one at a time, the worker always has room
                req = _request(f"low {i} " + " ".join(random.choices(WORDS, k=8)), 4)
                t0 = time.time()
                await producer.send_and_wait(stack.names.requests, encode(req))
                await rec.wait_finished({req.request_id}, within_s=30, stack=stack)
                ttft.append((rec.first_at[req.request_id] - t0) * 1000)
            low_waits = list(batcher.window_waits_ms)
            low_handoff = list(batcher.handoff_ms)
            batcher.batch_sizes.clear()
            burst = [_request(" ".join(random.choices(WORDS, k=12)), 16) for _ in range(400)]
            cpu0 = time.process_time()
            futs = [await producer.send(stack.names.requests, encode(r)) for r in burst]
            await asyncio.gather(*futs)
            await rec.wait_finished({r.request_id for r in burst}, within_s=300, stack=stack)
            burst_cpu_s = time.process_time() - cpu0
            load_waits = list(batcher.window_waits_ms)[len(low_waits) :]
            sizes = list(batcher.batch_sizes)
        return {
            "low_load_batcher_wait_ms_p50": statistics.median(low_waits),
            "low_load_batcher_wait_ms_p99": pct(low_waits, 0.99),
            "low_load_handoff_ms_p50": statistics.median(low_handoff),
            "low_load_ttft_ms_p50": statistics.median(ttft),
            "load_batcher_wait_ms_p50": statistics.median(load_waits),
            "load_batcher_wait_ms_p99": pct(load_waits, 0.99),
            "load_batch_size_mean": statistics.fmean(sizes),
            "load_batch_size_histogram": dict(sorted(Counter(sizes).items())),
            "load_requests": len(burst),
            # This process's CPU over the burst: the batcher's, the producer's and the
            # recorder's of the streams (every token event decoded).
            "load_process_cpu_s": burst_cpu_s,
            "load_requests_per_cpu_s": len(burst) / burst_cpu_s,
        }

    async def routing(
        self,
        mode: RoutingMode,
        prefixes: int,
        per_prefix: int,
        concurrency: int,
        *,
        tools: bool = False,
    ) -> dict[str, Any]:
        """Long shared prefixes, short answers: prefill dominates, as with system prompts,
        few-shot examples and (``tools``) agents' tool lists, which the chat template puts
        first behind a preamble every prompt shares. Each worker's KV budget holds about
        half of the prefixes (either kind of prompt is about 320 tokens)."""
        rng = random.Random(7)
        sampling = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
        reqs: list[GenerateRequest] = []
        for i in range(prefixes):
            if tools:
                kit = [_tool(f"tool_{i}_{k}", " ".join(rng.choices(WORDS, k=20))) for k in range(4)]
            else:
                head = " ".join(rng.choices(WORDS, k=300))
            for j in range(per_prefix):
                question = f"question {j}: " + " ".join(rng.choices(WORDS, k=6))
                if tools:
                    msgs = [ChatMessage(role="user", content=question)]
                    reqs.append(GenerateRequest(messages=msgs, tools=kit, sampling=sampling))
                else:
                    reqs.append(GenerateRequest(prompt=f"{head}\n{question}", sampling=sampling))
        rng.shuffle(reqs)
        name = f"{mode.value}{'-tools' if tools else ''}"
        async with self.cluster(
            name, mode, 2, TW_KV_BUDGET_TOKENS="3072", TW_MAX_RUNNING="8"
        ) as run:
            stack, producer, rec = run.stack, run.producer, run.recorder
            t0 = time.time()
            pending = list(reqs)
            inflight: set[str] = set()
            while pending or inflight:
                inflight -= rec.finished()
                while pending and len(inflight) < concurrency:
                    r = pending.pop()
                    await producer.send_and_wait(stack.names.requests, encode(r))
                    inflight.add(r.request_id)
                await asyncio.sleep(0.01)
                stack.check_alive()
            wall = time.time() - t0
            finals = [rec.final_event(r.request_id) for r in reqs]
        prompt = sum(f.usage.prompt_tokens for f in finals if f.usage)
        cached = sum(f.usage.cached_tokens for f in finals if f.usage)
        completion = sum(f.usage.completion_tokens for f in finals if f.usage)
        return {
            "hit_rate": cached / prompt,
            "tok_s": completion / wall,
            "wall_s": wall,
            "requests": len(reqs),
        }


def _request(prompt: str, max_tokens: int) -> GenerateRequest:
    return GenerateRequest(
        prompt=prompt,
        sampling=SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True),
    )


def _tool(name: str, description: str) -> dict[str, Any]:
    params = {"type": "object", "properties": {"query": {"type": "string"}}}
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": params},
    }


async def measure(
    env: dict[str, str], model_dir: str, log_dir: Path, quick: bool
) -> dict[str, Any]:
    bench = Bench(env, model_dir, log_dir)
    report: dict[str, Any] = {"window": await bench.window()}
    print(json.dumps(report["window"]))
    prefixes, per = (4, 4) if quick else (12, 12)
    for tools in (False, True):
        suffix = "_tools" if tools else ""
        for mode in (RoutingMode.AFFINITY, RoutingMode.ROUND_ROBIN):
            key = mode.value + suffix
            report[key] = await bench.routing(mode, prefixes, per, concurrency=8, tools=tools)
            print(key, json.dumps(report[key]))
        a, r = report["affinity" + suffix], report["round_robin" + suffix]
        report["affinity_vs_round_robin" + suffix] = {
            "hit_rate": (a["hit_rate"], r["hit_rate"]),
            "tok_s_ratio": a["tok_s"] / r["tok_s"],
        }
    return report


def costs_of(report: dict[str, Any]) -> dict[str, Cost]:
    """The requests/s one batcher routes, per CPU second of the process that ran it."""
    w = report["window"]
    note = (
        f"a burst of {w['load_requests']} requests over the CPU seconds of the process running "
        "the batcher, the producer and the stream recorder: a lower bound"
    )
    return {
        "batcher_requests_per_s": measured(
            w["load_requests_per_cpu_s"], "requests/s one batcher routes (one core)", note
        )
    }


def run(
    env: dict[str, str],
    model_dir: str,
    out: Path | None,
    quick: bool = False,
    costs: Path | None = None,
) -> dict[str, Any]:
    log_dir = Path("reports/logs")
    log_dir.mkdir(parents=True, exist_ok=True)
    report = asyncio.run(measure(env, model_dir, log_dir, quick))
    w = report["window"]
    print(
        f"\nwindow: low-load batcher wait p50 {w['low_load_batcher_wait_ms_p50']:.1f} ms "
        f"(p99 {w['low_load_batcher_wait_ms_p99']:.1f}) + hand-off to Kafka p50 "
        f"{w['low_load_handoff_ms_p50']:.1f} ms, TTFT p50 {w['low_load_ttft_ms_p50']:.1f} ms; "
        f"under load wait p50 {w['load_batcher_wait_ms_p50']:.0f} ms, "
        f"mean batch {w['load_batch_size_mean']:.1f}, sizes {w['load_batch_size_histogram']}; "
        f"{w['load_requests_per_cpu_s']:.0f} requests per CPU second of the batcher's process"
    )
    for what, suffix in (("shared prefixes", ""), ("shared tool lists", "_tools")):
        a, r = report["affinity" + suffix], report["round_robin" + suffix]
        print(
            f"routing (2 workers, {what}): hit rate {a['hit_rate']:.0%} affinity vs "
            f"{r['hit_rate']:.0%} round-robin; {a['tok_s']:.0f} vs {r['tok_s']:.0f} tok/s "
            f"({a['tok_s'] / r['tok_s']:.2f}x)"
        )
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2))
        print(f"wrote {out}")
    if costs is not None:
        merge_costs(costs, costs_of(report))
    return report
