"""The decode engine on a real model (the embedded tiny one): outputs must be identical to
Hugging Face ``generate`` run one request at a time, whatever the batching, prefix reuse,
chunking or preemption did."""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch

from services.worker.engine.engine import Engine
from services.worker.engine.request import Status
from services.worker.engine.wire import EngineConfig, EngineRequest, SamplingConfig, StepOutput

pytestmark = pytest.mark.timeout(600)


def reference(model: Any, prompt: list[int], n: int) -> list[int]:
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([prompt], device=model.device),
            max_new_tokens=n,
            do_sample=False,
            eos_token_id=[],
        )
    return out[0, len(prompt) :].tolist()


def collect(outputs: list[StepOutput]) -> tuple[dict[str, list[int]], dict[str, StepOutput]]:
    tokens: dict[str, list[int]] = {}
    finals: dict[str, StepOutput] = {}
    for o in outputs:
        tokens.setdefault(o.request_id, []).extend(o.token_ids)
        if o.finish is not None:
            finals[o.request_id] = o
    return tokens, finals


def random_ids(rng: random.Random, n: int, vocab: int) -> list[int]:
    return [rng.randrange(3, vocab) for _ in range(n)]


def test_greedy_matches_generate_with_staggered_arrivals_and_shared_prefixes(
    lm: tuple[Any, Any],
) -> None:
    model, tok = lm
    vocab = model.config.vocab_size
    rng = random.Random(1)
    prefixes = [random_ids(rng, n, vocab) for n in (64, 130, 200)]
    prompts = []
    for i in range(24):
        if i % 3 == 0:
            prompts.append(random_ids(rng, rng.randint(1, 300), vocab))
        else:
            prompts.append(prefixes[i % 3] + random_ids(rng, rng.randint(1, 60), vocab))
    new = 12
    engine = Engine(
        model, tok, EngineConfig(kv_budget_tokens=16_384, prefill_chunk=64, max_step_tokens=256)
    )
    outputs: list[StepOutput] = []
    for i, p in enumerate(prompts):  # a new request joins at every step
        engine.add_request(EngineRequest(f"r{i}", p, max_tokens=new, ignore_eos=True))
        outputs += engine.step()
    outputs += engine.run_until_idle()
    tokens, finals = collect(outputs)
    for i, p in enumerate(prompts):
        assert tokens[f"r{i}"] == reference(model, p, new), f"request {i} (prompt {len(p)} tokens)"
        assert finals[f"r{i}"].finish is Status.FINISHED_LENGTH
    assert engine.stats.prefix_hit_tokens > 0
    assert engine.stats.kv_used_blocks == 0  # everything freed


# How far below the best logit a greedy pick may score in a plain forward pass: rounding in
# the batched, chunked, paged passes against one unbatched pass, by precision. Measured on
# an H200 in bf16: 99.7% exact picks, the largest shortfall 0.031.
PICK_TOLERANCE = {torch.float32: 1e-3, torch.bfloat16: 0.125, torch.float16: 0.05}


