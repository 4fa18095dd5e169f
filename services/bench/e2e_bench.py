"""``tokenwire bench e2e``: the whole pipeline under load, against same-run baselines.

A local cluster (edge, batcher, worker on one model) is driven closed-loop (N concurrent
clients over HTTP SSE through the edge) and open-loop (Poisson arrivals published straight
to Kafka). The workload mixes shared system prompts, prompt and output lengths, and
interactive/bulk priorities. Reported: TTFT, inter-token and end-to-end latency
p50/p95/p99, tokens/s and requests/s, batch sizes, prefix-cache hit rate, the engine's busy
share, and the time each stage adds (Kafka + batcher, engine, Redis relay) from the
services' own metrics.

Baselines, in the same run and on the same requests: the engine alone in-process (no Kafka,
Redis or HTTP) at the same concurrency, and Hugging Face ``generate`` one request at a time.
A shared machine's speed drifts by tens of percent within minutes, so each level runs in
rounds of the pipeline and the baselines back to back (every other round the baselines go
first, so that neither side always runs second, after the other's trailing work), and ratios
are medians of per-round ratios, each with a distribution-free interval.
Writes ``report.json`` and PNG plots.

Each round also reads the CPU seconds each service process used over its closed loop
(``/proc``; the worker's engine process apart from its loop): per token at the top
concurrency, the costs ``tokenwire plan`` reads. ``--costs PATH`` merges them, the pipeline's
tokens/s and the batcher's CPU per request into a costs file.

The parts: :mod:`~services.bench.workload` (the requests), :mod:`~services.bench.drivers`
(closed and open loop), :mod:`~services.bench.baselines`, :mod:`~services.bench.prometheus`
(the services' metrics), :mod:`~services.bench.stats` and :mod:`~services.bench.report`
(ratios, plots, table); this module runs the rounds.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from services.bench.baselines import Baselines
from services.bench.cluster import Stack, make_stack
from services.bench.cpu import cpu_seconds, descendants, tree_cpu_seconds
from services.bench.drivers import (
    Sample,
    Throughput,
    closed_loop,
    edge_pool,
    latency_summary,
    open_loop,
    sse_request,
)
from services.bench.prometheus import engine_counters, scrape_stack, stage_times
from services.bench.report import plot, print_table, summarize
from services.bench.stats import median_interval, median_of, pct
from services.bench.workload import Mix, Workload
from services.ops.costs import Cost, measured, merge_costs


@dataclass
class E2EConfig:
    """The end-to-end benchmark's load: closed-loop concurrency levels, rounds, open-loop rates and the workload."""

    concurrencies: tuple[int, ...] = (1, 8, 32)
    requests_per_stream: int = 3  # closed loop: each level sends max(min_requests, this x N)
    min_requests: int = 8
    rounds: int = 5  # pipeline and baselines alternate this many times per level
    rates: tuple[float, ...] = (2.0, 8.0)  # open loop, requests/s
    open_seconds: float = 8.0
    workload: Workload = field(default_factory=Workload)
    serial_requests: int = 4  # requests HF generate runs one at a time, per round
    # Low-load TTFT, per round at the lowest concurrency: this many short requests (the
    # mix's prompts, ``probe_tokens`` out) one at a time, through the pipeline and the
    # engine alone. A p50 over the level's few long requests is mostly noise.
    probe_requests: int = 24
    probe_tokens: int = 8
    # Short requests through the pipeline (and the engine alone) before anything is measured.
    warmup_requests: int = 800


QUICK = E2EConfig(
    concurrencies=(1, 4),
    requests_per_stream=2,
    min_requests=4,
    rounds=2,
    rates=(4.0,),
    open_seconds=2.0,
    workload=Workload(system_words=40, prompt_words=(4, 16), output_tokens=(4, 8)),
    serial_requests=1,
    probe_requests=4,
    warmup_requests=8,
)

# Per level: the median over its rounds of each of these.
LEVEL_MEDIANS = (
    "tok_s",
    "tok_s_whole",
    "req_s",
    "engine_busy_share",
    "engine_alone_tok_s",
    "engine_alone_tok_s_whole",
    "vs_engine_alone",
    "vs_engine_alone_whole",
)


SERVICES = ("worker", "engine", "batcher", "edge")


def service_cpu(stack: Stack) -> dict[str, float]:
    """CPU seconds so far of each service process; ``engine``: the worker's children."""
    worker = stack.procs["worker"].pid
    return {
        "worker": cpu_seconds(worker),
        "engine": tree_cpu_seconds(descendants(worker)),
        "batcher": cpu_seconds(stack.procs["batcher"].pid),
        "edge": cpu_seconds(stack.procs["edge"].pid),
    }


