"""Per-request fault isolation in the engine: whatever one request's sampling fields hold
(anything the wire schema admits), and whatever fails in one request's forward pass, sampling
or detokenization, that request ends with an error and the step goes on for the others."""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.worker.engine.engine import Engine
from services.worker.engine.request import Status
from services.worker.engine.sampler import Picker
from services.worker.engine.wire import EngineConfig, EngineRequest, SamplingConfig, StepOutput
from shared.messages import MAX_STOP_STRINGS, SEED_MAX, SamplingParams
from tests.unit.test_engine import collect, random_ids, reference
from tests.unit.test_engine_overlap import overlapped

pytestmark = pytest.mark.timeout(900)

# Floats the schema admits, weighted to the edges of their ranges: subnormals, values whose
# reciprocal overflows float32, and the bounds themselves.
TINY = [5e-324, 1e-45, 1.4e-45, 1e-40, 1e-38, 1e-30, 1e-12, 1e-6, 1e-5, 1.0001e-5]
temperatures = st.one_of(
    st.sampled_from([0.0, *TINY, 100.0]),
    st.floats(0.0, 100.0, allow_nan=False, allow_infinity=False),
)
top_ps = st.one_of(
    st.sampled_from([*TINY, 1.0]), st.floats(5e-324, 1.0, exclude_min=False, allow_nan=False)
)


def sampling_strategy(vocab: int) -> st.SearchStrategy[SamplingParams]:
    return st.integers(1, 6).flatmap(lambda n: _sampling(vocab, n))


def _sampling(vocab: int, max_tokens: int) -> st.SearchStrategy[SamplingParams]:
    stop_text = st.text(min_size=1, max_size=256)
    return st.builds(
        SamplingParams,
        max_tokens=st.just(max_tokens),
        min_tokens=st.integers(0, max_tokens),
        logprobs=st.one_of(st.none(), st.sampled_from([0, 1, 20]), st.integers(0, 20)),
        presence_penalty=st.floats(-2.0, 2.0),
        frequency_penalty=st.floats(-2.0, 2.0),
        repetition_penalty=st.one_of(
            st.none(), st.sampled_from([*TINY, 10.0]), st.floats(1e-6, 10.0)
        ),
        # Ids past the vocabulary are refused (test_engine), not served: not drawn here.
        logit_bias=st.dictionaries(
            st.one_of(st.sampled_from([0, vocab - 1]), st.integers(0, vocab - 1)),
            st.one_of(st.sampled_from([-100.0, 100.0]), st.floats(-100, 100)),
            max_size=300,
        ),
        temperature=temperatures,
        top_p=top_ps,
        top_k=st.one_of(
            st.sampled_from([0, 1, vocab - 1, vocab, vocab + 1, 1_000_000]), st.integers(0, 10**6)
        ),
        min_p=st.one_of(st.none(), st.sampled_from([0.0, *TINY, 1.0]), st.floats(0.0, 1.0)),
        seed=st.one_of(st.none(), st.sampled_from([0, SEED_MAX]), st.integers(0, SEED_MAX)),
        stop=st.lists(stop_text, max_size=MAX_STOP_STRINGS),
        stop_token_ids=st.lists(st.integers(0, vocab - 1), max_size=64),
        ignore_eos=st.booleans(),
        include_stop_str_in_output=st.booleans(),
    )


def engine_request(rid: str, prompt: list[int], sp: SamplingParams) -> EngineRequest:
    """What the worker hands the engine for a wire request's sampling fields."""
    return EngineRequest(
        rid,
        prompt,
        max_tokens=sp.max_tokens,
        sampling=SamplingConfig(
            sp.temperature,
            sp.top_p,
            sp.top_k,
            sp.seed,
            presence_penalty=sp.presence_penalty,
            frequency_penalty=sp.frequency_penalty,
            repetition_penalty=sp.repetition_penalty or 1.0,
            logit_bias=tuple(sp.logit_bias.items()),
            min_p=sp.min_p or 0.0,
        ),
        stop=sp.stop,
        include_stop=sp.include_stop_str_in_output,
        stop_token_ids=sp.stop_token_ids,
        ignore_eos=sp.ignore_eos,
        min_tokens=sp.min_tokens,
        logprobs=sp.logprobs,
    )