def test_every_greedy_pick_tops_a_plain_forward_pass(lm: tuple[Any, Any]) -> None:
    """In any precision: each token the engine picks (batched decode, chunked prefill, shared
    prefixes) is, up to rounding, the best one in a single forward pass over the sequence so
    far. Unlike comparing whole generations, one near-tie cannot derail the rest."""
    model, tok = lm
    vocab = model.config.vocab_size
    rng = random.Random(7)
    prefix = random_ids(rng, 100, vocab)
    prompts = [
        prefix + random_ids(rng, rng.randint(1, 80), vocab)
        if i % 2
        else random_ids(rng, rng.randint(1, 250), vocab)
        for i in range(16)
    ]
    new = 24
    engine = Engine(
        model, tok, EngineConfig(kv_budget_tokens=16_384, prefill_chunk=64, max_step_tokens=256)
    )
    outputs: list[StepOutput] = []
    for i, p in enumerate(prompts):
        engine.add_request(EngineRequest(f"r{i}", p, max_tokens=new, ignore_eos=True))
        outputs += engine.step()
    tokens, _ = collect(outputs + engine.run_until_idle())
    gaps = []
    with torch.inference_mode():
        for i, p in enumerate(prompts):
            picks = torch.tensor(tokens[f"r{i}"], device=model.device)
            seq = torch.tensor([p + tokens[f"r{i}"][:-1]], device=model.device)
            logits = model(seq).logits[0, len(p) - 1 :].float()
            best = logits.max(-1).values
            gaps += (best - logits.gather(-1, picks[:, None])[:, 0]).tolist()
    exact = sum(g == 0 for g in gaps) / len(gaps)
    print(
        f"{model.dtype} on {model.device}: {len(gaps)} picks, {exact:.1%} exact argmax, "
        f"largest gap {max(gaps):.4f}"
    )
    assert len(gaps) == 16 * new
    assert max(gaps) <= PICK_TOLERANCE[model.dtype]
    assert exact >= 0.9


def test_shared_prefix_prefills_only_the_uncached_suffix(lm: tuple[Any, Any]) -> None:
    model, tok = lm
    rng = random.Random(2)
    prefix = random_ids(rng, 160, model.config.vocab_size)
    first, second = (
        prefix + random_ids(rng, 20, model.config.vocab_size),
        prefix + random_ids(rng, 9, model.config.vocab_size),
    )
    engine = Engine(model, tok, EngineConfig(kv_budget_tokens=4096, block_size=16))
    engine.add_request(EngineRequest("a", first, max_tokens=4, ignore_eos=True))
    engine.run_until_idle()
    before = engine.stats.prefilled_tokens
    engine.add_request(EngineRequest("b", second, max_tokens=8, ignore_eos=True))
    tokens, finals = collect(engine.run_until_idle())
    cached = 160  # ten full blocks of the shared prefix
    assert finals["b"].cached_tokens == cached
    assert engine.stats.prefilled_tokens - before == len(second) - cached
    assert tokens["b"] == reference(model, second, 8)


def test_seeded_sampling_is_independent_of_batch_neighbours(lm: tuple[Any, Any]) -> None:
    model, tok = lm
    rng = random.Random(3)
    prompt = random_ids(rng, 40, model.config.vocab_size)
    cfg = SamplingConfig(temperature=0.9, top_p=0.95, top_k=50, seed=1234)

    alone = Engine(model, tok, EngineConfig(kv_budget_tokens=8192))
    alone.add_request(EngineRequest("x", prompt, max_tokens=24, sampling=cfg, ignore_eos=True))
    solo, _ = collect(alone.run_until_idle())

    crowd = Engine(model, tok, EngineConfig(kv_budget_tokens=16_384))
    for i in range(15):
        other = SamplingConfig(
            temperature=rng.choice([0.0, 0.7, 1.3]), top_k=rng.choice([0, 5]), seed=i
        )
        crowd.add_request(
            EngineRequest(
                f"n{i}",
                random_ids(rng, rng.randint(5, 90), model.config.vocab_size),
                30,
                other,
                ignore_eos=True,
            )
        )
    crowd.step()
    crowd.add_request(EngineRequest("x", prompt, max_tokens=24, sampling=cfg, ignore_eos=True))
    together, _ = collect(crowd.run_until_idle())
    assert together["x"] == solo["x"]
    assert len(set(solo["x"])) > 1  # really sampled, not a constant