def cpu_per_token(rounds: list[dict[str, Any]]) -> dict[str, float]:
    """Each service's CPU microseconds per token over ``rounds`` (their sums)."""
    tokens = sum(r["tokens"] for r in rounds)
    return {k: sum(r["cpu_s"][k] for r in rounds) * 1e6 / tokens for k in SERVICES}


async def _round(
    stack: Stack,
    base: Baselines,
    bodies: list[dict[str, Any]],
    c: int,
    model: str,
    serial: int,
    baselines_first: bool,
) -> tuple[list[Sample], dict[str, Any]]:
    """The pipeline and the baselines (the engine alone, and ``generate`` when ``serial``)
    on ``bodies``, back to back: the baselines first when ``baselines_first``."""
    row: dict[str, Any] = {"baselines_first": baselines_first}

    def baselines() -> tuple[Throughput, list[float]]:
        out = base.engine_closed_loop(bodies, c)
        if serial:
            row["serial_generate_tok_s"] = base.serial_generate(bodies[:serial])
        return out

    if baselines_first:
        engine, engine_ttft = baselines()
    busy0, steps0 = await engine_counters(stack)
    cpu0 = service_cpu(stack)
    samples, wall, tput = await closed_loop(stack, bodies, c, model)
    cpu1 = service_cpu(stack)
    busy1, steps1 = await engine_counters(stack)
    if not baselines_first:
        engine, engine_ttft = baselines()
    # ``tok_s``: while all ``c`` streams are busy; ``_whole``: the drain included.
    row |= {
        "tok_s": tput.full,
        "tok_s_whole": tput.whole,
        "req_s": len(samples) / wall,
        "requests": len(samples),
        "tokens": sum(x.tokens for x in samples),
        "cpu_s": {k: cpu1[k] - cpu0[k] for k in SERVICES},
        "engine_busy_share": (busy1 - busy0) / wall,
        "engine_steps": steps1 - steps0,
        "engine_alone_tok_s": engine.full,
        "engine_alone_tok_s_whole": engine.whole,
        "engine_alone_ttft_p50_ms": pct(engine_ttft, 0.5) * 1000,
        "ttft_p50_ms": pct([x.ttft for x in samples], 0.5) * 1000,
        "vs_engine_alone": tput.full / engine.full,
        "vs_engine_alone_whole": tput.whole / engine.whole,
    }
    if serial:
        row["vs_serial_generate"] = tput.full / row["serial_generate_tok_s"]
        row["vs_serial_generate_whole"] = tput.whole / row["serial_generate_tok_s"]
    return samples, row


PROBE_GAP_S = 0.1  # the low-load probe lets the system settle this long before each run


async def _ttft_probe(
    stack: Stack, base: Baselines, mix: Mix, cfg: E2EConfig, model: str
) -> dict[str, Any]:
    """TTFT of short requests sent one at a time: the pipeline's and the engine's own p50,
    and what the pipeline added to each request (its TTFT minus the engine's on it). Each
    request runs through both back to back, alternating which goes first, so the pair sees
    the same machine: its speed drifts by tens of percent within seconds. Each run starts
    from a settled system (the previous request's trailing work done), as at low load."""
    pipeline: list[float] = []
    engine: list[float] = []
    async with edge_pool(stack) as pool:
        for i in range(cfg.probe_requests):
            body = {**mix.body(), "max_tokens": cfg.probe_tokens}
            for turn in (i % 2, 1 - i % 2):
                await asyncio.sleep(PROBE_GAP_S)
                if turn == 0:
                    pipeline.append((await sse_request(pool, {**body, "model": model})).ttft)
                else:
                    engine += base.engine_closed_loop([body], 1)[1]
    added = [(p - e) * 1000 for p, e in zip(pipeline, engine, strict=True)]
    return {
        "probe_ttft_p50_ms": pct(pipeline, 0.5) * 1000,
        "probe_engine_ttft_p50_ms": pct(engine, 0.5) * 1000,
        "probe_added_ms": [round(a, 2) for a in added],
    }


async def warm_up(stack: Stack, base: Baselines, cfg: E2EConfig, model_name: str) -> dict[str, Any]:
    """Short requests through the pipeline, then the engine alone, before anything is
    measured: a benchmark reports steady state. The broker is a JVM, and after it starts its
    first few hundred requests run slower while its JIT compiles; this takes away part of
    that slowdown, not all of it."""
    mix = Mix(cfg.workload)
    bodies = [{**mix.body(), "max_tokens": 2} for _ in range(cfg.warmup_requests)]
    t0 = time.perf_counter()
    await closed_loop(stack, bodies, 8, model_name)
    pipeline_s = time.perf_counter() - t0
    base.engine_closed_loop(bodies, 8)
    return {"requests": len(bodies), "pipeline_s": pipeline_s}


