"""``tokenwire bench engine``: the decode engine against Hugging Face baselines, same run.

Rows: tokens/s at several concurrencies (fixed prompt and output lengths, greedy, EOS
ignored) for ``generate`` one request at a time, ``generate`` on static batches,
transformers' continuous batching (``generate_batch``) and this engine; the engine's TTFT;
a shared-prefix workload with the prefix cache on and off; and requests asking for
log-probabilities, with penalties and logit biases, or constrained to a JSON schema,
against the same requests plain; and n-gram speculation against none, for one request on
extractive prompts (the answer copies from the prompt: passages of common words, and of
prose the model never trained on) and for a batch of the chat mix, with EOS held until
each request's length, and how much of its passage each answer copies; and, with the
engine against ``generate`` in alternating rounds, where a decode step's time goes at the
highest concurrency (the runner's pass, and the model's idle time between passes: the
engine's own scheduling, sampling and emitting that no pass overlaps); on a GPU, steps
that make their text while the next pass runs against steps that settle their own pass.
"""

from __future__ import annotations

import copy
import itertools
import json
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import torch

from services.bench.sections import SECTIONS
from services.bench.stats import pct
from services.bench.workload import WORDS, Mix, Workload
from services.model.corpus import iter_comment_passages, quote_answer, quote_prompt
from services.worker.engine.engine import Engine
from services.worker.engine.grammar import GrammarCache
from services.worker.engine.speculation import SpecConfig
from services.worker.engine.wire import EngineConfig, EngineRequest, SamplingConfig


@dataclass
class BenchConfig:
    """The engine benchmark's concurrency levels, prompt and output lengths, and the shared-prefix run."""

    concurrencies: tuple[int, ...] = (1, 8, 32)
    prompt_len: int = 128
    new_tokens: int = 128
    serial_requests: int = 2  # one-at-a-time generate is slow: a rate from a few requests
    prefix_len: int = 512
    suffix_len: int = 32
    prefix_requests: int = 16
    prefix_new_tokens: int = 32
    with_generate_batch: bool = True
    spec_k: int = 4  # n-gram speculation's draft tokens in its figure
    spec_prompts: int = 3  # extractive prompts, served one at a time
    spec_batch: int = 32  # the chat mix's concurrent requests
    draft_model: str = ""  # draft speculation's guessing model (a folder; "": no draft part)
    draft_k: int = 4
    seed: int = 0
    sections: tuple[str, ...] = SECTIONS  # which parts run (the throughput rows always do)


@dataclass
class Report:
    """The engine benchmark's rows, as printed and written to JSON."""

    model: str
    params_m: float
    threads: int
    config: dict[str, Any]
    placement: str  # device and precision, e.g. "cpu float32", "cuda bfloat16"
    throughput: list[dict[str, Any]] = field(default_factory=list)
    prefix: dict[str, Any] = field(default_factory=dict)
    features: dict[str, Any] = field(default_factory=dict)
    speculation: dict[str, Any] = field(default_factory=dict)
    draft: dict[str, Any] = field(default_factory=dict)
    overhead: dict[str, Any] = field(default_factory=dict)
    overlap: dict[str, Any] = field(default_factory=dict)
    int8: dict[str, Any] = field(default_factory=dict)
    padding: dict[str, Any] = field(default_factory=dict)


def _prompts(
    n: int, length: int, vocab: int, rng: random.Random, prefix: list[int] | None = None
) -> list[list[int]]:
    head = prefix or []
    return [head + [rng.randrange(3, vocab) for _ in range(length)] for _ in range(n)]


def _sync() -> None:
    """Wait for queued GPU work, so a timer sees what it ran (nothing to do on CPU)."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _timed(fn: Callable[[], Any]) -> float:
    _sync()
    t0 = time.perf_counter()
    fn()
    _sync()
    return time.perf_counter() - t0


def hf_serial(model: Any, prompts: list[list[int]], new: int | list[int]) -> float:
    """tokens/s of ``generate`` one request at a time (``new`` tokens each, or per prompt)."""
    lengths = new if isinstance(new, list) else [new] * len(prompts)

    def run() -> None:
        for p, n in zip(prompts, lengths, strict=True):
            ids = torch.tensor([p], device=model.device)
            model.generate(ids, max_new_tokens=n, do_sample=False, eos_token_id=[])

    return sum(lengths) / _timed(run)


def hf_static(model: Any, prompts: list[list[int]], new: int) -> float:
    """tokens/s of ``generate`` on one static batch (equal-length prompts: no padding)."""
    ids = torch.tensor(prompts, device=model.device)
    secs = _timed(
        lambda: model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new,
            eos_token_id=[],
            do_sample=False,
        )
    )
    return len(prompts) * new / secs


def hf_generate_batch(
    model: Any, prompts: list[list[int]], new: int, kv_tokens: int
) -> float | None:
    """tokens/s of transformers' continuous batching, its cache sized like ours."""
    from transformers import GenerationConfig

    gen = GenerationConfig(max_new_tokens=new, do_sample=False, eos_token_id=[], pad_token_id=0)
    try:  # report, don't fail the whole benchmark, where this API differs or fails
        from transformers.generation.configuration_utils import ContinuousBatchingConfig

        cb = ContinuousBatchingConfig(
            block_size=16, num_blocks=kv_tokens // 16, max_batch_tokens=1024
        )
        secs = _timed(
            lambda: model.generate_batch(
                prompts, generation_config=gen, continuous_batching_config=cb, warmup=False
            )
        )
    except Exception as exc:
        print(f"generate_batch unavailable here: {type(exc).__name__}: {exc}")
        return None
    return len(prompts) * new / secs