# Each step settling its own pass, and each pass settled by the next step (a GPU's order).
ORDERS = pytest.mark.parametrize("overlap", [False, True], ids=["lockstep", "overlapped"])


@pytest.fixture(scope="module", params=[False, True], ids=["lockstep", "overlapped"])
def engine(lm: tuple[Any, Any], request: pytest.FixtureRequest) -> Engine:
    model, tok = lm
    return overlapped(
        Engine(model, tok, EngineConfig(kv_budget_tokens=8192, max_running=16)), request.param
    )


def test_every_admitted_sampling_field_ends_in_a_final_event(engine: Engine) -> None:
    """Hypothesis over the whole admitted range of every sampling field, four requests per
    example batched together with a plain greedy one: the engine never raises, every request
    finishes, and the plain one is served exactly."""
    vocab = engine.vocab_size
    rng = random.Random(0)
    plain_prompt = random_ids(rng, 12, vocab)
    expected = reference(engine.runner.model, plain_prompt, 4)
    counter = iter(range(1_000_000))

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.lists(sampling_strategy(vocab), min_size=1, max_size=4), st.randoms())
    def check(params: list[SamplingParams], r: random.Random) -> None:
        n = next(counter)
        rids = [f"h{n}-{i}" for i in range(len(params))]
        # Every draw before the first request goes in: an example that hypothesis ends
        # while drawing must not leave requests in the engine for the next one.
        prompts = [random_ids(r, r.randint(1, 40), vocab) for _ in params]
        for rid, sp, prompt in zip(rids, params, prompts, strict=True):
            engine.add_request(engine_request(rid, prompt, sp))
        plain = f"h{n}-plain"
        engine.add_request(EngineRequest(plain, plain_prompt, max_tokens=4, ignore_eos=True))
        done = engine.run_until_idle()
        tokens, finals = collect(done)
        outs = {rid: [o for o in done if o.request_id == rid] for rid in rids}
        assert set(finals) == {*rids, plain}
        for rid, sp in zip(rids, params, strict=True):
            out = finals[rid]
            assert out.finish is not None and out.finish.finished
            assert out.error is None, out.error  # every admitted value is servable
            assert len(tokens.get(rid, [])) <= sp.max_tokens
            assert all(0 <= t < vocab for t in tokens.get(rid, []))
            if sp.logprobs is not None:  # one finite log-probability per token
                got = [lp for o in outs[rid] for lp in o.logprobs or []]
                assert len(got) == len(tokens.get(rid, []))
                assert all(-1e4 <= lp.logprob <= 0 and len(lp.top) == sp.logprobs for lp in got)
        assert tokens[plain] == expected
        assert engine.stats.kv_used_blocks == 0

    check()


def test_a_temperature_below_1e5_samples_greedily(engine: Engine) -> None:
    """vLLM's convention: below 1e-5 the temperature means greedy (the scaled logits would
    overflow float32 long before reaching 0)."""
    rng = random.Random(2)
    prompt = random_ids(rng, 20, engine.vocab_size)
    want = reference(engine.runner.model, prompt, 6)
    for i, temp in enumerate([1e-45, 1e-38, 9.9e-6]):
        sp = SamplingConfig(temperature=temp, seed=i)
        engine.add_request(EngineRequest(f"t{i}", prompt, 6, sp, ignore_eos=True))
    tokens, finals = collect(engine.run_until_idle())
    for i in range(3):
        assert tokens[f"t{i}"] == want
        assert finals[f"t{i}"].finish is Status.FINISHED_LENGTH


def test_max_tokens_up_to_the_context_limit(engine: Engine) -> None:
    ctx = engine.max_context
    rng = random.Random(3)
    prompt = random_ids(rng, ctx - 3, engine.vocab_size)
    engine.add_request(EngineRequest("full", prompt, 3, ignore_eos=True))
    engine.add_request(EngineRequest("over", prompt, 4, ignore_eos=True))
    tokens, finals = collect(engine.run_until_idle())
    assert finals["full"].finish is Status.FINISHED_LENGTH and len(tokens["full"]) == 3
    assert finals["over"].finish is Status.FINISHED_ERROR and finals["over"].error