async def _level(
    stack: Stack, base: Baselines, cfg: E2EConfig, model_name: str, c: int
) -> dict[str, Any]:
    """One closed-loop level: ``cfg.rounds`` rounds at concurrency ``c``, its latency over
    every round's samples and the medians of its per-round figures."""
    n = max(cfg.min_requests, cfg.requests_per_stream * c)
    pooled: list[Sample] = []
    rounds = []
    for r in range(cfg.rounds):
        mix = Mix(replace(cfg.workload, seed=cfg.workload.seed + 1000 * c + r))
        bodies = [mix.body() for _ in range(n)]
        serial = cfg.serial_requests if c == max(cfg.concurrencies) else 0
        samples, row = await _round(
            stack, base, bodies, c, model_name, serial, baselines_first=r % 2 == 1
        )
        if c == min(cfg.concurrencies) and cfg.probe_requests:
            row.update(await _ttft_probe(stack, base, mix, cfg, model_name))
        pooled += samples
        rounds.append(row)
        print(json.dumps({"concurrency": c, "round": r, **row}), flush=True)
    level = {"concurrency": c, "rounds": rounds, **latency_summary(pooled)}
    for key in LEVEL_MEDIANS:
        level[key] = median_of(rounds, key)
    level["cpu_us_per_token"] = cpu_per_token(rounds)
    level["batcher_cpu_us_per_request"] = (
        sum(r["cpu_s"]["batcher"] for r in rounds) * 1e6 / sum(r["requests"] for r in rounds)
    )
    level["vs_engine_alone_interval"] = median_interval([r["vs_engine_alone"] for r in rounds])
    return level


async def start_stack(env: dict[str, str], model_dir: str, model_name: str, log_dir: Path) -> Stack:
    """A worker, a batcher and an edge on a fresh prefix, unlimited rates."""
    stack = make_stack(f"e2e-{uuid.uuid4().hex[:6]}", env, model_dir, log_dir)
    stack.env.update(
        TW_MODEL_NAME=model_name,
        TW_TORCH_THREADS="0",
        TW_RATE_REQUESTS_PER_MIN="0",
        TW_RATE_TOKENS_PER_MIN="0",
    )
    await stack.create_topics(partitions=4)
    stack.start("worker")
    stack.start("batcher")
    stack.start("edge")
    return stack


async def measure(
    env: dict[str, str], model_dir: str, model_name: str, cfg: E2EConfig, log_dir: Path
) -> dict[str, Any]:
    base = Baselines(model_dir)  # on this thread, which then runs the engine alone
    stack = await start_stack(env, model_dir, model_name, log_dir)
    report: dict[str, Any] = {"model": model_dir, "config": asdict(cfg)}
    try:
        await stack.wait_ready()
        report["warmup"] = await warm_up(stack, base, cfg, model_name)
        since = await scrape_stack(stack)
        report["closed_loop"] = [
            await _level(stack, base, cfg, model_name, c) for c in cfg.concurrencies
        ]
        # Before the open loop, whose requests skip the edge: the stage means subtract
        # edge and worker figures over the same requests.
        report["stages"] = await stage_times(stack, since)
        print(json.dumps(report["stages"]))
        report["open_loop"] = [
            await open_loop(stack, Mix(cfg.workload), r, cfg.open_seconds) for r in cfg.rates
        ]
        for r in report["open_loop"]:
            print(json.dumps(r))
    finally:
        stack.stop_all()
    return summarize(report)


def costs_of(report: dict[str, Any]) -> dict[str, Cost]:
    """The top level's per-token CPU of each service, the batcher's CPU per request and
    the pipeline's tokens/s, as costs."""
    top = max(report["closed_loop"], key=lambda level: level["concurrency"])
    note = f"{top['concurrency']} closed-loop streams, model {report['model']}"
    out = {
        f"{k}_cpu_us_per_token": measured(v, f"us CPU of the {k} per token", note)
        for k, v in top["cpu_us_per_token"].items()
    }
    out["batcher_cpu_us_per_request"] = measured(
        top["batcher_cpu_us_per_request"], "us CPU of the batcher per request", note
    )
    out["pipeline_tok_s"] = measured(top["tok_s"], "tokens/s through the pipeline", note)
    return out


def run(
    env: dict[str, str],
    model_dir: str,
    model_name: str,
    cfg: E2EConfig,
    folder: Path,
    costs: Path | None = None,
) -> dict[str, Any]:
    folder.mkdir(parents=True, exist_ok=True)
    report = asyncio.run(measure(env, model_dir, model_name, cfg, folder))
    report["plots"] = [str(p) for p in plot(report, folder)]
    (folder / "report.json").write_text(json.dumps(report, indent=2))
    print_table(report)
    if costs is not None:
        merge_costs(costs, costs_of(report))
    return report