def engine_run(
    model: Any,
    tok: Any,
    prompts: list[list[int]],
    new: int,
    cfg: EngineConfig,
    grammars: GrammarCache | None = None,
    **ask: Any,
) -> tuple[float, list[float]]:
    """tokens/s and per-request TTFT (s) with all prompts submitted at once; ``ask``: more
    ``EngineRequest`` fields for every request (e.g. ``logprobs``); ``grammars``: compiled
    grammars kept from an earlier run, as a worker keeps them."""
    engine = Engine(model, tok, cfg, grammars)
    t0 = time.perf_counter()
    for i, p in enumerate(prompts):
        engine.add_request(EngineRequest(f"r{i}", p, max_tokens=new, ignore_eos=True, **ask))
    first: dict[str, float] = {}
    produced = 0
    while engine.has_work:
        for out in engine.step():
            produced += len(out.token_ids)
            first.setdefault(out.request_id, time.perf_counter() - t0)
    return produced / (time.perf_counter() - t0), list(first.values())


def engine_sequential_ttft(
    model: Any, tok: Any, prompts: list[list[int]], cfg: EngineConfig, warm: list[int]
) -> list[float]:
    """TTFT of requests arriving one at a time after ``warm`` was served (fills the prefix cache)."""
    engine = Engine(model, tok, cfg)
    engine.add_request(EngineRequest("warm", warm, max_tokens=1))
    engine.run_until_idle()
    ttfts = []
    for i, p in enumerate(prompts):
        engine.add_request(EngineRequest(f"s{i}", p, max_tokens=1, ignore_eos=True))
        t0 = time.perf_counter()
        engine.run_until_idle()
        ttfts.append(time.perf_counter() - t0)
    return ttfts


def run(
    model_dir: str, cfg: BenchConfig, out: Path | None, device: str = "auto", dtype: str = "auto"
) -> Report:
    from services.worker.loader import freeze_loaded_objects, load_model

    model, tok = load_model(model_dir, device, dtype)
    freeze_loaded_objects()  # as the worker's engine process does
    rng = random.Random(cfg.seed)
    params = sum(p.numel() for p in model.parameters()) / 1e6
    rep = Report(
        model_dir,
        round(params, 1),
        torch.get_num_threads(),
        asdict(cfg),
        f"{model.device.type} {str(model.dtype).removeprefix('torch.')}",
    )
    max_c = max(cfg.concurrencies)
    kv_tokens = max_c * (cfg.prompt_len + cfg.new_tokens) + 1024
    ecfg = EngineConfig(
        kv_budget_tokens=kv_tokens,
        max_running=max(64, max_c),
        max_step_tokens=1024,
        prefill_chunk=512,
    )
    rep.throughput = _throughput(model, tok, cfg, ecfg, rng)
    if "prefix" in cfg.sections:
        rep.prefix = _prefix_cache(model, tok, cfg, ecfg, rng)
        print(json.dumps(rep.prefix))
    if "features" in cfg.sections:
        rep.features = _features(model, tok, cfg, ecfg, rng)
        print(json.dumps(rep.features))
    if "speculation" in cfg.sections:
        rep.speculation = speculation(model, tok, cfg, ecfg)
        print(json.dumps(rep.speculation))
    if "draft" in cfg.sections and cfg.draft_model:
        if Path(cfg.draft_model).resolve() == Path(model_dir).resolve():
            print("draft speculation left out: the draft model is the served model")
        else:
            draft, _ = load_model(cfg.draft_model, device, dtype)
            rep.draft = speculation(model, tok, cfg, ecfg, draft)
            print(json.dumps(rep.draft))
    if "overhead" in cfg.sections:
        rep.overhead = overhead(model, tok, cfg, ecfg)
        print(json.dumps(rep.overhead))
    if "overlap" in cfg.sections and model.device.type == "cuda":  # a CPU runs lockstep
        rep.overlap = overlap(model, tok, cfg, ecfg)
        print(json.dumps(rep.overlap))
    if "int8" in cfg.sections and model.device.type == "cpu":
        rep.int8 = int8(model, tok, cfg, ecfg)
        print(json.dumps(rep.int8))
    if "padding" in cfg.sections and model.device.type == "cpu":
        rep.padding = padding(model, tok, cfg, ecfg)
        print(json.dumps(rep.padding))
    print_table(rep)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(asdict(rep), indent=2))
        print(f"wrote {out}")
    return rep


def _throughput(
    model: Any, tok: Any, cfg: BenchConfig, ecfg: EngineConfig, rng: random.Random
) -> list[dict[str, Any]]:
    """One row per concurrency: tokens/s of each way to generate, and the engine's TTFT."""
    vocab = model.config.vocab_size
    warm = _prompts(2, 16, vocab, rng)
    engine_run(model, tok, warm, 4, ecfg)  # first-call costs out of the way
    hf_serial(model, warm[:1], 4)

    serial = hf_serial(
        model, _prompts(cfg.serial_requests, cfg.prompt_len, vocab, rng), cfg.new_tokens
    )
    print(f"generate one at a time: {serial:,.0f} tok/s")
    rows = []
    for c in cfg.concurrencies:
        prompts = _prompts(c, cfg.prompt_len, vocab, rng)
        static = hf_static(model, prompts, cfg.new_tokens)
        cb = (
            hf_generate_batch(model, prompts, cfg.new_tokens, ecfg.kv_budget_tokens)
            if cfg.with_generate_batch
            else None
        )
        ours, ttft = engine_run(model, tok, prompts, cfg.new_tokens, ecfg)
        # On a GPU, the engine again with every decode step launched kernel by kernel.
        eager = (
            engine_run(model, tok, prompts, cfg.new_tokens, replace(ecfg, cuda_graphs=False))[0]
            if model.device.type == "cuda"
            else None
        )
        row = {
            "concurrency": c,
            "hf_generate_serial_tok_s": serial,
            "hf_generate_static_tok_s": static,
            "hf_generate_batch_tok_s": cb,
            "engine_tok_s": ours,
            "engine_no_cuda_graphs_tok_s": eager,
            "engine_vs_static": ours / static,
            "engine_vs_serial": ours / serial,
            "engine_vs_generate_batch": ours / cb if cb else None,
            "engine_ttft_p50_ms": 1000 * statistics.median(ttft),
            "engine_ttft_p99_ms": 1000 * pct(ttft, 0.99),
        }
        rows.append(row)
        print(json.dumps(row))
    return rows


