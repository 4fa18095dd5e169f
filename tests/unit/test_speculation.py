"""Speculation, n-gram and draft model: the proposer on plain lists, the KV rollback on the
pure cache manager and scheduler, and the engine on the embedded tiny model, each engine
test with both methods (the draft: the tiny model's first three layers and its head, which
agree with it on some tokens and not others): outputs token-identical with and without
drafts (greedy and seeded sampling, mixed batches, preemption), the prefix cache left
consistent, the sampled distribution preserved, and drafts off under load.
"""

from __future__ import annotations

import copy
import math
import random
from pathlib import Path
from typing import Any

import pytest
import torch

from services.worker.engine.draft import DraftModel, DraftUnsupported, DraftWant
from services.worker.engine.engine import Engine
from services.worker.engine.kv_cache import KVCacheManager
from services.worker.engine.request import SeqState, Status
from services.worker.engine.scheduler import Scheduler, SchedulerConfig
from services.worker.engine.speculation import SpecConfig, propose
from services.worker.engine.wire import EngineConfig, EngineRequest, SamplingConfig, StepOutput
from shared.prefix_hash import chain_hash

pytestmark = pytest.mark.timeout(600)


# --- the proposer --------------------------------------------------------------------------
def test_propose_takes_the_longest_recent_match() -> None:
    #         0  1  2  3  4  5  6  7  8  9 10 11
    tokens = [1, 2, 3, 9, 8, 2, 3, 7, 6, 1, 2, 3]
    # "1 2 3" occurs at 0..2 (then 9 8 …); "2 3" more recently at 5..6 (then 7 6): the
    # longer match wins over the more recent shorter one.
    assert propose(tokens, 3, max_n=3) == [9, 8, 2]
    assert propose(tokens, 2, max_n=2) == [7, 6]  # both match 2: the most recent
    assert propose(tokens, 5, max_n=1) == [7, 6, 1, 2, 3]
    assert propose(tokens, 2, max_n=3, min_n=3) == [9, 8]


def test_propose_gives_nothing_without_a_match() -> None:
    assert propose([1, 2, 3, 4], 4, max_n=3) == []
    assert propose([5], 4, max_n=3) == []
    assert propose([1, 2, 1], 0, max_n=3) == []
    assert propose([1, 2, 3, 1, 2], 4, max_n=3, min_n=3) == []
    assert propose([4, 4], 3, max_n=3) == [4]  # the draft stops at the known tokens


def test_spec_config_turns_off_above_its_running_cap() -> None:
    spec = SpecConfig(k=4, max_running=3)
    assert spec.active(3) and not spec.active(4)
    assert not SpecConfig().active(1)  # off by default


def test_drafts_shrink_as_the_batch_fills() -> None:
    spec = SpecConfig(k=4, max_running=16, step_tokens=8)
    assert [spec.per_request(n) for n in (1, 2, 3, 4, 8, 9, 16, 17)] == [4, 4, 2, 2, 1, 0, 0, 0]
    assert SpecConfig(k=4, max_running=16, step_tokens=64).per_request(16) == 4


# --- rollback in the cache manager and scheduler ---------------------------------------------
def test_rejected_draft_blocks_are_freed_and_never_cached() -> None:
    kv = KVCacheManager(num_blocks=16, block_size=4)
    sched = Scheduler(kv, SchedulerConfig(max_running=4, max_step_tokens=64, prefill_chunk=64))
    seq = SeqState("a", list(range(10, 16)), max_tokens=20)  # 6 prompt tokens
    sched.add(seq)
    sched.complete(sched.schedule())
    seq.append_output(16)  # 7 tokens known, 6 computed
    seq.draft = [17, 18, 19, 20, 21, 22]  # positions 7..12: blocks 1, 2 and 3
    plan = sched.schedule()
    (work,) = plan.work
    assert (work.num_tokens, work.draft) == (7, 6)
    assert len(kv.table("a").block_ids) == 4  # room for 13 tokens
    sched.complete(plan, {"a": 2})  # 17 and 18 agreed with; 19 did not
    seq.append_output(17)
    seq.append_output(18)
    seq.append_output(30)  # the model's own token after 18
    assert seq.num_computed == 9  # 16, 17, 18 computed after the prompt; 30 not yet
    assert seq.draft == []
    table = kv.table("a").block_ids
    assert len(table) == 3  # the block for positions 12..15 went back to the pool
    pool = kv._pool
    assert sum(b.ref for b in pool.blocks) == 3
    assert kv.stats.used_blocks == 3
    # Only the two full blocks of accepted tokens are cached, under their real tokens.
    ids = seq.all_ids
    h0 = chain_hash(None, tuple(ids[0:4]))
    h1 = chain_hash(h0, tuple(ids[4:8]))
    cached = {b.hash: b.tokens for b in pool.blocks if b.hash is not None}
    assert cached == {h0: tuple(ids[0:4]), h1: tuple(ids[4:8])}
    # A later sequence with the same tokens reuses exactly those.
    assert kv.cached_prefix_blocks([*ids, 1]) == list(table[:2])


