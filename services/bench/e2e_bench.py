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
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import statistics
import time
import uuid
from dataclasses import asdict, dataclass, field, replace
from itertools import pairwise
from pathlib import Path
from typing import Any

import httpx
import orjson
from aiokafka import AIOKafkaProducer
from prometheus_client.parser import text_string_to_metric_families

from services.bench.cluster import Stack, StreamRecorder, make_stack
from services.bench.sse_client import SsePool
from shared.codec import encode
from shared.messages import GenerateRequest, Priority, SamplingParams

WORDS = (
    "return the value of each key in the mapping when it is not none and raise an error if the "
    "argument is a list of strings or a path to a file that does not exist yet while the module "
    "keeps a cache of results for later calls"
).split()


@dataclass
class Workload:
    shared_prefix_share: float = 0.5  # share of requests that start with a shared system prompt
    system_prompts: int = 4
    system_words: int = 120
    prompt_words: tuple[int, int] = (8, 64)
    output_tokens: tuple[int, int] = (32, 256)  # chat-like: answers longer than questions
    bulk_share: float = 0.1
    seed: int = 0


@dataclass
class E2EConfig:
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


class Mix:
    """Draws requests from the workload (deterministic for a seed)."""

    def __init__(self, w: Workload) -> None:
        self.w = w
        self.rng = random.Random(w.seed)
        self.systems = [
            " ".join(self.rng.choices(WORDS, k=w.system_words)) for _ in range(w.system_prompts)
        ]

    def body(self) -> dict[str, Any]:
        words = " ".join(self.rng.choices(WORDS, k=self.rng.randint(*self.w.prompt_words)))
        if self.rng.random() < self.w.shared_prefix_share:
            words = self.rng.choice(self.systems) + "\n" + words
        return {
            "prompt": words,
            "max_tokens": self.rng.randint(*self.w.output_tokens),
            "temperature": 0,
            "ignore_eos": True,
            "priority": "bulk" if self.rng.random() < self.w.bulk_share else "interactive",
        }


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))] if s else float("nan")


def median_interval(values: list[float], confidence: float = 0.9) -> dict[str, float]:
    """A distribution-free interval for the median of ``values``: order statistics
    ``x_(k)`` and ``x_(n+1-k)`` with the largest ``k`` whose coverage, 1 - 2 P(B <= k-1)
    for B ~ Binomial(n, 1/2), is at least ``confidence``. With too few values for that,
    the whole range; ``coverage`` gives the interval's exact confidence either way."""
    s, n = sorted(values), len(values)
    if not n:
        return {"low": float("nan"), "high": float("nan"), "coverage": 0.0}

    def coverage(k: int) -> float:  # of [x_(k), x_(n+1-k)], k counted from 1
        return 1 - 2 * sum(math.comb(n, i) for i in range(k)) / 2**n

    k = 1
    while k + 1 <= (n + 1) // 2 and coverage(k + 1) >= confidence:
        k += 1
    return {"low": s[k - 1], "high": s[n - k], "coverage": coverage(k)}


def summary(values: list[float]) -> dict[str, float]:
    return {"p50": pct(values, 0.5), "p95": pct(values, 0.95), "p99": pct(values, 0.99)}


COMPLETIONS = "/v1/completions"


@dataclass
class Sample:
    ttft: float
    itl: list[float]
    e2e: float
    tokens: int
    prompt_tokens: int
    cached_tokens: int
    arrivals: list[tuple[float, int]]  # (perf_counter, tokens) of each chunk


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


@dataclass
class Throughput:
    """A closed loop's tokens/s over the whole run, and while all its streams were busy:
    from the start until the first client finds no request left to send. After that the
    last requests drain with fewer streams in flight than the level names."""

    whole: float
    full: float


def _pool(stack: Stack) -> SsePool:
    return SsePool("127.0.0.1", stack.edge_ports["edge"], stack.auth_headers())


async def closed_loop(
    stack: Stack, bodies: list[dict[str, Any]], concurrency: int, model: str
) -> tuple[list[Sample], float, Throughput]:
    """``concurrency`` clients send ``bodies`` (from the end) one after another; the
    samples, the wall time and the tokens/s."""
    samples: list[Sample] = []
    async with _pool(stack) as pool:
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