def _prefix_cache(
    model: Any, tok: Any, cfg: BenchConfig, ecfg: EngineConfig, rng: random.Random
) -> dict[str, Any]:
    """A shared-prefix workload with the prefix cache on and off: TTFT and tokens/s."""
    vocab = model.config.vocab_size
    prefix = [rng.randrange(3, vocab) for _ in range(cfg.prefix_len)]
    shared = _prompts(cfg.prefix_requests, cfg.suffix_len, vocab, rng, prefix)
    warm_req = prefix + [rng.randrange(3, vocab) for _ in range(cfg.suffix_len)]
    out: dict[str, Any] = {}
    for on in (True, False):
        pc = replace(ecfg, enable_prefix_cache=on, kv_budget_tokens=64 * 1024)
        ttft = engine_sequential_ttft(model, tok, shared[:8], pc, warm_req)
        tps, _ = engine_run(model, tok, shared, cfg.prefix_new_tokens, pc)
        key = "cache_on" if on else "cache_off"
        out[key] = {"ttft_p50_ms": 1000 * statistics.median(ttft), "tok_s": tps}
    out["ttft_ratio_on_vs_off"] = out["cache_on"]["ttft_p50_ms"] / out["cache_off"]["ttft_p50_ms"]
    out["tok_s_ratio_on_vs_off"] = out["cache_on"]["tok_s"] / out["cache_off"]["tok_s"]
    return out


# Rounds of each kind, alternated, for the sampling-feature rows (medians reported).
FEATURE_ROUNDS = 3
# The same for speculation, whose ratios sit near 1 at 32 requests, where one round's
# noise on a shared machine (10% and more) would otherwise decide the figure.
SPEC_ROUNDS = 7