def test_a_draft_never_preempts_and_is_cut_to_the_budget() -> None:
    kv = KVCacheManager(num_blocks=2, block_size=4)
    sched = Scheduler(kv, SchedulerConfig(max_running=4, max_step_tokens=64, prefill_chunk=64))
    seq = SeqState("a", [1, 2, 3, 4, 5, 6], max_tokens=8)
    sched.add(seq)
    sched.complete(sched.schedule())
    seq.append_output(7)
    seq.draft = [8, 9, 10]  # would need a third block
    (work,) = sched.schedule().work
    assert (work.num_tokens, work.draft, seq.draft) == (1, 0, [])
    assert seq.status is Status.RUNNING

    kv = KVCacheManager(num_blocks=8, block_size=4)
    sched = Scheduler(kv, SchedulerConfig(max_running=4, max_step_tokens=3, prefill_chunk=64))
    seq = SeqState("b", [1, 2, 3], max_tokens=8)
    sched.add(seq)
    sched.complete(sched.schedule())
    seq.append_output(4)
    seq.draft = [5, 6, 7, 8]
    (work,) = sched.schedule().work
    assert (work.num_tokens, work.draft, seq.draft) == (3, 2, [5, 6])


# --- the engine on the tiny model --------------------------------------------------------------
@pytest.fixture(scope="module")
def draft_lm(lm: tuple[Any, Any]) -> Any:
    """A draft for the tiny model: its embedding, first three layers, norm and head."""
    draft = copy.deepcopy(lm[0])
    draft.model.layers = draft.model.layers[:3]
    draft.config.num_hidden_layers = 3
    return draft


@pytest.fixture(params=["ngram", "draft"])
def method(request: pytest.FixtureRequest, draft_lm: Any) -> str:
    return str(request.param)


def engine_for(lm: tuple[Any, Any], draft: Any, config: EngineConfig) -> Engine:
    """An engine of the tiny model; the draft model goes with draft speculation."""
    model, tok = lm
    use = draft if config.speculation.enabled and config.speculation.method == "draft" else None
    return Engine(model, tok, config, draft_model=use)


def collect(outputs: list[StepOutput]) -> tuple[dict[str, list[int]], dict[str, StepOutput]]:
    tokens: dict[str, list[int]] = {}
    finals: dict[str, StepOutput] = {}
    for o in outputs:
        assert o.error is None, o.error
        tokens.setdefault(o.request_id, []).extend(o.token_ids)
        if o.logprobs is not None:
            assert len(o.logprobs) == len(o.token_ids)
        if o.finish is not None:
            finals[o.request_id] = o
    return tokens, finals