def test_tiny_kv_budget_preempts_and_still_matches_reference(lm: tuple[Any, Any]) -> None:
    model, tok = lm
    rng = random.Random(4)
    prompts = [random_ids(rng, rng.randint(8, 60), model.config.vocab_size) for _ in range(50)]
    budget = 320  # 20 blocks of 16: a handful of sequences at a time
    engine = Engine(
        model, tok, EngineConfig(kv_budget_tokens=budget, block_size=16, max_running=16)
    )
    for i, p in enumerate(prompts):
        engine.add_request(EngineRequest(f"r{i}", p, max_tokens=16, ignore_eos=True))
    tokens, finals = collect(engine.run_until_idle())
    assert len(finals) == 50
    assert engine.stats.preemptions > 0
    assert engine.stats.kv_peak_used_blocks * 16 <= budget
    for i, p in enumerate(prompts):
        assert tokens[f"r{i}"] == reference(model, p, 16), f"request {i}"


def test_cancel_frees_blocks_but_keeps_the_shared_prefix_cached(lm: tuple[Any, Any]) -> None:
    model, tok = lm
    rng = random.Random(5)
    prefix = random_ids(rng, 64, model.config.vocab_size)
    engine = Engine(model, tok, EngineConfig(kv_budget_tokens=4096))
    engine.add_request(EngineRequest("warm", [*prefix, 5], max_tokens=1))
    engine.run_until_idle()
    engine.add_request(EngineRequest("long", [*prefix, 7, 8, 9], max_tokens=100, ignore_eos=True))
    for _ in range(5):
        engine.step()
    assert engine.stats.running == 1
    engine.abort("long")
    outs = engine.step()
    assert [o.finish for o in outs if o.request_id == "long"] == [Status.FINISHED_ABORTED]
    assert engine.stats.running == 0 and engine.stats.kv_used_blocks == 0
    assert engine.kv.cached_prefix_blocks([*prefix, 1]) != []  # the prefix is still cached


def test_stop_strings_eos_and_multibyte_text(lm: tuple[Any, Any]) -> None:
    model, tok = lm
    prompt = tok("Le café coûte 3 € — 中文 🙂 and the function returns")["input_ids"]
    ref = reference(model, prompt, 40)
    full = tok.decode(ref, skip_special_tokens=True)
    engine = Engine(model, tok, EngineConfig(kv_budget_tokens=4096))
    engine.add_request(EngineRequest("plain", prompt, max_tokens=40, ignore_eos=True))
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    engine.add_request(
        EngineRequest("stopped", prompt, max_tokens=40, stop=[stop], ignore_eos=True)
    )
    engine.add_request(
        EngineRequest("stop-id", prompt, max_tokens=40, stop_token_ids=[ref[5]], ignore_eos=True)
    )
    engine.add_request(
        EngineRequest(
            "kept", prompt, max_tokens=40, stop=[stop], ignore_eos=True, include_stop=True
        )
    )
    engine.add_request(
        EngineRequest(
            "id-kept",
            prompt,
            max_tokens=40,
            stop_token_ids=[ref[5]],
            ignore_eos=True,
            include_stop=True,
        )
    )
    engine.add_request(EngineRequest("eos", prompt, max_tokens=40))
    outs = engine.run_until_idle()
    texts: dict[str, str] = {}
    for o in outs:
        texts[o.request_id] = texts.get(o.request_id, "") + o.text
        assert "\ufffd" not in o.text or "\ufffd" in full
    assert texts["plain"] == full
    assert texts["stopped"] == full[: full.index(stop)]
    assert texts["kept"] == full[: full.index(stop) + len(stop)]
    at = ref.index(ref[5])
    assert texts["stop-id"] == tok.decode(ref[:at], skip_special_tokens=True)
    assert texts["id-kept"] == tok.decode(ref[: at + 1], skip_special_tokens=True)
    assert texts["id-kept"] != texts["stop-id"]
    tokens, finals = collect(outs)
    assert tokens["kept"] == tokens["stopped"]  # the same tokens: only the text differs
    for name in ("stopped", "kept", "stop-id", "id-kept"):
        assert finals[name].finish is Status.FINISHED_STOPPED
    assert finals["stop-id"].completion_tokens == at + 1
    # Without ignore_eos the request ends at EOS exactly where generate does.
    with torch.inference_mode():
        natural = model.generate(
            torch.tensor([prompt], device=model.device), max_new_tokens=40, do_sample=False
        )
    natural_ids = natural[0, len(prompt) :].tolist()
    eos_tokens, _ = collect([o for o in outs if o.request_id == "eos"])
    assert eos_tokens["eos"] == natural_ids
    expected = (
        Status.FINISHED_STOPPED if natural_ids[-1] == tok.eos_token_id else Status.FINISHED_LENGTH
    )
    assert finals["eos"].finish is expected