def penalties(vocab: int) -> SamplingConfig:
    """Greedy with every logit adjustment at once: OpenAI's presence and frequency
    penalties, a Hugging Face repetition penalty and 50 logit biases (ids spread over the
    vocabulary, one in five pushed up, the rest down)."""
    ids = range(3, vocab, max(1, vocab // 50))[:50]
    return SamplingConfig(
        presence_penalty=0.5,
        frequency_penalty=0.3,
        repetition_penalty=1.2,
        logit_bias=tuple((t, 5.0 if i % 5 == 0 else -5.0) for i, t in enumerate(ids)),
    )


# The sampled requests of the features rows, against greedy ones.
SAMPLED = {
    "temperature_1": SamplingConfig(temperature=1.0),
    "top_p_0.95": SamplingConfig(temperature=0.8, top_p=0.95),
    "top_k_50": SamplingConfig(temperature=0.7, top_k=50),
}


def _features(
    model: Any, tok: Any, cfg: BenchConfig, ecfg: EngineConfig, rng: random.Random
) -> dict[str, Any]:
    """Tokens/s of requests asking for log-probabilities (and 5 alternatives), of requests
    with penalties and logit biases, and of sampled requests (temperature 1, OpenAI's
    default; temperature 0.8 with top-p 0.95; temperature 0.7 with top-k 50), against the
    same requests plain (all greedy), at the highest concurrency, in alternating rounds:
    the ratio of the medians, and the median of each round's ratio to the plain run of the
    same round."""
    n = max(cfg.concurrencies)
    prompts = _prompts(n, cfg.prompt_len, model.config.vocab_size, rng)
    adjusted = penalties(model.get_input_embeddings().num_embeddings)
    asks: dict[str, dict[str, Any]] = {
        "plain": {},
        "logprobs": {"logprobs": 5},
        "penalties": {"sampling": adjusted},
        **{name: {"sampling": s} for name, s in SAMPLED.items()},
    }
    runs: dict[str, list[float]] = {name: [] for name in asks}
    names = list(asks)
    for r in range(FEATURE_ROUNDS):
        # Each round starts with another kind, so a load that rises or falls on a shared
        # machine favours none of them.
        for name in names[r % len(names) :] + names[: r % len(names)]:
            tps = engine_run(model, tok, prompts, cfg.new_tokens, ecfg, **asks[name])[0]
            runs[name].append(tps)
    p = statistics.median(runs["plain"])
    row: dict[str, Any] = {"concurrency": n, "plain_tok_s": p}
    for name in names[1:]:
        row[f"{name}_tok_s"] = statistics.median(runs[name])
        row[f"{name}_vs_plain"] = row[f"{name}_tok_s"] / p
        row[f"{name}_vs_plain_paired"] = _paired(runs[name], runs["plain"])
    return {**row, **_constrained(model, tok, cfg, ecfg, prompts)}


def speculation(
    model: Any, tok: Any, cfg: BenchConfig, ecfg: EngineConfig, draft: Any = None
) -> dict[str, Any]:
    """Speculation against none, greedy, in alternating rounds, with the engine's default
    load cap: n-gram (``cfg.spec_k`` guesses) one request at a time on extractive prompts,
    or with ``draft`` the draft model (``cfg.draft_k``) one request at a time on prompts
    of the chat mix; and ``cfg.spec_batch`` requests of the chat mix at once (speculation
    is off while the batch is fuller than the cap, then on for its tail)."""
    rng = random.Random(cfg.seed + 1)
    mix = Mix(Workload(output_tokens=(max(1, cfg.new_tokens // 4), cfg.new_tokens), seed=cfg.seed))
    chat = [mix.body() for _ in range(cfg.spec_batch)]
    chat_prompts = [tok(b["prompt"])["input_ids"] for b in chat]
    chat_new = [int(b["max_tokens"]) for b in chat]
    # Room for the whole batch at once: a pool sized for the single-request rows would
    # hold a few of the 32, and measure preemption instead of a batch under load.
    ecfg = replace(
        ecfg,
        kv_budget_tokens=max(
            ecfg.kv_budget_tokens,
            sum(len(p) + n for p, n in zip(chat_prompts, chat_new, strict=True)) + 1024,
        ),
        max_running=max(ecfg.max_running, cfg.spec_batch),
    )
    if draft is None:
        spec = replace(ecfg, speculation=SpecConfig(k=cfg.spec_k))
        words = [" ".join(rng.choices(WORDS, k=cfg.prompt_len)) for _ in range(cfg.spec_prompts)]
        prose = _prose_passages(rng, cfg.prompt_len, cfg.spec_prompts)
        passages = {"extractive_1": words, "extractive_prose_1": prose}
        singles = {
            name: [tok(_extractive_text(p))["input_ids"] for p in texts]
            for name, texts in passages.items()
        }
    else:
        spec = replace(ecfg, speculation=SpecConfig(k=cfg.draft_k, method="draft"))
        passages = {}
        singles = {"chat_1": chat_prompts[: cfg.spec_prompts]}

    def engine_for(c: EngineConfig) -> Engine:
        return Engine(model, tok, c, draft_model=draft if c.speculation.enabled else None)

    def one_at_a_time(single: list[list[int]], c: EngineConfig) -> tuple[float, Engine]:
        engine = engine_for(c)
        t0 = time.perf_counter()
        n = cfg.new_tokens
        for i, p in enumerate(single):
            engine.add_request(EngineRequest(f"x{i}", p, max_tokens=n, min_tokens=n))
            engine.run_until_idle()
        return engine.stats.decoded_tokens / (time.perf_counter() - t0), engine

    def batch(c: EngineConfig) -> tuple[float, Engine]:
        engine = engine_for(c)
        t0 = time.perf_counter()
        for i, (p, n) in enumerate(zip(chat_prompts, chat_new, strict=True)):
            engine.add_request(EngineRequest(f"c{i}", p, max_tokens=n, min_tokens=n))
        engine.run_until_idle()
        return engine.stats.decoded_tokens / (time.perf_counter() - t0), engine

    out: dict[str, Any] = {
        "k": spec.speculation.k,
        "max_running": spec.speculation.max_running,
        "step_tokens": spec.speculation.step_tokens,
        "method": spec.speculation.method,
    }
    parts: list[tuple[str, Callable[[EngineConfig], tuple[float, Engine]]]] = [
        (name, partial(one_at_a_time, single)) for name, single in singles.items()
    ]
    for name, fn in (*parts, ("chat_mix_" + str(cfg.spec_batch), batch)):
        on: list[float] = []
        off: list[float] = []
        engine = None
        for r in range(SPEC_ROUNDS):
            for with_spec in (r % 2 == 0, r % 2 == 1):
                rate, e = fn(spec if with_spec else ecfg)
                (on if with_spec else off).append(rate)
                engine = e if with_spec else engine
        assert engine is not None
        st = engine.stats
        out[name] = {
            "spec_tok_s": statistics.median(on),
            "plain_tok_s": statistics.median(off),
            "spec_vs_plain": statistics.median(on) / statistics.median(off),
            "spec_vs_plain_paired": _paired(on, off),
            "round_ratios": [a / b for a, b in zip(on, off, strict=True)],
            "acceptance_rate": st.spec_accepted_tokens / max(1, st.spec_draft_tokens),
            "mean_accepted": st.spec_accepted_tokens / max(1, st.spec_verifications),
            "verifications": st.spec_verifications,
        }
        if name in passages:
            out[name].update(_copied(model, tok, passages[name], cfg.new_tokens, ecfg))
    return out


def _copied(
    model: Any, tok: Any, passages: list[str], new: int, ecfg: EngineConfig
) -> dict[str, float]:
    """How the greedy answers copy their passages, averaged: ``copied``, how much of the
    passage's rest an answer repeats before it first departs from it (a share of the rest,
    or of the answer where that is shorter); ``quoted``, the share of its words that go on
    a run of the passage's, wherever the copy went on. An extractive answer's drafts are
    kept for copying the passage or for the model repeating itself, and only these tell
    which."""
    engine = Engine(model, tok, ecfg)
    copied, quoted = [], []
    for i, passage in enumerate(passages):
        prompt = tok(_extractive_text(passage))["input_ids"]
        engine.add_request(EngineRequest(f"c{i}", prompt, max_tokens=new, min_tokens=new))
        text = "".join(o.text for o in engine.run_until_idle())
        copied.append(copied_share(text, passage[len(_copy_started(passage)) :]))
        quoted.append(quoted_share(text, passage))
    return {"copied": statistics.mean(copied), "quoted": statistics.mean(quoted)}


QUOTED_RUN = 3  # words in a row of the passage that make an answer's word a quote


def quoted_share(answer: str, passage: str) -> float:
    """The share of ``answer``'s words that end a run of ``QUOTED_RUN`` words found in
    ``passage``: its words in the passage's order, though the copy skips or starts again
    (0 for an answer of fewer words)."""
    words = answer.split()
    source = passage.split()
    runs = {tuple(source[i : i + QUOTED_RUN]) for i in range(len(source) - QUOTED_RUN + 1)}
    ends = range(QUOTED_RUN, len(words) + 1)
    if not ends:
        return 0.0
    return sum(tuple(words[end - QUOTED_RUN : end]) in runs for end in ends) / len(ends)


def copied_share(answer: str, rest: str) -> float:
    """The characters ``answer`` repeats of ``rest`` before it first departs from it, as a
    share of ``rest`` or of ``answer`` where that is shorter (0 for an empty one)."""
    room = min(len(answer), len(rest))
    if not room:
        return 0.0
    same = next((i for i, (a, b) in enumerate(zip(answer, rest, strict=False)) if a != b), room)
    return same / room


def engine_serial(
    model: Any, tok: Any, prompts: list[list[int]], new: int, cfg: EngineConfig
) -> float:
    """tokens/s of the engine serving ``prompts`` one at a time, each to the end."""
    engine = Engine(model, tok, cfg)
    t0 = time.perf_counter()
    for i, p in enumerate(prompts):
        engine.add_request(EngineRequest(f"s{i}", p, max_tokens=new, ignore_eos=True))
        engine.run_until_idle()
    return len(prompts) * new / (time.perf_counter() - t0)


# Rounds of the engine against generate in the overhead figures.
OVERHEAD_ROUNDS = 4


def overhead(model: Any, tok: Any, cfg: BenchConfig, ecfg: EngineConfig) -> dict[str, Any]:
    """The engine against ``generate`` in rounds that alternate which runs first: one
    request at a time (``cfg.serial_requests`` prompts) against ``generate`` one at a time,
    and the highest concurrency at once against ``generate`` on one static batch. Each
    round's ratio, and their median: on a machine shared with other work a ratio within a
    round drifts far less than the throughput rows, each timed once."""
    rng = random.Random(cfg.seed + 2)
    vocab = model.config.vocab_size
    serial = _prompts(cfg.serial_requests, cfg.prompt_len, vocab, rng)
    n = max(cfg.concurrencies)
    batch = _prompts(n, cfg.prompt_len, vocab, rng)
    pairs: dict[str, tuple[Callable[[], float], Callable[[], float]]] = {
        "one_at_a_time": (
            lambda: engine_serial(model, tok, serial, cfg.new_tokens, ecfg),
            lambda: hf_serial(model, serial, cfg.new_tokens),
        ),
        f"static_batch_{n}": (
            lambda: engine_run(model, tok, batch, cfg.new_tokens, ecfg)[0],
            lambda: hf_static(model, batch, cfg.new_tokens),
        ),
    }
    out: dict[str, Any] = {"rounds": OVERHEAD_ROUNDS}
    for name, (ours, theirs) in pairs.items():
        out[name] = _both_ways(ours, theirs, ("engine", "generate"))
    out["decode_step"] = decode_step_split(model, tok, batch, ecfg)
    return out


# Steady decode steps timed in ``decode_step_split``.
SPLIT_STEPS = 32


def decode_step_split(
    model: Any, tok: Any, prompts: list[list[int]], ecfg: EngineConfig, steps: int = SPLIT_STEPS
) -> dict[str, Any]:
    """Where a decode step's time goes with every prompt decoding at once (after their
    prefill): the median step, the median runner's pass (its inputs' preparation and the
    model's forward), and the median time the model waits from one pass's end to the next
    one's start: the engine's own time (scheduling, sampling, emitting) that no pass
    overlaps. On a GPU, where the pass is fast, that wait bounds the engine against a
    static batch; with ``overlap`` a step's text is made while the next pass runs, out of
    it. Pass times are the device's own on a GPU (events: nothing waits for them)."""
    engine = Engine(model, tok, ecfg)
    for i, p in enumerate(prompts):
        engine.add_request(EngineRequest(f"d{i}", p, max_tokens=steps + 8, ignore_eos=True))
    while engine.scheduler.waiting or any(s.in_prefill for s in engine.scheduler.running):
        engine.step()
    engine.step()  # the first step of decodes alone places their rows
    engine.step()  # (overlapped, this one settles that step's pass)
    clock = _PassClock(model.device)
    forward = engine.runner.forward

    def timed_pass(*args: Any, **kwargs: Any) -> torch.Tensor:
        start = clock.mark()
        logits = forward(*args, **kwargs)
        clock.passes.append((start, clock.mark()))
        return logits

    engine.runner.forward = timed_pass  # type: ignore[method-assign]
    step_s: list[float] = []
    for _ in range(steps):
        t0 = time.perf_counter()
        engine.step()
        step_s.append(time.perf_counter() - t0)
    engine.runner.forward = forward  # type: ignore[method-assign]
    engine.run_until_idle()  # settles the last timed pass
    _sync()
    marks = clock.passes
    idle = [clock.seconds(a[1], b[0]) for a, b in itertools.pairwise(marks)]
    return {
        "rows": len(prompts),
        "steps": steps,
        "step_ms": 1e3 * statistics.median(step_s),
        "pass_ms": 1e3 * statistics.median(clock.seconds(a, b) for a, b in marks),
        "idle_ms": 1e3 * statistics.median(idle),
    }


class _PassClock:
    """Marks at each pass's start and end: CUDA events on a GPU (the device's own times,
    read once it is done), the host's clock elsewhere."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.passes: list[tuple[Any, Any]] = []

    def mark(self) -> Any:
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self, a: Any, b: Any) -> float:
        return float(a.elapsed_time(b)) / 1e3 if self.cuda else float(b - a)


def overlap(model: Any, tok: Any, cfg: BenchConfig, ecfg: EngineConfig) -> dict[str, Any]:
    """On a GPU, steps that make their text while the next pass runs (``overlap``, the
    default) against steps that settle their own pass, in rounds that alternate which runs
    first: tokens/s one request at a time and at the highest concurrency, and each one's
    decode step split (``decode_step_split``) at that concurrency."""
    rng = random.Random(cfg.seed + 5)
    vocab = model.config.vocab_size
    serial = _prompts(cfg.serial_requests, cfg.prompt_len, vocab, rng)
    n = max(cfg.concurrencies)
    batch = _prompts(n, cfg.prompt_len, vocab, rng)
    on, off = replace(ecfg, overlap=True), replace(ecfg, overlap=False)
    out: dict[str, Any] = {"rounds": OVERHEAD_ROUNDS}
    for name, run in (
        ("one_at_a_time", lambda c: engine_serial(model, tok, serial, cfg.new_tokens, c)),
        (f"concurrency_{n}", lambda c: engine_run(model, tok, batch, cfg.new_tokens, c)[0]),
    ):
        out[name] = _both_ways(partial(run, on), partial(run, off), ("overlap", "lockstep"))
    out["decode_step"] = decode_step_split(model, tok, batch, on)
    out["decode_step_lockstep"] = decode_step_split(model, tok, batch, off)
    return out


def _print_split(label: str, split: dict[str, Any] | None) -> None:
    if split:
        print(
            f"{label}decode step at {split['rows']} rows (medians of {split['steps']}): "
            f"{split['step_ms']:.2f} ms, the runner's pass {split['pass_ms']:.2f} ms, the "
            f"model idle between passes {split['idle_ms']:.2f} ms "
            f"({1e3 * split['idle_ms'] / split['rows']:.1f} us a row)"
        )


def _alternating(
    ours: Callable[[], float], theirs: Callable[[], float]
) -> tuple[list[float], list[float]]:
    """``OVERHEAD_ROUNDS`` rounds of both, alternating which runs first."""
    a: list[float] = []
    b: list[float] = []
    for r in range(OVERHEAD_ROUNDS):
        for fn, into in ((ours, a), (theirs, b))[:: 1 if r % 2 == 0 else -1]:
            into.append(fn())
    return a, b


def _both_ways(
    ours: Callable[[], float], theirs: Callable[[], float], names: tuple[str, str]
) -> dict[str, Any]:
    """Both in ``_alternating`` rounds: each one's tokens/s (keys named by ``names``), each
    round's ratio, and their median."""
    a, b = _alternating(ours, theirs)
    ratios = [x / y for x, y in zip(a, b, strict=True)]
    return {
        f"{names[0]}_tok_s": a,
        f"{names[1]}_tok_s": b,
        "ratios": ratios,
        "median_ratio": statistics.median(ratios),
    }


def int8(model: Any, tok: Any, cfg: BenchConfig, ecfg: EngineConfig) -> dict[str, Any]:
    """``TW_QUANTIZE=int8`` against the full-precision model, in rounds that alternate
    which runs first: the engine's tokens/s one request at a time and at the highest
    concurrency, and how many greedy tokens of the one-at-a-time prompts equal full
    precision's (all of them, and up to the first difference)."""
    from services.worker.loader import quantize_int8

    q = copy.deepcopy(model)
    quantize_int8(q)
    rng = random.Random(cfg.seed + 3)
    vocab = model.config.vocab_size
    serial = _prompts(max(2, cfg.serial_requests), cfg.prompt_len, vocab, rng)
    n = max(cfg.concurrencies)
    batch = _prompts(n, cfg.prompt_len, vocab, rng)
    out: dict[str, Any] = {"rounds": OVERHEAD_ROUNDS}
    for name, run in (
        ("one_at_a_time", lambda m: engine_serial(m, tok, serial, cfg.new_tokens, ecfg)),
        (f"concurrency_{n}", lambda m: engine_run(m, tok, batch, cfg.new_tokens, ecfg)[0]),
    ):
        out[name] = _both_ways(partial(run, q), partial(run, model), ("int8", "fp"))
    equal = prefix = total = 0
    for p in serial:
        a, b = (_greedy(m, tok, p, cfg.new_tokens, ecfg) for m in (model, q))
        same = [x == y for x, y in zip(a, b, strict=True)]
        equal += sum(same)
        prefix += same.index(False) if False in same else len(same)
        total += len(same)
    out["greedy_agreement"] = equal / total
    out["greedy_common_prefix"] = prefix / total
    return out


# Concurrencies of the padding figure: the few-row products that padding is for.
PADDING_CONCURRENCIES = (2, 3, 4)


def padding(model: Any, tok: Any, cfg: BenchConfig, ecfg: EngineConfig) -> dict[str, Any]:
    """The engine with its products padded where the load measured that faster
    (``pad_products``, the default) against unpadded, in rounds that alternate which runs
    first, at 2, 3 and 4 requests at once; and the padding the load chose."""
    rng = random.Random(cfg.seed + 4)
    vocab = model.config.vocab_size
    chosen = Engine(model, tok, ecfg).runner.padded_products
    out: dict[str, Any] = {"rounds": OVERHEAD_ROUNDS, "padded": sorted(chosen.items())}
    for c in PADDING_CONCURRENCIES:
        prompts = _prompts(c, cfg.prompt_len, vocab, rng)

        def run(pad: bool, prompts: list[list[int]] = prompts) -> float:
            rate, _ = engine_run(
                model, tok, prompts, cfg.new_tokens, replace(ecfg, pad_products=pad)
            )
            return rate

        out[f"concurrency_{c}"] = _both_ways(
            partial(run, True), partial(run, False), ("padded", "unpadded")
        )
    return out


def _greedy(model: Any, tok: Any, prompt: list[int], new: int, ecfg: EngineConfig) -> list[int]:
    engine = Engine(model, tok, ecfg)
    engine.add_request(EngineRequest("g", prompt, max_tokens=new, ignore_eos=True))
    return [t for o in engine.run_until_idle() for t in o.token_ids]


COPY_STARTED = 7  # words of the passage that an extractive prompt's copy starts with


def _copy_started(passage: str) -> str:
    """The passage's first words, up to the space before the next (a word cut in two
    would read as other tokens than the passage's)."""
    return " ".join(passage.split(" ")[:COPY_STARTED])


def _extractive_text(passage: str) -> str:
    """An instruction to repeat a passage, the passage, and the start of its copy (the
    format of small-copy's quote tune, on passages that were never its corpus)."""
    return quote_prompt(passage) + quote_answer(_copy_started(passage))


def _prose_passages(rng: random.Random, words: int, n: int) -> list[str]:
    """``n`` passages of ``words`` words of English prose the model never trained on: the
    first words of comment blocks of the standard library, whose docstrings alone are the
    corpus."""
    blocks = [b.split() for b in iter_comment_passages()]
    return [" ".join(b[:words]) for b in rng.sample([b for b in blocks if len(b) >= words], n)]


def _paired(runs: list[float], base: list[float]) -> float:
    """The median ratio of each round's run to the base run of the same round: on a
    machine shared with other work it drifts less than the ratio of the medians."""
    return statistics.median(r / b for r, b in zip(runs, base, strict=True))


# Records of a few typed fields, at least as many as fill the output: every request is
# constrained for all of its tokens and ends at max_tokens, as the plain ones do.
BENCH_SCHEMA: dict[str, Any] = {
    "type": "array",
    "minItems": 1000,
    "items": {
        "type": "object",
        "properties": {
            "id": {"type": "integer", "minimum": 0, "maximum": 9999},
            "name": {"type": "string", "maxLength": 12},
            "kind": {"enum": ["alpha", "beta", "gamma"]},
            "score": {"type": "number", "minimum": 0, "maximum": 1},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 3},
        },
        "required": ["id", "name", "kind", "score", "tags"],
    },
}


def _constrained(
    model: Any, tok: Any, cfg: BenchConfig, ecfg: EngineConfig, prompts: list[list[int]]
) -> dict[str, Any]:
    """Greedy requests constrained to ``BENCH_SCHEMA`` against the same requests plain
    greedy, alternating rounds, medians; and the schema's first compile (later requests
    hit the cache)."""
    structure = ("json_schema", json.dumps(BENCH_SCHEMA))
    grammars = GrammarCache.for_tokenizer(tok, model.get_input_embeddings().num_embeddings)
    t0 = time.perf_counter()
    grammars.get(*structure)
    compile_ms = 1000 * (time.perf_counter() - t0)
    greedy = [engine_run(model, tok, prompts, cfg.new_tokens, ecfg)[0]]
    constrained: list[float] = []
    for _ in range(FEATURE_ROUNDS):
        constrained.append(
            engine_run(model, tok, prompts, cfg.new_tokens, ecfg, grammars, structure=structure)[0]
        )
        greedy.append(engine_run(model, tok, prompts, cfg.new_tokens, ecfg)[0])
    g, c = statistics.median(greedy), statistics.median(constrained)
    return {
        "greedy_tok_s": g,
        "json_schema_tok_s": c,
        "json_schema_vs_greedy": c / g,
        # Each constrained round against the greedy rounds just before and after it: on a
        # machine shared with other work, the median of these ratios drifts less than the
        # ratio of the medians.
        "json_schema_vs_greedy_paired": statistics.median(
            run / ((before + after) / 2)
            for run, before, after in zip(constrained, greedy, greedy[1:], strict=False)
        ),
        "json_schema_compile_ms": compile_ms,
    }


def _print_rounds(what: str, part: dict[str, Any]) -> None:
    """A part timed in alternating rounds: each of its figures' median ratio and rounds."""
    for key, r in part.items():
        if isinstance(r, dict) and "ratios" in r:
            print(
                f"{what} ({key.replace('_', ' ')}), {part['rounds']} alternating rounds: "
                f"median {r['median_ratio']:.2f}x (rounds "
                f"{', '.join(f'{x:.2f}x' for x in r['ratios'])})"
            )


def print_table(rep: Report) -> None:
    def f(v: float | None) -> str:
        return "n/a" if v is None else f"{v:,.0f}"

    print(
        f"\nengine benchmark — {rep.model} ({rep.params_m}M params, {rep.placement}, "
        f"{rep.threads} threads)"
    )
    print(
        "| concurrency | generate 1-at-a-time | generate static batch | generate_batch (CB) | this engine | engine, no CUDA graphs | vs 1-at-a-time | vs static batch | vs generate_batch | TTFT p50 / p99 ms |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rep.throughput:
        vs_cb = f"{r['engine_vs_generate_batch']:.2f}x" if r["engine_vs_generate_batch"] else "n/a"
        print(
            f"| {r['concurrency']} | {f(r['hf_generate_serial_tok_s'])} | {f(r['hf_generate_static_tok_s'])} | "
            f"{f(r['hf_generate_batch_tok_s'])} | {f(r['engine_tok_s'])} | {f(r.get('engine_no_cuda_graphs_tok_s'))} | "
            f"{r['engine_vs_serial']:.1f}x | {r['engine_vs_static']:.2f}x | {vs_cb} | "
            f"{r['engine_ttft_p50_ms']:.0f} / {r['engine_ttft_p99_ms']:.0f} |"
        )
    p = rep.prefix
    if p:
        print(
            f"\nshared prefix ({rep.config['prefix_len']} + {rep.config['suffix_len']} tokens): TTFT p50 "
            f"{p['cache_on']['ttft_p50_ms']:.1f} ms cached vs {p['cache_off']['ttft_p50_ms']:.1f} ms uncached "
            f"({100 * p['ttft_ratio_on_vs_off']:.0f}%); {f(p['cache_on']['tok_s'])} vs {f(p['cache_off']['tok_s'])} tok/s"
        )
    for sp, name, single in (
        (
            rep.speculation,
            "n-gram speculation",
            (
                ("extractive_1", "1 request, extractive prompts (passages of common words)"),
                ("extractive_prose_1", "1 request, extractive prompts (passages of prose)"),
            ),
        ),
        (rep.draft, "draft-model speculation", (("chat_1", "1 request, chat mix"),)),
    ):
        if not sp:
            continue
        for key, what in (
            *single,
            (
                f"chat_mix_{rep.config['spec_batch']}",
                f"{rep.config['spec_batch']} requests, chat mix",
            ),
        ):
            r = sp[key]
            print(
                f"{name} (k={sp['k']}, at most {sp['step_tokens']} a step, off above "
                f"{sp['max_running']} running), {what}: "
                f"{f(r['spec_tok_s'])} vs {f(r['plain_tok_s'])} tok/s without "
                f"({r['spec_vs_plain']:.2f}x, paired rounds {r['spec_vs_plain_paired']:.2f}x: "
                f"{', '.join(f'{x:.2f}x' for x in r['round_ratios'])}); "
                f"acceptance {100 * r['acceptance_rate']:.0f}%, mean accepted "
                f"{r['mean_accepted']:.2f} tokens over {r['verifications']} drafts"
                + (
                    f"; answers copy {100 * r['copied']:.0f}% of the passage before they "
                    f"depart from it, {100 * r['quoted']:.0f}% of their words quote it"
                    if "copied" in r
                    else ""
                )
            )
    _print_rounds("engine vs generate", rep.overhead)
    _print_split("", rep.overhead.get("decode_step"))
    _print_rounds("overlapped steps vs lockstep", rep.overlap)
    _print_split("overlapped: ", rep.overlap.get("decode_step"))
    _print_split("lockstep: ", rep.overlap.get("decode_step_lockstep"))
    _print_rounds("int8 weights vs full precision", rep.int8)
    if rep.padding:
        pads = rep.padding["padded"]
        chose = ", ".join(f"{m} rows to {n}" for m, n in pads) or "none"
        print(f"products padded (measured at load): {chose}")
    _print_rounds("padded products vs unpadded", rep.padding)
    q8 = rep.int8
    if q8:
        print(
            f"int8 greedy tokens equal to full precision's: {100 * q8['greedy_agreement']:.0f}% "
            f"({100 * q8['greedy_common_prefix']:.0f}% before the first difference)"
        )
    ft = rep.features
    if ft:
        print(
            f"logprobs (5 alternatives) at {ft['concurrency']} streams: {f(ft['logprobs_tok_s'])} "
            f"vs {f(ft['plain_tok_s'])} tok/s plain ({ft['logprobs_vs_plain']:.2f}x, paired "
            f"rounds {ft['logprobs_vs_plain_paired']:.2f}x)"
        )
        print(
            f"penalties and logit_bias at {ft['concurrency']} streams: "
            f"{f(ft['penalties_tok_s'])} vs {f(ft['plain_tok_s'])} tok/s plain greedy "
            f"({ft['penalties_vs_plain']:.2f}x, paired rounds "
            f"{ft['penalties_vs_plain_paired']:.2f}x)"
        )
        for name, sampling in SAMPLED.items():
            print(
                f"sampled ({sampling.temperature:g}, top_p {sampling.top_p:g}, top_k "
                f"{sampling.top_k}) at {ft['concurrency']} streams: {f(ft[name + '_tok_s'])} "
                f"vs {f(ft['plain_tok_s'])} tok/s plain greedy ({ft[name + '_vs_plain']:.2f}x, "
                f"paired rounds {ft[name + '_vs_plain_paired']:.2f}x)"
            )
        print(
            f"JSON-schema constrained at {ft['concurrency']} streams: "
            f"{f(ft['json_schema_tok_s'])} vs {f(ft['greedy_tok_s'])} tok/s plain greedy "
            f"({ft['json_schema_vs_greedy']:.2f}x, paired rounds "
            f"{ft['json_schema_vs_greedy_paired']:.2f}x; first compile "
            f"{ft['json_schema_compile_ms']:.0f} ms)"
        )