def test_non_finite_logits_fail_their_row_only() -> None:
    logits = torch.randn(4, 30)
    logits[1, 3] = float("nan")
    logits[2] = float("-inf")
    logits[3, 0] = float("inf")
    greedy, warm = SamplingConfig(), SamplingConfig(temperature=0.7, seed=1)
    picker = Picker(logits, [greedy, warm, greedy, warm])
    picks = [picker.pick(i, None) for i in range(4)]
    assert picks[0] == int(logits[0].argmax())
    assert picks[1:] == [None, None, None]


def _poisoned_forward(engine: Engine, poison: int) -> None:
    """Make the model's forward pass raise whenever a batch holds ``poison`` (as a kernel
    failing on one request's input would)."""
    forward = engine.runner.forward

    def guarded(items: Any) -> torch.Tensor:
        if any(poison in it.token_ids for it in items):
            raise RuntimeError("kernel failure")
        return forward(items)

    engine.runner.forward = guarded  # type: ignore[method-assign]


@ORDERS
def test_a_forward_pass_failing_on_one_request_fails_that_request_only(
    lm: tuple[Any, Any], overlap: bool
) -> None:
    """The step's requests are retried in halves until the culprit is alone; everyone else
    gets exactly what an undisturbed run gives."""
    model, tok = lm
    engine = overlapped(Engine(model, tok, EngineConfig(kv_budget_tokens=8192)), overlap)
    rng = random.Random(4)
    vocab = engine.vocab_size
    poison = 1
    prompts = [
        [t for t in random_ids(rng, rng.randint(5, 40), vocab) if t != poison] for _ in range(8)
    ]
    bad = [*prompts[3][:5], poison, *prompts[3][5:]]
    for i, p in enumerate(prompts):
        engine.add_request(EngineRequest(f"ok{i}", p, 6, ignore_eos=True))
    engine.add_request(EngineRequest("bad", bad, 6, ignore_eos=True))
    _poisoned_forward(engine, poison)
    outputs: list[StepOutput] = engine.run_until_idle()
    tokens, finals = collect(outputs)
    assert finals["bad"].finish is Status.FINISHED_ERROR
    assert "kernel failure" in (finals["bad"].error or "")
    assert finals["bad"].error_code == "engine_error"
    for i, p in enumerate(prompts):
        assert tokens[f"ok{i}"] == reference(model, p, 6), i
    assert engine.stats.request_errors == 1
    assert engine.stats.kv_used_blocks == 0


@ORDERS
def test_a_detokenizer_failure_fails_that_request_only(lm: tuple[Any, Any], overlap: bool) -> None:
    model, tok = lm

    class Fragile:
        """The tokenizer, failing to decode one token id."""

        def __init__(self, inner: Any, bad: int) -> None:
            self.inner, self.bad = inner, bad
            self.eos_token_id = inner.eos_token_id

        def decode(self, ids: Any, **kw: bool) -> str:
            if self.bad in ids:
                raise ValueError("cannot decode")
            return str(self.inner.decode(ids, **kw))

    rng = random.Random(5)
    prompt = random_ids(rng, 10, model.config.vocab_size)
    first = reference(model, prompt, 1)[0]
    engine = overlapped(
        Engine(model, Fragile(tok, first), EngineConfig(kv_budget_tokens=4096)), overlap
    )
    # A second request whose output never holds the failing token.
    while first in (want_other := reference(model, other := random_ids(rng, 10, 512), 4)):
        pass
    engine.add_request(EngineRequest("bad", prompt, 4, ignore_eos=True))
    engine.add_request(EngineRequest("good", other, 4, ignore_eos=True))
    tokens, finals = collect(engine.run_until_idle())
    assert finals["bad"].finish is Status.FINISHED_ERROR and "decode" in (finals["bad"].error or "")
    assert tokens["good"] == want_other and finals["good"].finish is Status.FINISHED_LENGTH
    assert engine.stats.request_errors == 1 and engine.stats.kv_used_blocks == 0