def test_requests_that_cannot_run_fail_cleanly(lm: tuple[Any, Any]) -> None:
    model, tok = lm
    engine = Engine(model, tok, EngineConfig(kv_budget_tokens=256))
    engine.add_request(EngineRequest("big", [5] * 200, max_tokens=100))
    engine.add_request(EngineRequest("empty", [], max_tokens=4))
    engine.add_request(EngineRequest("oov", [5, model.config.vocab_size], max_tokens=4))
    engine.add_request(EngineRequest("negative", [-1, 5], max_tokens=4))
    vocab = model.config.vocab_size
    # Ids the model has not (from a producer the edge did not check): never sampled, so
    # a bias or a stop id there would be ignored.
    biased = SamplingConfig(logit_bias=((vocab, 5.0),))
    engine.add_request(EngineRequest("oov-bias", [5, 6], max_tokens=4, sampling=biased))
    engine.add_request(EngineRequest("oov-stop", [5, 6], max_tokens=4, stop_token_ids=[vocab]))
    engine.add_request(EngineRequest("fine", [5, 6], max_tokens=4, ignore_eos=True))
    tokens, finals = collect(engine.run_until_idle())
    assert finals["big"].finish is Status.FINISHED_ERROR and "KV budget" in (
        finals["big"].error or ""
    )
    assert finals["empty"].finish is Status.FINISHED_ERROR
    for name in ("oov", "negative"):  # on CUDA these would poison the device, not raise
        assert finals[name].finish is Status.FINISHED_ERROR
        assert "token ids must lie in" in (finals[name].error or "")
    for name in ("oov-bias", "oov-stop"):
        assert finals[name].finish is Status.FINISHED_ERROR
        assert "must lie in" in (finals[name].error or "") and not tokens.get(name)
    assert finals["fine"].finish is Status.FINISHED_LENGTH and len(tokens["fine"]) == 4


def test_min_tokens_hold_stop_ids_as_generate_does(lm: tuple[Any, Any]) -> None:
    """Until ``min_tokens`` tokens are out, a stop id cannot be picked (Hugging Face's
    ``min_new_tokens``); after that it ends the request."""
    model, tok = lm
    rng = random.Random(9)
    prompts = [random_ids(rng, 24, model.config.vocab_size) for _ in range(4)]
    engine = Engine(model, tok, EngineConfig(kv_budget_tokens=4096))
    want = {}
    for i, p in enumerate(prompts):
        free = reference(model, p, 12)
        stop = free[1]  # picked early: held back while the minimum is not reached
        engine.add_request(
            EngineRequest(
                f"r{i}", p, max_tokens=20, stop_token_ids=[stop], ignore_eos=True, min_tokens=6
            )
        )
        with torch.inference_mode():
            out = model.generate(
                torch.tensor([p], device=model.device),
                max_new_tokens=20,
                min_new_tokens=6,
                do_sample=False,
                eos_token_id=[stop],
            )
        want[f"r{i}"] = out[0, len(p) :].tolist()
    tokens, _ = collect(engine.run_until_idle())
    for rid, expected in want.items():
        assert tokens[rid] == expected, rid
        assert len(tokens[rid]) >= 6
    assert any(len(t) < 20 for t in tokens.values())  # the stop id ends some after the minimum