def _latency(samples: list[Sample]) -> dict[str, Any]:
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
    producer = AIOKafkaProducer(
        bootstrap_servers=stack.env["TW_KAFKA_BOOTSTRAP"], acks="all", linger_ms=0
    )
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


async def scrape(url: str) -> dict[str, float]:
    """Prometheus samples of one /metrics page, name{labels} → value."""
    async with httpx.AsyncClient(timeout=10) as client:
        text = (await client.get(url)).text
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            key = s.name + (
                "{" + ",".join(f"{k}={v}" for k, v in sorted(s.labels.items())) + "}"
                if s.labels
                else ""
            )
            out[key] = s.value
    return out


def _mean(m: dict[str, float], name: str) -> float | None:
    count = m.get(f"{name}_count", 0.0)
    return m[f"{name}_sum"] / count if count else None


Scrapes = tuple[dict[str, float], dict[str, float], dict[str, float]]


async def scrape_stack(stack: Stack) -> Scrapes:
    """The worker's, batcher's and edge's metrics, in that order."""
    return (
        await scrape(f"http://127.0.0.1:{stack.metrics_ports['worker']}/metrics"),
        await scrape(f"http://127.0.0.1:{stack.metrics_ports['batcher']}/metrics"),
        await scrape(stack.url() + "/metrics"),
    )


async def stage_times(stack: Stack, since: Scrapes) -> dict[str, Any]:
    """Mean time each stage adds, from the services' own histograms, over the requests
    served after the scrapes ``since`` (histogram samples only grow, so they subtract)."""
    w, b, e = (
        {k: v - before.get(k, 0.0) for k, v in now.items()}
        for now, before in zip(await scrape_stack(stack), since, strict=True)
    )
    queue = _mean(w, "tw_request_queue_time_seconds")
    worker_ttft = _mean(w, "tw_time_to_first_token_seconds")
    edge_ttft = _mean(e, "tw_edge_first_event_seconds")
    sizes = {
        k.split("le=")[1].rstrip("}"): v
        for k, v in b.items()
        if k.startswith("tw_batcher_batch_size_bucket")
    }
    ms = lambda x: None if x is None else x * 1000  # noqa: E731
    return {
        "kafka_and_batcher_ms": ms(queue),
        "batcher_window_ms": ms(_mean(b, "tw_batcher_window_seconds")),
        "engine_to_first_token_ms": ms(worker_ttft - queue if worker_ttft and queue else None),
        "redis_relay_ms": ms(edge_ttft - worker_ttft if edge_ttft and worker_ttft else None),
        "batch_size_cumulative": sizes,
        "mean_batch_size": _mean(b, "tw_batcher_batch_size"),
    }


class Baselines:
    """The engine alone, in this process (no Kafka, Redis or HTTP), and HF ``generate``
    one request at a time, on the same model and requests as the pipeline."""

    def __init__(self, model_dir: str) -> None:
        from services.worker.engine.engine import Engine, EngineConfig
        from services.worker.loader import load_model

        self.model, self.tokenizer = load_model(model_dir)
        self.engine = Engine(
            self.model, self.tokenizer, EngineConfig(kv_budget_tokens=65_536, max_running=64)
        )

    def jobs(self, bodies: list[dict[str, Any]]) -> list[tuple[list[int], int]]:
        return [(self.tokenizer(b["prompt"])["input_ids"], b["max_tokens"]) for b in bodies]

    def engine_closed_loop(
        self, bodies: list[dict[str, Any]], concurrency: int
    ) -> tuple[Throughput, list[float]]:
        """tokens/s with ``concurrency`` requests kept in flight (taken from the end, as the
        pipeline's clients do), and each request's time from submission to its first text
        (what a streaming client sees first: a token that ends mid-character has none)."""
        from services.worker.engine.engine import EngineRequest

        engine, queue = self.engine, self.jobs(bodies)
        inflight = produced = 0
        added: dict[str, float] = {}
        ttft: list[float] = []
        full: tuple[float, int] | None = None  # when fewer streams began to run; tokens then
        t0 = time.perf_counter()
        while queue or engine.has_work:
            if full is None and not queue and inflight < concurrency < len(bodies):
                full = time.perf_counter(), produced
            while queue and inflight < concurrency:
                prompt, max_tokens = queue.pop()
                rid = uuid.uuid4().hex
                engine.add_request(
                    EngineRequest(rid, prompt, max_tokens=max_tokens, ignore_eos=True)
                )
                added[rid] = time.perf_counter()
                inflight += 1
            for o in engine.step():
                if o.request_id in added and (o.text or o.finish is not None):
                    ttft.append(time.perf_counter() - added.pop(o.request_id))
                produced += len(o.token_ids)
                inflight -= o.finish is not None
        end = time.perf_counter()
        full_at, full_tokens = full or (end, produced)
        return Throughput(produced / (end - t0), full_tokens / (full_at - t0)), ttft

    def serial_generate(self, bodies: list[dict[str, Any]]) -> float:
        from services.bench.engine_bench import hf_serial

        jobs = self.jobs(bodies)
        return hf_serial(self.model, [p for p, _ in jobs], [n for _, n in jobs])