def logprobs_of(outputs: list[StepOutput]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for o in outputs:
        for lp in o.logprobs or []:
            out.setdefault(o.request_id, []).append(lp.logprob)
    return out


def extractive(rng: random.Random, vocab: int) -> list[int]:
    """A prompt that quotes itself: a passage, other tokens, then the passage's start."""
    passage = [rng.randrange(3, vocab) for _ in range(rng.randint(12, 40))]
    other = [rng.randrange(3, vocab) for _ in range(rng.randint(1, 30))]
    return passage + other + passage[: rng.randint(2, 8)]


def run(
    lm: tuple[Any, Any],
    requests: list[EngineRequest],
    spec: SpecConfig,
    draft: Any = None,
    **config: Any,
) -> tuple[Engine, dict[str, list[int]], dict[str, StepOutput]]:
    engine, outputs = run_outputs(lm, requests, spec, draft, **config)
    return engine, *collect(outputs)


def run_outputs(
    lm: tuple[Any, Any],
    requests: list[EngineRequest],
    spec: SpecConfig,
    draft: Any = None,
    **config: Any,
) -> tuple[Engine, list[StepOutput]]:
    engine = engine_for(lm, draft, EngineConfig(speculation=spec, **config))
    outputs: list[StepOutput] = []
    for r in requests:  # a new request joins at every step
        engine.add_request(r)
        outputs += engine.step()
    return engine, outputs + engine.run_until_idle()


def mixed_requests(vocab: int, count: int, seed: int) -> list[EngineRequest]:
    """Extractive and random prompts, greedy and seeded sampling, with penalties, a
    biased token, min_tokens, stop ids, logprobs and one output structure."""
    rng = random.Random(seed)
    reqs = []
    for i in range(count):
        prompt = extractive(rng, vocab) if i % 3 else [rng.randrange(3, vocab) for _ in range(20)]
        sampling = SamplingConfig()
        if i % 4 == 1:
            sampling = SamplingConfig(temperature=0.9, top_k=50, top_p=0.95, seed=i)
        elif i % 4 == 2:
            sampling = SamplingConfig(
                presence_penalty=0.5,
                repetition_penalty=1.2,
                logit_bias=((prompt[-1], 3.0),),
                min_p=0.05,
            )
        reqs.append(
            EngineRequest(
                f"r{i}",
                prompt,
                max_tokens=rng.randint(4, 40),
                sampling=sampling,
                ignore_eos=i % 5 != 0,
                min_tokens=6 if i % 6 == 0 else 0,
                stop_token_ids=(prompt[5],) if i % 7 == 3 else (),
                logprobs=2 if i % 3 == 1 else None,
            )
        )
    reqs.append(
        EngineRequest(
            "structured",
            reqs[1].prompt_ids,
            max_tokens=24,
            structure=("json_schema", '{"type": "object"}'),
        )
    )
    return reqs


def test_outputs_are_identical_with_and_without_speculation(
    lm: tuple[Any, Any], draft_lm: Any, method: str
) -> None:
    vocab = lm[0].config.vocab_size
    reqs = mixed_requests(vocab, 24, seed=11)
    cfg = {"kv_budget_tokens": 8192, "prefill_chunk": 32, "max_step_tokens": 256}
    _, plain_out = run_outputs(lm, reqs, SpecConfig(), **cfg)
    # A cap below the peak batch: some steps speculate, others decode plainly.
    spec = SpecConfig(k=4, max_n=3, max_running=10, method=method, step_tokens=40)
    engine, spec_out = run_outputs(lm, reqs, spec, draft_lm, **cfg)
    (plain, plain_finals), (spec, spec_finals) = collect(plain_out), collect(spec_out)
    st = engine.stats
    assert st.spec_verifications > 0 and st.spec_accepted_tokens > 0
    assert st.spec_accepted_tokens < st.spec_draft_tokens  # some were rejected: rollback ran
    for r in reqs:
        rid = r.request_id
        assert spec[rid] == plain[rid], rid
        a, b = spec_finals[rid], plain_finals[rid]
        assert (a.finish, a.completion_tokens) == (b.finish, b.completion_tokens), rid
    lp_spec, lp_plain = logprobs_of(spec_out), logprobs_of(plain_out)
    assert lp_spec.keys() == lp_plain.keys() and lp_spec
    for rid, values in lp_spec.items():
        assert len(values) == len(lp_plain[rid]) == len(plain[rid])
        assert values == pytest.approx(lp_plain[rid], abs=1e-4), rid
    assert engine.stats.kv_used_blocks == 0
    if engine.drafter is not None:  # every request's draft state went with it
        assert engine.drafter.used_blocks == 0


def test_preemption_in_the_middle_of_speculation_changes_nothing(
    lm: tuple[Any, Any], draft_lm: Any, method: str
) -> None:
    vocab = lm[0].config.vocab_size
    rng = random.Random(4)
    reqs = [
        EngineRequest(f"r{i}", extractive(rng, vocab), max_tokens=24, ignore_eos=True)
        for i in range(24)
    ]
    cfg = {"kv_budget_tokens": 320, "block_size": 16, "max_running": 16}
    _, plain, _ = run(lm, reqs, SpecConfig(), **cfg)
    engine, spec, _ = run(
        lm, reqs, SpecConfig(k=6, max_running=16, method=method, step_tokens=96), draft_lm, **cfg
    )
    assert engine.stats.preemptions > 0 and engine.stats.spec_accepted_tokens > 0
    assert engine.stats.kv_peak_used_blocks * 16 <= 320
    assert spec == plain


def test_prefix_cache_holds_only_real_tokens_after_rollbacks(
    lm: tuple[Any, Any], draft_lm: Any, method: str
) -> None:
    """Every block the prefix cache registered holds tokens some request really had at that
    place (its hash chained over them), and nothing stays referenced once all finish."""
    vocab = lm[0].config.vocab_size
    rng = random.Random(8)
    reqs = [
        EngineRequest(f"r{i}", extractive(rng, vocab), max_tokens=40, ignore_eos=True)
        for i in range(12)
    ]
    spec = SpecConfig(k=5, method=method, step_tokens=40)
    engine, tokens, _ = run(lm, reqs, spec, draft_lm, block_size=4, kv_budget_tokens=8192)
    st = engine.stats
    assert st.spec_accepted_tokens > 0 and st.spec_accepted_tokens < st.spec_draft_tokens
    real: dict[int, tuple[int, ...]] = {}
    for r in reqs:
        ids = r.prompt_ids + tokens[r.request_id]
        parent = None
        for i in range(len(ids) // 4):
            chunk = tuple(ids[i * 4 : (i + 1) * 4])
            parent = chain_hash(parent, chunk)
            real[parent] = chunk
    assert isinstance(engine.kv, KVCacheManager)
    blocks = engine.kv._pool.blocks
    cached = [b for b in blocks if b.hash is not None]
    assert len(cached) > 20
    for b in cached:
        assert real.get(b.hash) == b.tokens
        assert engine.kv._by_hash[b.hash] == b.block_id
    assert all(b.ref == 0 for b in blocks) and engine.stats.kv_used_blocks == 0


def test_speculation_turns_off_while_the_batch_is_full(
    lm: tuple[Any, Any], draft_lm: Any, method: str
) -> None:
    rng = random.Random(3)
    prompt = extractive(rng, lm[0].config.vocab_size)
    spec = SpecConfig(k=4, max_running=2, method=method)
    # Each step settles its own pass: its verifications are counted in the step that
    # decided them (with ``overlap``, in the next one).
    engine = engine_for(lm, draft_lm, EngineConfig(speculation=spec, overlap=False))
    for i in range(6):  # they finish one after another: the batch shrinks below the cap
        engine.add_request(EngineRequest(f"r{i}", prompt, max_tokens=8 + 6 * i, ignore_eos=True))
    checked = 0
    while engine.has_work:
        running = len(engine.scheduler.running)
        before = engine.stats.spec_verifications
        engine.step()
        if running > 2:
            assert engine.stats.spec_verifications == before
            checked += 1
    assert checked > 3
    assert engine.stats.spec_verifications > 0


def test_sampling_with_drafts_keeps_the_target_distribution(
    lm: tuple[Any, Any], draft_lm: Any, method: str
) -> None:
    """Chi-square of the second token's counts (first token fixed, drafts verified) against
    the model's own probabilities after temperature and top-k, from one forward pass.
    Seeds are fixed, so the test is deterministic; its level is 0.001.

    The rule: the target draws its own token at each draft position and keeps the draft
    token while they agree. With a greedy draft (one token, probability 1) that is
    Leviathan et al.'s rejection sampling exactly: the draft token is kept with the
    target's probability of it, and a rejection draws from the target's distribution
    without it. Seeded requests give the same tokens with and without drafts."""
    model = lm[0]
    rng = random.Random(12)
    prompt = extractive(rng, model.config.vocab_size)
    sampling = SamplingConfig(temperature=1.5, top_k=8)
    # Led by the tokens most likely to follow it, so the likely first tokens recur in the
    # prompt and a draft follows them.
    with torch.inference_mode():
        last = model(torch.tensor([prompt], device=model.device)).logits[0, -1]
    prompt = last.topk(8).indices.tolist() + prompt
    n = 600
    spec = SpecConfig(k=3, max_running=1000, method=method, step_tokens=3000)
    engine = engine_for(lm, draft_lm, EngineConfig(max_running=200, speculation=spec))
    for i in range(n):
        s = SamplingConfig(temperature=1.5, top_k=8, seed=1000 + i)
        engine.add_request(EngineRequest(f"r{i}", prompt, max_tokens=3, sampling=s))
    tokens, _ = collect(engine.run_until_idle())
    assert engine.stats.spec_verifications > n // 4  # many second tokens came from a draft
    firsts = [t[0] for t in tokens.values()]
    first = max(set(firsts), key=firsts.count)
    if method == "ngram":
        assert propose([*prompt, first], 3, 4)  # a draft follows this first token
    seconds = [t[1] for t in tokens.values() if t[0] == first and len(t) > 1]
    assert len(seconds) > 200
    with torch.inference_mode():
        logits = model(torch.tensor([[*prompt, first]], device=model.device)).logits[0, -1]
    scaled = logits.float() / sampling.temperature
    top = scaled.topk(sampling.top_k)
    probs = torch.softmax(top.values, dim=-1).tolist()
    ids = top.indices.tolist()
    assert set(seconds) <= set(ids)
    chi2 = 0.0
    cells = 0
    rest_expected = rest_seen = 0.0
    for t, p in zip(ids, probs, strict=True):
        expected = p * len(seconds)
        seen = seconds.count(t)
        if expected < 5:  # pool the rare tokens into one cell
            rest_expected, rest_seen = rest_expected + expected, rest_seen + seen
            continue
        chi2 += (seen - expected) ** 2 / expected
        cells += 1
    if rest_expected > 0:
        chi2 += (rest_seen - rest_expected) ** 2 / rest_expected
        cells += 1
    assert cells >= 3
    assert chi2 < _chi2_critical(cells - 1)


def _chi2_critical(dof: int) -> float:
    """The chi-square quantile at 0.999 (Wilson-Hilferty)."""
    z = 3.090
    return dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3


def test_worker_metrics_count_drafts_and_accepted_tokens() -> None:
    from services.worker.engine.wire import EngineStats
    from services.worker.metrics import WorkerMetrics

    metrics = WorkerMetrics("w")
    stats = EngineStats(spec_verifications=3, spec_draft_tokens=12, spec_accepted_tokens=5)
    metrics.refresh(stats, 0)
    stats.spec_verifications, stats.spec_draft_tokens, stats.spec_accepted_tokens = 4, 16, 7
    metrics.refresh(stats, 0)
    value = metrics.registry.get_sample_value
    assert value("tw_spec_verifications_total") == 4
    assert value("tw_spec_draft_tokens_total") == 16
    assert value("tw_spec_accepted_tokens_total") == 7


# --- the draft model on its own ----------------------------------------------------------------
def test_a_draft_model_of_another_vocabulary_is_refused(lm: tuple[Any, Any]) -> None:
    model = lm[0]
    with pytest.raises(DraftUnsupported, match="share the target's tokenizer"):
        DraftModel(model, vocab_size=model.config.vocab_size + 1, block_size=16, kv_tokens=256)


def test_the_draft_catches_up_after_rejections_and_frees_its_blocks(
    lm: tuple[Any, Any], draft_lm: Any
) -> None:
    """Guesses after a partly rejected guess equal the guesses of a draft starting afresh
    on the same tokens (the rejected positions' KV was written over), and a short pool
    takes blocks from requests that do not draft this step."""
    rng = random.Random(5)
    prompt = extractive(rng, lm[0].config.vocab_size)
    kept = DraftModel(draft_lm, vocab_size=lm[0].config.vocab_size, block_size=4, kv_tokens=96)
    first = kept.propose([DraftWant("a", prompt, 4)])["a"]
    # The target kept two guesses, then drew a token of its own (unlike the third guess).
    other = (first[2] + 1) % lm[0].config.vocab_size
    tokens = [*prompt, *first[:2], other]
    again = kept.propose([DraftWant("a", tokens, 4)])["a"]
    fresh = DraftModel(draft_lm, vocab_size=lm[0].config.vocab_size, block_size=4, kv_tokens=96)
    assert again == fresh.propose([DraftWant("a", tokens, 4)])["a"]
    # Every guess kept, then the target's own token: the first guessing pass catches up
    # on both, beside a row that catches up on one.
    other = (again[0] + 1) % lm[0].config.vocab_size
    tokens_a, tokens_b = [*tokens, *again, other], [*tokens, other]
    kept.propose([DraftWant("b", tokens, 4)])
    both = kept.propose([DraftWant("a", tokens_a, 4), DraftWant("b", tokens_b, 4)])
    for rid, toks in (("a", tokens_a), ("b", tokens_b)):
        new = DraftModel(draft_lm, vocab_size=lm[0].config.vocab_size, block_size=4, kv_tokens=96)
        assert both[rid] == new.propose([DraftWant(rid, toks, 4)])[rid], rid
    # "b" needs most of the pool: "a", idle this step, gives its blocks back.
    long = [*prompt, *prompt][:80]
    assert len(kept.propose([DraftWant("b", long, 4)])["b"]) == 4
    assert kept.used_blocks == -(-(len(long) + 3) // 4)
    assert kept.propose([DraftWant("c", long, 4), DraftWant("b", long, 4)]).keys() == {"b"}
    kept.retain([])
    assert kept.used_blocks == 0


def test_a_failing_draft_pass_costs_its_step_the_drafts_only(
    lm: tuple[Any, Any], draft_lm: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = random.Random(6)
    reqs = [
        EngineRequest(f"r{i}", extractive(rng, lm[0].config.vocab_size), max_tokens=20)
        for i in range(4)
    ]
    _, plain, _ = run(lm, reqs, SpecConfig())
    engine = engine_for(lm, draft_lm, EngineConfig(speculation=SpecConfig(k=4, method="draft")))
    assert engine.drafter is not None
    forward = engine.drafter.runner.forward
    failed = 0

    def flaky(*args: Any, **kwargs: Any) -> torch.Tensor:
        nonlocal failed
        if engine.stats.steps % 3 == 1:  # every third step's draft pass fails
            failed += 1
            raise RuntimeError("draft pass failed")
        return forward(*args, **kwargs)

    monkeypatch.setattr(engine.drafter.runner, "forward", flaky)
    for r in reqs:
        engine.add_request(r)
    tokens, finals = collect(engine.run_until_idle())
    assert tokens == plain and len(finals) == len(reqs)
    assert failed > 3 and engine.stats.spec_accepted_tokens > 0


def test_a_finished_request_frees_its_draft_state_at_once(
    lm: tuple[Any, Any], draft_lm: Any
) -> None:
    """The last request of a busy spell frees its draft blocks as it finishes: an idle
    engine takes no further step that would."""
    rng = random.Random(8)
    engine = engine_for(lm, draft_lm, EngineConfig(speculation=SpecConfig(k=4, method="draft")))
    assert engine.drafter is not None
    engine.add_request(EngineRequest("only", extractive(rng, lm[0].config.vocab_size), 12))
    _, finals = collect(engine.run_until_idle())
    assert list(finals) == ["only"] and engine.stats.spec_verifications > 0
    assert engine.drafter.used_blocks == 0


def test_a_draft_model_with_another_tokenizer_is_refused_at_load(
    model_dir: str, tmp_path: Path
) -> None:
    from services.model.build import ensure_model
    from services.worker.runtime import EngineSpec, _build

    other = ensure_model("micro", tmp_path, log=lambda _: None)  # its own, smaller tokenizer
    spec = EngineSpec(
        model_dir,
        device="cpu",
        dtype="float32",
        config=EngineConfig(speculation=SpecConfig(k=2, method="draft")),
        draft_model_dir=str(other),
    )
    with pytest.raises(ValueError, match="another tokenizer"):
        _build(spec)