def test_logprobs_equal_log_softmax_of_a_plain_forward_pass(lm: tuple[Any, Any]) -> None:
    """Batched with requests that ask for none, sampled or greedy: each token's reported
    log-probability and top alternatives are those of one unbatched forward pass over the
    sequence so far."""
    model, tok = lm
    rng = random.Random(10)
    engine = Engine(model, tok, EngineConfig(kv_budget_tokens=8192))
    asks = {"g": (0.0, 3), "s": (0.8, 5), "z": (0.0, 0), "none": (0.0, None)}
    prompts = {rid: random_ids(rng, rng.randint(5, 60), model.config.vocab_size) for rid in asks}
    for rid, (temp, k) in asks.items():
        engine.add_request(
            EngineRequest(
                rid,
                prompts[rid],
                max_tokens=10,
                sampling=SamplingConfig(temperature=temp, seed=3),
                ignore_eos=True,
                logprobs=k,
            )
        )
    outputs = engine.run_until_idle()
    for rid, (_, k) in asks.items():
        outs = [o for o in outputs if o.request_id == rid]
        ids = [t for o in outs for t in o.token_ids]
        if k is None:
            assert all(o.logprobs is None for o in outs)
            continue
        got = [lp for o in outs for lp in o.logprobs or []]
        assert len(got) == len(ids) == 10
        with torch.inference_mode():
            seq = torch.tensor([prompts[rid] + ids[:-1]], device=model.device)
            want = torch.log_softmax(model(seq).logits[0, len(prompts[rid]) - 1 :].float(), -1)
        for pos, (tok_id, lp) in enumerate(zip(ids, got, strict=True)):
            assert abs(lp.logprob - want[pos, tok_id].item()) < 1e-4, (rid, pos)
            top_v, top_i = want[pos].topk(k) if k else (want[pos, :0], want[pos, :0])
            assert [t for t, _ in lp.top] == top_i.tolist(), (rid, pos)
            assert all(abs(v - w) < 1e-4 for (_, v), w in zip(lp.top, top_v.tolist(), strict=True))


def test_penalties_and_biases_change_the_picks_as_defined(lm: tuple[Any, Any]) -> None:
    """Greedy with a repetition penalty equals ``generate(repetition_penalty=...)``;
    presence and frequency penalties and logit biases equal a plain forward pass with the
    OpenAI definitions applied step by step; a plain request in the same batch is
    untouched."""
    model, tok = lm
    vocab = model.config.vocab_size
    rng = random.Random(11)
    prompt = random_ids(rng, 30, vocab)
    free = reference(model, prompt, 16)
    bias = ((free[0], -100.0), (free[5], 3.0))
    asks = {
        "rep": SamplingConfig(repetition_penalty=1.3),
        "openai": SamplingConfig(presence_penalty=1.5, frequency_penalty=0.7, logit_bias=bias),
        "plain": SamplingConfig(),
    }
    engine = Engine(model, tok, EngineConfig(kv_budget_tokens=4096))
    for rid, cfg in asks.items():
        engine.add_request(EngineRequest(rid, prompt, 16, cfg, ignore_eos=True))
    tokens, _ = collect(engine.run_until_idle())
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([prompt], device=model.device),
            max_new_tokens=16,
            do_sample=False,
            repetition_penalty=1.3,
            eos_token_id=[],
        )
    assert tokens["rep"] == out[0, len(prompt) :].tolist() != free
    assert tokens["plain"] == free
    # The OpenAI penalties by their definition, one plain forward pass per step.
    picks: list[int] = []
    with torch.inference_mode():
        for _ in range(16):
            logits = model(torch.tensor([prompt + picks], device=model.device)).logits[0, -1]
            logits = logits.float().clone()
            for t in set(picks):
                logits[t] -= 1.5 + 0.7 * picks.count(t)
            for t, b in bias:
                logits[t] += b
            picks.append(int(logits.argmax()))
    assert tokens["openai"] == picks != free
    assert free[0] not in tokens["openai"][:1]  # a -100 bias removes the free first pick