def _save(fig: Any, path: Path) -> Path:
    fig.savefig(path, dpi=110, bbox_inches="tight")
    return path


def plot(report: dict[str, Any], folder: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    rows = report["closed_loop"]
    cs = [r["concurrency"] for r in rows]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(cs, [r["tok_s"] for r in rows], "o-", label="tokenwire pipeline")
    ax.plot(
        cs,
        [report["baselines"][f"engine_alone_tok_s_c{c}"] for c in cs],
        "s--",
        label="engine alone",
    )
    ax.axhline(
        report["baselines"]["serial_generate_tok_s"],
        color="gray",
        ls=":",
        label="HF generate, one at a time",
    )
    ax.set(
        xlabel="concurrent streams",
        ylabel="tokens/s (all streams busy)",
        title="Throughput vs concurrency",
        xscale="log",
    )
    ax.legend()
    paths.append(_save(fig, folder / "throughput_vs_concurrency.png"))
    fig, ax = plt.subplots(figsize=(6, 4))
    for r in rows:
        cdf = r["ttft_cdf_ms"]
        ax.plot(
            cdf, [(i + 1) / len(cdf) for i in range(len(cdf))], label=f"{r['concurrency']} streams"
        )
    ax.set(
        xlabel="TTFT (ms)",
        ylabel="share of requests",
        title="Time to first token (CDF)",
        xscale="log",
    )
    ax.legend()
    paths.append(_save(fig, folder / "ttft_cdf.png"))
    fig, ax = plt.subplots(figsize=(6, 4))
    ol = report["open_loop"]
    for q in ("p50", "p95", "p99"):
        ax.plot(
            [r["rate"] for r in ol], [r["e2e_ms"][q] for r in ol], "o-", label=f"end-to-end {q}"
        )
    ax.plot([r["rate"] for r in ol], [r["ttft_ms"]["p50"] for r in ol], "s--", label="TTFT p50")
    ax.set(
        xlabel="offered load (requests/s, Poisson)",
        ylabel="latency (ms)",
        title="Latency vs offered load",
    )
    ax.legend()
    paths.append(_save(fig, folder / "latency_vs_load.png"))
    plt.close("all")
    return paths


async def _engine_counters(stack: Stack) -> tuple[float, float]:
    """The worker's engine busy seconds and steps so far, once the work before is counted:
    the worker refreshes its metrics on the heartbeat that follows finished requests."""
    await asyncio.sleep(0.5)
    m = await scrape(f"http://127.0.0.1:{stack.metrics_ports['worker']}/metrics")
    return m.get("tw_engine_busy_seconds_total", 0.0), m.get("tw_engine_steps_total", 0.0)


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
    busy0, steps0 = await _engine_counters(stack)
    samples, wall, tput = await closed_loop(stack, bodies, c, model)
    busy1, steps1 = await _engine_counters(stack)
    if not baselines_first:
        engine, engine_ttft = baselines()
    # ``tok_s``: while all ``c`` streams are busy; ``_whole``: the drain included.
    row |= {
        "tok_s": tput.full,
        "tok_s_whole": tput.whole,
        "req_s": len(samples) / wall,
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
    async with _pool(stack) as pool:
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


def _median(rows: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in rows)


async def warm_up(stack: Stack, base: Baselines, cfg: E2EConfig, model_name: str) -> dict[str, Any]:
    """Short requests through the pipeline, then the engine alone, before anything is
    measured: a benchmark reports steady state. The broker is a JVM, and after it starts its
    first few hundred requests run slower while its JIT compiles. Measured here, low-load
    probes right after a broker restart added 20–25 ms of TTFT over the first 20, 10–19 ms
    over the next 80 and about 11 ms after that. This takes away part of that, not all:
    on a fresh broker the first round of probes still came out at 15–20 ms."""
    mix = Mix(cfg.workload)
    bodies = [{**mix.body(), "max_tokens": 2} for _ in range(cfg.warmup_requests)]
    t0 = time.perf_counter()
    await closed_loop(stack, bodies, 8, model_name)
    pipeline_s = time.perf_counter() - t0
    base.engine_closed_loop(bodies, 8)
    return {"requests": len(bodies), "pipeline_s": pipeline_s}


async def measure(
    env: dict[str, str], model_dir: str, model_name: str, cfg: E2EConfig, log_dir: Path
) -> dict[str, Any]:
    base = Baselines(model_dir)  # on this thread, which then runs the engine alone
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
    report: dict[str, Any] = {"model": model_dir, "config": asdict(cfg)}
    top = max(cfg.concurrencies)
    try:
        await stack.wait_ready()
        report["warmup"] = await warm_up(stack, base, cfg, model_name)
        since = await scrape_stack(stack)
        report["closed_loop"] = []
        for c in cfg.concurrencies:
            n = max(cfg.min_requests, cfg.requests_per_stream * c)
            pooled: list[Sample] = []
            rounds = []
            for r in range(cfg.rounds):
                mix = Mix(replace(cfg.workload, seed=cfg.workload.seed + 1000 * c + r))
                bodies = [mix.body() for _ in range(n)]
                serial = cfg.serial_requests if c == top else 0
                samples, row = await _round(
                    stack, base, bodies, c, model_name, serial, baselines_first=r % 2 == 1
                )
                if c == min(cfg.concurrencies) and cfg.probe_requests:
                    row.update(await _ttft_probe(stack, base, mix, cfg, model_name))
                pooled += samples
                rounds.append(row)
                print(json.dumps({"concurrency": c, "round": r, **row}), flush=True)
            level = {"concurrency": c, "rounds": rounds, **_latency(pooled)}
            for key in (
                "tok_s",
                "tok_s_whole",
                "req_s",
                "engine_busy_share",
                "engine_alone_tok_s",
                "engine_alone_tok_s_whole",
                "vs_engine_alone",
                "vs_engine_alone_whole",
            ):
                level[key] = _median(rounds, key)
            level["vs_engine_alone_interval"] = median_interval(
                [r["vs_engine_alone"] for r in rounds]
            )
            report["closed_loop"].append(level)
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
    rows = {row["concurrency"]: row for row in report["closed_loop"]}
    top_rounds = rows[top]["rounds"]
    report["baselines"] = {
        "serial_generate_tok_s": _median(top_rounds, "serial_generate_tok_s"),
        **{f"engine_alone_tok_s_c{c}": row["engine_alone_tok_s"] for c, row in rows.items()},
    }
    report["ratios"] = {
        "pipeline_vs_engine_alone": _median(top_rounds, "vs_engine_alone"),
        "pipeline_vs_serial_generate": _median(top_rounds, "vs_serial_generate"),
        # The same over whole runs, the drain with fewer streams included.
        "pipeline_vs_engine_alone_whole": _median(top_rounds, "vs_engine_alone_whole"),
        "pipeline_vs_serial_generate_whole": _median(top_rounds, "vs_serial_generate_whole"),
    }
    report["ratio_intervals"] = {
        "pipeline_vs_engine_alone": rows[top]["vs_engine_alone_interval"],
        "pipeline_vs_serial_generate": median_interval(
            [r["vs_serial_generate"] for r in top_rounds]
        ),
    }
    low = rows[min(cfg.concurrencies)]["rounds"]
    report["low_load"] = {
        "concurrency": min(cfg.concurrencies),
        "requests_per_round": cfg.probe_requests,
        "ttft_p50_ms": _median(low, "probe_ttft_p50_ms"),
        "engine_alone_ttft_p50_ms": _median(low, "probe_engine_ttft_p50_ms"),
        # Per request, paired: its TTFT through the pipeline minus the engine's own (its
        # prefill and first sample) on it; the median over every round's requests.
        "added_ttft_p50_ms": statistics.median(a for r in low for a in r["probe_added_ms"]),
        "added_ttft_p50_ms_by_round": [statistics.median(r["probe_added_ms"]) for r in low],
        # The unpaired figure: per round, the pipeline's p50 minus the engine's; median.
        "p50_difference_ms": statistics.median(
            r["probe_ttft_p50_ms"] - r["probe_engine_ttft_p50_ms"] for r in low
        ),
    }
    return report


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


def run(
    env: dict[str, str], model_dir: str, model_name: str, cfg: E2EConfig, folder: Path
) -> dict[str, Any]:
    folder.mkdir(parents=True, exist_ok=True)
    report = asyncio.run(measure(env, model_dir, model_name, cfg, folder))
    report["plots"] = [str(p) for p in plot(report, folder)]
    (folder / "report.json").write_text(json.dumps(report, indent=2))
    print_table(report)
    return report


def print_table(report: dict[str, Any]) -> None:
    print(
        "\ntok/s while all streams are busy (the run with its drain: see the JSON)"
        "\n| streams | tok/s | engine alone tok/s | pipeline / engine | engine busy | req/s "
        "| TTFT p50/p95/p99 ms | ITL p50/p99 ms | e2e p50/p99 ms | prefix hits |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in report["closed_loop"]:
        t, i, e = r["ttft_ms"], r["itl_ms"], r["e2e_ms"]
        print(
            f"| {r['concurrency']} | {r['tok_s']:.0f} | {r['engine_alone_tok_s']:.0f} "
            f"| {r['vs_engine_alone']:.0%} | {r['engine_busy_share']:.0%} | {r['req_s']:.1f} "
            f"| {t['p50']:.0f} / {t['p95']:.0f} / {t['p99']:.0f} "
            f"| {i['p50']:.1f} / {i['p99']:.1f} | {e['p50']:.0f} / {e['p99']:.0f} "
            f"| {r['prefix_hit_rate']:.0%} |"
        )
    ra, b, s, lo = report["ratios"], report["baselines"], report["stages"], report["low_load"]
    intervals = report["ratio_intervals"]
    ia, ig = intervals["pipeline_vs_engine_alone"], intervals["pipeline_vs_serial_generate"]
    top = max(report["config"]["concurrencies"])
    print(
        f"\npipeline at {top} streams (median of per-round ratios, with a "
        f"{ia['coverage']:.0%} interval for it): "
        f"{ra['pipeline_vs_engine_alone']:.0%} of the engine alone "
        f"({ia['low']:.0%}–{ia['high']:.0%}), "
        f"{ra['pipeline_vs_serial_generate']:.1f}x HF generate one at a time "
        f"({ig['low']:.1f}–{ig['high']:.1f}x; "
        f"{b['serial_generate_tok_s']:.0f} tok/s); over whole runs, the drain included: "
        f"{ra['pipeline_vs_engine_alone_whole']:.0%} and "
        f"{ra['pipeline_vs_serial_generate_whole']:.1f}x"
    )
    print(
        f"low load ({lo['concurrency']} stream): TTFT p50 {lo['ttft_p50_ms']:.1f} ms, the engine's "
        f"own {lo['engine_alone_ttft_p50_ms']:.1f} ms; added per request (paired), median "
        f"{lo['added_ttft_p50_ms']:+.1f} ms (p50 difference {lo['p50_difference_ms']:+.1f} ms)"
    )
    print(
        f"stages (mean): {json.dumps({k: v for k, v in s.items() if k != 'batch_size_cumulative'})}"
    )
